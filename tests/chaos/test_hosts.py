"""Scenario 15 of the ledger: a fleet across hosts (network namespaces, ``tests/chaos/hosts``)
whose network fails: a GPU host cut off from Redis mid-batch, a GPU host behind a slow, lossy
link, the client host cut off while its callers wait, a worker told to stop while its host
is cut off."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from config import node_status
from tests.chaos import hosts as namespaced
from tests.chaos.harness import (
    CHAOS_LIMITS,
    REDIS_HOST,
    Callers,
    ChaosFleet,
    load_running,
    on_device_of,
    wait_until,
)
from tests.chaos.hosts import CLIENT, Hosts
from tests.chaos.ledger import Ledger, LedgerReport, assert_nothing_lost
from workers.runtime.heartbeat import shutdown_grace_s

pytestmark = pytest.mark.hosts
Record = Callable[[LedgerReport], LedgerReport]
GPU_HOSTS = ("gpu-a", "gpu-b")
# The load outlasts the cut by this much: the cut-off host's batches are reclaimed meanwhile,
# and it rejoins under load.
LOAD_AFTER_CUT_S = 8.0
CLIENT_CUT_S = 10.0
# 200 ms more per round trip and 5% of frames lost, on the link of one GPU host.
DELAY_EACH_WAY_MS = 100
LOSS = 0.05
SLOW_LOAD_S = 10.0
# A process's own teardown once its grace period ends (Python and Celery exiting).
EXIT_SLACK_S = 5.0


@pytest.fixture
def hosts_fleet(tmp_path: Path) -> Iterator[tuple[Hosts, ChaosFleet]]:
    """A Redis host and two GPU hosts (CPU workers here), each GPU host with a batcher and a
    worker of its own; the test process is the client host."""
    why_not = namespaced.unavailable()
    if why_not is not None:
        pytest.skip(why_not)
    with Hosts([REDIS_HOST, *GPU_HOSTS]) as hosts:
        fleet = ChaosFleet(tmp_path, hosts=hosts).start()
        try:
            yield hosts, fleet
        finally:
            fleet.close()


def serve_on(hosts: Hosts, fleet: ChaosFleet, host: str) -> list[Any]:
    run_in = hosts.run_in(host)
    return [
        fleet.processes.start("batcher", "--name", f"batcher@{host}", wrapper=run_in),
        fleet.processes.start("worker", "--cpu", "--name", f"worker@{host}", wrapper=run_in),
    ]


def beat_at(fleet: ChaosFleet, host: str) -> float:
    """When the worker on ``host`` last published its status (its heartbeat), 0 if never."""
    at = fleet.client.hget(fleet.keys.node(f"worker@{host}"), node_status.AT)
    return float(at) if at else 0.0


@pytest.mark.parametrize("cut_s", [10.0, pytest.param(60.0, marks=pytest.mark.long)])
def test_a_gpu_host_cut_off_mid_batch(
    hosts_fleet: tuple[Hosts, ChaosFleet], record: Record, cut_s: float
) -> None:
    """gpu-a's link goes down (its packets dropped) while its worker has a batch on its
    device: the other host takes its requests over, every request is answered once, and
    gpu-a serves again when the link is back, with the processes it had."""
    hosts, fleet = hosts_fleet
    cut_off = serve_on(hosts, fleet, "gpu-a")
    serve_on(hosts, fleet, "gpu-b")
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=cut_s + LOAD_AFTER_CUT_S):
        wait_until(lambda: on_device_of(fleet, "worker@gpu-a") > 0)
        hosts.cut("gpu-a")
        time.sleep(cut_s)  # the fault itself: the link stays down this long
        healed_at = time.time()
        hosts.heal("gpu-a")
        wait_until(lambda: beat_at(fleet, "gpu-a") > healed_at, timeout_s=60)
    assert fleet.settle(timeout_s=120), f"backlog {fleet.backlog()}\n{fleet.processes.logs()}"
    scenario = f"15 GPU host cut off for {cut_s:.0f} s mid-batch"
    report = record(fleet.account(scenario, ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert all(process.poll() is None for process in cut_off), fleet.processes.logs()


def test_the_client_host_cut_off_while_its_callers_wait(
    hosts_fleet: tuple[Hosts, ChaosFleet], record: Record
) -> None:
    """The client's own link goes down for 10 s while its callers wait on requests the fleet
    is running: once it is back, every caller gets every answer, with no exception."""
    hosts, fleet = hosts_fleet
    for host in GPU_HOSTS:
        serve_on(hosts, fleet, host)
    ledger = Ledger()
    with fleet.producer() as producer:
        fleet.wait_ready(producer)
        callers = Callers(producer, ledger)
        hosts.cut(CLIENT)
        time.sleep(CLIENT_CUT_S)  # the fault itself
        hosts.heal(CLIENT)
        assert callers.all_answered(), callers.outcomes()
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account("15 client host cut off while its callers wait", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted


def test_a_worker_told_to_stop_while_its_host_is_cut_off_exits_in_its_grace_period(
    hosts_fleet: tuple[Hosts, ChaosFleet], record: Record
) -> None:
    """SIGTERM reaches gpu-a's worker just after its link went down (its packets dropped,
    every call waiting out a timeout): it exits within its grace period (the hard time limit
    and two socket timeouts) instead of hanging on Redis, and the other host answers what it
    held."""
    hosts, fleet = hosts_fleet
    victim = serve_on(hosts, fleet, "gpu-a")[1]
    serve_on(hosts, fleet, "gpu-b")
    limit = float(CHAOS_LIMITS["BATCHFLEET_WORKER__TIME_LIMIT_S"])
    worker_limits = fleet.settings.worker.model_copy(update={"time_limit_s": limit})
    grace_s = shutdown_grace_s(fleet.settings.model_copy(update={"worker": worker_limits}))
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=LOAD_AFTER_CUT_S):
        wait_until(lambda: on_device_of(fleet, "worker@gpu-a") > 0)
        hosts.cut("gpu-a")
        os.killpg(victim.pid, signal.SIGTERM)
        victim.wait(timeout=grace_s + EXIT_SLACK_S)
        hosts.heal("gpu-a")
    assert fleet.settle(timeout_s=120), f"backlog {fleet.backlog()}\n{fleet.processes.logs()}"
    report = record(fleet.account("15 worker told to stop while its host is cut off", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted


def test_a_gpu_host_behind_a_slow_lossy_link(
    hosts_fleet: tuple[Hosts, ChaosFleet], record: Record
) -> None:
    """gpu-a reaches Redis with 200 ms more per round trip and 5% of frames lost: the fleet
    keeps serving, every request answered once, gpu-a's processes still running."""
    hosts, fleet = hosts_fleet
    hosts.impair("gpu-a", DELAY_EACH_WAY_MS, LOSS)
    processes = {host: serve_on(hosts, fleet, host) for host in GPU_HOSTS}
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=SLOW_LOAD_S):
        pass
    assert fleet.settle(timeout_s=120), f"backlog {fleet.backlog()}\n{fleet.processes.logs()}"
    report = record(fleet.account("15 GPU host behind 200 ms and 5% loss", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert all(process.poll() is None for process in processes["gpu-a"]), "gpu-a gave up"
