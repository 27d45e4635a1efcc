"""Requests and results on the wire: versioned JSON, never pickle.

A request travels as one stream entry field ``request`` (JSON of :class:`Request`) and, inside a
Celery batch task, as the same JSON string. A final answer is one JSON :class:`Result`, stored
under the request id and pushed to each waiting producer's inbox.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, Literal, TypeVar, cast

import pydantic_core
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from config.errors import InvalidInput, RequestFailed, WireFormatError, failure_for

try:
    from _json import make_encoder as make_c_encoder
except ImportError:  # an interpreter without json's C accelerator
    make_c_encoder = None  # type: ignore[assignment, misc]

STREAM_FIELD = "request"

ErrorCode = Literal["expired", "invalid_input", "model_error", "poison", "cancelled"]
MAX_NESTING = 100
MAX_REQUEST_ID_LEN = 200


def is_valid_request_id(request_id: object) -> bool:
    """A request id is 1-200 printable characters, no white space, valid UTF-8."""
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_LEN:
        return False
    if not request_id.isprintable() or any(ch.isspace() for ch in request_id):
        return False
    try:
        request_id.encode()
    except UnicodeEncodeError:
        return False
    return True


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar is 0), without recursion."""
    depth = 0
    level = [value]
    while level:
        containers = [item for item in level if isinstance(item, (list, tuple, dict))]
        if not containers:
            break
        depth += 1
        level = [
            child
            for container in containers
            for child in (container.values() if isinstance(container, dict) else container)
        ]
    return depth


def _encoder_of(settings: json.JSONEncoder) -> Callable[[Any], str]:
    """``settings.encode`` (``ensure_ascii`` off) as one call of a C encoder built once:
    ``JSONEncoder.encode`` builds one per call, two thirds of its time on a small value
    (``benchmarks/README.md``). It keeps no circular-reference bookkeeping, which shared
    between threads would be wrong: a value that contains itself fails as too deep
    (``RecursionError``). ``settings.encode`` itself where the C accelerator is missing."""
    if make_c_encoder is None:
        return settings.encode
    encode = make_c_encoder(
        None,
        settings.default,
        encode_basestring,
        None,
        settings.key_separator,
        settings.item_separator,
        settings.sort_keys,
        settings.skipkeys,
        settings.allow_nan,
    )

    def encode_value(value: Any) -> str:
        if isinstance(value, str):  # as JSONEncoder.encode: a string needs no encoder call
            return encode_basestring(value)
        return "".join(encode(value, 0))

    return encode_value


_COMPACT_JSON = _encoder_of(
    json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
)
_SORTED_JSON = _encoder_of(
    json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True)
)


def canonical_json(value: Any) -> str:
    """Encodes ``value`` as compact JSON with sorted keys, the form that is hashed and sent.

    Raises:
        InvalidInput: the value is not JSON-serialisable (sets, bytes, NaN, objects, …) or
            nests deeper than ``MAX_NESTING`` levels.
    """
    return _checked_json(value, sort_keys=True)


def output_json(value: Any) -> str:
    """Encodes a model output as its result carries it: compact JSON in the output's own key
    order, checked as ``canonical_json`` checks (only a digest needs sorted keys). The most
    common output, a flat list of finite floats (an embedding), is encoded by pydantic's
    serializer: ``json`` costs ~0.4 µs a number.

    Raises:
        InvalidInput: as ``canonical_json``.
    """
    if type(value) is list and set(map(type, value)) <= {float} and math.isfinite(sum(value)):
        return pydantic_core.to_json(value).decode()
    return _checked_json(value, sort_keys=False)


def _checked_json(value: Any, sort_keys: bool) -> str:
    try:
        encoded = (_SORTED_JSON if sort_keys else _COMPACT_JSON)(value)
        encoded.encode()  # a lone surrogate passes json.dumps but is not UTF-8
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"value is not JSON-serialisable: {exc}") from exc
    # Fewer brackets than the limit cannot nest deeper than it; only then is depth walked.
    if encoded.count("[") + encoded.count("{") > MAX_NESTING and nesting_depth(value) > MAX_NESTING:
        raise InvalidInput(f"value nests deeper than {MAX_NESTING} levels")
    return encoded


