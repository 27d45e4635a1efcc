"""Bulk jobs: a JSONL file of requests through the fleet, results written as they complete.

The file's lines, the job's request ids and what earlier runs wrote are ``bulk_files``'
business. A rerun of a job never runs a request twice: lines already answered in the output
or errors file are skipped, and requests still in the fleet from an interrupted run are
waited for, not sent again. The file streams through in waves of ``window`` lines (two in
flight); memory holds those waves and a 64-bit hash of each line's custom_id. Each request
may wait ``DEADLINE_S`` (24 h) in the queue: a bulk job is not interactive. A job with a
window (``JobOptions.expires_at``, a Batch API job's) sends nothing once it has passed.

Output lines: ``{"custom_id", "output"}``; error lines (in a file of their own):
``{"custom_id", "line", "error": {"code", "message"}}``, ``custom_id`` null for a line that
could not be read. The summary's figures come from the requests this run sent; answers
of requests sent by an earlier run are written but not timed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from config.errors import (
    QueueFull,
    RequestIdConflict,
    RequestRejected,
    ResultTimeout,
    UnknownRequest,
)
from config.schema import Result
from producer.client import Producer
from workers.tools.bulk_files import (
    BadLine,
    EarlierRuns,
    Line,
    claim_output,
    count_lines,
    custom_id_key,
    default_job_id,
    drop_partial_line,
    parse_line,
    read_earlier_runs,
    request_id_for,
)
from workers.tools.load_stats import TABLE_HEADER, RunStats, Sample, table_line
from workers.tools.pricing import run_cost

WINDOW = 2048
SAMPLES_KEPT = 10_000
DEADLINE_S = 24 * 3600.0
QUEUE_FULL_BACKOFF_S = (0.05, 2.0)
# The least a request sent just before its job's window ends may wait.
MIN_DEADLINE_S = 1.0
# The error line of a line the job's window ended before it was sent (OpenAI's code).
BATCH_EXPIRED = "batch_expired"
# A wave's answers are waited for in slices this long, to see between them whether to stop.
COLLECT_SLICE_S = 5.0


@dataclass
class BulkReport:
    """What a bulk run did: answers written, errors by code, lines skipped (answered or
    reported by an earlier run, or blank); for the summary table, exact counts and model
    time of the requests this run sent, and the client's view of a uniform sample of them
    (outputs dropped: memory stays bounded)."""

    total_lines: int = 0
    skipped: int = 0
    blank: int = 0
    written: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    errors_earlier: int = 0
    interrupted: bool = False
    expired: bool = False  # the job's window ended with lines of it never sent
    tokens: int = 0
    answered: int = 0
    completed: int = 0
    answered_earlier: int = 0
    first_sent: float | None = None
    last_answered: float | None = None
    busy_s: float = 0.0
    calls: dict[tuple[str, str, float], int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    # Worker process -> the device it runs on (``node_status.device_of``), for pricing:
    # processes sharing a GPU are one device. A worker missing here is a device of its own.
    device_of: dict[str, str] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def workers(self) -> set[str]:
        """The worker processes whose model calls ran the requests this run sent."""
        return {worker for worker, _, _ in self.calls} - {""}

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def failed_lines(self) -> int:
        """Lines of the job that ended in an error: reported now or by an earlier run."""
        return sum(self.errors.values()) + self.errors_earlier

    def answered_request(self, sample: Sample, sent_by_this_run: bool = True) -> None:
        """Counts a request the fleet answered. One this run sent is timed: kept in the
        sample with probability ``SAMPLES_KEPT / answered`` (reservoir sampling), its model
        call counted once; one an earlier run sent is only counted."""
        if not sent_by_this_run:
            self.answered_earlier += 1
            return
        self.answered += 1
        result = sample.result
        self.completed += result.error is None
        self.first_sent = min(self.first_sent or sample.sent_at, sample.sent_at)
        self.last_answered = max(self.last_answered or sample.answered_at, sample.answered_at)
        call = (result.worker or "", result.batch_id or "", result.model_s)
        if result.batch_id is not None and call not in self.calls:
            self.calls[call] = result.batch_size or 1
            self.busy_s += result.model_s
        slim = Sample(
            sample.sent_at, sample.answered_at, result.model_copy(update={"output": None})
        )
        if len(self.samples) < SAMPLES_KEPT:
            self.samples.append(slim)
        elif (slot := self._rng.randrange(self.answered)) < SAMPLES_KEPT:
            self.samples[slot] = slim

    def summary(self, model: str) -> dict[str, Any]:
        """The demo's figures for the requests this run sent: latencies from the sample,
        the rest exact; the mean batch is the mean size of the model calls that ran them."""
        summary = RunStats(model, "file", len(self.samples), self.samples).summary()
        window_s = (self.last_answered or 0.0) - (self.first_sent or 0.0)
        devices = max(1, len({self.device_of.get(worker, worker) for worker in self.workers()}))
        sizes = list(self.calls.values())
        summary.update(
            sent=self.answered,
            completed=self.completed,
            window_s=round(window_s, 3),
            throughput_rps=round(self.completed / window_s, 1) if window_s > 0 else 0.0,
            batches=len(sizes),
            mean_batch_size=round(sum(sizes) / len(sizes), 2) if sizes else 0.0,
            busy_fraction=(
                round(min(1.0, self.busy_s / (window_s * devices)), 3) if window_s > 0 else 0.0
            ),
            devices=devices,
        )
        return summary


class LineFormat(Protocol):
    """How a job writes its answer and error lines. The lines' ``custom_id`` and ``error``
    (an object with ``code``, on error lines only) and error lines' ``line`` must stay where
    they are: a rerun reads them to resume."""

    def answer(self, line: Line, result: Result) -> dict[str, Any]:
        """The answer line of ``line``; ValueError when ``result`` has no fit output (the
        line then gets a ``model_error`` line)."""
        ...

    def error(self, custom_id: str | None, number: int, code: str, message: str) -> dict[str, Any]:
        """The error line of line ``number``."""
        ...


class PlainLines:
    """``{"custom_id", "output"}`` and ``{"custom_id", "line", "error": {"code", "message"}}``."""

    def answer(self, line: Line, result: Result) -> dict[str, Any]:
        return {"custom_id": line.custom_id, "output": result.output}

    def error(self, custom_id: str | None, number: int, code: str, message: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "line": number, "error": {"code": code, "message": message}}


@dataclass(frozen=True)
class JobOptions:
    """How a bulk job runs: its id (request ids are derived from it), lines in flight per
    wave, how long each request may wait, how to count an input's tokens (for cost), how
    its lines are written, and whether to go on."""

    job_id: str
    window: int = WINDOW
    deadline_s: float = DEADLINE_S
    count_tokens: Callable[[Any], int] | None = None
    line_format: LineFormat = field(default_factory=PlainLines)
    # Asked before each wave: False stops the job once the waves sent are answered.
    keep_going: Callable[[], bool] = lambda: True
    # The job was stopped for good before this run (a batch cancelled while no gateway ran
    # it): this run sends nothing, and ends what earlier runs sent (``BulkJob.wind_down``).
    wind_down: bool = False
    # The end of the job's window (``time.time()``; None for none): no request waits past it,
    # and once it has passed nothing more is sent; the job winds down, each line never sent
    # getting a ``batch_expired`` error line.
    expires_at: float | None = None


class BulkJob:
    """Runs one file through ``producer`` for ``model``."""

    def __init__(
        self,
        producer: Producer,
        model: str,
        output: IO[str],
        errors: IO[str],
        report: BulkReport,
        options: JobOptions,
    ) -> None:
        self._producer = producer
        self._model = model
        self._output = output
        self._errors = errors
        self._report = report
        self._options = options
        self._started_at = time.time()
        self._unsent: list[Line] = []  # lines of a wave that stopped before they were sent

    def run(self, lines: Iterator[Line | BadLine], on_answer: Any) -> None:
        """Submits ``lines`` wave by wave, collecting each wave while the next one runs; once
        the job's window has passed, winds down the lines left (``wind_down``, expired)."""
        if self._options.wind_down:
            self.wind_down(lines, on_answer)
            return
        previous: dict[str, tuple[Line, float]] = {}
        while True:
            going = self._going()
            wave = self._submit(self._next_wave(lines, on_answer), on_answer) if going else {}
            if previous:
                self._collect(previous, on_answer)
            if not wave:
                break
            previous = wave
        if self._window_passed() and self._options.keep_going():
            self.wind_down(itertools.chain(self._unsent, lines), on_answer, expired=True)

    def wind_down(
        self, lines: Iterator[Line | BadLine], on_answer: Any, expired: bool = False
    ) -> None:
        """Sends nothing: cancels the request an earlier run sent for each of ``lines`` (those
        not yet answered) and writes what each ends with (``cancelled``, or its answer where
        it had one or was already running). A line never sent stays unwritten; ``expired``
        (the job's window has passed), it gets its error line, ``batch_expired`` (or its own,
        for a line that could not be read), and the report says the job expired."""
        sent: dict[str, tuple[Line, float]] = {}
        for line in lines:
            self._report.expired |= expired
            if isinstance(line, BadLine):
                if expired:
                    self._write_error(line.custom_id, line.number, line.code, line.message)
                    on_answer()
                continue
            request_id = request_id_for(self._model, self._options.job_id, line.custom_id)
            try:
                self._producer.cancel(request_id)
            except UnknownRequest:  # never sent (or its result is gone)
                if expired:
                    message = "the batch's completion window ended before this line was sent"
                    self._write_error(line.custom_id, line.number, BATCH_EXPIRED, message)
                    on_answer()
                continue
            sent[request_id] = (line, time.monotonic())
        if sent:
            self._collect(sent, on_answer)

    def _going(self) -> bool:
        """Whether to send more: the job is not told to stop, and its window is open."""
        return self._options.keep_going() and not self._window_passed()

    def _window_passed(self) -> bool:
        expires_at = self._options.expires_at
        return expires_at is not None and time.time() >= expires_at

    def _deadline_s(self) -> float:
        """How long a request sent now may wait: the job's ``deadline_s``, ending no later
        than its window (but at least ``MIN_DEADLINE_S``)."""
        expires_at = self._options.expires_at
        if expires_at is None:
            return self._options.deadline_s
        return max(MIN_DEADLINE_S, min(self._options.deadline_s, expires_at - time.time()))

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
            if len(wave) >= self._options.window:
                break
        return wave

    def _submit(
        self, wave: Sequence[Line], on_answer: Callable[[], None]
    ) -> dict[str, tuple[Line, float]]:
        """Enqueues ``wave`` with its lines' request ids, waiting for room when the queue is
        full, until the job is told to stop or its window passes (the lines not sent then are
        kept in ``_unsent``); returns the submitted lines by request id, with when each was
        sent."""
        job_id = self._options.job_id
        pending = {request_id_for(self._model, job_id, line.custom_id): line for line in wave}
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
                    deadline_s=self._deadline_s(),
                )
            except QueueFull as full:
                accepted = full.accepted_ids
                if not self._going():  # the rest is never sent
                    self._unsent += [line for rid, line in pending.items() if rid not in accepted]
                    pending = {rid: pending[rid] for rid in accepted}
                else:
                    time.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, QUEUE_FULL_BACKOFF_S[1])
            except RequestIdConflict as conflict:
                accepted = conflict.accepted_ids
                for request_id in conflict.conflicting_ids:
                    line = pending.pop(request_id)
                    message = f"custom_id {line.custom_id!r} was sent before with another input"
                    self._write_error(line.custom_id, line.number, conflict.reason, message)
                    on_answer()
            for request_id in accepted:
                sent[request_id] = (pending.pop(request_id), now)
        return sent

    def _collect(self, wave: dict[str, tuple[Line, float]], on_answer: Any) -> None:
        """Writes each answer of ``wave`` as it comes, however long the wave takes (each
        request ends by its deadline); once the job is told to stop, or its window has
        passed, what it still waits for is cancelled, and written as cancelled."""
        pending = list(wave)
        while pending:
            try:
                for result in self._producer.results(pending, timeout_s=COLLECT_SLICE_S):
                    line, sent_at = wave[result.request_id]
                    sent_by_this_run = (result.submitted_at or 0.0) >= self._started_at
                    sample = Sample(sent_at, time.monotonic(), result)
                    self._report.answered_request(sample, sent_by_this_run)
                    self._write_answer(line, result)
                    on_answer()
                return
            except ResultTimeout as waited:
                pending = waited.pending_ids
            if not self._going():
                for request_id in pending:
                    with contextlib.suppress(UnknownRequest):
                        self._producer.cancel(request_id)

    def _write_answer(self, line: Line, result: Result) -> None:
        if result.error is None:
            try:
                record = self._options.line_format.answer(line, result)
            except ValueError as exc:
                self._write_error(line.custom_id, line.number, "model_error", str(exc))
                return
            # One write a line: Ctrl-C lands between lines, never inside one.
            self._output.write(json.dumps(record) + "\n")
            self._output.flush()
            self._report.written += 1
            if self._options.count_tokens is not None:
                self._report.tokens += self._options.count_tokens(line.input)
        else:
            self._write_error(line.custom_id, line.number, result.error.code, result.error.message)

    def _write_error(self, custom_id: str | None, number: int, code: str, message: str) -> None:
        record = self._options.line_format.error(custom_id, number, code, message)
        self._errors.write(json.dumps(record) + "\n")
        self._errors.flush()
        self._report.error(code)


