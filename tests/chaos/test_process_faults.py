"""Scenarios 1, 2 and 12 of the ledger: workers and batchers killed or stopped under load."""

from __future__ import annotations

import signal
from collections.abc import Callable

from producer.client import Producer
from tests.chaos.harness import ChaosFleet, held_by, load_running, on_device_of, wait_until
from tests.chaos.ledger import MODEL, Ledger, LedgerReport, assert_nothing_lost
from tests.chaos.ledger_model import read_executions
from workers.protocol.capacity import FleetState, worker_member

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]
LOAD_S = 6.0


def under_load(fleet: ChaosFleet, ledger: Ledger, fault: Callable[[Producer], None]) -> None:
    """Runs the open-loop load, injects ``fault`` while it runs, and waits for the drain."""
    with load_running(fleet, ledger, seconds=LOAD_S) as (producer, _):
        fault(producer)
    assert fleet.settle(timeout_s=60), f"backlog {fleet.backlog()}\n{fleet.processes.logs()}"


def test_worker_killed_mid_batch_and_restarted(chaos_fleet: MakeFleet, record: Record) -> None:
    """A worker SIGKILLed while a batch is inside its model, then restarted under its name: the
    batch runs again, every request is answered once."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    victim = fleet.processes.start("worker", "--cpu", "--name", "victim@chaos")
    ledger = Ledger()

    def kill_and_restart(producer: Producer) -> None:
        in_model = ledger.send_new(producer, stall_s=0.8)
        wait_until(lambda: in_model in read_executions(fleet.executions_path))
        fleet.processes.stop(victim, signal.SIGKILL)
        fleet.processes.start("worker", "--cpu", "--name", "victim@chaos")

    under_load(fleet, ledger, kill_and_restart)
    report = record(fleet.account("1a worker SIGKILL mid-batch, restarted", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert report.reexecutions > 0


def test_worker_killed_mid_batch_while_another_remains(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """A worker SIGKILLed mid-batch and not restarted: the other worker answers everything."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    victim = fleet.processes.start("worker", "--cpu", "--name", "victim@chaos")
    fleet.processes.start("worker", "--cpu", "--name", "survivor@chaos")
    ledger = Ledger()

    def kill(_: Producer) -> None:
        wait_until(lambda: on_device_of(fleet, "victim@chaos") > 0)
        fleet.processes.stop(victim, signal.SIGKILL)

    under_load(fleet, ledger, kill)
    report = record(fleet.account("1b worker SIGKILL mid-batch, another remains", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted


def test_batcher_killed_after_read_before_dispatch(chaos_fleet: MakeFleet, record: Record) -> None:
    """A batcher SIGKILLed while it holds requests it read and had not dispatched: restarted
    under its name, it sends them at once."""
    # The batcher sees one live worker that is busy and keeps a long window: it reads the
    # requests and holds them for a fuller batch, undispatched.
    fleet = chaos_fleet(policy={"late_binding": False, "max_wait_s": 60})
    state = FleetState(fleet.client, fleet.keys, MODEL)
    state.heartbeat(worker_member("busy@chaos", 2), ttl_s=60)
    state.dispatched("running-batch", "size", lease_s=60)
    batcher = fleet.processes.start("batcher", "--name", "b1")
    ledger = Ledger()
    with fleet.producer() as producer:
        for _ in range(20):
            ledger.send_new(producer)
        wait_until(lambda: held_by(fleet, "b1") == 20)
        fleet.processes.stop(batcher, signal.SIGKILL)
        state.leave(worker_member("busy@chaos", 2))
        state.undispatched("running-batch")
        fleet.processes.start("worker", "--cpu")
        fleet.processes.start("batcher", "--name", "b1")
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account("2a batcher SIGKILL after read, before dispatch", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted == 20
    assert report.reexecutions == 0


def test_batcher_killed_under_load_and_replaced(chaos_fleet: MakeFleet, record: Record) -> None:
    """A batcher SIGKILLed under load while it holds requests (published to Celery or not yet),
    replaced by a batcher of another name: what it held is answered, what was published runs
    once."""
    fleet = chaos_fleet()
    batcher = fleet.processes.start("batcher", "--name", "b1")
    fleet.processes.start("worker", "--cpu")
    ledger = Ledger()

    def kill_and_replace(_: Producer) -> None:
        wait_until(lambda: held_by(fleet, "b1") > 0)
        fleet.processes.stop(batcher, signal.SIGKILL)
        fleet.processes.start("batcher", "--name", "b2")

    under_load(fleet, ledger, kill_and_replace)
    report = record(fleet.account("2b batcher SIGKILL under load, another batcher", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted


def test_workers_stopped_gracefully_in_turn(chaos_fleet: MakeFleet, record: Record) -> None:
    """SIGTERM to each of two workers in turn under load, each restarted once it has exited:
    running batches finish, nothing is lost."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    workers = {
        name: fleet.processes.start("worker", "--cpu", "--name", name)
        for name in ("w1@chaos", "w2@chaos")
    }
    ledger = Ledger()

    def stop_each_in_turn(_: Producer) -> None:
        for name, process in workers.items():
            wait_until(lambda name=name: on_device_of(fleet, name) > 0)
            assert fleet.processes.stop(process, signal.SIGTERM) == 0
            fleet.processes.start("worker", "--cpu", "--name", name)

    under_load(fleet, ledger, stop_each_in_turn)
    report = record(fleet.account("12 graceful SIGTERM of each worker in turn", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
