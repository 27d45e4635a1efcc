"""Figures of one load run: throughput, latency and overhead percentiles, batches, busy time."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from config.schema import Result


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it: when it was sent, when its answer came, the answer."""

    sent_at: float
    answered_at: float
    result: Result

    @property
    def latency_s(self) -> float:
        return self.answered_at - self.sent_at


@dataclass(frozen=True)
class RunStats:
    """Everything one run measured, from its samples."""

    label: str
    offered: str
    sent: int
    samples: Sequence[Sample]
    workers: int = 1
    client_errors: int = 0

    @property
    def ok(self) -> list[Sample]:
        return [sample for sample in self.samples if sample.result.ok]

    @property
    def window_s(self) -> float:
        """From the first request sent to the last answer received."""
        if not self.samples:
            return 0.0
        return max(s.answered_at for s in self.samples) - min(s.sent_at for s in self.samples)

    @property
    def throughput(self) -> float:
        return len(self.ok) / self.window_s if self.window_s > 0 else 0.0

    def batches(self) -> dict[tuple[str, str, float], Result]:
        """One result per model call (a batch split to isolate a failure is several calls)."""
        calls: dict[tuple[str, str, float], Result] = {}
        for sample in self.ok:
            result = sample.result
            calls[(result.worker or "", result.batch_id or "", result.model_s)] = result
        return calls

    def flush_reasons(self) -> Counter[str]:
        """Why the batcher sent each model call's batch (said by its requests that did not
        join it late); a call made only of late joiners counts as ``late``."""
        reasons: dict[tuple[str, str, float], str] = {}
        for sample in self.ok:
            result = sample.result
            call = (result.worker or "", result.batch_id or "", result.model_s)
            if result.flush_reason not in (None, "late"):
                reasons[call] = result.flush_reason
            else:
                reasons.setdefault(call, "late")
        return Counter(reasons.values())

    def busy_fraction(self) -> float:
        """Time inside the model over the run's window, averaged over the fleet's workers."""
        if self.window_s <= 0:
            return 0.0
        busy_s = sum(result.model_s for result in self.batches().values())
        return busy_s / (self.window_s * self.workers)

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (times in milliseconds)."""
        latencies = [sample.latency_s * 1000 for sample in self.ok]
        overheads = [(sample.latency_s - sample.result.model_s) * 1000 for sample in self.ok]
        calls = self.batches().values()
        sizes = Counter(result.batch_size for result in calls)
        errors: Counter[str] = Counter(
            sample.result.error.code for sample in self.samples if sample.result.error is not None
        )
        if self.client_errors:
            errors["client"] = self.client_errors
        return {
            "label": self.label,
            "offered": self.offered,
            "sent": self.sent,
            "completed": len(self.ok),
            "errors": dict(errors),
            "window_s": round(self.window_s, 3),
            "throughput_rps": round(self.throughput, 1),
            "latency_ms": quantiles_ms(latencies),
            "overhead_ms": quantiles_ms(overheads),
            "batches": len(calls),
            "mean_batch_size": round(sum(r.batch_size for r in calls) / len(calls), 2)
            if calls
            else 0.0,
            "batch_size_histogram": dict(sorted(sizes.items())),
            "flush_reasons": dict(self.flush_reasons()),
            "late_bound_requests": sum(s.result.flush_reason == "late" for s in self.ok),
            "busy_fraction": round(self.busy_fraction(), 3),
        }


def quantiles_ms(values_ms: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99, rounded; None (JSON null) when there is nothing to measure."""
    quantiles: dict[str, float | None] = {}
    for name in ("p50", "p95", "p99"):
        value = percentile(values_ms, float(name[1:]))
        quantiles[name] = None if math.isnan(value) else round(value, 1)
    return quantiles


TABLE_HEADER = (
    f"{'run':<14} {'offered':>12} {'done':>11} {'err':>4} {'req/s':>7} {'p50':>7} {'p95':>7} "
    f"{'p99':>7} {'ovh p99':>7} {'batch':>5} {'busy':>5}"
)


def table_line(summary: dict[str, Any]) -> str:
    """One row of the report table (latencies in ms)."""
    latency, overhead = summary["latency_ms"], summary["overhead_ms"]
    figures = [latency["p50"], latency["p95"], latency["p99"], overhead["p99"]]
    return (
        f"{summary['label']:<14} {summary['offered']:>12} "
        f"{summary['completed']:>5}/{summary['sent']:<5} {sum(summary['errors'].values()):>4} "
        f"{summary['throughput_rps']:>7.1f} "
        + " ".join(f"{value:>7.1f}" if value is not None else f"{'-':>7}" for value in figures)
        + f" {summary['mean_batch_size']:>5.1f} {summary['busy_fraction'] * 100:>4.0f}%"
    )