def submit_file(
    producer: Producer,
    model: str,
    path: Path,
    output: Path,
    errors: Path | None = None,
    console: Console | None = None,
    options: JobOptions | None = None,
) -> BulkReport:
    """Runs every request of the JSONL file ``path`` through the fleet (``run_file``) with a
    progress bar: answers appended to ``output``, errors to ``errors`` (default: ``output``
    with ``.errors.jsonl``); a rerun of the same job (``options.job_id``, by default the job
    of this file into this output) resumes. Ctrl-C stops it cleanly (``interrupted`` in the
    report). Each request may wait ``options.deadline_s`` (24 h, as a batch API's window) in
    the queue, whatever the model's interactive timeout. With ``options.count_tokens`` (the
    model's ``cost``), the report counts the tokens of the inputs answered."""
    errors = errors or output.with_suffix(".errors.jsonl")
    options = options or JobOptions(job_id=default_job_id(path, output))
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
    with progress:
        task = progress.add_task(model, total=None, rate="-")

        def on_progress(report: BulkReport) -> None:
            elapsed_s = time.monotonic() - started
            sent_off = report.written + sum(report.errors.values())
            rate = f"{sent_off / elapsed_s:.0f}" if elapsed_s > 0 else "-"
            done = sent_off + report.skipped + report.blank
            progress.update(task, total=report.total_lines, completed=done, rate=rate)

        return run_file(producer, model, path, output, errors, options, on_progress)


