"""The Lua scripts' contracts (``config/lua``): what each returns and what it leaves in Redis,
run through the call sites the product uses, against both fakeredis and a real redis-server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio as aioredis

from config import lua, stats_fields
from config.errors import QueueFull, RequestIdConflict, UnknownRequest
from config.keys import CONSUMER_GROUP, STREAM_GROUP, Keys, device_consumer, worker_consumer
from config.schema import STREAM_FIELD, Request, Result, cache_entry
from config.settings import ModelPolicy, Settings
from producer.admission import Prepared, ProducerCore
from producer.async_client import AsyncProducer
from producer.client import Producer
from workers.local.local_redis import LocalRedis
from workers.protocol.batch_cap import BatchCap
from workers.protocol.capacity import FleetState, GpuClaim, NodeBeat, node_heartbeat
from workers.protocol.entries import to_text
from workers.protocol.results import Answer, ResultWriter, error_answer

MODEL = "m"
QUEUE_CAP = 3
FAKEREDIS = "fakeredis"


@pytest.fixture(params=[FAKEREDIS, "redis-server"])
def store(request: pytest.FixtureRequest, redis_server: LocalRedis) -> Iterator[redis.Redis]:
    """A client of fakeredis, or of the session's redis-server."""
    if request.param == FAKEREDIS:
        client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def settings() -> Settings:
    """Settings under this test's own key prefix, with one cached model."""
    return Settings(
        redis_url="redis://unused:6379/0",
        key_prefix=f"t{uuid.uuid4().hex[:10]}",
        models={MODEL: ModelPolicy(max_queue_len=QUEUE_CAP, cache_ttl_s=60)},
    )


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.key_prefix)


@pytest.fixture
def core(settings: Settings) -> ProducerCore:
    return ProducerCore(settings)


def admit(
    client: redis.Redis, core: ProducerCore, chunk: Sequence[Prepared], waiting: bool = False
) -> list[str]:
    """The admission script's statuses for ``chunk``, called as the producer calls it: the
    callers' ids claimed first in the index of ids."""
    claim = lua.register(client, "claim_request_id")
    claims = partial(core.queue_claims, items=chunk, script=claim)
    owners = core.claim_owners(chunk, lua.execute(client, claims, [claim]))
    assert {to_text(owner) for owner in owners.values()} <= {MODEL}
    script = lua.register(client, "admit")
    admission = partial(
        core.queue_admission,
        script=script,
        call=core.admit_call(chunk, waiting=waiting),
        replica_wait=None,
    )
    replies = lua.execute(client, admission, [script])
    statuses = core.admission_statuses([None] * len(chunk), replies, None)
    return [to_text(status) for status in statuses]


def prepare(core: ProducerCore, *inputs: Any, ids: Sequence[str] | None = None) -> list[Prepared]:
    return core.build(core.check_all(MODEL, list(inputs), request_ids=ids))


def stats(client: redis.Redis, keys: Keys) -> dict[str, int]:
    return {to_text(k): int(v) for k, v in client.hgetall(keys.stats(MODEL)).items()}


def answer(item: Prepared, entry_id: str, version: str | None = None) -> Answer:
    """The final answer a worker writes for ``item``, with the output ``["out", input]``."""
    request = item.request
    result = Result(
        request_id=item.request_id,
        model=MODEL,
        model_version=version,
        output=["out", request.input],
        submitted_at=request.submitted_at,
        finished_at=request.submitted_at,
    )
    return Answer.of(entry_id, result, item.digest, ttl_s=60)


def entry_of(client: redis.Redis, item: Prepared) -> str:
    """The stream entry named in a queued request's record."""
    return to_text(client.get(item.record_key)).split(":")[1]


def wait_for(client: redis.Redis, core: ProducerCore, inbox: str, *items: Prepared) -> None:
    """Registers ``inbox`` as a waiter of ``items`` (pending ones), as a producer's watch
    call does."""
    call_keys, _ = core.watch_call(MODEL, [item.request_id for item in items])
    lua.register(client, "watch")(keys=call_keys, args=[inbox])


def inbox_outputs(client: redis.Redis, keys: Keys, producer: str) -> list[Any]:
    """The outputs of the answers pushed to ``producer``'s inbox, sorted."""
    raws = client.lrange(keys.inbox(MODEL, producer), 0, -1)
    return sorted(Result.decode(raw).output for raw in raws)


