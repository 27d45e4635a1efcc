"""Bulk jobs' pure parts: reading a line, naming the job's requests, resuming from what
earlier runs wrote, and a report whose memory stays bounded and whose figures are this run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.errors import ConfigError
from config.schema import Result
from workers.tools import bulk
from workers.tools.bulk import BulkReport, exit_code, lines_to_run
from workers.tools.bulk_files import (
    BadLine,
    Line,
    claim_output,
    count_lines,
    default_job_id,
    drop_partial_line,
    parse_line,
    read_earlier_runs,
    request_id_for,
)
from workers.tools.load_stats import Sample


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"custom_id": "a", "input": [1, 2]}', Line(1, "a", [1, 2])),
        ('{"custom_id": "b", "body": {"model": "m", "input": "hi"}}', Line(1, "b", "hi")),
        (
            '{"custom_id": "c", "body": {"model": "m", "messages": [{"role": "user"}]}}',
            Line(1, "c", {"messages": [{"role": "user"}]}),
        ),
        ("   ", None),
    ],
)
def test_a_line_is_plain_or_openai_batch(text: str, expected: Line | None) -> None:
    assert parse_line(1, text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{oops", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"input": 1}', "no string custom_id"),
        ('{"custom_id": "d", "body": {"model": "m"}}', "neither an input nor a request body"),
    ],
)
def test_a_bad_line_says_why_with_its_number(text: str, why: str) -> None:
    bad = parse_line(7, text)
    assert isinstance(bad, BadLine) and bad.code == "invalid_line"
    assert bad.message.startswith("line 7: ") and why in bad.message


def test_the_report_keeps_a_bounded_sample_and_exact_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50 answers from 10 model calls of 5: 10 samples kept, without outputs; throughput,
    batches, mean batch size and busy time exact."""
    monkeypatch.setattr(bulk, "SAMPLES_KEPT", 10)
    report = BulkReport()
    for n in range(50):
        result = Result(
            request_id=f"r{n}",
            model="m",
            output={"big": "x" * 1000},
            batch_id=f"b{n // 5}",
            batch_size=5,
            model_s=0.1,
            worker="w",
            finished_at=float(n),
        )
        report.answered_request(Sample(sent_at=0.0, answered_at=n / 10 + 0.1, result=result))
        report.written += 1
    assert len(report.samples) == 10 and report.answered == 50
    assert all(sample.result.output is None for sample in report.samples)
    summary = report.summary("m")
    assert summary["completed"] == 50 and summary["batches"] == 10
    assert summary["mean_batch_size"] == 5.0
    assert summary["window_s"] == pytest.approx(5.0)
    assert summary["throughput_rps"] == pytest.approx(10.0)
    assert summary["busy_fraction"] == pytest.approx(0.2)


def answer(n: int, batch: int, submitted_at: float = 100.0) -> Result:
    return Result(
        request_id=f"r{n}",
        model="m",
        output=n,
        batch_id=f"b{batch}",
        batch_size=4,
        model_s=0.1,
        worker="w",
        submitted_at=submitted_at,
        finished_at=submitted_at + 1,
    )


