"""Reading request-stream entries: each becomes a request, an ``invalid_input`` answer, or a drop.
Also the consumer group every reader of a stream needs first.

Whatever sits in the stream (written by hand, truncated, not UTF-8, nested too deep), reading
it never raises: the batcher and the worker both go on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from config.errors import WireFormatError
from config.schema import STREAM_FIELD, Request, is_valid_request_id
from workers.protocol.results import Answer, error_result

log = logging.getLogger(__name__)

StreamEntry = tuple[Any, dict[Any, Any]]
"""A stream entry as Redis returns it: its id and its fields."""
DecodedEntry = tuple[str, bytes | str, Request]
"""A request read from its stream entry: the entry id, the raw JSON (as Redis returned it),
the request."""

_STREAM_FIELD_BYTES = STREAM_FIELD.encode()


def entries_of(reply: Any) -> list[StreamEntry]:
    """The entries of an ``XREADGROUP`` reply (one stream)."""
    return [entry for _, entries in reply or [] for entry in entries]


def ensure_group(client: redis.Redis, stream: str, group: str) -> None:
    """Creates ``group`` on ``stream`` (and the stream) unless it exists: after a start, or a
    Redis that came back empty."""
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def to_text(value: Any) -> str:
    """Redis bytes as text; bytes that are not UTF-8 are replaced, never fatal."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class ReadEntries:
    """Entries sorted by what happens next."""

    decoded: list[DecodedEntry] = field(default_factory=list)
    invalid: list[Answer] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def read_entries(entries: Sequence[StreamEntry], model: str, result_ttl_s: float) -> ReadEntries:
    """Decodes stream entries of ``model``'s stream.

    Returns ``(entry_id, raw, request)`` for each good entry; an ``invalid_input`` answer for a
    bad entry that names a request id; the entry id alone (to ack and delete) for the rest.
    The requests are decoded from the bytes Redis returned, not from text first (a read took
    two fifths less time, ``benchmarks/README.md``): JSON that is not UTF-8 is malformed. They
    are decoded in one call (``Request.decode_all``), one by one only when one of them is bad.
    """
    read = ReadEntries()
    present = [
        (to_text(entry_id_raw), _request_field(fields))
        for entry_id_raw, fields in entries
        if entry_id_raw is not None  # Redis 6.2's XCLAIM names deleted entries this way
    ]
    together = Request.decode_all([raw for _, raw in present])
    if together is not None and all(request.model == model for request in together):
        read.decoded = [
            (entry_id, raw, request)
            for (entry_id, raw), request in zip(present, together, strict=True)
        ]
        return read
    for entry_id, raw in present:
        try:
            request = Request.decode(raw)
            if request.model != model:
                raise WireFormatError(f"request for model {request.model!r}")
        except Exception as exc:  # whatever is in the stream, the reader must go on
            log.warning("model %s: malformed stream entry %s: %s", model, entry_id, exc)
            request_id = _claimed_request_id(raw)
            if request_id is None:
                read.dropped.append(entry_id)
            else:
                result = error_result(request_id, model, "invalid_input", str(exc))
                read.invalid.append(Answer.of(entry_id, result, digest="", ttl_s=result_ttl_s))
            continue
        read.decoded.append((entry_id, raw, request))
    return read


def _request_field(fields: dict[Any, Any] | None) -> bytes | str:
    """The request JSON of an entry's fields (keys are bytes, or text from a client that
    decodes replies); empty when there is none."""
    if not fields:
        return b""
    raw: bytes | str | None = fields.get(_STREAM_FIELD_BYTES)
    return fields.get(STREAM_FIELD, b"") if raw is None else raw


def _claimed_request_id(raw: bytes | str) -> str | None:
    """The request id a malformed entry names, if it names a usable one (bytes that are not
    UTF-8 elsewhere in the entry do not hide it)."""
    try:
        request_id = json.loads(to_text(raw)).get("request_id")
    except Exception:  # not JSON, not an object, nested too deep: no id to answer
        return None
    return request_id if is_valid_request_id(request_id) else None
