"""Bulk jobs: a JSONL file of requests through the fleet, results written as they complete.

One request per line, in the OpenAI Batch input format (``{"custom_id", "body": {...}}``: the
body's ``input``, else the body without its ``model``, is the request's input) or plain
(``{"custom_id", "input"}``). Each line's request id is derived from the model and its
``custom_id``, so a rerun never runs a request twice: lines already answered in the output or
errors file are skipped, and requests still in the fleet from an interrupted run are waited
for, not sent again. The file streams through in waves of ``window`` lines (two in flight);
memory holds those waves and a 64-bit hash of each line's custom_id (about 70 bytes each in
a Python set), to skip lines answered before a rerun and to report a custom_id used twice.
Each request may wait ``DEADLINE_S`` (24 h) in the queue: a bulk job is not interactive.

Output lines: ``{"custom_id", "output"}``; error lines (in a file of their own):
``{"custom_id", "line", "error": {"code", "message"}}``, ``custom_id`` null for a line that
could not be read.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from config.errors import QueueFull, RequestIdConflict, RequestRejected
from config.schema import Result
from producer.client import Producer
from workers.load_stats import TABLE_HEADER, RunStats, Sample, table_line
from workers.pricing import run_cost

WINDOW = 2048
SAMPLES_KEPT = 10_000
DEADLINE_S = 24 * 3600.0
QUEUE_FULL_BACKOFF_S = (0.05, 2.0)


@dataclass(frozen=True)
class Line:
    """One request read from the file."""

    number: int
    custom_id: str
    input: Any


@dataclass(frozen=True)
class BadLine:
    """A line that is no request, with why."""

    number: int
    custom_id: str | None
    code: str
    message: str


@dataclass
class BulkReport:
    """What a bulk run did: answers written, errors by code, lines skipped as already
    answered; for the summary table, exact counts and model time, and the client's view of
    a uniform sample of the requests answered (outputs dropped: memory stays bounded)."""

    total_lines: int = 0
    skipped: int = 0
    written: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    tokens: int = 0
    answered: int = 0
    first_sent: float | None = None
    last_answered: float | None = None
    busy_s: float = 0.0
    calls: set[tuple[str, str, float]] = field(default_factory=set)
    samples: list[Sample] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def answered_request(self, sample: Sample) -> None:
        """Counts a request the fleet answered, keeping it in the sample with probability
        ``SAMPLES_KEPT / answered`` (reservoir sampling)."""
        self.answered += 1
        self.first_sent = min(self.first_sent or sample.sent_at, sample.sent_at)
        self.last_answered = max(self.last_answered or sample.answered_at, sample.answered_at)
        result = sample.result
        call = (result.worker or "", result.batch_id or "", result.model_s)
        if call not in self.calls:
            self.calls.add(call)
            self.busy_s += result.model_s
        slim = Sample(
            sample.sent_at, sample.answered_at, result.model_copy(update={"output": None})
        )
        if len(self.samples) < SAMPLES_KEPT:
            self.samples.append(slim)
        elif (slot := self._rng.randrange(self.answered)) < SAMPLES_KEPT:
            self.samples[slot] = slim

    def summary(self, model: str) -> dict[str, Any]:
        """The demo's figures: latencies from the sample, the rest exact."""
        summary = RunStats(model, "file", len(self.samples), self.samples).summary()
        window_s = (self.last_answered or 0.0) - (self.first_sent or 0.0)
        devices = max(1, len({worker for worker, _, _ in self.calls} - {""}))
        summary.update(
            sent=self.answered,
            completed=self.written,
            window_s=round(window_s, 3),
            throughput_rps=round(self.written / window_s, 1) if window_s > 0 else 0.0,
            batches=len(self.calls),
            mean_batch_size=round(self.answered / len(self.calls), 2) if self.calls else 0.0,
            busy_fraction=round(self.busy_s / (window_s * devices), 3) if window_s > 0 else 0.0,
            devices=devices,
        )
        return summary


def request_id_for(model: str, custom_id: str) -> str:
    """The request id of a line: the same for the same model and custom_id in every run."""
    return "bulk-" + hashlib.blake2b(f"{model}\0{custom_id}".encode(), digest_size=20).hexdigest()


def _key(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "big")


