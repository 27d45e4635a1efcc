"""Flower on the fleet's broker: behind basic auth, showing the workers and each batch task
with its size (never its inputs)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import free_port
from workers.models.synthetic import expected_output

from .conftest import check_outputs, producer_for, wait_ready

AUTH = ("admin", "s3cret-for-tests")


def poll(get: Callable[[], Any], until: Callable[[Any], bool], timeout_s: float = 60) -> Any:
    """``get()`` until ``until`` holds for its value (Flower learns of workers and tasks
    through Celery events, a moment after they happen)."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            value = get()
            if until(value):
                return value
        except httpx.TransportError:
            pass
        assert time.monotonic() < give_up, "Flower did not show it in time"
        time.sleep(0.5)


def following(api: str, worker: str) -> None:
    """Barrier: Flower receives the fleet's events (it saw ``worker``'s heartbeat), so it
    misses none of the batches sent from now on."""
    poll(
        lambda: httpx.get(f"{api}/workers", params={"status": 1}, auth=AUTH, timeout=5).json(),
        lambda found: found.get(worker) is True,
    )


def serve_and_show_in_flower(fleet: LocalFleet, worker: str) -> None:
    """Starts a batcher, a worker named ``worker`` and Flower on ``fleet`` (which has
    ``FLOWER_BASIC_AUTH`` set to ``AUTH``): requests are answered in batches, and Flower shows
    the batch tasks run by that worker."""
    port = free_port()
    fleet.start("batcher")
    fleet.start("worker", "--cpu", "--name", worker)
    fleet.start("flower", "--port", str(port))
    api = f"http://127.0.0.1:{port}/api"
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        following(api, worker)
        inputs = [f"item {n}" for n in range(200)]
        ids = producer.submit_many("synthetic", inputs)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=60)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )
    tasks = poll(
        lambda: httpx.get(f"{api}/tasks", auth=AUTH, timeout=5).json(),
        lambda found: sum(str(task.get("args")).count("requests>") for task in found.values()) >= 2,
    )
    assert {task["worker"] for task in tasks.values() if task.get("worker")} == {worker}


def test_flower_shows_the_workers_and_batch_sizes_behind_basic_auth(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    port = free_port()
    fleet = make_fleet(FLOWER_BASIC_AUTH=":".join(AUTH))
    fleet.start("batcher")
    fleet.start("worker", "--cpu", "--name", "w1@flower")
    fleet.start("flower", "--port", str(port))
    api = f"http://127.0.0.1:{port}/api"
    poll(lambda: httpx.get(f"{api}/workers", timeout=5).status_code, lambda code: code == 401)
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        following(api, "w1@flower")
        ids = producer.submit_many("synthetic", [f"secret input {n}" for n in range(40)])
        list(producer.results(ids, timeout_s=60))
    tasks = poll(
        lambda: httpx.get(f"{api}/tasks", auth=AUTH, timeout=5).json(),
        lambda found: sum(str(task.get("args")).count("requests>") for task in found.values()) >= 2,
    )
    assert not any("secret input" in str(task.get("args")) for task in tasks.values())
    assert {task["worker"] for task in tasks.values() if task.get("worker")} == {"w1@flower"}
    workers = poll(
        lambda: httpx.get(f"{api}/workers", params={"refresh": 1}, auth=AUTH, timeout=10).json(),
        lambda found: "w1@flower" in found,
    )
    assert "w1@flower" in workers


def test_a_worker_told_to_stop_publishes_the_events_it_still_held(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """A worker publishes its task events together, every 0.1 s; stopped (SIGTERM) the
    moment its batches are answered, it still publishes what it held: Flower shows every
    batch succeeded, with how many requests it ran."""
    port = free_port()
    fleet = make_fleet(FLOWER_BASIC_AUTH=":".join(AUTH))
    fleet.start("batcher")
    worker = fleet.start("worker", "--cpu", "--name", "w2@flower")
    fleet.start("flower", "--port", str(port))
    api = f"http://127.0.0.1:{port}/api"
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        following(api, "w2@flower")
        ids = producer.submit_many("synthetic", [f"input {n}" for n in range(40)])
        list(producer.results(ids, timeout_s=60))
    assert fleet.stop(worker) == 0, fleet.logs()
    tasks = poll(
        lambda: httpx.get(f"{api}/tasks", auth=AUTH, timeout=5).json(),
        lambda found: found and all(task["state"] == "SUCCESS" for task in found.values()),
        timeout_s=30,
    )
    assert sum(str(task.get("args")).count("requests>") for task in tasks.values()) >= 2
    ran = 0
    for task in tasks.values():  # the 40, and the warm-up's batch if Flower saw it
        shown = re.fullmatch(r"'(\d+) requests ran \((\d+) sent\)'", str(task.get("result")))
        assert shown, task
        assert f"<{shown.group(2)} requests>" in str(task.get("args")), task
        ran += int(shown.group(1))
    assert ran >= 40
