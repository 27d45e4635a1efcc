"""The Batch API's routes: ``POST /v1/files`` (an upload, purpose ``batch``), ``GET /v1/files``
(the listing), ``GET /v1/files/{id}`` and ``…/content``, ``DELETE /v1/files/{id}``,
``POST /v1/batches``, ``GET /v1/batches`` and ``/v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. Jobs run on whichever gateway takes them
(``batch_runner``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict

from producer.async_client import AsyncProducer
from workers.gateway.batch_lines import KINDS, model_of
from workers.gateway.batch_runner import BatchRunner
from workers.gateway.batch_store import BatchStore, batch_object
from workers.gateway.files import FileStore, new_file_id
from workers.gateway.openai_errors import ApiError

COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600
LIST_LIMIT = 100
FILES_LIST_LIMIT = 10_000


class BatchRequest(BaseModel):
    """The body of ``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str = COMPLETION_WINDOW
    metadata: dict[str, str] | None = None


@dataclass(frozen=True)
class BatchApi:
    store: BatchStore
    files: FileStore
    runner: BatchRunner


def _job_of(store: BatchStore, batch_id: str) -> dict[str, str]:
    job = store.get(batch_id)
    if job is None:
        raise ApiError(404, f"no batch {batch_id!r}", "not_found", "batch_id")
    return job


def listing(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's page of a list: ``data``, its first and last ids, whether more follow."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def batch_routes(api: BatchApi) -> APIRouter:
    """The routes, on ``api``'s stores and runner."""
    router = APIRouter(prefix="/v1")

    @router.post("/files")
    async def upload(file: UploadFile, purpose: str = Form()) -> dict[str, Any]:
        if purpose != "batch":
            raise ApiError(400, "purpose must be 'batch'", "invalid_purpose", "purpose")
        return await asyncio.to_thread(api.files.save, file.file, file.filename or "", purpose)

    @router.get("/files")
    async def list_files(
        purpose: str | None = None,
        limit: int = FILES_LIST_LIMIT,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        listed = partial(api.files.listed, purpose, order, after)
        data, more = await asyncio.to_thread(listed, max(1, min(limit, FILES_LIST_LIMIT)))
        return listing(data, more)

    @router.get("/files/{file_id}")
    async def file_object(file_id: str) -> dict[str, Any]:
        return api.files.meta(file_id)

    @router.get("/files/{file_id}/content")
    async def file_content(file_id: str) -> FileResponse:
        api.files.meta(file_id)
        return FileResponse(api.files.path(file_id), media_type="application/jsonl")

    @router.delete("/files/{file_id}")
    async def delete_file(file_id: str) -> dict[str, Any]:
        await asyncio.to_thread(api.files.delete, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @router.post("/batches")
    async def create_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
        if body.endpoint not in KINDS:
            raise ApiError(400, f"endpoint must be one of {sorted(KINDS)}", "invalid_endpoint")
        if body.completion_window != COMPLETION_WINDOW:
            message = f"completion_window must be {COMPLETION_WINDOW!r}"
            raise ApiError(400, message, "invalid_window", "completion_window")
        api.files.meta(body.input_file_id)
        model = await asyncio.to_thread(model_of, api.files.path(body.input_file_id))
        producer: AsyncProducer = request.app.state.producer
        await producer.policy(model)  # UnknownModel: 404
        now = int(time.time())
        job = {
            "id": f"batch_{uuid.uuid4().hex}",
            "status": "validating",
            "endpoint": body.endpoint,
            "model": model,
            "input_file_id": body.input_file_id,
            "completion_window": body.completion_window,
            "created_at": now,
            "expires_at": now + WINDOW_S,
            "metadata": body.metadata,
            "work_output": new_file_id(),
            "work_errors": new_file_id(),
        }
        await asyncio.to_thread(api.store.create, job)
        api.runner.wake()
        return batch_object(await asyncio.to_thread(_job_of, api.store, str(job["id"])))

    @router.get("/batches/{batch_id}")
    async def get_batch(batch_id: str) -> dict[str, Any]:
        return batch_object(await asyncio.to_thread(_job_of, api.store, batch_id))

    @router.post("/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str) -> dict[str, Any]:
        await asyncio.to_thread(_job_of, api.store, batch_id)
        await asyncio.to_thread(api.store.cancel, batch_id)
        return batch_object(await asyncio.to_thread(_job_of, api.store, batch_id))

    @router.get("/batches")
    async def list_batches(limit: int = 20, after: str | None = None) -> dict[str, Any]:
        try:
            jobs, more = await asyncio.to_thread(
                api.store.listed, max(1, min(limit, LIST_LIMIT)), after
            )
        except LookupError:
            message = f"after names no batch: {after!r}"
            raise ApiError(400, message, "invalid_cursor", "after") from None
        return listing([batch_object(job) for job in jobs], more)

    return router