def test_answers_sent_by_an_earlier_run_are_counted_but_not_timed() -> None:
    """Resuming, the requests an interrupted run sent come back at once: they are counted,
    not taken for this run's throughput, latency or batches (no 18,000 req/s, no busy 2121%,
    no mean batch above the batches' sizes)."""
    report = BulkReport()
    for n in range(40):
        report.answered_request(Sample(0.0, 0.001, answer(n, n // 4)), sent_by_this_run=False)
    for n in range(40, 48):
        report.answered_request(Sample(1.0, 2.0 + n / 100, answer(n, n // 4)))
    summary = report.summary("m")
    assert report.answered_earlier == 40 and summary["sent"] == summary["completed"] == 8
    assert summary["batches"] == 2 and summary["mean_batch_size"] == 4.0
    assert summary["busy_fraction"] <= 1.0 and summary["throughput_rps"] < 10


def test_request_ids_belong_to_a_job() -> None:
    """The same custom_id is another request in another job, the same in a rerun of one."""
    assert request_id_for("m", "job-a", "1") == request_id_for("m", "job-a", "1")
    assert request_id_for("m", "job-a", "1") != request_id_for("m", "job-b", "1")
    first = default_job_id(Path("small.jsonl"), Path("a.jsonl"))
    assert first == default_job_id(Path("small.jsonl"), Path("a.jsonl"))
    assert first != default_job_id(Path("small_edit.jsonl"), Path("b.jsonl"))


def test_a_rerun_passes_over_what_an_earlier_run_answered_or_reported(tmp_path: Path) -> None:
    """Answered custom_ids and bad lines already reported are skipped (not reported again);
    a custom_id whose only error was being a duplicate on a later line still runs; blank
    lines are counted; a duplicate's error names its custom_id."""
    source = tmp_path / "in.jsonl"
    source.write_text(
        "\n".join(
            [
                json.dumps({"custom_id": "a", "input": 1}),
                "{broken",
                "",
                json.dumps({"custom_id": "b", "input": 2}),
                json.dumps({"custom_id": "b", "input": 3}),
            ]
        )
    )
    output, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    output.write_text(json.dumps({"custom_id": "a", "output": 1}) + "\n")
    errors.write_text(
        json.dumps(
            {
                "custom_id": None,
                "line": 2,
                "error": {"code": "invalid_line", "message": parse_line(2, "{broken").message},
            }  # type: ignore[union-attr]
        )
        + "\n"
        + json.dumps(
            {
                "custom_id": "b",
                "line": 5,
                "error": {"code": "duplicate_custom_id", "message": "line 5: earlier"},
            }
        )
        + "\n"
    )
    report = BulkReport()
    skips: list[int] = []
    left = list(
        lines_to_run(source, read_earlier_runs(output, errors), report, lambda: skips.append(1))
    )
    assert left == [
        Line(4, "b", 2),
        BadLine(5, "b", "duplicate_custom_id", "line 5: custom_id 'b' is on an earlier line"),
    ]
    assert (report.skipped, report.blank, len(skips)) == (2, 1, 3)
    assert count_lines(source) == 5, "the last line counts without its newline"


def test_an_output_belongs_to_one_job(tmp_path: Path) -> None:
    """A rerun of the job resumes its output; another job's lines never mix into it."""
    output = tmp_path / "results.jsonl"
    claim_output(output, "job-a")
    claim_output(output, "job-a")
    with pytest.raises(ConfigError, match="holds the answers of job job-a, not job-b"):
        claim_output(output, "job-b")


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        (b"", b""),
        (b'{"a": 1}\n', b'{"a": 1}\n'),
        (b'{"a": 1}\n{"b": 2', b'{"a": 1}\n'),
        (b'{"b": 2', b""),
        (b'{"a": 1}\n' + b"x" * 200_000, b'{"a": 1}\n'),
    ],
)
def test_a_line_cut_short_by_a_crash_is_dropped_before_the_rerun_appends(
    tmp_path: Path, written: bytes, kept: bytes
) -> None:
    """A process killed mid-write leaves a piece of a line: the rerun cuts it off, so the
    next line it appends starts a line of its own."""
    output = tmp_path / "results.jsonl"
    output.write_bytes(written)
    drop_partial_line(output)
    assert output.read_bytes() == kept


def test_a_bad_line_fixed_and_answered_on_a_rerun_leaves_the_job_without_errors(
    tmp_path: Path,
) -> None:
    """Only errors that still stand count for the exit code: a line reported as not JSON,
    fixed since, runs again, and the job exits 0 once it is answered."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "a", "input": 1}) + "\n")
    errors = tmp_path / "out.errors.jsonl"
    stale = {"code": "invalid_line", "message": "line 1: not JSON: Expecting value"}
    errors.write_text(json.dumps({"custom_id": None, "line": 1, "error": stale}) + "\n")
    report = BulkReport()
    earlier = read_earlier_runs(tmp_path / "out.jsonl", errors)
    assert list(lines_to_run(source, earlier, report, lambda: None)) == [Line(1, "a", 1)]
    assert report.errors_earlier == 0 and exit_code(report) == 0
    report.error("model_error")
    assert exit_code(report) == 1
    report.interrupted = True
    assert exit_code(report) == 130