def parse_line(number: int, text: str) -> Line | BadLine | None:
    """The request on one line; None for a blank line."""
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadLine(number, None, "invalid_line", f"line {number}: not JSON: {exc.msg}")
    if not isinstance(record, dict):
        return BadLine(number, None, "invalid_line", f"line {number}: not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(number, None, "invalid_line", f"line {number}: no string custom_id")
    if "input" in record:
        return Line(number, custom_id, record["input"])
    body = record.get("body")
    if isinstance(body, dict) and body:
        if "input" in body:
            return Line(number, custom_id, body["input"])
        fields = {key: value for key, value in body.items() if key != "model"}
        if fields:
            return Line(number, custom_id, fields)
    return BadLine(
        number, custom_id, "invalid_line", f"line {number}: neither an input nor a request body"
    )


def answered_ids(*paths: Path) -> set[int]:
    """Hashes of the custom_ids already written to the output or errors files."""
    done: set[int] = set()
    for path in paths:
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for text in lines:
                try:
                    custom_id = json.loads(text).get("custom_id")
                except (json.JSONDecodeError, AttributeError):
                    continue  # a line cut short by a crash: its request is asked again
                if isinstance(custom_id, str):
                    done.add(_key(custom_id))
    return done


def count_lines(path: Path) -> int:
    with path.open("rb") as source:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: source.read(1 << 20), b""))


class BulkJob:
    """Runs one file through ``producer`` for ``model``."""

    def __init__(
        self,
        producer: Producer,
        model: str,
        output: IO[str],
        errors: IO[str],
        report: BulkReport,
        window: int = WINDOW,
        count_tokens: Callable[[Any], int] | None = None,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self._producer = producer
        self._model = model
        self._output = output
        self._errors = errors
        self._report = report
        self._window = window
        self._count_tokens = count_tokens
        self._deadline_s = deadline_s

    def run(self, lines: Iterator[Line | BadLine], on_answer: Any) -> None:
        """Submits ``lines`` wave by wave, collecting each wave while the next one runs."""
        previous: dict[str, tuple[Line, float]] = {}
        while True:
            wave = self._submit(self._next_wave(lines, on_answer))
            if previous:
                self._collect(previous, on_answer)
            if not wave:
                return
            previous = wave

    def _next_wave(self, lines: Iterator[Line | BadLine], on_answer: Any) -> list[Line]:
        wave: list[Line] = []
        for line in lines:
            if isinstance(line, BadLine):
                self._write_error(line.custom_id, line.number, line.code, line.message)
                on_answer()
                continue
            try:
                self._producer.validate(self._model, line.input)
            except RequestRejected as refusal:
                self._write_error(line.custom_id, line.number, refusal.reason, str(refusal))
                on_answer()
                continue
            wave.append(line)
            if len(wave) >= self._window:
                break
        return wave

    def _submit(self, wave: Sequence[Line]) -> dict[str, tuple[Line, float]]:
        """Enqueues ``wave`` with its lines' request ids, waiting for room when the queue is
        full; returns the submitted lines by request id, with when each was sent."""
        pending = {request_id_for(self._model, line.custom_id): line for line in wave}
        sent: dict[str, tuple[Line, float]] = {}
        backoff_s = QUEUE_FULL_BACKOFF_S[0]
        while pending:
            ids = list(pending)
            now = time.monotonic()
            try:
                accepted = self._producer.submit_many(
                    self._model,
                    [pending[rid].input for rid in ids],
                    request_ids=ids,
                    deadline_s=self._deadline_s,
                )
            except QueueFull as full:
                accepted = full.accepted_ids
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, QUEUE_FULL_BACKOFF_S[1])
            except RequestIdConflict as conflict:
                accepted = conflict.accepted_ids
                for request_id in conflict.conflicting_ids:
                    line = pending.pop(request_id)
                    message = f"custom_id {line.custom_id!r} was sent before with another input"
                    self._write_error(line.custom_id, line.number, conflict.reason, message)
            for request_id in accepted:
                sent[request_id] = (pending.pop(request_id), now)
        return sent

    def _collect(self, wave: dict[str, tuple[Line, float]], on_answer: Any) -> None:
        for result in self._producer.results(list(wave)):
            line, sent_at = wave[result.request_id]
            self._report.answered_request(Sample(sent_at, time.monotonic(), result))
            self._write_answer(line, result)
            on_answer()

    def _write_answer(self, line: Line, result: Result) -> None:
        if result.error is None:
            # One write a line: Ctrl-C lands between lines, never inside one.
            self._output.write(
                json.dumps({"custom_id": line.custom_id, "output": result.output}) + "\n"
            )
            self._output.flush()
            self._report.written += 1
            if self._count_tokens is not None:
                self._report.tokens += self._count_tokens(line.input)
        else:
            self._write_error(line.custom_id, line.number, result.error.code, result.error.message)

    def _write_error(self, custom_id: str | None, number: int, code: str, message: str) -> None:
        record = {
            "custom_id": custom_id,
            "line": number,
            "error": {"code": code, "message": message},
        }
        self._errors.write(json.dumps(record) + "\n")
        self._errors.flush()
        self._report.error(code)


