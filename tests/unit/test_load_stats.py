"""The benchmark's figures are computed right from the samples."""

from __future__ import annotations

import json

from config.schema import Result
from workers.tools.load_stats import RunStats, Sample, percentile


def sample(
    sent_at: float,
    answered_at: float,
    batch: str,
    size: int,
    model_s: float,
    reason: str | None = "slot",
) -> Sample:
    result = Result(
        request_id=f"{batch}-{sent_at}",
        model="m",
        output=1,
        batch_id=batch,
        batch_size=size,
        model_s=model_s,
        worker="w",
        flush_reason=reason,
        finished_at=0.0,
    )
    return Sample(sent_at, answered_at, result)


def test_percentile_is_nearest_rank() -> None:
    """p50 of 1..10 is 5, p99 is 10; one value is every percentile of itself."""
    values = [float(v) for v in range(10, 0, -1)]
    assert (percentile(values, 50), percentile(values, 99)) == (5.0, 10.0)
    assert percentile([3.0], 1) == 3.0


def test_summary_counts_batches_busy_time_and_late_joiners() -> None:
    """Two model calls of 0.5 s over a 2 s window on one worker are 50% busy; latency and
    overhead subtract what they should; a late joiner does not change its batch's reason."""
    samples = [
        sample(0.0, 1.0, "a", 2, 0.5),
        sample(0.0, 1.0, "a", 2, 0.5, reason="late"),
        sample(1.0, 2.0, "b", 1, 0.5, reason="idle"),
    ]
    summary = RunStats("batched", "3 at once", 3, samples, workers=1).summary()
    assert summary["throughput_rps"] == 1.5
    assert summary["busy_fraction"] == 0.5
    assert summary["latency_ms"]["p50"] == 1000.0
    assert summary["overhead_ms"]["p99"] == 500.0
    assert summary["batch_size_histogram"] == {1: 1, 2: 1}
    assert summary["flush_reasons"] == {"slot": 1, "idle": 1}
    assert summary["late_bound_requests"] == 1


def test_a_run_without_answers_reports_null_not_nan() -> None:
    """No successful request: the JSON says null for percentiles, never NaN."""
    summary = RunStats("batched", "1/s", 5, [], client_errors=5).summary()
    assert summary["latency_ms"]["p50"] is None
    assert summary["errors"] == {"client": 5}
    assert "NaN" not in json.dumps(summary)
