"""``POST /v1/chat/completions`` and ``POST /v1/completions``, for models that generate (the
``openai`` backend's chat and completions endpoints, or any model that streams). A call is one
request to the fleet: the body without ``model`` and the streaming fields is its input. With
``stream: true`` it goes down the model's streaming lane and comes back as server-sent events
in OpenAI's chunk format, ending with ``data: [DONE]``; a client that leaves cancels it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from config.errors import BatchfleetError
from producer.async_client import AsyncProducer
from workers.gateway.openai_errors import ApiError, UnfitOutput, api_error
from workers.gateway.waits import answer_wait_s

# Fields of the call that are the gateway's business, not the model's input.
CALL_FIELDS = {"model", "stream", "stream_options", "n"}


class GenerationRequest(BaseModel):
    """What every generation call carries; other fields go to the model as they are."""

    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1

    def fleet_input(self) -> dict[str, Any]:
        if self.n != 1:
            raise ApiError(400, "n must be 1", "invalid_input", "n")
        return self.model_dump(exclude=CALL_FIELDS, exclude_none=True)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(GenerationRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)


class CompletionRequest(GenerationRequest):
    prompt: str = Field(min_length=1)


@dataclass(frozen=True)
class Kind:
    """How one endpoint names its objects and puts text in a choice."""

    prefix: str
    whole: str
    chunk: str
    chat: bool

    def whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """The choice of a whole answer."""
        if self.chat:
            return self._choice(finish_reason, message={"role": "assistant", "content": text})
        return self._choice(finish_reason, text=text)

    def chunk_choice(
        self, text: str | None, finish_reason: str | None, opening: bool
    ) -> dict[str, Any]:
        """The choice of one chunk; the ``opening`` one of a chat names the role."""
        if not self.chat:
            return self._choice(finish_reason, text=text or "")
        delta: dict[str, Any] = {"role": "assistant"} if opening else {}
        if text:
            delta["content"] = text
        return self._choice(finish_reason, delta=delta)

    @staticmethod
    def _choice(finish_reason: str | None, **content: Any) -> dict[str, Any]:
        return {"index": 0, **content, "finish_reason": finish_reason, "logprobs": None}


CHAT = Kind("chatcmpl-", "chat.completion", "chat.completion.chunk", chat=True)
TEXT = Kind("cmpl-", "text_completion", "text_completion", chat=False)


def _usage(output: Mapping[str, Any]) -> dict[str, Any]:
    usage = output.get("usage")
    if isinstance(usage, dict):
        return usage
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def _text_of(output: Any) -> str:
    if not isinstance(output, dict) or not isinstance(output.get("text"), str):
        raise UnfitOutput("the model's output has no text: it does not generate")
    text: str = output["text"]
    return text


async def complete(body: GenerationRequest, producer: AsyncProducer, kind: Kind) -> dict[str, Any]:
    """One whole answer, through the model's micro-batches.

    Raises:
        ApiError: a bad field.
        UnfitOutput: the output has no text.
        BatchfleetError: the fleet refused or failed the request.
    """
    wait_s = await answer_wait_s(producer, body.model)
    request_id = await producer.submit(body.model, body.fleet_input())
    output = await producer.result(request_id, timeout_s=wait_s)
    return completion_body(kind, request_id, body.model, output)


def completion_body(kind: Kind, request_id: str, model: str, output: Any) -> dict[str, Any]:
    """OpenAI's answer to a generation call whose request ``request_id`` got ``output``.

    Raises:
        UnfitOutput: the output has no text.
    """
    return {
        "id": f"{kind.prefix}{request_id}",
        "object": kind.whole,
        "created": int(time.time()),
        "model": model,
        "choices": [kind.whole_choice(_text_of(output), output.get("finish_reason"))],
        "usage": _usage(output),
    }


async def generate(body: GenerationRequest, producer: AsyncProducer, kind: Kind) -> Any:
    """A whole answer, or with ``stream`` the response that streams it."""
    if not body.stream:
        return JSONResponse(await complete(body, producer, kind))
    events = await open_stream(body, producer, kind)
    return StreamingResponse(events, media_type="text/event-stream")


def _event(payload: Mapping[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


async def open_stream(
    body: GenerationRequest, producer: AsyncProducer, kind: Kind
) -> AsyncIterator[str]:
    """The call's server-sent events. The request is admitted before this returns, so a
    refusal is an HTTP error, not an event; a failure later is an ``error`` event.

    Raises:
        ApiError: a bad field.
        BatchfleetError: the fleet refused the request.
    """
    chunks = producer.stream(body.model, body.fleet_input())
    first = await anext(chunks)
    return _events(body, kind, first, chunks)


async def _events(
    body: GenerationRequest,
    kind: Kind,
    first: dict[str, Any],
    chunks: AsyncIterator[dict[str, Any]],
) -> AsyncIterator[str]:
    call_id, created = f"{kind.prefix}{uuid.uuid4().hex}", int(time.time())

    def chunk_event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _event(
            {
                "id": call_id,
                "object": kind.chunk,
                "created": created,
                "model": body.model,
                "choices": choices,
                **extra,
            }
        )

    chunk, opening = first, True
    try:
        while True:
            if chunk.get("final"):
                if "error" in chunk:
                    error = chunk["error"]
                    yield _event({"error": {"message": error["message"], "code": error["code"]}})
                    return
                yield chunk_event([kind.chunk_choice(None, chunk.get("finish_reason"), opening)])
                if body.include_usage:
                    yield chunk_event([], usage=_usage(chunk))
                yield _event("[DONE]")
                return
            yield chunk_event([kind.chunk_choice(chunk.get("delta"), None, opening)])
            opening = False
            chunk = await anext(chunks)
    except BatchfleetError as exc:
        error = api_error(exc)
        yield _event({"error": {"message": error.message, "code": error.code}})
    finally:
        with anyio.CancelScope(shield=True):
            await chunks.aclose()  # type: ignore[attr-defined]
