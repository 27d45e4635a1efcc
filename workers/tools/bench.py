"""``batchfleet bench``: load against a private fleet, and the figures.

Modes: ``saturate`` (every request at once, or N in flight), ``rate`` (open loop: Poisson
arrivals at a fixed rate for a duration), ``sweep`` (``rate`` at several rates, with PNG plots
of latency and worker busy fraction against load). ``--baseline`` runs the same load through
the same fleet with ``max_batch_size = 1`` (one request per model call) for comparison. The
model is the synthetic one (a GPU-like sleep) or the real ``embedding`` backend on this
machine's CPU, fed sentences of mixed length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.settings import ModelPolicy
from producer.async_client import AsyncProducer
from workers.local.private_fleet import PrivateFleet, private_fleet
from workers.models.registry import token_counter
from workers.runtime.gpu import GpuSampler
from workers.tools.bench_inputs import inputs_for, poisson_arrivals, synthetic_input
from workers.tools.load_stats import TABLE_HEADER, RunStats, Sample, table_line
from workers.tools.pricing import RunCost, run_cost

UNBATCHED_SUFFIX = "-unbatched"
RESULT_TIMEOUT_S = 300.0
InputMaker = Callable[[int], Any]


@dataclass(frozen=True)
class BenchConfig:
    """What to run: the fleet's shape, its model, and the load."""

    mode: str
    requests: int = 5000
    inflight: int = 0
    rate: float = 200.0
    duration_s: float = 20.0
    rates: tuple[float, ...] = (100.0, 200.0, 400.0, 600.0, 800.0)
    workers: int = 1
    backend: str = "synthetic"
    max_batch_size: int = 32
    max_wait_s: float = 0.015
    base_ms: float = 20.0
    per_item_ms: float = 0.5
    launch_ms: float = 0.0
    threads: int | None = None
    weights: str | None = None
    group_by_cost: bool = False
    gpus: int = 0
    # Each worker of the synthetic model (which stands for a model computing on a GPU) pinned
    # to a CPU core (``workers.runtime.cpu_core``); the embedding model's workers never are,
    # not measured pinned on a GPU yet, and on the CPU its threads would share the one core.
    pin_cores: bool = True
    baseline: bool = False
    gpu_cost_per_hour: float | None = None
    out_dir: Path = Path("benchmarks/results")
    seed: int = 1

    @property
    def batched_model(self) -> str:
        return self.backend

    @property
    def unbatched_model(self) -> str:
        return self.backend + UNBATCHED_SUFFIX

    def gpu_indices(self) -> list[int]:
        """The GPUs the workers are pinned to (round-robin), none on the CPU."""
        return sorted({index % self.gpus for index in range(self.workers)}) if self.gpus else []

    @property
    def pins_cores(self) -> bool:
        """Whether the workers run pinned to a CPU core each (see ``pin_cores``)."""
        return self.pin_cores and self.backend == "synthetic"

    def describe(self) -> str:
        """The model and its batching, in words, for the report's first line."""
        if self.backend == "synthetic":
            model = f"synthetic model {self.base_ms:g} ms + {self.per_item_ms:g} ms/item"
            if self.launch_ms:
                model += f", launched in {self.launch_ms:g} ms of Python"
        else:
            threads = f", {self.threads} torch thread(s)" if self.threads else ""
            device = f"{self.gpus} GPU(s)" if self.gpus else f"the CPU{threads}"
            model = f"{self.backend} model on {device}"
        grouping = ", grouped by cost" if self.group_by_cost else ""
        pinned = ", each worker pinned to a CPU core" if self.pins_cores else ""
        return (
            f"{model}, max batch {self.max_batch_size}, max wait {self.max_wait_s * 1000:g} ms"
            + grouping
            + pinned
        )

    def models(self) -> dict[str, dict[str, Any]]:
        if self.backend == "synthetic":
            options: dict[str, Any] = {
                "base_ms": self.base_ms,
                "per_item_ms": self.per_item_ms,
                "launch_ms": self.launch_ms,
            }
        else:
            options = {"threads": self.threads} if self.threads else {}
            if self.weights:
                options["weights"] = self.weights
        # A benchmark measures queueing: nothing may expire before the client stops waiting.
        common = {
            "backend": self.backend,
            "options": options,
            "max_queue_len": 1_000_000,
            "request_timeout_s": RESULT_TIMEOUT_S,
        }
        return {
            self.batched_model: {
                **common,
                "max_batch_size": self.max_batch_size,
                "max_wait_s": self.max_wait_s,
                "group_by_cost": self.group_by_cost,
            },
            self.unbatched_model: {**common, "max_batch_size": 1},
        }


