"""What serving cost at a GPU price (``gpu_cost_per_hour``): per 1,000 requests and per
million tokens at the throughput measured, and what the device time spent outside the model
cost — the figure that says what batching saved."""

from __future__ import annotations

import math
from dataclasses import dataclass

SIGNIFICANT_DIGITS = 4


def money(amount: float) -> str:
    """``amount`` to four significant digits in plain decimals: ``0.00001536``, never
    ``1.536e-05``; ``0.0012``, ``12.35``, ``1235``."""
    if amount == 0 or not math.isfinite(amount):
        return f"{amount:g}"
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(abs(amount))))
    text = f"{amount:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


@dataclass(frozen=True)
class RunCost:
    """The price of ``devices`` GPUs held for a run, spread over what it served."""

    total: float
    per_1k_requests: float | None
    per_million_tokens: float | None
    idle: float

    def describe(self, price_per_hour: float) -> str:
        parts = [f"at {price_per_hour:g}/GPU-hour:"]
        if self.per_1k_requests is not None:
            parts.append(f"{money(self.per_1k_requests)} per 1,000 requests")
        if self.per_million_tokens is not None:
            parts.append(f"{money(self.per_million_tokens)} per million tokens")
        parts.append(f"idle GPU time {money(self.idle)} of {money(self.total)}")
        return " ".join(parts[:2]) + "".join(f", {part}" for part in parts[2:])


def run_cost(
    price_per_hour: float,
    devices: int,
    window_s: float,
    completed: int,
    busy_fraction: float,
    tokens: int | None = None,
) -> RunCost:
    """The cost of ``devices`` GPUs for ``window_s`` that answered ``completed`` requests
    (``tokens`` tokens in all, for a model that counts them) while busy in the model
    ``busy_fraction`` of the time."""
    total = price_per_hour * devices * window_s / 3600
    return RunCost(
        total=total,
        per_1k_requests=total / completed * 1000 if completed else None,
        per_million_tokens=total / tokens * 1e6 if tokens else None,
        idle=total * (1 - min(max(busy_fraction, 0.0), 1.0)),
    )
