"""The Batch API's files, in the folder the gateway is given (``gateway.files_dir``, shared
by every gateway of a fleet): ``FILE_ID.jsonl`` holds a file's bytes and ``FILE_ID.json`` its
OpenAI file object (its modification time: when it was made, to the nanosecond, which orders
the listing). Uploads are held to ``gateway.max_file_bytes``; a job's output and error
files grow in the same folder while it runs and become files when it ends."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import IO, Any

from workers.gateway.openai_errors import ApiError

FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")
COPY_CHUNK_BYTES = 1 << 20


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    """Files by id in one folder; ids are checked before they name a path."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        """Where file ``file_id``'s bytes are (or will be, for a job's output).

        Raises:
            ApiError: 404, ``file_id`` is no file id.
        """
        if not FILE_ID.match(file_id):
            raise ApiError(404, f"no file {file_id!r}", "not_found", "file_id")
        return self.folder / f"{file_id}.jsonl"

    def save(self, source: IO[bytes], filename: str, purpose: str) -> dict[str, Any]:
        """Copies an upload into the folder and returns its file object.

        Raises:
            ApiError: 413, the upload is over ``max_bytes`` (nothing is kept).
        """
        file_id = new_file_id()
        target = self.path(file_id)
        size = 0
        with target.open("wb") as sink:
            for chunk in iter(lambda: source.read(COPY_CHUNK_BYTES), b""):
                size += len(chunk)
                if size > self.max_bytes:
                    sink.close()
                    target.unlink()
                    raise ApiError(413, f"a file is at most {self.max_bytes} bytes", "too_large")
                sink.write(chunk)
        return self.register(file_id, filename, purpose)

    def register(self, file_id: str, filename: str, purpose: str) -> dict[str, Any]:
        """Makes the bytes at ``path(file_id)`` a file: writes and returns its file object."""
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": self.path(file_id).stat().st_size,
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        staged = self.folder / f".{file_id}.json"
        staged.write_text(json.dumps(meta), encoding="utf-8")
        made_ns = time.time_ns()  # the listing's order: finer than the file system's own stamp
        os.utime(staged, ns=(made_ns, made_ns))
        os.replace(staged, self.folder / f"{file_id}.json")
        return meta

    def meta(self, file_id: str) -> dict[str, Any]:
        """The file object of ``file_id``.

        Raises:
            ApiError: 404, no such file.
        """
        self.path(file_id)  # checks the id
        try:
            meta: dict[str, Any] = json.loads((self.folder / f"{file_id}.json").read_text())
        except FileNotFoundError:
            raise ApiError(404, f"no file {file_id!r}", "not_found", "file_id") from None
        return meta

    def listed(
        self, purpose: str | None, order: str, after: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` file objects (of ``purpose``, when given), in the order they were
        made (``order``: ``asc`` or ``desc``), from the one after ``after``; and whether more
        follow.

        Raises:
            ApiError: 400, ``after`` is no file of the listing.
        """
        made = []
        for meta_path in self.folder.glob("file-*.json"):
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                made.append((meta_path.stat().st_mtime_ns, meta["id"], meta))
        made.sort(key=lambda item: item[:2], reverse=order == "desc")
        metas = [meta for _, _, meta in made if purpose is None or meta["purpose"] == purpose]
        start = 0
        if after is not None:
            try:
                start = [meta["id"] for meta in metas].index(after) + 1
            except ValueError:
                message = f"after names no listed file: {after!r}"
                raise ApiError(400, message, "invalid_cursor", "after") from None
        return metas[start : start + limit], start + limit < len(metas)

    def delete(self, file_id: str) -> None:
        """Removes file ``file_id``.

        Raises:
            ApiError: 404, no such file.
        """
        self.meta(file_id)
        for suffix in (".json", ".jsonl"):
            (self.folder / f"{file_id}{suffix}").unlink(missing_ok=True)
