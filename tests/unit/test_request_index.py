"""Request ids across models: each model's requests live in its own hash slot, so a caller
that knows only an id finds its model in the index of ids, and an id names one request of
one model at a time (fakeredis)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import fakeredis
import fakeredis.aioredis
import pytest

from config import stats_fields
from config.errors import RequestIdConflict, UnknownRequest
from config.keys import Keys
from config.published_policy import encode_policy
from config.schema import Result
from config.settings import ModelPolicy, Settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from tests.waiters import names_waiter
from workers.protocol.results import Answer, ResultWriter

KEYS = Keys("bf")
CONFLICTS = stats_fields.refused(RequestIdConflict.reason)
MODELS = ("text", "image")


@pytest.fixture
def settings() -> Settings:
    return Settings(
        redis_url="redis://fake:6379/0",
        models={model: ModelPolicy(max_queue_len=10) for model in MODELS},
    )


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def producer_on(settings: Settings, server: fakeredis.FakeServer) -> Producer:
    return Producer(
        settings,
        client=fakeredis.FakeRedis(server=server),
        listen_client=fakeredis.FakeRedis(server=server),
    )


@pytest.fixture
def producer(settings: Settings, server: fakeredis.FakeServer) -> Iterator[Producer]:
    with producer_on(settings, server) as client:
        yield client


def answer(server: fakeredis.FakeServer, model: str, request_id: str) -> None:
    """Writes the request's answer as a worker of ``model`` does, waking its waiters."""
    result = Result(request_id=request_id, model=model, output=f"{model} out", finished_at=0)
    answer = Answer.of("", result, digest="", ttl_s=60)
    ResultWriter(fakeredis.FakeRedis(server=server), KEYS, model).finalize([answer])


def queued(server: fakeredis.FakeServer, model: str) -> int:
    return int(fakeredis.FakeRedis(server=server).xlen(KEYS.stream(model)))


def test_another_producer_finds_a_request_by_its_id_alone(
    settings: Settings, server: fakeredis.FakeServer, producer: Producer
) -> None:
    """A producer that admitted neither waits for them, and cancels them, by id alone: a
    caller's id through the index of ids, an id the producer drew by its record."""
    drawn = producer.submit("image", 1)
    (own,) = producer.submit_many("text", [2], request_ids=["caller-7"])
    with producer_on(settings, server) as other:
        answer(server, "image", drawn)
        assert other.result(drawn, timeout_s=5) == "image out"
        assert other.cancel(own) is True
        with pytest.raises(UnknownRequest):
            other.result("never-submitted", timeout_s=5)


def test_a_producer_finds_ids_of_a_model_only_the_fleet_names(
    server: fakeredis.FakeServer, producer: Producer
) -> None:
    """A producer configured for other models looks for an id among the models the fleet
    serves (as its batchers publish them), not only its own."""
    drawn = producer.submit("image", 1)
    policy = encode_policy(ModelPolicy(max_queue_len=10))
    fakeredis.FakeRedis(server=server).hset(KEYS.policies(), "image", policy)
    answer(server, "image", drawn)
    with producer_on(Settings(redis_url="redis://fake:6379/0"), server) as other:
        assert other.result(drawn, timeout_s=5) == "image out"


def test_one_wait_gets_the_answers_of_several_models(
    server: fakeredis.FakeServer, producer: Producer
) -> None:
    """A wait on ids of two models listens on the producer's inbox of each."""
    ids = {model: producer.submit(model, model) for model in MODELS}
    got: list[Result] = []
    waiter = threading.Thread(target=lambda: got.extend(producer.results(list(ids.values()), 30)))
    waiter.start()
    client = fakeredis.FakeRedis(server=server)
    for model, request_id in ids.items():
        inbox = KEYS.inbox(model, producer.producer_id)
        while not names_waiter(client.get(KEYS.record(model, request_id)), inbox):  # it waits now
            waiter.join(timeout=0.01)
        answer(server, model, request_id)
    waiter.join(timeout=30)
    assert {result.request_id: result.output for result in got} == {
        request_id: f"{model} out" for model, request_id in ids.items()
    }


def test_an_id_one_model_holds_is_refused_for_another(
    server: fakeredis.FakeServer, producer: Producer
) -> None:
    """The same id for another model is RequestIdConflict (counted in that model's stats),
    and with it the rest of its chunk is withheld; for the same model it stays idempotent."""
    producer.submit("text", "a", request_id="shared")
    with pytest.raises(RequestIdConflict) as refused:
        producer.submit_many("image", ["b", "c"], request_ids=["fresh", "shared"])
    assert refused.value.conflicting_ids == ["shared"]
    assert queued(server, "image") == 0
    counted = fakeredis.FakeRedis(server=server).hget(KEYS.stats("image"), CONFLICTS)
    assert counted == b"1"
    assert producer.submit("text", "a", request_id="shared") == "shared"
    assert queued(server, "text") == 1


def test_async_single_submits_refuse_only_the_id_another_model_holds(
    settings: Settings, server: fakeredis.FakeServer, producer: Producer
) -> None:
    """Single submits made at once are admitted each as if alone: the id another model holds
    is refused, the others are taken; that id is then found by its id alone, in its model."""
    producer.submit("text", "a", request_id="shared")

    async def scenario() -> tuple[list[str | BaseException], bool]:
        client = fakeredis.aioredis.FakeRedis(server=server)
        async with AsyncProducer(settings, client=client, listen_client=client) as other:
            submits = await asyncio.gather(
                other.submit("image", "b", request_id="shared"),
                other.submit("image", "c", request_id="fresh"),
                other.submit("image", "d"),
                return_exceptions=True,
            )
            return submits, await other.cancel("shared")

    (conflict, fresh, drawn), cancelled = asyncio.run(scenario())
    assert isinstance(conflict, RequestIdConflict)
    assert fresh == "fresh" and isinstance(drawn, str)
    assert queued(server, "image") == 2
    assert cancelled is True and queued(server, "text") == 0
