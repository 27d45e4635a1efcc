"""Scenarios 6 and 7 of the ledger: batches past their time limits, and poison inputs that
raise or kill their worker process."""

from __future__ import annotations

import random
from collections.abc import Callable

from tests.chaos.harness import ChaosFleet, load_running
from tests.chaos.ledger import MODEL, Ledger, LedgerReport, assert_nothing_lost

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]
MAX_ATTEMPTS = 2


def test_batch_past_the_soft_limit_keeps_its_results(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """A batch that runs past the soft limit (1 s) but within the hard limit (2 s) finishes
    with its results, and the worker's slots keep serving under load. It stays past the soft
    limit for longer than the worker's watch samples the model time (every 0.5 s), so the
    warning cannot fall between two samples."""
    fleet = chaos_fleet()
    fleet.serve()
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=5) as (producer, _):
        slow = ledger.send_new(producer, stall_s=1.6)
        assert producer.result(slow, timeout_s=30) == {"echo": ledger.accepted[slow]}
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account("6a batch past the soft time limit", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert "soft limit" in fleet.processes.logs()


def test_batch_stuck_past_the_hard_limit(chaos_fleet: MakeFleet, record: Record) -> None:
    """A model call stuck past the hard limit ends its worker (exit 70, restarted by its
    supervisor); the stuck request is retried alone and ends poison after max_attempts,
    every other request is answered."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    fleet.supervise("worker", "--cpu", "--name", "w@chaos")
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=5) as (producer, _):
        stuck = ledger.send_new(producer, stall_s=3600)
        (result,) = list(producer.results([stuck], timeout_s=90))
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account("6b batch stuck past the hard time limit", ledger))
    assert_nothing_lost(report)
    assert result.error is not None and result.error.code == "poison"
    assert report.errors == {"poison": 1}
    assert fleet.client.xlen(fleet.keys.dead_letter(MODEL)) == 1
    assert report.ok == report.accepted - 1
    assert fleet.starts["worker --cpu --name w@chaos"] <= MAX_ATTEMPTS + 1
    assert "past the hard limit" in fleet.processes.logs()


def test_poison_inputs_fail_alone(chaos_fleet: MakeFleet, record: Record) -> None:
    """Batches of 32 with poison at random positions: inputs on which the model raises, and one
    that kills the worker process. Innocents all succeed; inputs that raise end model_error at
    once, the one that kills its process ends poison within max_attempts; the worker is
    restarted a bounded number of times."""
    fleet = chaos_fleet(policy={"max_batch_size": 32})
    fleet.processes.start("batcher")
    fleet.supervise("worker", "--cpu", "--name", "w@chaos")
    ledger = Ledger()
    rng = random.Random(7)
    poison = {rng.randrange(32 * batch, 32 * (batch + 1)): "raise" for batch in range(3)}
    poison[rng.randrange(96, 128)] = "exit"
    with fleet.producer() as producer:
        fleet.wait_ready(producer)
        ids = [
            ledger.send_new(producer, **({"poison": poison[index]} if index in poison else {}))
            for index in range(128)
        ]
        results = {result.request_id: result for result in producer.results(ids, timeout_s=120)}
    assert fleet.settle(timeout_s=30), fleet.processes.logs()
    report = record(fleet.account("7 poison inputs (3 raise, 1 exit) in batches of 32", ledger))
    assert_nothing_lost(report)
    poisoned = {ids[index] for index in poison}
    assert {i for i, r in results.items() if not r.ok} == poisoned
    outcomes = {(kind, results[ids[index]].error.code) for index, kind in poison.items()}
    assert outcomes == {("raise", "model_error"), ("exit", "poison")}
    assert report.ok == 128 - len(poison)
    assert fleet.starts["worker --cpu --name w@chaos"] <= MAX_ATTEMPTS + 1