def input_digest(model: str, input_json: str) -> str:
    """The identity of a request's content: same model and input give the same digest."""
    return hashlib.sha256(f"{model}\n{input_json}".encode()).hexdigest()


Priority = Literal["high", "normal", "low"]
PRIORITY_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}


class RequestEncoder:
    """The wire forms of requests admitted together (:class:`Request`), built from checked
    parts without building the models: the producer's hot path. What the requests share
    (model, submit time, deadline, priority) is encoded once, its two floats above all
    (``repr`` of a float cost more than the rest of a request's form, ``benchmarks/README.md``);
    each request adds its id, input and digest. A unit test pins it to ``Request.decode``."""

    def __init__(
        self, model: str, submitted_at: float, deadline_at: float, priority: Priority = "normal"
    ) -> None:
        self._before_input = f',"model":{_json_string(model)},"input":'
        self._end = (
            f',"submitted_at":{submitted_at!r},"deadline_at":{deadline_at!r},'
            f'"priority":"{priority}"}}'
        )

    def encode(self, request_id: str, input_json: str, digest: str) -> str:
        """The request ``request_id`` carrying ``input_json`` (as ``canonical_json`` encodes
        it), whose input digest is ``digest``."""
        return (
            f'{{"schema_version":1,"request_id":{_json_string(request_id)}'
            f'{self._before_input}{input_json},"digest":"{digest}"{self._end}'
        )


Wire = TypeVar("Wire", bound=BaseModel)


def _decode_together(
    adapter: TypeAdapter[list[Wire]], raws: Sequence[str | bytes]
) -> list[Wire] | None:
    """The values ``raws`` hold (each one JSON object, all bytes or all text), decoded as one
    JSON array in one pydantic call: a third less time a value than a call each
    (``benchmarks/README.md``). None when any is malformed or they do not make one value
    each (a raw that holds two): then each is decoded alone, to learn which and why. Only
    raws written to fit together (one opening what another closes) could move a value
    between them: their writer could write any value in Redis anyway."""
    if not raws:
        return []
    try:  # a join of bytes and text raises TypeError
        if isinstance(raws[0], bytes):
            joined: str | bytes = b"[" + b",".join(cast(Sequence[bytes], raws)) + b"]"
        else:
            joined = "[" + ",".join(cast(Sequence[str], raws)) + "]"
        values = adapter.validate_json(joined)
    except (TypeError, ValueError, RecursionError):  # ValidationError is a ValueError
        return None
    return values if len(values) == len(raws) else None


class Request(BaseModel):
    """One accepted request as it sits in the stream and travels in a batch."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = 1
    request_id: str
    model: str
    input: Any
    digest: str
    submitted_at: float
    deadline_at: float
    priority: Priority = "normal"

    def encode(self) -> str:
        return self.model_dump_json()

    @classmethod
    def decode(cls, raw: str | bytes) -> Request:
        """Raises WireFormatError when ``raw`` is not a request of this schema version."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise WireFormatError(
                f"malformed request: {exc.error_count()} error(s): {exc.errors()[0]['msg']}",
                raw=raw,
            ) from exc
        except (ValueError, RecursionError) as exc:
            raise WireFormatError(f"malformed request: {exc}", raw=raw) from exc

    @classmethod
    def decode_all(cls, raws: Sequence[str | bytes]) -> list[Request] | None:
        """The requests ``raws`` hold, in one call; None when one is no request (``decode``
        each then, to learn which and why)."""
        return _decode_together(_REQUESTS, raws)


