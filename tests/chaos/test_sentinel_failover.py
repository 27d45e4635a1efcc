"""Scenario 14 of the ledger: a Redis Sentinel group fails over under load while callers wait,
gracefully (``SENTINEL FAILOVER``) and unplanned (the master SIGKILLed), with the replica wait
(``redis_wait_replicas``) on and off."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from config.errors import UnknownRequest
from tests.chaos.harness import Callers, ChaosFleet, load_running, wait_until
from tests.chaos.ledger import Ledger, LedgerReport, assert_nothing_lost

pytestmark = pytest.mark.sentinel

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]


@pytest.mark.parametrize("wait_replicas", [0, 1], ids=["no replica wait", "replica wait"])
@pytest.mark.parametrize("unplanned", [False, True], ids=["graceful", "master killed"])
def test_a_failover_under_load_answers_every_accepted_request_once(
    chaos_fleet: MakeFleet, record: Record, unplanned: bool, wait_replicas: int
) -> None:
    """Every process follows the master to the replica the sentinels promote, and callers
    waiting through it get their answers, each once and right. With the replica wait on,
    nothing accepted is lost, graceful or not. Without it, what the old master accepted
    after the replica was promoted (until the sentinels say so, ~1 s) is taken back with it:
    the ledger reports it as lost, and a caller waiting for it hears ``UnknownRequest``. (With
    one replica, writes that wait for it are refused from the kill until the killed node is
    back as the new master's replica: submits retry meanwhile.)"""
    fleet = chaos_fleet(sentinel=True, wait_replicas=wait_replicas)
    assert fleet.group is not None
    fleet.serve()
    ledger = Ledger()
    with load_running(fleet, ledger, seconds=6) as (producer, load):
        wait_until(lambda: len(ledger.accepted) > 150)
        callers = Callers(producer, ledger)
        if unplanned:
            killed = fleet.group.kill_master()
            if wait_replicas:  # writes wait for a replica: the killed node must come back
                fleet.group.rejoin(killed)
        else:
            fleet.group.failover()
        load.join()
        outcomes = callers.outcomes()
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    how = "master SIGKILLed" if unplanned else "graceful"
    wait = "replica wait" if wait_replicas else "no replica wait"
    report = record(fleet.account(f"14 Sentinel failover, {how}, {wait}", ledger))
    assert not report.wrong and not report.errors and not report.duplicated, report.table()
    assert all(process.poll() is None for process in fleet.processes.processes)
    if wait_replicas:
        assert_nothing_lost(report)
        assert report.ok == report.accepted
        assert callers.all_answered(), outcomes
    else:
        assert report.ok + len(report.lost) == report.accepted, report.table()
        for outcome in outcomes:
            answered = (
                not isinstance(outcome, Exception) and outcome.items() <= callers.expected.items()
            )
            assert answered or isinstance(outcome, UnknownRequest), outcome
