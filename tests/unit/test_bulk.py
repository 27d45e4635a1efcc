"""Bulk jobs' pure parts: reading a line, and a report whose memory stays bounded."""

from __future__ import annotations

import pytest

from config.schema import Result
from workers import bulk
from workers.bulk import BadLine, BulkReport, Line, parse_line
from workers.load_stats import Sample


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
