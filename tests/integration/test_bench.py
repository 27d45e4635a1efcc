"""``batchfleet bench`` measures a private fleet and records its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import row, run_cli


@pytest.mark.slow
def test_sweep_writes_figures_and_plots(tmp_path: Path) -> None:
    """A short sweep with a baseline prints a row per rate and model, and writes the JSON of
    every figure plus the two PNG plots."""
    done = run_cli(
        "bench",
        "sweep",
        "--rates",
        "20,60",
        "--duration",
        "2",
        "--baseline",
        "--gpu-cost-per-hour",
        "3.6",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [row(line) for line in done.stdout.splitlines() if line.startswith(("batched", "one"))]
    assert len(rows) == 4
    assert done.stdout.count("at 3.6/GPU-hour:") == 4
    (report,) = tmp_path.glob("bench-sweep-*.json")
    runs = json.loads(report.read_text())["runs"]
    assert {(run["label"], run["rate"]) for run in runs} == {
        (label, rate) for label in ("batched", "one at a time") for rate in (20.0, 60.0)
    }
    for run in runs:
        assert run["completed"] == run["sent"] > 0
        assert 0 < run["busy_fraction"] <= 1
        assert run["latency_ms"]["p50"] <= run["latency_ms"]["p99"]
        assert sum(run["batch_size_histogram"].values()) == run["batches"]
        # One device for the run's window, at $0.001 a second, spread over what it answered.
        assert run["cost"]["total"] == pytest.approx(0.001 * run["window_s"])
        assert run["cost"]["per_1k_requests"] == pytest.approx(
            run["cost"]["total"] / run["completed"] * 1000
        )
    assert sorted(path.name.split("-")[-1] for path in tmp_path.glob("*.png")) == [
        "busy.png",
        "latency.png",
    ]
