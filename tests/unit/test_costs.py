"""Batches formed by cost: the batcher prices each input with the model's ``cost`` and keeps
batches under ``max_batch_cost``, grouping inputs of similar cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest

from config.errors import ConfigError
from config.keys import Keys
from config.schema import STREAM_FIELD, Request, Result
from config.settings import ModelPolicy, Settings
from producer.client import Producer
from workers.batcher.model_batcher import ModelBatcher
from workers.models.registry import cost_function
from workers.protocol.capacity import FleetState, worker_member

from .test_batch_path import RecordingCelery, new_batcher

KEYS = Keys("bf")


class WordsModel:
    """Costs one unit per word; echoes."""

    version = "words-1"

    def setup(self, device: str) -> None:
        pass

    def cost(self, item: Any) -> int:
        return len(str(item).split())

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        return list(batch)


def batched_inputs(task: dict[str, Any], client: fakeredis.FakeRedis) -> list[Any]:
    """The inputs of a batch task's requests, read from their stream entries."""
    stream = KEYS.stream(task["args"][0])
    return [
        Request.decode(client.xrange(stream, entry_id, entry_id)[0][1][STREAM_FIELD.encode()]).input
        for entry_id, _ in task["args"][2]
    ]


@pytest.fixture
def fleet(
    fake_redis: fakeredis.FakeRedis,
) -> tuple[Settings, ModelBatcher, RecordingCelery, Producer]:
    policy = ModelPolicy(
        backend=f"{__name__}:WordsModel", max_batch_size=3, max_batch_cost=12, group_by_cost=True
    )
    settings = Settings(models={"words": policy})
    recorder = RecordingCelery(fake_redis, "words")
    batcher = new_batcher(settings, fake_redis, recorder, "words")
    FleetState(fake_redis, KEYS, "words").heartbeat(worker_member("w1", 1), 30)
    listen = fakeredis.FakeRedis(server=fake_redis.connection_pool.connection_kwargs["server"])
    return settings, batcher, recorder, Producer(settings, client=fake_redis, listen_client=listen)


def test_the_batcher_groups_by_cost_within_the_budget(
    fleet: tuple[Settings, ModelBatcher, RecordingCelery, Producer], fake_redis: fakeredis.FakeRedis
) -> None:
    """The oldest input leaves with the ones nearest its cost, and the padded cost of a batch
    (longest x size) stays under max_batch_cost."""
    _, batcher, recorder, producer = fleet
    producer.submit_many("words", ["a b c d", "x", "e f g h", "y", "i j k l", "z"])
    batcher.step()  # reads
    batcher.step()  # dispatches
    (first,) = recorder.sent
    assert batched_inputs(first, fake_redis) == ["a b c d", "e f g h", "i j k l"]  # 3 x 4 = 12
    assert first["args"][3] == "size"


def test_an_input_over_the_budget_alone_is_answered_invalid_input(
    fleet: tuple[Settings, ModelBatcher, RecordingCelery, Producer], fake_redis: fakeredis.FakeRedis
) -> None:
    """A request that costs more than max_batch_cost by itself gets a clear error at once; the
    queue behind it keeps moving."""
    _, batcher, recorder, producer = fleet
    too_long, short = producer.submit_many("words", [" ".join(["w"] * 13), "short one"])
    batcher.step()
    batcher.step()
    raw = fake_redis.get(KEYS.result("words", too_long))
    assert raw is not None
    error = Result.decode(raw).error
    assert error is not None and error.code == "invalid_input"
    assert "costs 13, over the model's max_batch_cost of 12" in error.message
    assert [batched_inputs(task, fake_redis) for task in recorder.sent] == [["short one"]]
    assert fake_redis.get(KEYS.result("words", short)) is None, (
        "the short one is batched, not answered"
    )


def test_costs_without_a_cost_method_are_a_config_error() -> None:
    """A policy that batches by cost for a model that reports none is refused at start."""
    with pytest.raises(ConfigError, match="has no cost"):
        cost_function(ModelPolicy(backend="synthetic", max_batch_cost=100))
    assert cost_function(ModelPolicy(backend="synthetic"))("anything") == 1