# ADMIT


def test_admit_accepts_new_requests_into_the_stream(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """New ids are appended to the stream and recorded as ``digest:entry:model``; counted."""
    chunk = prepare(core, "a", "b")
    assert admit(store, core, chunk) == ["accepted", "accepted"]
    entries = store.xrange(keys.stream(MODEL))
    assert [Request.decode(fields[STREAM_FIELD.encode()]).input for _, fields in entries] == [
        "a",
        "b",
    ]
    for item, (entry_id, _) in zip(chunk, entries, strict=True):
        assert store.get(item.record_key) == f"{item.digest}:{to_text(entry_id)}:{MODEL}".encode()
        assert 0 < store.pttl(item.record_key) <= item.record_ttl_ms
    assert stats(store, keys) == {stats_fields.ACCEPTED: 2}


def test_admit_keeps_a_resubmitted_id_with_the_same_input_once(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """The same id and input again is a ``duplicate``: nothing more is queued or counted."""
    chunk = prepare(core, "a", ids=["r1"])
    admit(store, core, chunk)
    assert admit(store, core, prepare(core, "a", ids=["r1"])) == ["duplicate"]
    assert store.xlen(keys.stream(MODEL)) == 1
    assert stats(store, keys) == {stats_fields.ACCEPTED: 1}


def test_admit_refuses_a_whole_chunk_with_a_reused_id(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """An id reused with another input is a ``conflict``; the chunk's new requests are
    ``withheld`` and nothing of it is written."""
    admit(store, core, prepare(core, "a", ids=["r1"]))
    chunk = prepare(core, "other", "b", ids=["r1", "r2"])
    assert admit(store, core, chunk) == ["conflict", "withheld"]
    assert store.xlen(keys.stream(MODEL)) == 1
    assert store.get(chunk[1].record_key) is None
    assert stats(store, keys) == {
        stats_fields.ACCEPTED: 1,
        stats_fields.refused(RequestIdConflict.reason): 1,
    }


def test_admit_refuses_a_chunk_the_queue_has_no_room_for(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """New requests past ``max_queue_len`` are all ``full``; a duplicate stays ``duplicate``."""
    admit(store, core, prepare(core, "a", "b", ids=["r1", "r2"]))
    chunk = prepare(core, "a", "c", "d", ids=["r1", "r3", "r4"])
    assert admit(store, core, chunk) == ["duplicate", "full", "full"]
    assert store.xlen(keys.stream(MODEL)) == 2
    assert stats(store, keys) == {
        stats_fields.ACCEPTED: 2,
        stats_fields.refused(QueueFull.reason): 2,
    }


def cache_one(store: redis.Redis, core: ProducerCore, keys: Keys, version: str) -> Prepared:
    """Admits input "a", and answers it as a worker of ``version`` does (the answer cached)."""
    store.set(keys.model_version(MODEL), version)
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    writer = ResultWriter(store, keys, MODEL, cache_ttl_s=60)
    assert writer.finalize([answer(item, entry_of(store, item), version)]) == ["written"]
    return item


def test_admit_one_by_one_refuses_only_what_it_must(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """One by one, a reused id refuses only itself and new requests are taken in order while
    the queue has room; the rest are ``full``, and each refusal is counted."""
    admit(store, core, prepare(core, "x", ids=["taken"]))
    chunk = prepare(core, "y", "a", "b", "c", ids=["taken", "r-a", "r-b", "r-c"])
    call_keys, args = core.admit_call(chunk, one_by_one=True)
    replies = lua.register(store, "admit")(keys=call_keys, args=args)
    assert [to_text(status) for status in replies] == ["conflict", "accepted", "accepted", "full"]
    assert store.xlen(keys.stream(MODEL)) == QUEUE_CAP
    counted = stats(store, keys)
    assert counted[stats_fields.refused(RequestIdConflict.reason)] == 1
    assert counted[stats_fields.refused(QueueFull.reason)] == 1
    assert counted[stats_fields.ACCEPTED] == 3


def test_single_submits_made_at_once_are_admitted_each_as_if_alone(
    redis_server: LocalRedis, settings: Settings, keys: Keys
) -> None:
    """An AsyncProducer's concurrent single submits share admission calls, yet each is
    admitted as if alone: a reused id refuses only its caller, an id submitted twice at once
    is queued once and both callers get it, and new requests are taken while there is room."""

    async def submit_at_once() -> list[Any]:
        client, listener = (aioredis.Redis.from_url(redis_server.url) for _ in range(2))
        async with AsyncProducer(settings, client=client, listen_client=listener) as producer:
            await producer.submit(MODEL, "x", request_id="taken")
            return await asyncio.gather(
                producer.submit(MODEL, "y", request_id="taken"),
                producer.submit(MODEL, "same", request_id="twice"),
                producer.submit(MODEL, "same", request_id="twice"),
                producer.submit(MODEL, "a"),
                producer.submit(MODEL, "b"),
                return_exceptions=True,
            )

    conflict, first, second, fitted, refused = asyncio.run(submit_at_once())
    assert isinstance(conflict, RequestIdConflict)
    assert first == second == "twice"
    assert isinstance(fitted, str)
    assert isinstance(refused, QueueFull)
    client = redis.Redis.from_url(redis_server.url)
    assert client.xlen(keys.stream(MODEL)) == QUEUE_CAP
    client.close()


def test_admit_answers_an_input_cached_by_the_current_version_at_once(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A cache entry of the current version answers a new id ``cached``: its result is
    written, its record holds the digest alone, nothing is queued; hits are counted."""
    computed = cache_one(store, core, keys, "v1")
    assert (
        store.get(keys.cache(MODEL, computed.digest)) == cache_entry("v1", '["out","a"]').encode()
    )
    (item,) = prepare(core, "a")
    assert admit(store, core, [item]) == ["cached"]
    result = Result.decode(store.get(item.result_key))
    assert (result.cached, result.model_version, result.output) == (True, "v1", ["out", "a"])
    assert result.request_id == item.request_id and result.model == MODEL
    assert store.get(item.record_key) == item.digest.encode()
    assert 0 < store.pttl(item.result_key) <= item.result_ttl_ms
    assert store.xlen(keys.stream(MODEL)) == 0
    assert stats(store, keys) == {
        stats_fields.ACCEPTED: 1,
        stats_fields.CACHE_MISS: 1,
        stats_fields.CACHE_HIT: 1,
        stats_fields.COMPLETED: 1,
    }


def test_admit_ignores_a_cache_entry_of_another_version(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """Once the model's version changes, its old entries answer nothing: a ``miss``."""
    cache_one(store, core, keys, "v1")
    store.set(keys.model_version(MODEL), "v10")
    assert admit(store, core, prepare(core, "a")) == ["accepted"]
    assert stats(store, keys)[stats_fields.CACHE_MISS] == 2


def test_admit_withholds_a_cache_hit_of_a_refused_chunk(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A cached input in a chunk refused for a conflict is ``withheld``, its result unwritten."""
    cache_one(store, core, keys, "v1")
    admit(store, core, prepare(core, "x", ids=["r1"]))
    chunk = prepare(core, "a", "y", ids=["r2", "r1"])
    assert admit(store, core, chunk) == ["withheld", "conflict"]
    assert store.get(chunk[0].result_key) is None
    assert stats_fields.CACHE_HIT not in stats(store, keys)


# WATCH


def test_admit_for_a_waiting_producer_makes_it_the_waiter_of_what_it_enqueues(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """Admitted ``waiting`` (``infer``), each request enqueued has the producer's inbox as its
    waiter, and its answer is pushed there with no watch call; a request already queued does
    not (the producer watches it)."""
    queued = prepare(core, "a", ids=["queued"])
    admit(store, core, queued)
    chunk = [*prepare(core, "a", ids=["queued"]), *prepare(core, "b")]
    statuses = admit(store, core, chunk, waiting=True)
    assert statuses == ["duplicate", "accepted"]
    fresh = chunk[1]
    assert core.enqueued(chunk, statuses) == {fresh.request_id}

    answers = [answer(item, entry_of(store, item)) for item in (queued[0], fresh)]
    assert ResultWriter(store, keys, MODEL).finalize(answers) == ["written", "written"]
    (pushed,) = store.lrange(core.inbox(MODEL), 0, -1)
    assert Result.decode(pushed).output == ["out", "b"]


def test_watch_answers_done_pending_or_unknown(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A pending request registers the producer's inbox as a waiter, once however often it
    watches, and its answer is pushed there once; an answered one returns the result, and
    nothing is pushed for it; an id without a record is unknown."""
    watch = lua.register(store, "watch")
    done, pending = prepare(core, "a", "b")
    admit(store, core, [done, pending])
    writer = ResultWriter(store, keys, MODEL)
    writer.finalize([answer(done, entry_of(store, done))])
    ids = [done.request_id, pending.request_id]
    for _ in range(2):
        call_keys, args = core.watch_call(MODEL, ids)
        result, waiting = core.read_watch(ids, watch(keys=call_keys, args=args))
        assert result is not None and result.output == ["out", "a"]
        assert waiting is None
    assert 0 < store.pttl(pending.record_key) <= pending.record_ttl_ms
    writer.finalize([answer(pending, entry_of(store, pending))])
    (pushed,) = store.lrange(core.inbox(MODEL), 0, -1)
    assert Result.decode(pushed).output == ["out", "b"]

    ids = [pending.request_id, "never"]
    call_keys, args = core.watch_call(MODEL, ids)
    with pytest.raises(UnknownRequest):
        core.read_watch(ids, watch(keys=call_keys, args=args))


# STREAM_ADMIT


def test_stream_admit_takes_a_request_only_to_a_lane_a_worker_serves(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """No group on the lane: ``unstreamable``; then ``accepted`` (recorded by digest),
    ``duplicate``, ``conflict`` and ``full``, each counted."""
    stream_admit = lua.register(store, "stream_admit")
    lane = keys.stream_lane(MODEL)

    def submit(item: Prepared) -> str:
        call_keys, args = core.stream_call([item])
        (status,) = stream_admit(keys=call_keys, args=args)
        return to_text(status)

    (first,) = prepare(core, "a", ids=["s1"])
    assert submit(first) == "unstreamable"
    store.xgroup_create(lane, STREAM_GROUP, id="0", mkstream=True)
    assert submit(first) == "accepted"
    assert store.get(first.record_key) == first.digest.encode()
    assert submit(prepare(core, "a", ids=["s1"])[0]) == "duplicate"
    assert submit(prepare(core, "b", ids=["s1"])[0]) == "conflict"
    for item in prepare(core, "c", "d", ids=["s2", "s3"]):
        assert submit(item) == "accepted"
    assert submit(prepare(core, "e", ids=["s4"])[0]) == "full"
    assert store.xlen(lane) == QUEUE_CAP
    assert stats(store, keys) == {
        stats_fields.ACCEPTED: 3,
        stats_fields.refused(RequestIdConflict.reason): 1,
        stats_fields.refused(QueueFull.reason): 1,
    }


# CANCEL


@pytest.fixture
def producer(store: redis.Redis, settings: Settings) -> Iterator[Producer]:
    with Producer(settings, client=store, listen_client=store) as client:
        yield client


def test_cancel_of_an_unknown_id_raises(producer: Producer) -> None:
    """An id without a record is unknown."""
    with pytest.raises(UnknownRequest):
        producer.cancel("never")


def test_cancel_of_an_answered_request_changes_nothing(
    store: redis.Redis, core: ProducerCore, keys: Keys, producer: Producer
) -> None:
    """A request with its final answer keeps it (``final``: False)."""
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    ResultWriter(store, keys, MODEL).finalize([answer(item, entry_of(store, item))])
    assert producer.cancel(item.request_id) is False
    assert Result.decode(store.get(item.result_key)).output == ["out", "a"]
    assert stats_fields.failed("cancelled") not in stats(store, keys)


def test_cancel_removes_a_request_no_batcher_has_read(
    store: redis.Redis, core: ProducerCore, keys: Keys, producer: Producer
) -> None:
    """Unread, the entry leaves the stream; the ``cancelled`` answer is published to every
    waiter and counted."""
    store.xgroup_create(keys.stream(MODEL), CONSUMER_GROUP, id="0", mkstream=True)
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    wait_for(store, core, keys.inbox(MODEL, "p1"), item)
    assert producer.cancel(item.request_id) is True
    assert store.xlen(keys.stream(MODEL)) == 0
    result = Result.decode(store.get(item.result_key))
    assert result.error is not None and result.error.code == "cancelled"
    assert result.model == MODEL
    assert Result.decode(store.lpop(keys.inbox(MODEL, "p1"))).request_id == item.request_id
    # The record now expires with the answer (one script set both to the result TTL), no
    # longer a request lifetime later; read in one round trip, the two differ by at most the
    # milliseconds between the reads.
    pipe = store.pipeline(transaction=False)
    pipe.pttl(item.record_key)
    pipe.pttl(item.result_key)
    record_ttl_ms, result_ttl_ms = pipe.execute()
    assert abs(record_ttl_ms - result_ttl_ms) < 1000 < item.record_ttl_ms - item.result_ttl_ms
    assert stats(store, keys)[stats_fields.failed("cancelled")] == 1


def test_cancel_takes_a_read_request_off_the_stream_and_its_ledger(
    store: redis.Redis, core: ProducerCore, keys: Keys, producer: Producer
) -> None:
    """A request a batcher holds is answered ``cancelled`` and leaves the stream and the
    group's pending entries, so its batch skips it and no one reclaims it."""
    store.xgroup_create(keys.stream(MODEL), CONSUMER_GROUP, id="0", mkstream=True)
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    store.xreadgroup(CONSUMER_GROUP, "batcher", {keys.stream(MODEL): ">"})
    store.hset(keys.attempts(MODEL), entry_of(store, item), 1)
    assert producer.cancel(item.request_id) is True
    assert store.xlen(keys.stream(MODEL)) == 0
    assert store.xpending(keys.stream(MODEL), CONSUMER_GROUP)["pending"] == 0
    assert store.hlen(keys.attempts(MODEL)) == 0
    assert Result.decode(store.get(item.result_key)).error is not None
    assert stats(store, keys)[stats_fields.failed("cancelled")] == 1


def test_cancel_acts_only_on_the_record_its_caller_read(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A record changed since the caller read it is left alone (``changed``: read again)."""
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    call_keys, args = core.cancel_call(MODEL, item.request_id, b"an older record")
    assert to_text(lua.register(store, "cancel")(keys=call_keys, args=args)) == "changed"
    assert store.get(item.result_key) is None


def test_cancel_answers_a_cached_request_without_touching_a_stream(
    store: redis.Redis, core: ProducerCore, keys: Keys, producer: Producer
) -> None:
    """A record without an entry (a cache hit, a streaming request) is answered
    ``cancelled`` unless it has its answer already."""
    cache_one(store, core, keys, "v1")
    (item,) = prepare(core, "a")
    admit(store, core, [item])
    assert producer.cancel(item.request_id) is False
    stream_item = prepare(core, "b")[0]
    store.set(stream_item.record_key, stream_item.digest, px=60_000)
    assert producer.cancel(stream_item.request_id) is True
    result = Result.decode(store.get(stream_item.result_key))
    assert result.error is not None and result.model == MODEL


# FINALIZE


def queued(store: redis.Redis, core: ProducerCore, keys: Keys, *inputs: str) -> list[Prepared]:
    """Requests admitted and read by a batcher (pending in the group)."""
    store.xgroup_create(keys.stream(MODEL), CONSUMER_GROUP, id="0", mkstream=True)
    items = prepare(core, *inputs)
    admit(store, core, items)
    store.xreadgroup(CONSUMER_GROUP, "batcher", {keys.stream(MODEL): ">"})
    return items


def test_finalize_writes_once_and_closes_the_entry_either_way(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """The first answer is ``written``, pushed to waiters and counted; a second is a
    ``duplicate``; one for a record holding another input is ``stale``. Every call acks and
    deletes its entry and forgets its attempts."""
    writer = ResultWriter(store, keys, MODEL)
    first, second = queued(store, core, keys, "a", "b")
    entry = entry_of(store, first)
    store.hset(keys.attempts(MODEL), entry, 1)
    wait_for(store, core, keys.inbox(MODEL, "p1"), first)
    assert writer.finalize([answer(first, entry)]) == ["written"]
    assert Result.decode(store.lpop(keys.inbox(MODEL, "p1"))).output == ["out", "a"]
    assert store.pttl(first.record_key) <= 60_000
    assert not store.hexists(keys.attempts(MODEL), entry)

    request = first.request
    late = error_answer(request, entry, "model_error", "late", ttl_s=60)
    assert writer.finalize([late]) == ["duplicate"]
    assert Result.decode(store.get(first.result_key)).output == ["out", "a"]
    assert store.llen(keys.inbox(MODEL, "p1")) == 0

    other_entry = entry_of(store, second)
    store.set(second.record_key, "another digest")
    assert writer.finalize([answer(second, other_entry)]) == ["stale"]
    assert store.get(second.result_key) is None
    assert store.xlen(keys.stream(MODEL)) == 0
    assert store.xpending(keys.stream(MODEL), CONSUMER_GROUP)["pending"] == 0
    assert stats(store, keys)[stats_fields.COMPLETED] == 1


def test_finalize_loads_its_script_where_redis_lost_it(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A Redis that restarted or flushed its scripts between two batches still takes a
    batch's answers: the finalize call, sent past redis-py's script handling, loads its
    script and runs once."""
    writer = ResultWriter(store, keys, MODEL)
    first, second = queued(store, core, keys, "a", "b")
    assert writer.finalize([answer(first, entry_of(store, first))]) == ["written"]
    store.script_flush()
    assert writer.finalize([answer(second, entry_of(store, second))]) == ["written"]
    assert Result.decode(store.get(second.result_key)).output == ["out", "b"]
    assert stats(store, keys)[stats_fields.COMPLETED] == 2
    assert store.xlen(keys.stream(MODEL)) == 0


def test_an_answer_and_its_record_expire_at_the_same_moment(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A record that outlived its result even by a millisecond would make a caller who asks
    then wait for an answer that never comes instead of hearing the request is unknown. A
    batch of 2,000 answers takes several milliseconds to write, so expiries computed one by
    one would fall on different milliseconds."""
    items = prepare(core, *range(2000))
    for item in items:
        store.set(item.record_key, f"{item.digest}:0-1")
    writer = ResultWriter(store, keys, MODEL)
    assert set(writer.finalize([answer(item, "") for item in items])) == {"written"}
    with store.pipeline(transaction=False) as pipe:
        for item in items:
            pipe.pexpiretime(item.result_key).pexpiretime(item.record_key)
        try:
            expiries = pipe.execute()
        except redis.ResponseError:
            pytest.skip("this Redis has no PEXPIRETIME (Redis 7 has)")
    assert expiries[0::2] == expiries[1::2]
    assert min(expiries) > 0


def test_answers_of_different_ttls_each_keep_theirs_in_order(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A call's answers share a TTL in the script's call: answers of several are written in
    as many calls, each result (and its record) living its own, the statuses in order."""
    writer = ResultWriter(store, keys, MODEL)
    items = queued(store, core, keys, "a", "b", "c")
    ttls_s = [60, 600, 60]
    answers = [
        answer(item, entry_of(store, item))._replace(ttl_s=ttl_s)
        for item, ttl_s in zip(items, ttls_s, strict=True)
    ]
    assert writer.finalize([answers[0]]) == ["written"]
    assert writer.finalize(answers) == ["duplicate", "written", "written"]
    for item, ttl_s in zip(items, ttls_s, strict=True):
        for key in (item.result_key, item.record_key):
            assert (ttl_s - 30) * 1000 < store.pttl(key) <= ttl_s * 1000
    assert store.xlen(keys.stream(MODEL)) == 0


def test_finalize_writes_a_batch_in_one_call_each_waiter_getting_its_answers(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """A batch's answers go in one call: each written once and counted, each pushed to
    every inbox that waits for it and to no other, every entry closed; an answer a request
    already had is a ``duplicate`` beside the batch's new ones."""
    writer = ResultWriter(store, keys, MODEL)
    items = queued(store, core, keys, "a", "b", "c")
    entries = [entry_of(store, item) for item in items]
    first, second, third = items
    assert writer.finalize([answer(first, entries[0])]) == ["written"]
    wait_for(store, core, keys.inbox(MODEL, "p1"), *items)
    wait_for(store, core, keys.inbox(MODEL, "p2"), second)

    answers = [answer(item, entry) for item, entry in zip(items, entries, strict=True)]
    assert writer.finalize(answers) == ["duplicate", "written", "written"]

    # "a" had its answer before p1 waited
    assert inbox_outputs(store, keys, "p1") == [["out", "b"], ["out", "c"]]
    assert inbox_outputs(store, keys, "p2") == [["out", "b"]]
    assert 0 < store.pttl(keys.inbox(MODEL, "p1")) <= 60_000
    assert Result.decode(store.get(third.result_key)).output == ["out", "c"]
    assert store.xlen(keys.stream(MODEL)) == 0
    assert store.xpending(keys.stream(MODEL), CONSUMER_GROUP)["pending"] == 0
    assert stats(store, keys)[stats_fields.COMPLETED] == 3


def test_a_batch_start_records_its_worker_and_claims_only_entries_left_in_the_stream(
    store: redis.Redis, core: ProducerCore, keys: Keys, producer: Producer
) -> None:
    """Starting a delivery records the worker running it, moves its entries to the worker's
    consumer and reads their requests: none for an entry an earlier delivery closed with its
    answer, nor for one cancelled while a batcher held it."""
    writer = ResultWriter(store, keys, MODEL)
    stream = keys.stream(MODEL)
    fresh, answered, cancelled = queued(store, core, keys, "a", "b", "c")
    entries = [entry_of(store, item) for item in (fresh, answered, cancelled)]
    assert writer.finalize([answer(answered, entries[1])]) == ["written"]
    assert producer.cancel(cancelled.request_id) is True
    consumer = worker_consumer("w1")
    claimed = writer.start_batch("batch-1", "w1|1", consumer, entries)
    assert [
        (to_text(entry_id), Request.decode(fields[STREAM_FIELD.encode()]).input)
        for entry_id, fields in claimed
    ] == [(entries[0], "a")]
    assert store.hget(keys.inflight_owners(MODEL), "batch-1") == b"w1|1"
    pending = store.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10)
    assert [(to_text(row["message_id"]), to_text(row["consumer"])) for row in pending] == [
        (entries[0], consumer)
    ]


def test_count_device_deaths_counts_only_entries_of_gone_devices(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """An entry on a gone process's device counts one more attempt and moves to the claiming
    consumer; one on a live device is left to it (None); one elsewhere keeps its count."""
    writer = ResultWriter(store, keys, MODEL)
    stream = keys.stream(MODEL)
    on_gone, on_live, elsewhere = queued(store, core, keys, "a", "b", "c")
    gone, live = device_consumer("w1", "old"), device_consumer("w2", "now")
    entries = [entry_of(store, item) for item in (on_gone, on_live, elsewhere)]
    store.xclaim(stream, CONSUMER_GROUP, gone, 0, [entries[0]], justid=True)
    store.xclaim(stream, CONSUMER_GROUP, live, 0, [entries[1]], justid=True)
    node_heartbeat(store, keys, NodeBeat("w2", live, {}, [MODEL], ttl_s=60))
    store.hset(keys.attempts(MODEL), entries[2], 1)
    claimer = worker_consumer("w3")
    assert writer.count_device_deaths(claimer, entries) == [1, None, 1]
    owners = {
        to_text(row["message_id"]): to_text(row["consumer"])
        for row in store.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10)
    }
    assert owners == {entries[0]: claimer, entries[1]: live, entries[2]: claimer}


# Heartbeats, capacity, dispatch, GPU claims


def test_worker_heartbeats_count_live_slots_until_they_leave(
    store: redis.Redis, keys: Keys
) -> None:
    """A heartbeat adds its worker's slots; leaving removes them; an expired one is pruned."""
    state = FleetState(store, keys, MODEL)
    state.heartbeat("w1|2", ttl_s=60)
    state.heartbeat("w2|1", ttl_s=60)
    state.heartbeat("w3|4", ttl_s=-1)
    capacity = state.capacity(lease_s=60)
    assert (capacity.workers, capacity.slots, capacity.inflight) == (2, 3, 0)
    state.leave("w2|1")
    assert store.zrange(keys.workers(MODEL), 0, -1) == [b"w1|2"]


def test_capacity_prunes_batches_of_gone_workers_and_past_the_lease(
    store: redis.Redis, keys: Keys
) -> None:
    """Batches whose worker is gone or older than the lease are forgotten, with their owner;
    the rest are counted in flight, each counted by flush reason when dispatched."""
    state = FleetState(store, keys, MODEL)
    state.heartbeat("w1|1", ttl_s=60)
    for batch in ("kept", "orphan", "old"):
        state.dispatched(batch, "size", lease_s=60)
    writer = ResultWriter(store, keys, MODEL)
    writer.start_batch("kept", "w1|1", "w1@test", [])
    writer.start_batch("orphan", "gone|1", "gone@test", [])
    store.zadd(keys.inflight(MODEL), {"old": 1.0})
    store.hset(keys.inflight_owners(MODEL), "forgotten", "w1|1")
    assert state.capacity(lease_s=60).inflight == 1
    assert store.zrange(keys.inflight(MODEL), 0, -1) == [b"kept"]
    assert store.hgetall(keys.inflight_owners(MODEL)) == {b"kept": b"w1|1"}
    assert stats(store, keys) == {stats_fields.batches("size"): 3}


def test_node_heartbeat_keeps_a_device_alive_and_renews_only_its_own_gpu_claim(
    store: redis.Redis, keys: Keys
) -> None:
    """The device consumer is scored by its expiry and expired ones pruned; a claim held by
    this owner or nobody is renewed, one another owner took is not (held False)."""
    claim = keys.gpu_claim("GPU-1")
    store.zadd(keys.devices(MODEL), {"expired:device": 1.0})
    beat = NodeBeat("w1", "w1:device", {}, [MODEL], ttl_s=60, gpu_claim=GpuClaim(claim, "w1"))
    assert node_heartbeat(store, keys, beat) == ({MODEL: 0}, True)
    assert store.get(claim) == b"w1" and 0 < store.pttl(claim) <= 60_000
    assert store.zrange(keys.devices(MODEL), 0, -1) == [b"w1:device"]
    store.set(claim, "w2")
    assert node_heartbeat(store, keys, beat) == ({MODEL: 0}, False)
    assert store.get(claim) == b"w2"


# Batch cap


def test_batch_cap_is_lowered_never_raised_by_an_out_of_memory(
    store: redis.Redis, keys: Keys
) -> None:
    """Out of memory at N sets the cap to N/2 unless it is lower already."""
    cap = BatchCap(store, keys, MODEL, max_batch_size=32)
    cap.out_of_memory(16)
    assert store.get(keys.batch_cap(MODEL)) == b"8"
    cap.out_of_memory(32)
    assert store.get(keys.batch_cap(MODEL)) == b"8"


def test_batch_cap_is_raised_only_from_the_cap_it_was_computed_from(
    store: redis.Redis, keys: Keys
) -> None:
    """A raise computed from a cap another worker lowered meanwhile is dropped; back at the
    maximum, the cap is deleted."""
    raise_cap = lua.register(store, "raise_batch_cap")
    store.set(keys.batch_cap(MODEL), 4)
    assert raise_cap(keys=[keys.batch_cap(MODEL)], args=[8, 9]) == 0
    assert raise_cap(keys=[keys.batch_cap(MODEL)], args=[4, 5]) == 1
    assert store.get(keys.batch_cap(MODEL)) == b"5"
    assert raise_cap(keys=[keys.batch_cap(MODEL)], args=[5, ""]) == 1
    assert not store.exists(keys.batch_cap(MODEL))


# Consumers


def test_prune_consumers_forgets_idle_consumers_that_hold_nothing(
    store: redis.Redis, core: ProducerCore, keys: Keys
) -> None:
    """Consumers with nothing pending past the idle time go; one holding entries and the
    caller itself stay."""
    stream = keys.stream(MODEL)
    queued(store, core, keys, "a")
    store.xgroup_createconsumer(stream, CONSUMER_GROUP, "empty")
    store.xgroup_createconsumer(stream, CONSUMER_GROUP, "me")
    prune = lua.register(store, "prune_consumers")
    assert prune(keys=[stream], args=[CONSUMER_GROUP, -1, "me"]) == 1
    names = {to_text(c["name"]) for c in store.xinfo_consumers(stream, CONSUMER_GROUP)}
    assert names == {"batcher", "me"}


def test_the_includes_are_in_place() -> None:
    """``--#include`` lines are replaced by the included file: finalize and cancel share
    ``publish_answer``."""
    for name in ("finalize", "cancel"):
        text = lua.source(name)
        assert "--#include" not in text
        assert text.count("local function publish_answer(") == 1
