"""Scenario 16 of the ledger: the request path on a Redis Cluster of three masters (the
batches on a Redis of their own), two models whose keys live on different masters, under
load; the master of one is SIGKILLed, left down until the cluster marks it failed, and
restarted on its AOF."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from config.keys import Keys
from tests.chaos.harness import PREFIX, Background, ChaosFleet, load_running, wait_until
from tests.chaos.ledger import MODEL, Ledger, LedgerReport, assert_nothing_lost
from workers.local.local_cluster import master_of

pytestmark = pytest.mark.cluster
MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]
MASTERS = 3
LOAD_S = 8.0
RATE = 50.0
# Admissions the other model takes while the first's master is down: it keeps serving.
SERVED_MEANWHILE = 25


def model_elsewhere(keys: Keys) -> str:
    """A model name whose keys live on another master than the ledger model's."""
    home = master_of(keys.stream(MODEL), MASTERS)
    names = (f"{MODEL}{n}" for n in range(2, 100))
    return next(name for name in names if master_of(keys.stream(name), MASTERS) != home)


def test_a_master_killed_under_load_and_restarted_on_its_aof(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    keys = Keys(PREFIX)
    other = model_elsewhere(keys)
    fleet = chaos_fleet("--appendfsync", "always", cluster=True, models=(MODEL, other))
    fleet.serve()
    assert fleet.cluster is not None
    victim = fleet.cluster.node_of(keys.stream(MODEL))
    # Ids the caller chooses are claimed in the index of ids, whose keys spread over every
    # master: the other model's callers let the producer draw theirs, so that their
    # admission needs their model's master alone.
    killed, spared = Ledger(), Ledger(model=other, id_prefix="o", drawn_ids=True)
    with fleet.producer() as second:
        with load_running(fleet, killed, seconds=LOAD_S, rate=RATE):
            other_load = Background(lambda: spared.open_loop(second, RATE, LOAD_S))
            wait_until(lambda: len(killed.accepted) > RATE)
            victim.crash()
            before = len(spared.accepted)
            # Down long enough for the cluster to mark it failed (CLUSTERDOWN for its slots).
            wait_until(lambda: fleet.cluster.marked_failed(victim))  # type: ignore[union-attr]
            wait_until(lambda: len(spared.accepted) >= before + SERVED_MEANWHILE)
            victim.start()
            fleet.cluster.wait_ok()
        other_load.join()
    assert fleet.settle(timeout_s=120), f"backlog {fleet.backlog()}\n{fleet.processes.logs()}"
    for ledger, what in ((killed, "its master killed"), (spared, "on another master")):
        report = record(fleet.account(f"16 Redis Cluster master SIGKILL: model {what}", ledger))
        assert_nothing_lost(report)
        assert report.ok == report.accepted
