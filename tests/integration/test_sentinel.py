"""The fleet on a Redis Sentinel group, named by one setting: producers, a batcher, a worker,
the Celery broker (kombu's Sentinel transport) and Flower all reach the master through the
sentinels."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import free_port
from workers.local.sentinel_group import NAME, SentinelGroup
from workers.models.synthetic import expected_output

from .conftest import check_outputs, producer_for, wait_ready
from .test_flower import AUTH, poll

pytestmark = pytest.mark.sentinel


@pytest.fixture
def sentinel_fleet() -> Iterator[LocalFleet]:
    """A fleet whose only Redis setting is a Sentinel group's URL and master name."""
    with SentinelGroup() as group:
        fleet = LocalFleet(
            {
                "BATCHFLEET_REDIS_URL": group.url,
                "BATCHFLEET_REDIS_SENTINEL_MASTER": NAME,
                "BATCHFLEET_KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}",
                "FLOWER_BASIC_AUTH": ":".join(AUTH),
            }
        )
        try:
            yield fleet
        finally:
            fleet.close()


def test_every_process_reaches_the_master_through_the_sentinels(
    sentinel_fleet: LocalFleet,
) -> None:
    """Requests are answered in batches, and Flower shows the batch tasks and the worker."""
    port = free_port()
    sentinel_fleet.start("batcher")
    sentinel_fleet.start("worker", "--cpu", "--name", "w1@sentinel")
    sentinel_fleet.start("flower", "--port", str(port))
    with producer_for(sentinel_fleet) as producer:
        wait_ready(producer, sentinel_fleet)
        inputs = [f"item {n}" for n in range(200)]
        ids = producer.submit_many("synthetic", inputs)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=60)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )
    api = f"http://127.0.0.1:{port}/api"
    tasks = poll(
        lambda: httpx.get(f"{api}/tasks", auth=AUTH, timeout=5).json(),
        lambda found: sum(str(task.get("args")).count("requests>") for task in found.values()) >= 2,
    )
    assert {task["worker"] for task in tasks.values() if task.get("worker")} == {"w1@sentinel"}
