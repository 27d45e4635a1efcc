"""The gateway's ASGI application: routes, the guards (API key, body cap) and metrics around
them, and one ``AsyncProducer`` for its lifetime. ``POST /v1/embeddings`` is served by its
own lane in front of FastAPI (``embeddings.EmbeddingsLane``), FastAPI the rest. It keeps no
state of its own: run as many as you like behind a load balancer.

Routes: ``POST /v1/embeddings``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, the Batch API (``batches``, where the gateway has a files folder),
``GET /livez`` (200 while its event loop answers: a liveness probe), ``GET /healthz`` (200
while Redis answers, else 503) and ``GET /metrics``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from config.connection import connect
from config.errors import BatchfleetError, ConfigError
from config.keys import Keys
from config.settings import Settings
from producer.async_client import AsyncProducer, connect_async
from workers.gateway.api_keys import load_keys
from workers.gateway.batch_runner import BatchRunner
from workers.gateway.batch_store import BatchStore
from workers.gateway.batches import BatchApi, batch_routes
from workers.gateway.completions import CHAT, TEXT, ChatRequest, CompletionRequest, generate
from workers.gateway.embeddings import EmbeddingsLane, TokenCounter
from workers.gateway.files import FileStore
from workers.gateway.guards import Guards
from workers.gateway.metrics import GatewayMetrics, MeasureRequests
from workers.gateway.openai_errors import ApiError, UnfitOutput, as_api_error, invalid_request
from workers.models.registry import token_counter

OWNER = "batchfleet"


class TokenCounters:
    """Each model's ``cost`` (its tokens) where this gateway's configuration names a backend
    that counts them, found once per model."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._found: dict[str, TokenCounter | None] = {}

    def of(self, model: str) -> TokenCounter | None:
        if model not in self._found:
            policy = self._settings.models.get(model)
            try:
                self._found[model] = token_counter(policy) if policy else None
            except ConfigError:
                self._found[model] = None
        return self._found[model]


def _bad_request(_: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    fields = [{**error, "loc": tuple(error.get("loc", ()))[1:]} for error in errors]  # no "body"
    return invalid_request(fields, str(exc)).response()


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (an unknown path, a wrong method) in OpenAI's error body."""
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    detail = exc.detail if isinstance(exc, StarletteHTTPException) else str(exc)
    return ApiError(status, str(detail), "not_found" if status == 404 else None).response()


def _refusal(_: Request, exc: Exception) -> JSONResponse:
    error = as_api_error(exc)
    if error is None:
        raise exc
    return error.response()


def _install_error_handlers(app: FastAPI) -> None:
    for refusal in (ApiError, BatchfleetError, UnfitOutput):
        app.add_exception_handler(refusal, _refusal)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)


def _batch_api(settings: Settings) -> BatchApi | None:
    """The Batch API's stores and runner, where the gateway has a files folder."""
    folder = settings.gateway.files_dir
    if folder is None:
        return None
    files = FileStore(folder, settings.gateway.max_file_bytes)
    store = BatchStore(connect(settings), Keys(settings.key_prefix), settings.gateway.batch_lease_s)
    return BatchApi(store, files, BatchRunner(settings, store, files))


def create_app(settings: Settings) -> ASGIApp:
    """The gateway for the fleet of ``settings``: its middlewares (metrics, then the guards)
    around the embeddings lane, in front of the FastAPI app that serves the other routes.

    Raises:
        ConfigError: no API key is configured, or a key file cannot be read.
    """
    keys = load_keys(settings.gateway)
    metrics = GatewayMetrics()
    counters = TokenCounters(settings)

    batch_api = _batch_api(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncProducer(settings, cancel_on_exit=True) as producer:
            health = connect_async(settings)
            app.state.producer, app.state.health = producer, health
            if batch_api is not None:
                batch_api.runner.start()
            try:
                yield
            finally:
                if batch_api is not None:
                    await batch_api.runner.aclose()
                await health.aclose()

    app = FastAPI(title="batchfleet gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    if batch_api is not None:
        app.include_router(batch_routes(batch_api))

    def producer_of(request: Request) -> AsyncProducer:
        producer: AsyncProducer = request.app.state.producer
        return producer

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        return await generate(body, producer_of(request), CHAT)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await generate(body, producer_of(request), TEXT)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        names = await producer_of(request).models()
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": OWNER} for name in names
            ],
        }

    @app.get("/livez")
    async def livez() -> JSONResponse:
        return JSONResponse({"status": "ok"})  # its loop answered; Redis is /healthz's

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        started = time.perf_counter()
        try:
            await request.app.state.health.ping()
        except RedisError as exc:
            return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok", "redis_ms": 1000 * (time.perf_counter() - started)})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    guarded = Guards(
        EmbeddingsLane(app, counters.of),
        keys=keys,
        max_body_bytes=settings.gateway.max_body_bytes,
        max_file_bytes=settings.gateway.max_file_bytes,
    )
    return MeasureRequests(guarded, metrics=metrics)