def run_file(
    producer: Producer,
    model: str,
    path: Path,
    output: Path,
    errors: Path,
    options: JobOptions,
    on_progress: Callable[[BulkReport], None],
) -> BulkReport:
    """Runs job ``options.job_id``: every line of ``path`` not ended by an earlier run of the
    job, answers appended to ``output`` and errors to ``errors``; ``on_progress`` is called
    with the report after each line ends. Ctrl-C stops it cleanly (``interrupted``).

    Raises:
        ConfigError: ``output`` holds another job's answers.
    """
    claim_output(output, options.job_id)
    for written in (output, errors):
        drop_partial_line(written)
    earlier = read_earlier_runs(output, errors)
    report = BulkReport(total_lines=count_lines(path))
    with (
        output.open("a", encoding="utf-8") as out,
        errors.open("a", encoding="utf-8") as err,
    ):

        def on_answer() -> None:
            on_progress(report)

        lines = lines_to_run(path, earlier, report, on_answer)
        try:
            BulkJob(producer, model, out, err, report, options).run(lines, on_answer)
        except KeyboardInterrupt:
            report.interrupted = True
    return report


def lines_to_run(
    path: Path, earlier: EarlierRuns, report: BulkReport, on_skip: Callable[[], None]
) -> Iterator[Line | BadLine]:
    """The lines of ``path`` still to run or report: a line an earlier run answered or
    reported, or a blank one, is counted in ``report`` and passed over; a custom_id on an
    earlier line is a ``duplicate_custom_id`` error of its own line."""
    seen: set[int] = set()
    with path.open(encoding="utf-8") as source:
        for number, text in enumerate(source, start=1):
            parsed = parse_line(number, text)
            if isinstance(parsed, Line) and custom_id_key(parsed.custom_id) in seen:
                parsed = BadLine(
                    number,
                    parsed.custom_id,
                    "duplicate_custom_id",
                    f"line {number}: custom_id {parsed.custom_id!r} is on an earlier line",
                )
            elif isinstance(parsed, Line):
                seen.add(custom_id_key(parsed.custom_id))
            outcome = None if parsed is None else earlier.outcome(parsed)
            if parsed is None:
                report.blank += 1
            elif outcome is not None:
                report.skipped += 1
                report.errors_earlier += outcome == "error"
            else:
                yield parsed
                continue
            on_skip()


def print_summary(
    report: BulkReport,
    model: str,
    source: str,
    job_id: str,
    gpu_cost_per_hour: float | None = None,
) -> None:
    """What happened to every line, the demo's table for the requests this run sent, and
    with a GPU price what the run cost (one device per GPU, or CPU worker, that answered)."""
    errors = ", ".join(f"{code} {count}" for code, count in sorted(report.errors.items()))
    blank = f", {report.blank} blank lines" if report.blank else ""
    print(
        f"batchfleet submit {source} (job {job_id}): {report.written} answered, "
        f"{sum(report.errors.values())} errors{f' ({errors})' if errors else ''}, "
        f"{report.skipped} skipped (answered or reported by an earlier run){blank}"
    )
    if report.answered_earlier:
        print(
            f"{report.answered_earlier} of the answers were to requests an earlier run sent:"
            " written, not timed"
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
    elif report.failed_lines():
        print(f"{report.failed_lines()} lines of the job ended in an error: see the errors file")


def exit_code(report: BulkReport) -> int:
    """130 for a job stopped by Ctrl-C, 1 for one with a line that ended in an error (in this
    run or an earlier one), else 0."""
    if report.interrupted:
        return 130
    return 1 if report.failed_lines() else 0
