"""Controls: deliberately broken workers, to prove the ledger reports loss and duplicates when
they happen (a ledger that cannot see them would pass every scenario)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.chaos.harness import ChaosFleet, wait_until
from tests.chaos.ledger import MODEL, Ledger, LedgerReport
from tests.chaos.ledger_model import read_executions

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]
BROKEN = "tests.chaos.broken_worker"


def test_the_ledger_reports_loss_from_a_worker_that_acks_on_receipt(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """A worker that acknowledges requests before writing their results, killed while one is
    in its model: that request is never answered, and the ledger says lost."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    broken = fleet.processes.start("ack-on-receipt", "worker", "--cpu", module=BROKEN)
    ledger = Ledger()
    with fleet.producer() as producer:
        fleet.wait_ready(producer)
        before = [ledger.send_new(producer) for _ in range(20)]
        for request_id in before:
            producer.result(request_id, timeout_s=30)
        victim = ledger.send_new(producer, stall_s=30)
        wait_until(lambda: victim in read_executions(fleet.executions_path))
        fleet.processes.stop(broken, signal.SIGKILL)
        fleet.processes.start("worker", "--cpu")
    assert not fleet.settle(timeout_s=10), "the acknowledged request left the stream"
    report = record(fleet.account("control: acks on receipt, killed mid-batch", ledger))
    assert report.lost == [victim], report.table()


def test_the_ledger_reports_a_second_answer_from_a_worker_that_overwrites(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """A worker that writes results without "first write wins", given a finished request
    again: the request's result is written twice, and the ledger says duplicated."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    ledger = Ledger()
    with fleet.producer() as producer:
        request_id = ledger.send_new(producer)
        (entry,) = fleet.client.xrange(fleet.keys.stream(MODEL))
        fleet.processes.start("overwrite", "worker", "--cpu", module=BROKEN)
        producer.result(request_id, timeout_s=30)
        fleet.enqueue_again(entry)
        wait_until(lambda: fleet.writes()[request_id] == 2)
    report = record(fleet.account("control: overwrites results, request given again", ledger))
    assert report.duplicated == [request_id], report.table()