async def _one(
    producer: AsyncProducer, model: str, value: Any, sent_at: float | None = None
) -> Sample:
    """One request, timed from ``sent_at`` (its scheduled time in an open loop) to its answer."""
    sent_at = time.monotonic() if sent_at is None else sent_at
    request_id = await producer.submit(model, value)
    async with contextlib.aclosing(producer.results([request_id], RESULT_TIMEOUT_S)) as results:
        async for result in results:
            return Sample(sent_at, time.monotonic(), result)
    raise AssertionError("results() ended without a result")


async def saturate(
    producer: AsyncProducer, model: str, count: int, inflight: int, make_input: InputMaker
) -> list[Sample]:
    """``count`` requests: all at once (``inflight`` 0), or ``inflight`` at a time, closed loop."""
    if inflight <= 0:
        sent_at = time.monotonic()
        ids = await producer.submit_many(model, [make_input(index) for index in range(count)])
        return [
            Sample(sent_at, time.monotonic(), result)
            async for result in producer.results(ids, timeout_s=RESULT_TIMEOUT_S)
        ]
    samples: list[Sample] = []
    counter = iter(range(count))

    async def client() -> None:
        for index in counter:
            samples.append(await _one(producer, model, make_input(index)))

    await asyncio.gather(*(client() for _ in range(inflight)))
    return samples


