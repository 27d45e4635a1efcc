"""What a run cost at a GPU price, in `batchfleet bench` and `batchfleet top`."""

from __future__ import annotations

import pytest

from workers.tools.bench import BenchConfig, cost_of_run
from workers.tools.bulk import BulkReport
from workers.tools.pricing import money, run_cost
from workers.tools.top import Snapshot, cost_line


def test_a_runs_cost_is_spread_over_its_requests_and_tokens_and_its_idle_share_named() -> None:
    """Two GPUs at 3.6 an hour for 100 s cost 0.2: 0.2 per 1,000 requests for 1,000 answered,
    1.0 per million tokens for 200,000, of which the quarter spent outside the model, 0.05,
    was idle."""
    cost = run_cost(
        3.6, devices=2, window_s=100, completed=1000, busy_fraction=0.75, tokens=200_000
    )
    assert cost.total == pytest.approx(0.2)
    assert cost.per_1k_requests == pytest.approx(0.2)
    assert cost.per_million_tokens == pytest.approx(1.0)
    assert cost.idle == pytest.approx(0.05)
    assert cost.describe(3.6) == (
        "at 3.6/GPU-hour: 0.2 per 1,000 requests, 1 per million tokens, idle GPU time 0.05 of 0.2"
    )


def test_a_run_that_answered_nothing_has_no_per_request_price() -> None:
    cost = run_cost(3.6, devices=1, window_s=10, completed=0, busy_fraction=0.0)
    assert cost.per_1k_requests is None and cost.per_million_tokens is None
    assert cost.idle == pytest.approx(cost.total)


@pytest.mark.parametrize(
    ("amount", "shown"),
    [(1.536e-05, "0.00001536"), (0.0012, "0.0012"), (12.3456, "12.35"), (1234.5, "1234"), (0, "0")],
)
def test_costs_are_printed_in_plain_decimals(amount: float, shown: str) -> None:
    """A cost reads as money, four significant digits, never in exponent notation."""
    assert money(amount) == shown


def test_bench_workers_sharing_a_gpu_are_priced_as_that_one_gpu() -> None:
    """Four workers on one GPU for 1,000 s at 3.6 an hour cost one GPU's 1.0, and their
    busy shares (30% each) add up: the GPU was never idle."""
    config = BenchConfig(mode="saturate", workers=4, gpus=1, gpu_cost_per_hour=3.6)
    summary = {"sent": 1000, "window_s": 1000.0, "completed": 1000, "busy_fraction": 0.3}
    cost = cost_of_run(config, config.batched_model, summary)
    assert cost is not None
    assert cost.total == pytest.approx(1.0)
    assert cost.idle == pytest.approx(0.0)
    on_the_cpu = cost_of_run(
        BenchConfig(mode="saturate", workers=4, gpu_cost_per_hour=3.6),
        config.batched_model,
        summary,
    )
    assert on_the_cpu is not None
    assert on_the_cpu.total == pytest.approx(4.0)
    assert on_the_cpu.idle == pytest.approx(2.8)


def fleet(at: float, busy_s: dict[str, float], answered: int) -> Snapshot:
    """Three worker processes: two sharing the GPU ``GPU-a``, one on ``GPU-b``."""
    gpus = {"gpu0-0@h": "GPU-a", "gpu0-1@h": "GPU-a", "gpu1@h": "GPU-b"}
    return Snapshot(
        now=at,
        depths={"m": 0},
        stats={"m": {"completed": answered}},
        latencies={"m": []},
        nodes={
            name: {"at": str(at), "busy_s": str(busy_s[name]), "gpu_uuid": gpu}
            for name, gpu in gpus.items()
        },
    )


def test_top_prices_processes_sharing_a_gpu_as_that_one_gpu() -> None:
    """Over 100 s at 3.6 a GPU-hour, two GPUs answer 1,000 requests: 0.2 per 1,000. The
    shared GPU's processes were busy 40% and 50%, so it was idle 10%; the other 20%, idle 80%:
    idle GPUs cost 3.6 x 0.9 an hour."""
    before = fleet(0.0, {"gpu0-0@h": 0.0, "gpu0-1@h": 0.0, "gpu1@h": 0.0}, answered=0)
    now = fleet(100.0, {"gpu0-0@h": 40.0, "gpu0-1@h": 50.0, "gpu1@h": 20.0}, answered=1000)
    assert cost_line(before, now, 3.6) == (
        "at 3.6/GPU-hour: 0.2 per 1,000 requests, idle GPUs 3.24/hour"
    )


def test_a_bulk_run_prices_the_workers_sharing_a_gpu_as_that_one_gpu() -> None:
    """``batchfleet submit``'s cost: two worker processes on one GPU (their statuses name the
    same device) and one whose status is gone count two devices, not three."""
    report = BulkReport(first_sent=0.0, last_answered=10.0, busy_s=12.0, completed=96)
    report.calls = {
        ("gpu0-0@h", "b1", 4.0): 32,
        ("gpu0-1@h", "b2", 4.0): 32,
        ("old@h", "b3", 4.0): 32,
    }
    report.device_of = {"gpu0-0@h": "GPU-a", "gpu0-1@h": "GPU-a"}
    summary = report.summary("m")
    assert summary["devices"] == 2
    assert summary["busy_fraction"] == pytest.approx(0.6)
