"""The producer's I/O-free core: request preparation, the Lua scripts' keys and args (the
scripts are ``config/lua/claim_request_id.lua``, ``admit.lua``, ``watch.lua``,
``stream_admit.lua``, ``cancel.lua``), and their replies; which model each request id
belongs to.

``Producer`` and ``AsyncProducer`` differ only in how they talk to Redis; everything they
decide is decided here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, cast

from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.commands.core import AsyncScript, Script

from config import lua, stats_fields
from config.errors import (
    ConfigError,
    DeadlinePassed,
    InputTooLarge,
    InvalidInput,
    QueueFull,
    RequestIdConflict,
    RequestRejected,
    ResultTimeout,
    UnknownModel,
    UnknownRequest,
    WireFormatError,
    failure_for,
)
from config.keys import CONSUMER_GROUP, Keys
from config.replica_wait import ReplicaWait
from config.schema import (
    MAX_REQUEST_ID_LEN,
    PRIORITY_RANK,
    STREAM_FIELD,
    Priority,
    Request,
    RequestEncoder,
    Result,
    canonical_json,
    input_digest,
    is_valid_request_id,
)
from config.settings import ModelPolicy, Settings
from config.stream_chunks import decode_chunk, last_chunk
from producer.fleet_policies import FleetPolicies

log = logging.getLogger(__name__)

MAX_DEADLINE_S = 7 * 24 * 3600.0
MODELS_REMEMBERED = 1 << 16
REQUEST_ID_BYTES = 16  # random bytes in a request id drawn here

# The cancel script's reply when the record changed between the caller's read and the script
# (the id was admitted again): the caller reads it again and retries.
RECORD_CHANGED = "changed"
SHOWN_CHARS = 40
# A stream's caller waits for its first chunk until the request's deadline and this long
# after; once chunks flow, it gives up when none comes for STREAM_STALL_S.
STREAM_GRACE_S = 5.0
STREAM_STALL_S = 30.0
T = TypeVar("T")
# The watch script's reply for a request without an answer (config/lua/watch.lua): pending
# (the caller is its waiter now), or unknown (no record).
WATCH_PENDING, WATCH_UNKNOWN = 1, 0


class Prepared(NamedTuple):
    """A validated request, encoded for the wire and ready for the admission script (a
    named tuple: one is built per request, in a third of a frozen dataclass's time)."""

    request_id: str
    model: str
    digest: str
    encoded: str
    record_key: str
    record_ttl_ms: int
    result_key: str
    result_ttl_ms: int
    submitted_at: float
    # Whether the caller gave the id (True) or this producer drew it: only a caller's id can
    # be taken by another model already, so only those are claimed in the index of ids.
    callers_id: bool

    @property
    def index_ttl_ms(self) -> int:
        """How long a caller's id's entry in the index of ids lives: its record's lifetime,
        and its result's again for an answer written late (the record then outlives its first
        TTL)."""
        return self.record_ttl_ms + self.result_ttl_ms

    @property
    def request(self) -> Request:
        return Request.decode(self.encoded)


class CheckedInputs(NamedTuple):
    """One call's requests, every one validated (``ProducerCore.check_all``) but not yet
    built into admission calls (``ProducerCore.build``)."""

    model: str
    policy: ModelPolicy
    request_ids: list[str]
    inputs_json: list[str]
    # Whether the caller gave the ids (see ``Prepared.callers_id``).
    callers_ids: bool
    timeout_s: float
    priority: Priority
    # When the call was checked: every request's submission time, its deadline counted
    # from it, however late its chunk is built.
    checked_at: float


def abbreviated(value: object) -> str:
    """``value``'s repr for an error message, its first ``SHOWN_CHARS`` characters and its
    length when longer (a 100,000-character id is not repeated back)."""
    shown = repr(value)
    if len(shown) <= SHOWN_CHARS:
        return shown
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{shown[:SHOWN_CHARS]}…{size}"


class ProducerCore:
    """Validates and encodes requests and reads script replies; does no I/O."""

    def __init__(
        self, settings: Settings, producer_id: str | None = None, cancel_on_exit: bool = False
    ) -> None:
        if producer_id is not None and not (producer_id and producer_id.isprintable()):
            # Its inbox's name is a line of the admission records it waits on (waiters.lua).
            raise ConfigError(f"invalid producer id {producer_id!r}: printable text only")
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.fleet = FleetPolicies(settings)
        self.producer_id = producer_id or uuid.uuid4().hex
        self.cancel_on_exit = cancel_on_exit
        self._outstanding: set[str] = set()
        # The model of each id this producer admitted lately, so that waiting for it needs
        # no look-up; the oldest are forgotten past MODELS_REMEMBERED.
        self._models: OrderedDict[str, str] = OrderedDict()

    def inbox(self, model: str) -> str:
        """This producer's inbox for ``model``'s results."""
        return self.keys.inbox(model, self.producer_id)

    def submitted(self, model: str, request_ids: Sequence[str]) -> None:
        """Notes requests this producer enqueued for ``model``: with ``cancel_on_exit``, those
        it has not received an answer for are cancelled when it closes."""
        if self.cancel_on_exit:
            self._outstanding.update(request_ids)
        self.remember(model, request_ids)

    def remember(self, model: str, request_ids: Iterable[str]) -> None:
        """Notes that ``request_ids`` belong to ``model``, to wait for them or cancel them
        without a look-up."""
        for request_id in request_ids:
            self._models[request_id] = model
        while len(self._models) > MODELS_REMEMBERED:
            self._models.popitem(last=False)

    def known_models(self, request_ids: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """The models of ``request_ids`` this producer knows, and the ids to look up
        (``look_up``)."""
        known, unknown = {}, []
        for request_id in request_ids:
            model = self._models.get(request_id)
            if model is None:
                unknown.append(request_id)
            else:
                known[request_id] = model
        return known, unknown

    def look_up(self, request_ids: Sequence[str]) -> ModelLookUp:
        """The look-up of the models of ``request_ids``, which this producer did not admit
        lately, among the models the fleet serves."""
        return ModelLookUp(self.keys, request_ids, sorted(self.fleet.models))

    def answered(self, request_id: str) -> None:
        self._outstanding.discard(request_id)

    def outstanding(self) -> list[str]:
        """The requests to cancel on close."""
        return sorted(self._outstanding)

    def policy(self, model: str) -> ModelPolicy:
        """The policy ``model`` is admitted by: the fleet's, else this producer's.

        Raises:
            UnknownModel: neither the fleet nor this producer's configuration serves it.
        """
        policy = self.fleet.models.get(model)
        if policy is None:
            served = sorted(self.fleet.models)
            raise UnknownModel(f"unknown model {model!r}; served: {served}")
        return policy

    def prepare(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> Prepared:
        """Validates one request and builds its admission call.

        Raises:
            UnknownModel, InvalidInput, InputTooLarge, DeadlinePassed: refused at the edge.
        """
        ids = None if request_id is None else [request_id]
        checked = self.check_all(
            model, [input], request_ids=ids, deadline_s=deadline_s, priority=priority
        )
        (prepared,) = self.build(checked)
        return prepared

    def check_all(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        request_ids: Sequence[str] | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> CheckedInputs:
        """Validates a call's options and every input before any request is built or
        enqueued; ``request_ids``, when given, are the caller's, one per input, else each
        request's id is drawn here.

        Raises:
            UnknownModel, InvalidInput, InputTooLarge, DeadlinePassed: refused at the edge.
        """
        policy = self.policy(model)
        items = list(inputs)
        if request_ids is None:
            ids = new_request_ids(len(items))
        else:
            if len(request_ids) != len(items):
                raise InvalidInput(f"{len(request_ids)} request ids for {len(items)} inputs")
            ids = [self._check_request_id(request_id) for request_id in request_ids]
            if len(set(ids)) != len(ids):
                repeated = next(rid for rid, n in Counter(ids).items() if n > 1)
                raise InvalidInput(f"request id {abbreviated(repeated)} is given twice in one call")
        timeout_s = policy.request_timeout_s if deadline_s is None else deadline_s
        if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
            raise InvalidInput(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        if timeout_s <= 0:
            raise DeadlinePassed(f"deadline {timeout_s}s is already past")
        if timeout_s > MAX_DEADLINE_S:
            raise InvalidInput(f"deadline_s {timeout_s} is over the {MAX_DEADLINE_S:.0f}s maximum")
        if priority not in PRIORITY_RANK:
            raise InvalidInput(f"priority is one of {list(PRIORITY_RANK)}, got {priority!r}")
        if priority != "normal" and not policy.priorities:
            raise InvalidInput(f"model {model!r} takes no priorities (set its priorities = true)")
        inputs_json = []
        for item in items:
            input_json = canonical_json(item)
            size = len(input_json.encode())
            if size > policy.max_input_bytes:
                raise InputTooLarge(
                    f"input of {size} bytes is over the {policy.max_input_bytes}-byte cap"
                    f" of {model!r}"
                )
            inputs_json.append(input_json)
        return CheckedInputs(
            model,
            policy,
            ids,
            inputs_json,
            request_ids is not None,
            timeout_s,
            cast(Priority, priority),
            time.time(),
        )

    def build(
        self, checked: CheckedInputs, start: int = 0, stop: int | None = None
    ) -> list[Prepared]:
        """The admission calls of ``checked``'s requests ``start`` to ``stop`` (all by
        default)."""
        model, policy = checked.model, checked.policy
        record_ttl_ms = int((checked.timeout_s + policy.result_ttl_s) * 1000)
        result_ttl_ms = int(policy.result_ttl_s * 1000)
        submitted_at = checked.checked_at
        requests = RequestEncoder(
            model, submitted_at, submitted_at + checked.timeout_s, checked.priority
        )
        prepared = []
        for request_id, input_json in zip(
            checked.request_ids[start:stop], checked.inputs_json[start:stop], strict=True
        ):
            digest = input_digest(model, input_json)
            encoded = requests.encode(request_id, input_json, digest)
            # Positional, in the fields' order: half the time of naming them, per request.
            prepared.append(
                Prepared(
                    request_id,
                    model,
                    digest,
                    encoded,
                    self.keys.record(model, request_id),
                    record_ttl_ms,
                    self.keys.result(model, request_id),
                    result_ttl_ms,
                    submitted_at,
                    checked.callers_ids,
                )
            )
        return prepared

    def admission_chunks(self, checked: CheckedInputs) -> Iterator[list[Prepared]]:
        """``checked``'s requests in the chunks admitted one round trip each, each built when
        asked for, so that the first is queued (and running) while the rest are built: at most
        ``submit_chunk``, and at most the model's queue cap, so that each fits an empty
        queue."""
        size = min(self.settings.submit_chunk, checked.policy.max_queue_len)
        for start in range(0, len(checked.request_ids), size):
            yield self.build(checked, start, start + size)

    def one_by_one_groups(self, items: Sequence[Prepared]) -> list[list[int]]:
        """The single submits of many callers (``items``, any models) in the groups admitted
        one by one, one call each, by index: one model per group, at most ``submit_chunk``,
        and an id given twice goes to a later group, whose call sees the earlier one's."""
        groups: list[list[int]] = []
        open_groups: dict[str, tuple[list[int], set[str]]] = {}
        for n, item in enumerate(items):
            group, ids = open_groups.get(item.model, ([], set()))
            if not group or item.request_id in ids or len(group) == self.settings.submit_chunk:
                group, ids = [], set()
                groups.append(group)
                open_groups[item.model] = (group, ids)
            group.append(n)
            ids.add(item.request_id)
        return groups

    def admit_call(
        self, chunk: Sequence[Prepared], one_by_one: bool = False, waiting: bool = False
    ) -> tuple[list[str], list[str | int]]:
        """The keys and args of one admission script call for ``chunk`` (one model, distinct
        ids), in the layout ``admit.lua`` names: admitted all or nothing, or ``one_by_one``
        (each request on its own, as if submitted alone); ``waiting``, this producer's inbox
        is registered as the waiter of each request enqueued (see ``enqueued``)."""
        model = chunk[0].model
        policy = self.policy(model)
        cached = policy.cache_ttl_s is not None
        keys = [self.keys.stream(model), self.keys.stats(model), self.keys.model_version(model)]
        args: list[str | int] = [
            policy.max_queue_len,
            STREAM_FIELD,
            "1" if cached else "",
            model,
            stats_fields.ACCEPTED,
            stats_fields.refused(RequestIdConflict.reason),
            stats_fields.refused(QueueFull.reason),
            stats_fields.CACHE_HIT,
            stats_fields.CACHE_MISS,
            "1" if one_by_one else "",
            self.inbox(model) if waiting else "",
            int(policy.result_ttl_s * 1000),
        ]
        for item in chunk:
            keys.append(item.record_key)
            args += [item.digest, item.encoded, item.record_ttl_ms]
            if cached:  # a model without a cache never reads these
                keys += [item.result_key, self.keys.cache(model, item.digest)]
                args.append(cached_result_head(item))
        return keys, args

    def queue_claims(
        self,
        pipe: Pipeline | AsyncPipeline,
        items: Sequence[Prepared],
        script: Script | AsyncScript,
    ) -> None:
        """Queues on ``pipe`` the claim of each caller's id among ``items`` for its model in
        the index of ids (``script``: ``claim_request_id.lua``)."""
        for item in items:
            if item.callers_id:
                keys = [self.keys.model_of(item.request_id)]
                lua.queue(pipe, script, keys, [item.model, item.index_ttl_ms])

    @staticmethod
    def claim_owners(items: Sequence[Prepared], replies: Sequence[Any]) -> dict[str, Any]:
        """The model each caller's id among ``items`` belongs to, by the claims' ``replies``."""
        claimed = [item.request_id for item in items if item.callers_id]
        return dict(zip(claimed, replies, strict=True))

    @staticmethod
    def after_claims(
        items: Sequence[Prepared], owners: dict[str, Any], one_by_one: bool
    ) -> tuple[list[Prepared], list[str | None]]:
        """The items still to admit once the callers' ids among ``items`` are claimed
        (``owners``: id → the model the claim says it belongs to), and a status per item:
        ``conflict`` for an id another model holds, None for the admission script to say.
        Admitted all or nothing (not ``one_by_one``), a conflict withholds every other."""
        taken = {
            request_id
            for request_id, owner in owners.items()
            if (owner.decode() if isinstance(owner, bytes) else owner) != items[0].model
        }
        statuses: list[str | None] = [
            "conflict" if item.request_id in taken else None for item in items
        ]
        if taken and not one_by_one:
            return [], [status or "withheld" for status in statuses]
        return [item for item in items if item.request_id not in taken], statuses

    def claim_refusals(
        self, items: Sequence[Prepared], statuses: Sequence[str | None]
    ) -> tuple[str, str, int] | None:
        """The stats hash, field and count of the ids ``after_claims`` refused (another model
        holds them), counted as the admission script counts a reused id; None for none."""
        conflicts = statuses.count("conflict")
        if not conflicts:
            return None
        return (
            self.keys.stats(items[0].model),
            stats_fields.refused(RequestIdConflict.reason),
            conflicts,
        )

    @staticmethod
    def queue_admission(
        pipe: Pipeline | AsyncPipeline,
        script: Script | AsyncScript,
        call: tuple[Sequence[Any], Sequence[Any]],
        replica_wait: ReplicaWait | None,
    ) -> None:
        """Queues on ``pipe`` an admission: ``script``'s ``call`` (keys and args), then the
        replica wait."""
        lua.queue(pipe, script, *call)
        if replica_wait is not None:
            replica_wait.queue(pipe)

    @staticmethod
    def admission_statuses(
        statuses: Sequence[str | None], replies: Sequence[Any], replica_wait: ReplicaWait | None
    ) -> list[Any]:
        """Every item's status: those ``after_claims`` gave, and the admission script's for
        the rest, from the ``replies`` of the pipeline ``queue_admission`` filled.

        Raises:
            BrokerUnavailable: fewer replicas than ``redis_wait_replicas`` acknowledged the
                writes in time (trying again is safe).
        """
        if replica_wait is not None and not replica_wait.confirmed(replies[-1]):
            raise replica_wait.unconfirmed()
        admitted = iter(replies[0])
        return [next(admitted) if status is None else status for status in statuses]

    def refusal_count(self, model: str, refusal: RequestRejected) -> tuple[str, str] | None:
        """The stats hash and field that count a refusal at the edge; None for a model the
        fleet does not serve (its name is the caller's, and metrics label only served ones)."""
        if model not in self.fleet.models:
            return None
        return self.keys.stats(model), stats_fields.refused(refusal.reason)

    @staticmethod
    def _check_request_id(request_id: str) -> str:
        if not is_valid_request_id(request_id):
            raise InvalidInput(
                f"request_id must be 1-{MAX_REQUEST_ID_LEN} printable characters without spaces,"
                f" got {abbreviated(request_id)}"
            )
        return request_id

    @staticmethod
    def check_admission(prepared: Prepared, reply: str | bytes) -> None:
        """Turns the admission script's reply into nothing (accepted) or a typed refusal."""
        status = reply.decode() if isinstance(reply, bytes) else reply
        request = prepared
        if status in ("accepted", "duplicate", "cached"):
            return
        if status == "full":
            raise QueueFull(f"queue of model {request.model!r} is full; request not enqueued")
        if status == "unstreamable":
            raise InvalidInput(
                f"model {request.model!r} does not stream: no worker serves its streaming lane"
            )
        if status == "conflict":
            raise RequestIdConflict(
                f"request id {request.request_id!r} was already used with another model or input",
                conflicting_ids=[request.request_id],
            )
        raise InvalidInput(f"unexpected admission reply {status!r}")

    def check_chunk(self, chunk: Sequence[Prepared], replies: Sequence[Any]) -> list[str]:
        """The ids of a chunk the admission script took (all of them), or its refusal.

        Raises:
            RequestIdConflict: an id was reused with another input (``conflicting_ids``);
                nothing of the chunk was enqueued.
            QueueFull: the queue had no room for every new request of the chunk; nothing of
                it was enqueued.
        """
        statuses = [reply.decode() if isinstance(reply, bytes) else reply for reply in replies]
        conflicting = [
            item.request_id
            for item, status in zip(chunk, statuses, strict=True)
            if status == "conflict"
        ]
        if conflicting:
            raise RequestIdConflict(
                f"{len(conflicting)} request id(s) already used with another model or input,"
                f" e.g. {abbreviated(conflicting[0])}; nothing of these {len(chunk)} was enqueued",
                conflicting_ids=conflicting,
            )
        if "full" in statuses:
            model = chunk[0].model
            raise QueueFull(
                f"queue of model {model!r} has no room for {statuses.count('full')} more"
                f" requests; nothing of these {len(chunk)} was enqueued"
            )
        for item, reply in zip(chunk, replies, strict=True):
            self.check_admission(item, reply)
        return [item.request_id for item in chunk]

    @staticmethod
    def enqueued(chunk: Sequence[Prepared], replies: Sequence[Any]) -> set[str]:
        """The ids of ``chunk`` its admission enqueued (``accepted``): admitted ``waiting``,
        their answers are pushed to this producer's inbox, with no watch call."""
        return {
            item.request_id
            for item, reply in zip(chunk, replies, strict=True)
            if reply in ("accepted", b"accepted")
        }

    def watch_call(self, model: str, request_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """The keys and args of one watch script call for ``request_ids`` of ``model``."""
        keys = []
        for request_id in request_ids:
            keys += [self.keys.result(model, request_id), self.keys.record(model, request_id)]
        return keys, [self.inbox(model)]

    def stream_call(self, items: Sequence[Prepared]) -> tuple[list[str], list[str | int]]:
        """The keys and args of the streaming admission script for ``items``: one."""
        (item,) = items
        keys = [item.record_key, self.keys.stream_lane(item.model), self.keys.stats(item.model)]
        cap = self.policy(item.model).max_queue_len
        counted = [
            stats_fields.ACCEPTED,
            stats_fields.refused(RequestIdConflict.reason),
            stats_fields.refused(QueueFull.reason),
        ]
        return keys, [item.digest, item.encoded, item.record_ttl_ms, cap, STREAM_FIELD, *counted]

    def cancel_call(
        self, model: str, request_id: str, record: bytes | str | None
    ) -> tuple[list[str], list[str | int | bytes]]:
        """The keys and args of the cancel script for ``request_id`` of ``model``, given its
        admission record as just read (None: there is none). A queued request's record names
        its stream entry (``digest:entry:model``), which the script takes off the stream and
        its consumer group's ledger."""
        ttl_s = max(policy.result_ttl_s for policy in self.fleet.models.values())
        entry = queued_at(record)
        result = {
            "request_id": request_id,
            "error": {"code": "cancelled", "message": "cancelled by its caller"},
            "finished_at": time.time(),
            "model": model,
        }
        keys = [
            self.keys.record(model, request_id),
            self.keys.result(model, request_id),
            self.keys.stats(model),
            self.keys.stream(model),
            self.keys.attempts(model),
        ]
        args: list[str | int | bytes] = [
            b"" if record is None else record,
            json.dumps(result),
            int(ttl_s * 1000),
            CONSUMER_GROUP,
            entry,
            stats_fields.failed("cancelled"),
        ]
        return keys, args

    @staticmethod
    def cancel_status(reply: str | bytes) -> str:
        """The cancel script's reply: ``RECORD_CHANGED`` (read the record and call again) or
        what ``read_cancel`` reads."""
        return reply.decode() if isinstance(reply, bytes) else reply

    @staticmethod
    def read_cancel(request_id: str, status: str) -> bool:
        """Whether the cancel script ended the request (False: it had its final answer).

        Raises:
            UnknownRequest: the id was never accepted or its result has expired.
        """
        if status == "unknown":
            raise unknown_request(request_id)
        return status != "final"

    @staticmethod
    def read_watch(request_ids: Sequence[str], reply: Sequence[Any]) -> list[Result | None]:
        """Per request of a watch call, its result if it is final, None while it is pending
        (the script's reply: the result, or ``WATCH_PENDING``, or ``WATCH_UNKNOWN``).

        Raises:
            UnknownRequest: an id was never accepted or its result has expired.
        """
        answers = []
        for request_id, answer in zip(request_ids, reply, strict=True):
            if answer == WATCH_UNKNOWN:
                raise unknown_request(request_id)
            if answer != WATCH_PENDING:
                answers.append(answer)
        decoded = Result.decode_all(answers)
        if decoded is None:  # one is malformed: Result.decode says which and why
            decoded = [Result.decode(answer) for answer in answers]
        results = iter(decoded)
        return [None if answer == WATCH_PENDING else next(results) for answer in reply]

    def default_timeout_s(self) -> float:
        """How long a wait lasts when the caller does not say: the longest request lifetime."""
        return max(policy.request_timeout_s for policy in self.fleet.models.values()) + 5.0

    def submit_deadline(self) -> float:
        """Until when (``time.monotonic``) an admission starting now is tried while Redis
        cannot be reached."""
        return time.monotonic() + self.settings.submit_retry_s


@dataclass(frozen=True)
class ModelLookUp:
    """Finds the models of request ids a producer did not admit lately, in one round trip:
    a caller's own id is in the index of ids (``keys.model_of``); an id a producer drew is
    found by its admission record, under each model the fleet serves (it is random, so no
    two models hold it)."""

    keys: Keys
    request_ids: Sequence[str]
    models: Sequence[str]

    def queue(self, pipe: Pipeline | AsyncPipeline) -> None:
        for request_id in self.request_ids:
            pipe.get(self.keys.model_of(request_id))
            for model in self.models:
                pipe.exists(self.keys.record(model, request_id))

    def read(self, replies: Sequence[Any]) -> dict[str, str]:
        """The model of each id, from the replies of the pipeline ``queue`` filled.

        Raises:
            UnknownRequest: no model holds an id: never accepted, or its result expired.
        """
        found = {}
        per_id = 1 + len(self.models)
        for n, request_id in enumerate(self.request_ids):
            indexed, *held = replies[n * per_id : (n + 1) * per_id]
            owners = [model for model, exists in zip(self.models, held, strict=True) if exists]
            if indexed is not None:
                found[request_id] = indexed.decode() if isinstance(indexed, bytes) else indexed
            elif owners:
                found[request_id] = owners[0]
            else:
                raise unknown_request(request_id)
        return found


class StreamReader:
    """The caller's side of one stream, free of I/O: what to read next, and what a read
    means. The clients loop ``block_ms`` → XREAD ``key`` from ``last`` → ``chunks(reply)``,
    and after a read that brought nothing, GET ``result_key`` → ``ended(raw)``."""

    def __init__(self, keys: Keys, model: str, request_id: str, deadline_at: float) -> None:
        self.request_id = request_id
        self.key = keys.chunks(model, request_id)
        self.result_key = keys.result(model, request_id)
        self.last: Any = "0-0"
        self.finished = False
        self._deadline_at = deadline_at
        # When the stream last showed life: its latest chunk, or Redis back after an outage.
        self._alive_at: float | None = None

    def block_ms(self) -> int:
        """How long the next read may block.

        Raises:
            ResultTimeout: the first chunk did not come by the deadline (plus a grace), or a
                later one not within ``STREAM_STALL_S`` of the one before.
        """
        if self._alive_at is None:
            gives_up_at = self._deadline_at + STREAM_GRACE_S
        else:
            gives_up_at = self._alive_at + STREAM_STALL_S
        left_s = gives_up_at - time.time()
        if left_s <= 0:
            raise ResultTimeout(f"request {self.request_id}: the stream stalled")
        return max(1, int(min(left_s, 1.0) * 1000))

    def reconnected(self) -> None:
        """Redis is back after an outage, during which no chunk could come: once the stream
        has started, the next chunk gets ``STREAM_STALL_S`` from now."""
        if self._alive_at is not None:
            self._alive_at = time.time()

    def chunks(self, reply: Any) -> list[dict[str, Any]]:
        """The chunks of an XREAD reply, in order.

        Raises:
            RequestFailed: (a subclass) the stream ended with an error.
        """
        chunks = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                self.last, self._alive_at = entry_id, time.time()
                chunk = decode_chunk(fields)
                if chunk.get("final"):
                    self.finished = True
                    error = chunk.get("error")
                    if error is not None:
                        raise failure_for(
                            str(error.get("code")), self.request_id, str(error.get("message"))
                        )
                chunks.append(chunk)
        return chunks

    def ended(self, raw_result: bytes | str | None) -> dict[str, Any] | None:
        """The last chunk of a stream answered without one reaching its caller (cancelled
        elsewhere, or its worker stopped right after answering); None while unanswered.

        Raises:
            RequestFailed: (a subclass) the answer is an error.
        """
        if raw_result is None:
            return None
        self.finished = True
        result = Result.decode(raw_result)
        if result.error is not None:
            raise result.failure()
        output = result.output if isinstance(result.output, dict) else {"text": result.output}
        return last_chunk(output)


def queued_at(record: bytes | str | None) -> str:
    """The stream entry named in an admission record (``digest:entry:model``, as
    ``admit.lua`` writes it while the request is queued, then a line per waiter); ``""`` for a
    record that holds the digest alone (answered from the cache, or a streaming request) or
    none."""
    if record is None:
        return ""
    text = record.decode() if isinstance(record, bytes) else record
    parts = text.split("\n", 1)[0].split(":", 2)
    return parts[1] if len(parts) == 3 else ""


def unknown_request(request_id: str) -> UnknownRequest:
    """The error for an id no model knows."""
    return UnknownRequest(
        f"request {abbreviated(request_id)} is unknown: never accepted, or its result expired"
    )


def new_request_ids(count: int) -> list[str]:
    """``count`` random request ids, 128 bits each in hex, drawn in one system call (one a
    call cost ~0.5 µs an id, ~10 ms before a 20,000-request ``submit_many`` could send)."""
    drawn = os.urandom(REQUEST_ID_BYTES * count).hex()
    width = 2 * REQUEST_ID_BYTES
    return [drawn[start : start + width] for start in range(0, len(drawn), width)]


def cached_result_head(item: Prepared) -> str:
    """The start of the result the admission script writes for a cache hit: it appends the
    model version and the cached output."""
    head = {
        "request_id": item.request_id,
        "model": item.model,
        "cached": True,
        "submitted_at": item.submitted_at,
        "finished_at": item.submitted_at,
    }
    return json.dumps(head)[:-1] + ',"model_version":'


def chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """Splits ``items`` into the groups sent in one round trip each."""
    return [items[start : start + size] for start in range(0, len(items), size)]


INBOX_DRAIN = 512


def queue_inbox_take(pipe: Pipeline | AsyncPipeline, inbox: str, block_s: float) -> None:
    """Queues one take from ``inbox`` on ``pipe``: a ``BLPOP`` that waits up to ``block_s``
    for a result, then an ``LPOP`` of up to ``INBOX_DRAIN`` more. Redis runs the ``LPOP``
    once the ``BLPOP`` returns: a batch's results come in one round trip, blocking or not."""
    pipe.blpop([inbox], timeout=block_s)
    pipe.lpop(inbox, INBOX_DRAIN)


def inbox_taken(replies: Sequence[Any]) -> list[Any]:
    """The raw items of one take (``queue_inbox_take``'s replies)."""
    first, rest = replies
    return ([first[1]] if first else []) + (rest or [])


def read_inbox(raws: Sequence[bytes | str | None]) -> list[Result]:
    """The results among raw inbox items, decoded in one call (``Result.decode_all``; one by
    one when one is bad); wake-up sentinels and unreadable items are skipped."""
    items = [raw for raw in raws if raw]
    together = Result.decode_all(items)
    if together is not None:
        return together
    results = []
    for raw in items:
        try:
            results.append(Result.decode(raw))
        except WireFormatError as exc:
            log.warning("dropping an unreadable result from an inbox: %s", exc)
    return results
