"""What a run cost at a GPU price."""

from __future__ import annotations

import pytest

from workers.tools.pricing import money, run_cost


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
