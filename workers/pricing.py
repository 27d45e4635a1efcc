"""What serving cost at a GPU price (``gpu_cost_per_hour``): per 1,000 requests and per
million tokens at the throughput measured, and what the device time spent outside the model
cost — the figure that says what batching saved."""

from __future__ import annotations

from dataclasses import dataclass


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
            parts.append(f"{self.per_1k_requests:.4g} per 1,000 requests")
        if self.per_million_tokens is not None:
            parts.append(f"{self.per_million_tokens:.4g} per million tokens")
        parts.append(f"idle GPU time {self.idle:.4g} of {self.total:.4g}")
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
