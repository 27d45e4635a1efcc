"""A streaming request's chunks on the wire: the stream ``Keys.chunks(request_id)`` that the
worker's streaming lane appends to and the caller reads, in order.

Each entry has one field, ``chunk``: a JSON object. A chunk on the way carries ``delta`` (the
next piece of text) and whatever else the model adds; the last one carries ``final: true``
and either the whole output (``text`` and the model's other fields) or
``error: {code, message}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CHUNK_FIELD = "chunk"


def encode_chunk(chunk: Mapping[str, Any]) -> dict[Any, Any]:
    """The stream entry's fields for ``chunk``."""
    return {CHUNK_FIELD: json.dumps(chunk)}


def decode_chunk(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """The chunk of a stream entry read back (field names as bytes or text)."""
    raw = fields.get(CHUNK_FIELD.encode(), fields.get(CHUNK_FIELD))
    chunk: dict[str, Any] = json.loads(raw)
    return chunk


def last_chunk(output: Mapping[str, Any]) -> dict[str, Any]:
    """The stream's last chunk for a request answered with ``output``."""
    return {"final": True, **output}


def error_chunk(code: str, message: str) -> dict[str, Any]:
    """The stream's last chunk for a request answered with an error."""
    return {"final": True, "error": {"code": code, "message": message}}
