"""Scenarios 8 and 13 of the ledger: a flood at ten times the fleet's capacity, and untrusted
input fuzzed at the producer, written straight into the stream and into the Celery queue."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from config.batch_task import RUN_BATCH_TASK
from config.errors import InvalidInput, RequestRejected
from config.schema import STREAM_FIELD, Result
from tests.chaos.harness import ChaosFleet, load_running
from tests.chaos.ledger import MODEL, Ledger, LedgerReport, assert_nothing_lost
from workers.protocol.celery_app import make_celery_app
from workers.tools.load_stats import percentile

MakeFleet = Callable[..., ChaosFleet]
Record = Callable[[LedgerReport], LedgerReport]
# One worker: a batch of 8 costs 100 + 8 x 5 ms, so the fleet serves ~57 requests a second.
SLOW_MODEL = {"base_ms": 100, "per_item_ms": 5}
CAPACITY = 8 / 0.140
FLOOD_S = 30.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RSS for {pid}")


@pytest.mark.long
def test_a_flood_at_ten_times_capacity_is_refused_fast_and_memory_stays_flat(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """30 s at 10x what the fleet can serve: the excess is refused with QueueFull without
    waiting, every accepted request finishes, and Redis memory and the batcher's and worker's
    RSS stop growing once the queue is full (Redis only by the results it keeps for their
    TTL, ~60 a second here)."""
    fleet = chaos_fleet(
        policy={"max_batch_size": 8, "max_queue_len": 300},
        model_options=SLOW_MODEL,
    )
    processes = {
        "batcher": fleet.processes.start("batcher"),
        "worker": fleet.processes.start("worker", "--cpu"),
    }
    ledger = Ledger()
    samples: list[dict[str, int]] = []

    def sample() -> None:
        memory = {name: rss_bytes(process.pid) for name, process in processes.items()}
        samples.append({**memory, "redis": int(fleet.client.info("memory")["used_memory"])})

    with load_running(fleet, ledger, FLOOD_S, rate=10 * CAPACITY) as (_, load):
        for _ in range(6):  # every 5 s of the flood, from the ramp's end (the queue fills in 1 s)
            load.join_for(FLOOD_S / 6)
            sample()
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    refusal_p99_ms = percentile(ledger.refusal_s, 99) * 1000
    growth = {name: samples[-1][name] - samples[0][name] for name in samples[0]}
    report = record(
        fleet.account(
            f"8 flood at 10x capacity ({10 * CAPACITY:.0f} req/s) for {FLOOD_S:.0f} s",
            ledger,
            notes=f"refusal p99 {refusal_p99_ms:.1f} ms; growth after the ramp: "
            + ", ".join(f"{name} {value / 1e6:+.1f} MB" for name, value in growth.items()),
        )
    )
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert report.refused["QueueFull"] > report.accepted
    assert max(ledger.refusal_s) < 1.0, "a full queue refuses at once, it never waits for room"
    assert growth["redis"] < 4e6 and growth["batcher"] < 8e6 and growth["worker"] < 8e6, growth


BAD_INPUTS: list[tuple[Any, dict[str, Any], type[RequestRejected]]] = [
    (float("nan"), {}, InvalidInput),
    ({"x": float("inf")}, {}, InvalidInput),
    ("\ud800 lone surrogate", {}, InvalidInput),
    (b"raw bytes", {}, InvalidInput),
    ({1, 2}, {}, InvalidInput),
    ("x" * (2 << 20), {}, InvalidInput),
    ("ok", {"request_id": "has space"}, InvalidInput),
    ("ok", {"request_id": "x" * 500}, InvalidInput),
    ("ok", {"deadline_s": float("nan")}, InvalidInput),
]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def stream_garbage(rng: random.Random) -> list[dict[str, bytes | str]]:
    """Stream entries no producer would write: random bytes, invalid UTF-8, JSON of the wrong
    shape, NaN, deep nesting, a huge field, a wrong field name."""
    entries: list[dict[str, bytes | str]] = [
        {STREAM_FIELD: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))}
        for _ in range(40)
    ]
    entries += [
        {STREAM_FIELD: b"\xff\xfe not utf-8"},
        {STREAM_FIELD: "[]"},
        {STREAM_FIELD: json.dumps({"request_id": "no-input"})},
        {STREAM_FIELD: '{"request_id": "nan", "input": NaN}'},
        {STREAM_FIELD: '{"request_id": "deep", "input": ' + "[" * 5000 + "]" * 5000 + "}"},
        {STREAM_FIELD: json.dumps({"request_id": "huge", "input": "x" * (2 << 20)})},
        {"not-the-field": "x"},
    ]
    return entries


def test_untrusted_input_is_refused_typed_and_harms_no_one(
    chaos_fleet: MakeFleet, record: Record
) -> None:
    """Bad input at the producer raises typed errors; garbage written straight into the stream
    and non-JSON or malformed messages on the Celery queue crash no process; the valid traffic
    sent meanwhile is all answered."""
    fleet = chaos_fleet()
    batcher = fleet.processes.start("batcher")
    worker = fleet.processes.start("worker", "--cpu")
    ledger = Ledger()
    rng = random.Random(13)
    with load_running(fleet, ledger, seconds=6) as (producer, _):
        for value, options, error in BAD_INPUTS:
            with pytest.raises(error):
                producer.submit(MODEL, value, **options)
        with pytest.raises(InvalidInput):
            producer.submit(MODEL, nested(5000))
        stream = fleet.keys.stream(MODEL)
        for fields in stream_garbage(rng):
            fleet.client.xadd(stream, fields)  # type: ignore[arg-type]
        queue = fleet.keys.celery_queue(MODEL)
        with make_celery_app(fleet.settings).connection_for_write() as connection:
            publish = connection.Producer().publish
            headers = {"task": RUN_BATCH_TASK, "lang": "py"}
            publish(
                [[MODEL, "evil", [["0-1", "{}"]]], {}, {}],
                routing_key=queue,
                serializer="pickle",
                headers={**headers, "id": str(uuid.uuid4())},
            )
            for args in ([MODEL], ["no-such-model", "b", []], [MODEL, "b", "not entries"]):
                publish(
                    [args, {}, {}],
                    routing_key=queue,
                    serializer="json",
                    headers={**headers, "id": str(uuid.uuid4())},
                )
    assert fleet.settle(timeout_s=60), fleet.processes.logs()
    report = record(fleet.account("13 untrusted input at every hop, under load", ledger))
    assert_nothing_lost(report)
    assert report.ok == report.accepted
    assert batcher.poll() is None and worker.poll() is None, fleet.processes.logs()
    assert "pickle" in fleet.processes.logs()
    for request_id in ("no-input", "nan", "huge"):  # entries that name their request
        raw = fleet.client.get(fleet.keys.result(MODEL, request_id))
        assert raw is not None, request_id
        error = Result.decode(raw).error
        assert error is not None and error.code == "invalid_input", (request_id, error)
