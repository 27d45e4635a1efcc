"""Scenarios 9, 10 and 11 of the ledger: deadlines on a backlog, duplicate request ids, and
the result TTL against a late duplicate execution."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from config.errors import RequestIdConflict, UnknownRequest
from tests.chaos.harness import ChaosFleet, wait_until
from tests.chaos.ledger import MODEL, Ledger, LedgerReport, assert_nothing_lost
from tests.chaos.ledger_model import read_executions

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]


def test_a_backlog_past_its_deadlines_is_never_executed(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """Requests queued while no worker runs, whose deadlines pass before one starts, end
    expired and never reach the model; requests with time left all run."""
    fleet = chaos_fleet()
    fleet.processes.start("batcher")
    ledger = Ledger()
    with fleet.producer() as producer:
        short = [ledger.new_input() for _ in range(200)]
        for request_id, value in short:
            assert ledger.send(producer, value, request_id, deadline_s=0.5)
        patient = [ledger.send_new(producer) for _ in range(50)]
        time.sleep(0.6)  # the fault itself: the short deadlines pass while no worker runs
        fleet.processes.start("worker", "--cpu")
        fleet.wait_ready(producer)
    assert fleet.settle(timeout_s=30), fleet.processes.logs()
    report = record(fleet.account("9 backlog older than its deadlines", ledger))
    assert_nothing_lost(report)
    assert report.errors == {"expired": 200}
    assert report.ok == len(patient)
    assert not {request_id for request_id, _ in short} & set(read_executions(fleet.executions_path))


def test_duplicate_request_ids_run_once_and_answer_alike(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """The same id and input sent while in flight, 50 times at once, and after completion:
    accepted every time, executed once, one answer for every caller. The same id with another
    input is refused."""
    fleet = chaos_fleet()
    fleet.serve()
    ledger = Ledger()
    with fleet.producer() as producer:
        fleet.wait_ready(producer)
        request_id, value = ledger.new_input(stall_s=0.5)
        assert ledger.send(producer, value, request_id)
        wait_until(lambda: request_id in read_executions(fleet.executions_path))
        assert ledger.send(producer, value, request_id)  # while it runs
        barrier = threading.Barrier(50)
        accepted: Counter[bool] = Counter()

        def resend() -> None:
            barrier.wait()
            accepted[ledger.send(producer, value, request_id)] += 1

        senders = [threading.Thread(target=resend) for _ in range(50)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        answers = [producer.result(request_id, timeout_s=30) for _ in range(3)]
        assert ledger.send(producer, value, request_id)  # after completion
        with pytest.raises(RequestIdConflict):
            producer.submit(MODEL, {**value, "other": True}, request_id=request_id)
        assert producer.result(request_id, timeout_s=30) == answers[0]
    assert accepted == {True: 50}
    assert answers == [{"echo": value}] * 3
    assert fleet.settle(timeout_s=30)
    report = record(fleet.account("10 duplicate request ids", ledger))
    assert_nothing_lost(report)
    assert read_executions(fleet.executions_path).count(request_id) == 1
    assert report.reexecutions == 0


def test_an_expired_result_stays_gone_after_a_late_duplicate_execution(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """Before result_ttl_s the result; after it UnknownRequest; and the same request given
    again after that runs the model but cannot write the result back."""
    fleet = chaos_fleet(policy={"result_ttl_s": 1.5})
    fleet.processes.start("batcher")
    ledger = Ledger()
    with fleet.producer() as producer:
        request_id = ledger.send_new(producer)
        (entry,) = fleet.client.xrange(fleet.keys.stream(MODEL))
        fleet.processes.start("worker", "--cpu")
        assert producer.result(request_id, timeout_s=30) == {"echo": ledger.accepted[request_id]}
        wait_until(lambda: not fleet.client.exists(fleet.keys.result(MODEL, request_id)))
        with pytest.raises(UnknownRequest):
            producer.result(request_id, timeout_s=5)
        fleet.enqueue_again(entry)
        wait_until(lambda: read_executions(fleet.executions_path).count(request_id) == 2)
        stream = fleet.keys.stream(MODEL)  # the batch is done when its entry leaves
        wait_until(lambda: fleet.client.xlen(stream) == 0)
        with pytest.raises(UnknownRequest):
            producer.result(request_id, timeout_s=5)
    report = record(fleet.account("11 result TTL, then a late duplicate execution", ledger))
    assert fleet.writes()[request_id] == 1
    assert not report.duplicated
    assert report.reexecutions == 1