def submit_file(
    producer: Producer,
    model: str,
    path: Path,
    output: Path,
    errors: Path | None = None,
    window: int = WINDOW,
    console: Console | None = None,
    count_tokens: Callable[[Any], int] | None = None,
    deadline_s: float = DEADLINE_S,
) -> BulkReport:
    """Runs every request of the JSONL file ``path`` through the fleet: answers appended to
    ``output``, errors to ``errors`` (default: ``output`` with ``.errors.jsonl``); a rerun
    resumes. Ctrl-C stops it cleanly (``interrupted`` in the report). Each request may wait
    ``deadline_s`` (24 h, as a batch API's window) in the queue, whatever the model's
    interactive timeout. With ``count_tokens`` (the model's ``cost``), the report counts the
    tokens of the inputs answered."""
    errors = errors or output.with_suffix(".errors.jsonl")
    done = answered_ids(output, errors)
    report = BulkReport(total_lines=count_lines(path))

    seen: set[int] = set()

    def remaining() -> Iterator[Line | BadLine]:
        with path.open(encoding="utf-8") as source:
            for number, text in enumerate(source, start=1):
                parsed = parse_line(number, text)
                if parsed is None or parsed.custom_id is None:
                    if parsed is not None:
                        yield parsed
                    continue
                key = _key(parsed.custom_id)
                if key in done:
                    report.skipped += 1
                elif key in seen:
                    yield BadLine(
                        number,
                        None,
                        "duplicate_custom_id",
                        f"line {number}: custom_id {parsed.custom_id!r} is on an earlier line",
                    )
                else:
                    seen.add(key)
                    yield parsed

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}/s"),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )
    started = time.monotonic()
    with (
        output.open("a", encoding="utf-8") as out,
        errors.open("a", encoding="utf-8") as err,
        progress,
    ):
        task = progress.add_task(model, total=report.total_lines - len(done), rate="-")

        def on_answer() -> None:
            elapsed_s = time.monotonic() - started
            finished = report.written + sum(report.errors.values())
            rate = f"{finished / elapsed_s:.0f}" if elapsed_s > 0 else "-"
            progress.update(task, completed=finished, rate=rate)

        try:
            job = BulkJob(producer, model, out, err, report, window, count_tokens, deadline_s)
            job.run(remaining(), on_answer)
        except KeyboardInterrupt:
            report.interrupted = True
    return report


def print_summary(
    report: BulkReport, model: str, source: str, gpu_cost_per_hour: float | None = None
) -> None:
    """The demo's table for the requests answered, what happened to every line, and with a
    GPU price what the run cost (one device per worker that answered)."""
    errors = ", ".join(f"{code} {count}" for code, count in sorted(report.errors.items()))
    print(
        f"batchfleet submit {source}: {report.written} answered, "
        f"{sum(report.errors.values())} errors{f' ({errors})' if errors else ''}, "
        f"{report.skipped} skipped (answered by an earlier run)"
    )
    if report.answered:
        summary = report.summary(model)
        print(TABLE_HEADER)
        print(table_line(summary))
        if gpu_cost_per_hour is not None:
            cost = run_cost(
                gpu_cost_per_hour,
                summary["devices"],
                summary["window_s"],
                summary["completed"],
                summary["busy_fraction"],
                report.tokens or None,
            )
            print(cost.describe(gpu_cost_per_hour))
    if report.interrupted:
        print("interrupted: run the same command again to resume")
