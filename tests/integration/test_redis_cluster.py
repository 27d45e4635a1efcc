"""The request path on a Redis Cluster of three masters, the batch hop on a Redis of its own:
two models whose keys live on different masters, served end to end by one fleet, through the
blocking and the asyncio producer."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from config.keys import Keys
from config.settings import load_settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from workers.local.local_cluster import LocalCluster
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis
from workers.models.synthetic import expected_output

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