class ErrorInfo(BaseModel):
    """Why a request ended without an output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ErrorCode
    message: str


class Result(BaseModel):
    """A request's one final answer: an output, or an error."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = 1
    request_id: str
    model: str
    # The version the model reported (``Model.version``) for an output it computed.
    model_version: str | None = None
    output: Any = None
    error: ErrorInfo | None = None
    batch_id: str | None = None
    batch_size: int = 0
    # Why the batcher sent the batch (size, idle, wait, isolated), or "late" for a request
    # that joined a waiting batch when its device freed.
    flush_reason: str | None = None
    model_s: float = 0.0
    worker: str | None = None
    # Answered from the model's response cache at submit, without running.
    cached: bool = False
    submitted_at: float | None = None
    finished_at: float

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """Returns the output.

        Raises:
            RequestFailed: (a subclass by error code) the request ended with an error.
        """
        if self.error is not None:
            raise self.failure()
        return self.output

    def failure(self) -> RequestFailed:
        """The exception that stands for this result's error; only for failed results."""
        if self.error is None:
            raise ValueError("result is not an error")
        return failure_for(self.error.code, self.request_id, self.error.message)

    def encode(self) -> str:
        return self.model_dump_json()

    @classmethod
    def decode(cls, raw: str | bytes) -> Result:
        """Raises WireFormatError when ``raw`` is not a result of this schema version."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise WireFormatError(f"malformed result: {exc.errors()[0]['msg']}", raw=raw) from exc
        except (ValueError, RecursionError) as exc:
            raise WireFormatError(f"malformed result: {exc}", raw=raw) from exc

    @classmethod
    def decode_all(cls, raws: Sequence[str | bytes]) -> list[Result] | None:
        """The results ``raws`` hold, in one call; None when one is no result (``decode``
        each then, to learn which and why)."""
        return _decode_together(_RESULTS, raws)


_REQUESTS = TypeAdapter(list[Request])
_RESULTS = TypeAdapter(list[Result])


class ResultEncoder:
    """The wire forms of the results (:class:`Result`) one model call computed, built from
    their parts without building the models: the worker's hot path. What the call's results
    share (model, version, batch, model time, worker, finish time) is encoded once; each
    result adds its request's id and submit time, its output and its flush reason. It keeps
    the repr of the last submit time it encoded. A unit test pins it to ``Result.decode``."""

    def __init__(
        self,
        model: str,
        model_version: str,
        batch_id: str,
        batch_size: int,
        model_s: float,
        worker: str,
        finished_at: float,
    ) -> None:
        self._before_output = (
            f',"model":{_json_string(model)},"model_version":{_json_string(model_version)},'
            '"output":'
        )
        self._before_reason = (
            f',"error":null,"batch_id":{_json_string(batch_id)},"batch_size":{batch_size},'
            '"flush_reason":'
        )
        self._before_submitted = (
            f',"model_s":{model_s!r},"worker":{_json_string(worker)},"cached":false,"submitted_at":'
        )
        self._end = f',"finished_at":{finished_at!r}}}'
        # The last submit time's repr, kept: the requests admitted together share their submit
        # time, and a float's repr is the dearest part of a result.
        self._submitted_repr = functools.lru_cache(maxsize=1)(repr)

    def encode(self, request: Request, encoded_output: str, flush_reason: str | None) -> str:
        """The result of ``request`` carrying ``encoded_output`` (as ``output_json``
        encodes it); ``request`` is of the encoder's model."""
        reason = "null" if flush_reason is None else _json_string(flush_reason)
        submitted = self._submitted_repr(request.submitted_at)
        return (
            f'{{"schema_version":1,"request_id":{_json_string(request.request_id)}'
            f"{self._before_output}{encoded_output}{self._before_reason}{reason}"
            f"{self._before_submitted}{submitted}{self._end}"
        )


def cache_entry(model_version: str, output_json: str) -> str:
    """A response cache entry (``Keys.cache``): ``<version's UTF-8 byte length>:<version>``
    then the output's JSON. The admission script (``admit.lua``) answers from it only while
    that version is the model's current one; the length makes the tag unambiguous whatever
    the version holds."""
    return f"{len(model_version.encode())}:{model_version}{output_json}"
