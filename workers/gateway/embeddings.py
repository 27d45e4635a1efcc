"""``POST /v1/embeddings``: every input becomes one request to the fleet, so it rides in
micro-batches with everyone else's; the answer takes OpenAI's shape (vectors as floats or,
with ``encoding_format: base64``, as little-endian float32).

The gateway's hot route, it is served straight on ASGI (``EmbeddingsLane``), in front of
FastAPI, which serves every other request: FastAPI's middleware and routing layers cost
about as much CPU as a bare answer itself (0.69 against 0.32 ms a call at 200 calls/s,
``benchmarks/README.md``).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from producer.async_client import AsyncProducer
from workers.gateway.openai_errors import ApiError, UnfitOutput, as_api_error, invalid_request
from workers.gateway.waits import answer_wait_s

PATH = "/v1/embeddings"
# OpenAI's own cap on the inputs of one call.
MAX_INPUTS = 2048
TokenCounter = Callable[[Any], int]


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings``: texts only (token arrays are refused)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[str] = Field(union_mode="left_to_right")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def _vector(output: Any) -> list[float]:
    if not isinstance(output, list) or not all(
        isinstance(value, int | float) and not isinstance(value, bool) for value in output
    ):
        raise UnfitOutput("the model's output is not an embedding (a list of numbers)")
    return [float(value) for value in output]


def _encoded(vector: Sequence[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def create_embeddings(
    body: EmbeddingRequest, producer: AsyncProducer, count_tokens: TokenCounter | None
) -> dict[str, Any]:
    """Runs ``body``'s inputs through the fleet and answers in OpenAI's shape; ``usage``
    counts tokens with the model's ``count_tokens`` where the gateway has one, else 0.

    Raises:
        ApiError: a bad field.
        UnfitOutput: an output is no vector.
        BatchfleetError: the fleet refused or failed an input (the whole call fails).
    """
    inputs = [body.input] if isinstance(body.input, str) else body.input
    if not inputs or len(inputs) > MAX_INPUTS or not all(inputs):
        message = f"input must hold 1 to {MAX_INPUTS} texts, none of them empty"
        raise ApiError(400, message, "invalid_input", "input")
    if body.dimensions is not None:
        raise ApiError(400, "dimensions is not supported", "invalid_input", "dimensions")
    wait_s = await answer_wait_s(producer, body.model)
    outputs = await producer.infer(body.model, inputs, timeout_s=wait_s)
    tokens = sum(count_tokens(text) for text in inputs) if count_tokens else 0
    return embeddings_body(body.model, outputs, body.encoding_format, tokens)


def embeddings_body(
    model: str, outputs: Sequence[Any], encoding_format: str, tokens: int
) -> dict[str, Any]:
    """OpenAI's answer to an embeddings call whose inputs got ``outputs``.

    Raises:
        UnfitOutput: an output is no vector.
    """
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": _encoded(_vector(output), encoding_format),
            }
            for index, output in enumerate(outputs)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class EmbeddingsLane:
    """An ASGI app: ``POST /v1/embeddings`` answered here, every other request handed to
    ``app`` (whose lifespan sets ``app.state.producer``). A call's guards and metrics are
    the gateway's middlewares, around both; its refusals get the answers FastAPI's handlers
    give."""

    path = PATH  # the endpoint the gateway's metrics label its calls with (a route's path)

    def __init__(self, app: FastAPI, counters: Callable[[str], TokenCounter | None]) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        scope["route"] = self
        response = await self._answer(Request(scope, receive))
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> Response:
        if request.method != "POST":
            return ApiError(405, "Method Not Allowed", headers={"Allow": "POST"}).response()
        try:
            body = EmbeddingRequest.model_validate_json(await request.body())
            producer: AsyncProducer = self.app.state.producer
            answer = await create_embeddings(body, producer, self.counters(body.model))
        except ValidationError as exc:
            return invalid_request(exc.errors(), str(exc)).response()
        except Exception as exc:
            error = as_api_error(exc)
            if error is None:
                raise
            return error.response()
        return JSONResponse(answer)
