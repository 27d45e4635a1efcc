"""What the gateway checks before a route reads anything: the API key of every ``/v1/``
call (401 without a valid one, the body unread) and the size of the body (413 past the cap,
by ``Content-Length`` or as it streams in: the body is read here, up to the cap, and handed
to the route whole; an upload to ``/v1/files`` is held to the file cap instead, and streams
to the route: one sent in chunks past the cap ends there, refused 400)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.gateway.api_keys import KeyRing
from workers.gateway.openai_errors import ApiError

API_PREFIX = "/v1/"
UPLOADS = "/v1/files"


def too_large(cap: int) -> ApiError:
    return ApiError(413, f"the request body is over {cap} bytes", "body_too_large")


async def _read_body(receive: Receive, cap: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``cap`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts)
        part = message.get("body", b"")
        size += len(part)
        if size > cap:
            return None
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def _capped(receive: Receive, cap: int) -> Receive:
    """``receive`` that ends the body (a disconnect) once it passes ``cap`` bytes."""
    size = 0

    async def capped_receive() -> Message:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        return {"type": "http.disconnect"} if size > cap else message

    return capped_receive


async def _refuse(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await error.response()(scope, receive, send)


class Guards:
    """An ASGI middleware: the key check, then the body cap, then the app."""

    def __init__(
        self, app: ASGIApp, keys: KeyRing, max_body_bytes: int, max_file_bytes: int
    ) -> None:
        self.app = app
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"].startswith(API_PREFIX) and not self._authorised(headers):
            message = "a valid API key is required (Authorization: Bearer KEY)"
            await _refuse(ApiError(401, message, "invalid_api_key"), scope, receive, send)
            return
        upload = scope["path"] == UPLOADS and scope["method"] == "POST"
        cap = self.max_file_bytes if upload else self.max_body_bytes
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > cap:
            await _refuse(too_large(cap), scope, receive, send)
            return
        if upload:  # streamed to a file by the route, never held whole here
            await self.app(scope, _capped(receive, cap), send)
            return
        body = await _read_body(receive, cap)
        if body is None:
            await _refuse(too_large(cap), scope, receive, send)
            return
        replayed = False

        async def replaying_receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect a stream listens for

        await self.app(scope, replaying_receive, send)

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and bool(key) and self.keys.admits(key.strip())
