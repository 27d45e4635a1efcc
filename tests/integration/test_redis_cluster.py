"""The request path on a Redis Cluster of three masters, the batch hop on a Redis of its own:
two models whose keys live on different masters, served end to end by one fleet, through the
blocking and the asyncio producer."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from config.keys import CONSUMER_GROUP, Keys, held_on_device
from config.settings import load_settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from tests.chaos.harness import wait_until
from workers.local.local_cluster import LocalCluster
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis
from workers.models.synthetic import expected_output
from workers.protocol.entries import to_text

from .conftest import check_outputs, wait_ready

pytestmark = pytest.mark.cluster
# Their keys land on different masters of an evenly split three-master cluster (checked).
MODELS = ("synthetic", "text")
PREFIX = "bf"


@pytest.fixture
def cluster_fleet() -> Iterator[tuple[LocalCluster, LocalFleet]]:
    """A fleet whose requests live on a three-master cluster and whose batches travel on a
    plain Redis."""
    with LocalCluster() as cluster, LocalRedis() as broker:
        models = {model: {"backend": "synthetic"} for model in MODELS}
        fleet = LocalFleet(
            {
                "BATCHFLEET_REDIS_URL": cluster.url,
                "BATCHFLEET_REDIS_CLUSTER": "true",
                "BATCHFLEET_BROKER_URL": broker.url,
                "BATCHFLEET_KEY_PREFIX": f"{PREFIX}{uuid.uuid4().hex[:6]}",
                "BATCHFLEET_MODELS": json.dumps(models),
            }
        )
        try:
            yield cluster, fleet
        finally:
            fleet.close()


def settings_of(fleet: LocalFleet) -> dict[str, str]:
    return {k: v for k, v in fleet.env.items() if k.startswith("BATCHFLEET_")}


def test_two_models_on_different_masters_are_served_end_to_end(
    cluster_fleet: tuple[LocalCluster, LocalFleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, fleet = cluster_fleet
    for name, value in settings_of(fleet).items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    keys = Keys(settings.key_prefix)
    masters = {cluster.node_of(keys.stream(model)).port for model in MODELS}
    assert len(masters) == len(MODELS), "the models' keys share a master"
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    inputs = {model: [f"{model} {n}" for n in range(100)] for model in MODELS}
    with Producer(settings) as producer:
        wait_ready(producer, fleet)
        outputs = {model: producer.infer(model, inputs[model], timeout_s=60) for model in MODELS}
        mine = producer.submit("text", "chosen id", request_id=f"mine-{uuid.uuid4().hex}")
        assert producer.result(mine, timeout_s=60) == expected_output("chosen id")
    for model in MODELS:
        check_outputs(
            dict(enumerate(outputs[model])),
            dict(enumerate(expected_output(value) for value in inputs[model])),
        )

    async def asynchronous() -> list[object]:
        async with AsyncProducer(settings) as producer:
            ids = await asyncio.gather(*(producer.submit(m, f"{m} async") for m in MODELS))
            with Producer(settings) as other:  # finds them by id alone, on their masters
                return [other.result(request_id, timeout_s=60) for request_id in ids]

    assert asyncio.run(asynchronous()) == [expected_output(f"{m} async") for m in MODELS]


@pytest.mark.parametrize(
    "waiting_policy", [{}, {"max_batch_size": 1}], ids=["tops-itself-up", "full"]
)
def test_a_slot_release_handed_to_another_models_batch_reaches_its_own_master(
    cluster_fleet: tuple[LocalCluster, LocalFleet],
    monkeypatch: pytest.MonkeyPatch,
    waiting_policy: dict[str, int],
) -> None:
    """One worker serves both models: a batch of one waits for the device while the other's
    runs, and gets the finished batch's slot release to send. It goes to the finished
    model's master, so that model's batch leaves in-flight, and the waiting batch runs and
    answers (sent to the wrong master, it failed that batch: its request was answered only
    when reclaimed, after the lease). The waiting batch tops itself up (the release follows
    its read) or is full (the release follows its claim, sent without waiting)."""
    cluster, fleet = cluster_fleet
    slow = {"backend": "synthetic", "options": {"base_ms": 300, "per_item_ms": 0}}
    fleet.env["BATCHFLEET_MODELS"] = json.dumps({"synthetic": slow, "text": waiting_policy})
    for name, value in settings_of(fleet).items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    keys = Keys(settings.key_prefix)
    first, second = MODELS
    stream = redis.Redis.from_url(cluster.node_of(keys.stream(first)).url)
    inflight = redis.Redis.from_url(cluster.node_of(keys.inflight(first)).url)
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with Producer(settings) as producer:
        wait_ready(producer, fleet)
        running = producer.submit(first, "runs first")
        wait_until(lambda: on_device(stream, keys.stream(first)))
        waiting = producer.submit(second, "waits for the device")
        before_reclaim_s = settings.batcher.reclaim_lease_s / 2
        answer = producer.result(waiting, timeout_s=before_reclaim_s)
        assert answer == expected_output("waits for the device")
        assert producer.result(running, timeout_s=60) == expected_output("runs first")
    assert inflight.zcard(keys.inflight(first)) == 0
    stream.close()
    inflight.close()


def on_device(client: redis.Redis, stream: str) -> bool:
    """Whether a worker's device holds a request of ``stream`` (it is in the model call)."""
    held = client.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10)
    return any(held_on_device(to_text(entry["consumer"])) for entry in held)
