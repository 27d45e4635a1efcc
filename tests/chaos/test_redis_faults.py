"""Scenarios 3, 4 and 5 of the ledger: Redis killed and restarted (with and without AOF), and
Redis frozen (SIGSTOP) for a while, each while callers wait with timeouts longer than the
outage."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from config.errors import UnknownRequest
from tests.chaos.harness import Callers, ChaosFleet, Waiter, load_running, wait_until
from tests.chaos.ledger import Ledger, LedgerReport, assert_nothing_lost

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]


def aof(fsync: str) -> tuple[str, ...]:
    return ("--appendonly", "yes", "--appendfsync", fsync)


def kill_redis_under_load(fleet: ChaosFleet, ledger: Ledger) -> Callers:
    """Redis SIGKILLed under load while callers wait, and restarted on its AOF: submits
    meanwhile are tried again until it is back, the callers wait through it, and the batcher
    and worker reconnect by themselves."""
    fleet.serve()
    with load_running(fleet, ledger, seconds=8) as (producer, load):
        wait_until(lambda: len(ledger.accepted) > 150)
        callers = Callers(producer, ledger)
        fleet.redis.crash()
        fleet.redis.start()
        load.join()
        callers.outcomes()
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    assert all(process.poll() is None for process in fleet.processes.processes)
    return callers


def test_redis_killed_and_restarted_with_aof_always_loses_nothing_and_writes_once(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """With ``appendfsync always`` Redis writes every change to disk before it answers
    anyone, so what any client saw survives the kill: every accepted request is answered,
    each answer written once, and every caller waiting through the kill gets its answers."""
    fleet = chaos_fleet(*aof("always"))
    ledger = Ledger()
    callers = kill_redis_under_load(fleet, ledger)
    report = record(fleet.account("3 Redis SIGKILL, restarted with AOF always", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert callers.all_answered(), callers.outcomes()


def test_redis_killed_with_aof_everysec_answers_right_or_says_unknown(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """With ``appendfsync everysec`` Redis may answer before its AOF write when a background
    fsync is slow, so a kill can take back the last moments' writes that clients already
    saw. The README's promise for it: no answer is wrong (one written again is the same
    request's), and a request whose admission was taken back is ``UnknownRequest`` to a
    caller asking for it, never a hang."""
    fleet = chaos_fleet(*aof("everysec"))
    ledger = Ledger()
    callers = kill_redis_under_load(fleet, ledger)
    report = record(fleet.account("3b Redis SIGKILL, restarted with AOF everysec", ledger))
    assert not report.wrong and not report.errors, report.table()
    stored = fleet.stored_results(ledger.model, list(ledger.accepted))
    taken_back = [request_id for request_id in ledger.accepted if request_id not in stored]
    assert report.ok + len(taken_back) == report.accepted
    with fleet.producer() as producer:
        for request_id in taken_back:
            with pytest.raises(UnknownRequest):
                producer.result(request_id, timeout_s=10)
    for outcome in callers.outcomes():  # answered, or told the request was taken back
        assert isinstance(outcome, UnknownRequest) or outcome.items() <= callers.expected.items()


def test_redis_restarted_without_persistence_strands_no_caller(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """Redis restarted empty: what was queued is gone (expected), but a waiting caller is told
    so (``UnknownRequest``) once Redis is back instead of waiting out its timeout, and the
    fleet serves new requests within seconds without any process restarted."""
    fleet = chaos_fleet()
    fleet.serve()
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=3) as (producer, load):
        wait_until(lambda: len(ledger.accepted) > 100)
        waiting = ledger.send_new(producer, stall_s=0.8)
        waiter = Waiter(producer, [waiting])
        fleet.redis.crash()
        fleet.redis.start()
        assert isinstance(waiter.outcome(), UnknownRequest)
        load.join()
        with pytest.raises(UnknownRequest):
            producer.result(waiting, timeout_s=10)
        fresh = Ledger(_next=10_000)
        recovered_at = time.monotonic()
        fresh_ids = [fresh.send_new(producer) for _ in range(20)]
        assert [producer.result(i, timeout_s=30) for i in fresh_ids] == [
            {"echo": fresh.accepted[i]} for i in fresh_ids
        ]
        recovery_s = time.monotonic() - recovered_at
    assert fleet.settle(timeout_s=30), fleet.processes.logs()
    report = record(
        fleet.account(
            "4 Redis restarted with no persistence (loss expected)",
            ledger,
            notes=f"20 new requests answered {recovery_s:.1f} s after the restart",
        )
    )
    assert not report.duplicated and not report.wrong
    assert all(process.poll() is None for process in fleet.processes.processes)


@pytest.mark.parametrize("frozen_s", [10, pytest.param(30, marks=pytest.mark.long)])
def test_redis_frozen_writes_no_result_twice(
    chaos_fleet: MakeFleet, record: Record, frozen_s: float
) -> None:
    """Redis stopped (SIGSTOP) under load for a while, then resumed: no result is written
    twice, nothing accepted is lost, every caller waiting through it gets its answers, and
    work resumes."""
    fleet = chaos_fleet()
    fleet.serve()
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=4) as (producer, load):
        wait_until(lambda: len(ledger.accepted) > 150)
        callers = Callers(producer, ledger)
        fleet.redis.send_signal(signal.SIGSTOP)
        time.sleep(frozen_s)  # the fault itself: Redis answers nobody for this long
        fleet.redis.send_signal(signal.SIGCONT)
        load.join()
        after = [ledger.send_new(producer) for _ in range(20)]
        assert [producer.result(i, timeout_s=60) for i in after] == [
            {"echo": ledger.accepted[i]} for i in after
        ]
        assert callers.all_answered(), callers.outcomes()
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account(f"5 Redis frozen (SIGSTOP) for {frozen_s} s", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert all(process.poll() is None for process in fleet.processes.processes)