async def open_loop(
    producer: AsyncProducer,
    model: str,
    rate: float,
    duration_s: float,
    seed: int,
    make_input: InputMaker,
) -> tuple[list[Sample], int]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``, each request on its own,
    timed from its scheduled arrival (a late sender cannot hide queueing); returns the
    samples and how many requests failed in the client (refused, timed out)."""
    tasks = [
        asyncio.create_task(_one(producer, model, make_input(index), due))
        async for index, due in poisson_arrivals(rate, duration_s, seed)
    ]
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    samples = [outcome for outcome in outcomes if isinstance(outcome, Sample)]
    return samples, len(outcomes) - len(samples)


def label_of(model: str) -> str:
    return "one at a time" if model.endswith(UNBATCHED_SUFFIX) else "batched"


async def saturation_run(
    fleet: PrivateFleet,
    model: str,
    count: int,
    inflight: int = 0,
    workers: int = 1,
    make_input: InputMaker = synthetic_input,
) -> RunStats:
    """``count`` requests to ``model``, all at once or ``inflight`` at a time."""
    async with AsyncProducer(fleet.settings) as producer:
        samples = await saturate(producer, model, count, inflight, make_input)
    offered = f"{count} " + (f"x{inflight}" if inflight else "at once")
    return RunStats(label_of(model), offered, count, samples, workers)


async def rate_run(
    fleet: PrivateFleet,
    model: str,
    rate: float,
    duration_s: float,
    *,
    seed: int = 1,
    workers: int = 1,
    make_input: InputMaker = synthetic_input,
) -> RunStats:
    """Open-loop Poisson load on ``model`` at ``rate`` per second for ``duration_s``."""
    async with AsyncProducer(fleet.settings) as producer:
        samples, failed = await open_loop(producer, model, rate, duration_s, seed, make_input)
    return RunStats(label_of(model), f"{rate:g}/s", len(samples) + failed, samples, workers, failed)


async def _run(fleet: PrivateFleet, config: BenchConfig, model: str, rate: float) -> RunStats:
    make_input = inputs_for(config.backend, config.seed)
    if config.mode == "saturate":
        return await saturation_run(
            fleet, model, config.requests, config.inflight, config.workers, make_input
        )
    return await rate_run(
        fleet,
        model,
        rate,
        config.duration_s,
        seed=config.seed,
        workers=config.workers,
        make_input=make_input,
    )


def run_bench(config: BenchConfig) -> int:
    """Runs the benchmark, prints the table, writes the JSON (and plots for a sweep)."""
    rates = config.rates if config.mode == "sweep" else (config.rate,)
    models = [config.batched_model]
    if config.baseline:
        models.append(config.unbatched_model)
    print(f"batchfleet bench {config.mode}: {config.workers} worker(s), {config.describe()}")
    summaries: list[dict[str, Any]] = []
    with private_fleet(
        config.models(), workers=config.workers, gpus=config.gpus, pin_cores=config.pins_cores
    ) as fleet:
        print(TABLE_HEADER)
        for rate in rates:
            for model in models:
                with GpuSampler(config.gpu_indices()) as sampler:
                    stats = asyncio.run(_run(fleet, config, model, rate))
                summary = {**stats.summary(), "rate": rate if config.mode != "saturate" else None}
                summary["gpu_utilisation"] = sampler.utilisation()
                summaries.append(summary)
                print(table_line(summary), flush=True)
                if summary["gpu_utilisation"] is not None:
                    print(f"{'':<14} GPU utilisation (NVML): {summary['gpu_utilisation']:.0%}")
                cost = cost_of_run(config, model, summary)
                if cost is not None and config.gpu_cost_per_hour is not None:
                    summary["cost"] = vars(cost)
                    print(f"{'':<14} {cost.describe(config.gpu_cost_per_hour)}")
    path = write_report(config, summaries)
    print(f"figures: {path}")
    if config.mode == "sweep":
        for plot in plot_sweep(summaries, path.with_suffix("")):
            print(f"plot: {plot}")
    return 0 if all(s["completed"] == s["sent"] for s in summaries) else 1


def cost_of_run(config: BenchConfig, model: str, summary: dict[str, Any]) -> RunCost | None:
    """The run's cost at ``gpu_cost_per_hour`` (a device per GPU the workers are pinned to,
    else per worker; workers sharing a GPU add their busy shares up), with its tokens when the
    model counts them; None without a price."""
    if config.gpu_cost_per_hour is None:
        return None
    counter = token_counter(ModelPolicy.model_validate(config.models()[model]))
    tokens = None
    if counter is not None:
        make_input = inputs_for(config.backend, config.seed)  # the run's inputs, in order
        tokens = sum(counter(make_input(index)) for index in range(summary["sent"]))
    devices = len(config.gpu_indices()) or config.workers
    return run_cost(
        config.gpu_cost_per_hour,
        devices,
        summary["window_s"],
        summary["completed"],
        summary["busy_fraction"] * config.workers / devices,
        tokens,
    )


def write_report(config: BenchConfig, summaries: Sequence[dict[str, Any]]) -> Path:
    config.out_dir.mkdir(parents=True, exist_ok=True)
    path = config.out_dir / f"bench-{config.mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(config).items()},
        "runs": list(summaries),
    }
    path.write_text(json.dumps(record, indent=2))
    return path


def plot_sweep(summaries: Sequence[dict[str, Any]], stem: Path) -> list[Path]:
    """Latency-vs-load and busy-fraction-vs-load PNGs of a sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({s["label"] for s in summaries})
    paths = []
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        runs = [s for s in summaries if s["label"] == label]
        for quantile, style in (("p50", "-o"), ("p99", "--s")):
            axis.plot(
                [s["rate"] for s in runs],
                [s["latency_ms"][quantile] for s in runs],
                style,
                label=f"{label} {quantile}",
            )
    axis.set(
        xlabel="offered load (req/s)",
        ylabel="latency (ms)",
        yscale="log",
        title="Latency against load",
    )
    axis.grid(True, alpha=0.3)
    axis.legend()
    paths.append(stem.with_name(stem.name + "-latency.png"))
    figure.savefig(paths[-1], dpi=110, bbox_inches="tight")
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        runs = [s for s in summaries if s["label"] == label]
        axis.plot(
            [s["rate"] for s in runs], [s["busy_fraction"] * 100 for s in runs], "-o", label=label
        )
    axis.set(
        xlabel="offered load (req/s)",
        ylabel="worker busy (%)",
        ylim=(0, 105),
        title="Worker busy fraction against load",
    )
    axis.grid(True, alpha=0.3)
    axis.legend()
    paths.append(stem.with_name(stem.name + "-busy.png"))
    figure.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close("all")
    return paths
