"""Admission at the edge: typed refusals, nothing enqueued, idempotent ids (fakeredis)."""

from __future__ import annotations

import json
import re
import time

import fakeredis
import pytest

from config.errors import (
    ConfigError,
    DeadlinePassed,
    InputTooLarge,
    InvalidInput,
    QueueFull,
    RequestIdConflict,
    ResultTimeout,
    UnknownModel,
    UnknownRequest,
    WireFormatError,
)
from config.keys import Keys
from config.schema import STREAM_FIELD, Request, Result
from config.settings import ModelPolicy, Settings
from producer.admission import WATCH_PENDING, WATCH_UNKNOWN, ProducerCore, read_inbox
from producer.client import Producer
from workers.protocol.results import Answer, ResultWriter

STREAM = Keys("bf").stream("synthetic")


def queued(client: fakeredis.FakeRedis) -> int:
    return int(client.xlen(STREAM)) if client.exists(STREAM) else 0


def test_submit_enqueues_one_entry_and_returns_an_id(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """An accepted request is one stream entry and has an admission record."""
    request_id = producer.submit("synthetic", {"text": "hi"})
    assert queued(fake_redis) == 1
    assert fake_redis.exists(Keys("bf").record("synthetic", request_id))


@pytest.mark.parametrize("producer_id", ["", "two\nlines", "tab\there"])
def test_a_producer_id_must_be_printable_text(
    settings: Settings, fake_redis: fakeredis.FakeRedis, producer_id: str
) -> None:
    """Its inbox's name is a line of each admission record it waits on: an id that is
    empty or breaks the line is refused when the producer is made, before any request."""
    with pytest.raises(ConfigError, match="producer id"):
        Producer(settings, client=fake_redis, listen_client=fake_redis, producer_id=producer_id)


def test_a_named_producer_is_woken_by_its_answers(
    settings: Settings, fake_redis: fakeredis.FakeRedis
) -> None:
    """A producer with an id of its own (spaces allowed) is named the waiter of what it
    submits, and the answer written for it reaches its ``result``."""
    listen = fakeredis.FakeRedis(server=fake_redis.connection_pool.connection_kwargs["server"])
    with Producer(
        settings, client=fake_redis, listen_client=listen, producer_id="billing job 7"
    ) as producer:
        request_id = producer.submit("synthetic", 1)
        result = Result(request_id=request_id, model="synthetic", output=2, finished_at=0)
        answer = Answer.of("", result, digest="", ttl_s=60)
        assert ResultWriter(fake_redis, Keys("bf"), "synthetic").finalize([answer]) == ["written"]
        assert producer.result(request_id, timeout_s=30) == 2


def test_submit_many_gives_each_request_an_id_of_its_own(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """Ids drawn for a call are distinct, 128 random bits in hex, each its own request."""
    ids = producer.submit_many("synthetic", [{"n": n} for n in range(10)])
    assert len(set(ids)) == 10 and all(re.fullmatch("[0-9a-f]{32}", one) for one in ids)
    assert queued(fake_redis) == 10


@pytest.mark.parametrize(
    ("model", "value", "error"),
    [
        ("nope", 1, UnknownModel),
        ("synthetic", {1, 2}, InvalidInput),
        ("synthetic", float("inf"), InvalidInput),
        ("synthetic", "x" * 2000, InputTooLarge),
        ("synthetic", json.loads("[" * 150 + "]" * 150), InvalidInput),
    ],
)
def test_bad_input_is_refused_with_a_typed_error_and_nothing_enqueued(
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    model: str,
    value: object,
    error: type[Exception],
) -> None:
    """Unknown model, non-JSON input and oversized input never reach the queue."""
    with pytest.raises(error):
        producer.submit(model, value)
    assert queued(fake_redis) == 0


def test_past_deadline_is_refused(producer: Producer, fake_redis: fakeredis.FakeRedis) -> None:
    """A deadline already past is refused at submit."""
    with pytest.raises(DeadlinePassed):
        producer.submit("synthetic", 1, deadline_s=0)
    assert queued(fake_redis) == 0


@pytest.mark.parametrize("deadline_s", [float("nan"), float("inf"), 1e300, "5"])
def test_unusable_deadlines_are_invalid_input(
    producer: Producer, fake_redis: fakeredis.FakeRedis, deadline_s: object
) -> None:
    """NaN, infinite, absurdly far or non-numeric deadlines are refused with InvalidInput."""
    with pytest.raises(InvalidInput):
        producer.submit("synthetic", 1, deadline_s=deadline_s)  # type: ignore[arg-type]
    assert queued(fake_redis) == 0


@pytest.mark.parametrize("request_id", ["", "has space", "x" * 201, "tab\t"])
def test_malformed_request_ids_are_refused(producer: Producer, request_id: str) -> None:
    """A caller's id must be short, printable and free of spaces."""
    with pytest.raises(InvalidInput):
        producer.submit("synthetic", 1, request_id=request_id)


def test_an_over_long_request_id_is_refused_without_repeating_it(producer: Producer) -> None:
    """The error shows the id's start and its length, not 100,000 characters."""
    with pytest.raises(InvalidInput) as refused:
        producer.submit("synthetic", "x", request_id="x" * 100_000)
    message = str(refused.value)
    assert len(message) < 200 and "(100000 characters)" in message, message


def test_resubmitting_an_id_does_not_enqueue_twice(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """The same id with the same input is accepted once; with another input it is refused."""
    assert producer.submit("synthetic", {"a": 1}, request_id="job-1") == "job-1"
    assert producer.submit("synthetic", {"a": 1}, request_id="job-1") == "job-1"
    assert queued(fake_redis) == 1
    with pytest.raises(RequestIdConflict):
        producer.submit("synthetic", {"a": 2}, request_id="job-1")
    assert queued(fake_redis) == 1


def test_a_call_the_queue_has_no_room_for_enqueues_nothing(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """A submit_many that does not fit under max_queue_len (10) is refused whole: a caller
    who sends it again later runs nothing twice."""
    producer.submit_many("synthetic", list(range(4)))
    with pytest.raises(QueueFull, match="nothing of these 7 was enqueued") as caught:
        producer.submit_many("synthetic", list(range(7)))
    assert caught.value.accepted_ids == []
    assert queued(fake_redis) == 4
    assert len(producer.submit_many("synthetic", list(range(6)))) == 6
    with pytest.raises(QueueFull):
        producer.submit("synthetic", "one more")


def test_an_id_conflict_in_a_call_enqueues_nothing_and_names_the_reused_ids(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """One reused id refuses the whole call: the new id beside it is not enqueued."""
    producer.submit("synthetic", "first", request_id="dup-1")
    with pytest.raises(RequestIdConflict) as caught:
        producer.submit_many("synthetic", ["other", "new"], request_ids=["dup-1", "new-1"])
    assert caught.value.conflicting_ids == ["dup-1"] and caught.value.accepted_ids == []
    assert queued(fake_redis) == 1
    assert fake_redis.get(Keys("bf").record("synthetic", "new-1")) is None
    assert int(fake_redis.hget(Keys("bf").stats("synthetic"), "refused:id_conflict")) == 1


def test_a_refusal_past_the_first_chunk_lists_exactly_what_earlier_chunks_enqueued(
    settings: Settings, fake_redis: fakeredis.FakeRedis
) -> None:
    """Calls past 256 inputs go in chunks, each whole or not at all: the error of a refused
    later chunk lists the ids the earlier chunks enqueued, and only those are queued."""
    roomy = settings.model_copy(
        update={"models": {"synthetic": ModelPolicy(max_queue_len=300, max_input_bytes=1000)}}
    )
    producer = Producer(roomy, client=fake_redis, listen_client=fake_redis)
    ids = [f"r{n}" for n in range(600)]
    with pytest.raises(QueueFull) as caught:
        producer.submit_many("synthetic", list(range(600)), request_ids=ids)
    assert caught.value.accepted_ids == ids[: roomy.submit_chunk]
    assert queued(fake_redis) == roomy.submit_chunk


def test_a_call_bigger_than_the_queue_cap_goes_in_chunks_that_fit(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """With max_queue_len 10, 11 requests go as a chunk of 10 and one of 1: the first fits an
    empty queue (a chunk larger than the cap would never fit, and a bulk job would wait
    forever); the second is refused, and accepted_ids names the first ten."""
    with pytest.raises(QueueFull) as caught:
        producer.submit_many("synthetic", list(range(11)))
    assert len(caught.value.accepted_ids) == 10
    assert queued(fake_redis) == 10


def test_the_same_id_twice_in_one_call_is_refused(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """Two inputs under one request id would be two queued requests racing for one answer."""
    with pytest.raises(InvalidInput, match="given twice"):
        producer.submit_many("synthetic", ["a", "b"], request_ids=["same", "same"])
    assert queued(fake_redis) == 0


def test_submit_many_validates_everything_before_enqueuing(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """One bad input in a list refuses the whole call; nothing is enqueued."""
    with pytest.raises(InvalidInput):
        producer.submit_many("synthetic", [1, 2, {3}])
    assert queued(fake_redis) == 0


def test_a_bad_input_past_the_first_chunk_refuses_the_whole_call(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """Chunks (of 10 here, the queue cap) are built one by one as they are admitted, but
    every input is validated before the first is: a bad input in a later chunk still
    enqueues nothing."""
    with pytest.raises(InputTooLarge):
        producer.submit_many("synthetic", [*range(10), "x" * 2000])
    with pytest.raises(InvalidInput):
        producer.submit_many("synthetic", [*range(10), 11], request_ids=[*"abcdefghij", " "])
    assert queued(fake_redis) == 0


def test_every_chunk_of_a_call_counts_its_deadline_from_the_call(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A later chunk is built when its turn comes, yet its requests were submitted with the
    call: the same submission time and deadline as the first chunk's, deadline_s after it."""
    settings = Settings(
        redis_url="redis://fake:6379/0", submit_chunk=4, models={"synthetic": ModelPolicy()}
    )
    listen = fakeredis.FakeRedis(server=fake_redis.connection_pool.connection_kwargs["server"])
    with Producer(settings, client=fake_redis, listen_client=listen) as producer:
        called_at = time.time()
        producer.submit_many("synthetic", range(10), deadline_s=5)  # three chunks
        returned_at = time.time()
    entries = fake_redis.xrange(STREAM)
    requests = [Request.decode(fields[STREAM_FIELD.encode()]) for _, fields in entries]
    assert [request.input for request in requests] == list(range(10))
    submitted_at = requests[0].submitted_at
    assert {(r.submitted_at, r.deadline_at) for r in requests} == {(submitted_at, submitted_at + 5)}
    assert called_at <= submitted_at <= returned_at


def test_result_of_an_unknown_id_fails_at_once(producer: Producer) -> None:
    """Asking for an id never accepted raises UnknownRequest instead of waiting."""
    with pytest.raises(UnknownRequest):
        producer.result("never-submitted", timeout_s=30)


def test_waiting_past_the_timeout_raises_result_timeout(producer: Producer) -> None:
    """A pending request with no worker ends the wait with ResultTimeout, not a hang."""
    request_id = producer.submit("synthetic", 1)
    with pytest.raises(ResultTimeout):
        producer.result(request_id, timeout_s=0.05)


def test_an_unreadable_inbox_item_is_skipped_and_the_rest_read() -> None:
    """Results read together from an inbox: wake-ups and an unreadable item are skipped, the
    others come in order."""
    results = [Result(request_id=f"r{n}", model="m", output=n, finished_at=1.0) for n in range(3)]
    raws = [results[0].encode().encode(), b"", b"not a result", results[1].encode().encode()]
    assert read_inbox([*raws, None, results[2].encode().encode()]) == results


def test_a_watch_reply_reads_pending_and_final_answers_in_order() -> None:
    """Per id: its result when final, None while pending; a malformed result raises."""
    done = [Result(request_id=f"r{n}", model="m", output=n, finished_at=1.0) for n in range(2)]
    reply = [done[0].encode().encode(), WATCH_PENDING, done[1].encode().encode()]
    assert ProducerCore.read_watch(["r0", "p", "r1"], reply) == [done[0], None, done[1]]
    with pytest.raises(WireFormatError):
        ProducerCore.read_watch(["r0", "r1"], [done[0].encode().encode(), b"{"])
    with pytest.raises(UnknownRequest):
        ProducerCore.read_watch(["r0", "gone"], [done[0].encode().encode(), WATCH_UNKNOWN])
