"""``batchfleet top``: a live terminal view of the fleet, read from Redis alone.

Per model: queue depth, requests in and out per second, mean batch size, p50/p99 latency of
the latest answers, error rate. Per worker: its device, busy fraction, GPU utilisation and
memory, and how long ago it finished a batch. With a GPU price, what the workers cost per
1,000 requests and per hour of idle time. Rates are the change, over the last
``RATE_WINDOW_S``, of the counters producers, batchers and workers keep in Redis.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from config import node_status, stats_fields
from config.keys import Keys
from workers.protocol.entries import to_text
from workers.tools.pricing import money

LATENCY_WINDOW_S = 60.0
RATE_WINDOW_S = 5.0


@dataclass(frozen=True)
class Snapshot:
    """One read of the fleet, at Redis server time ``now``."""

    now: float
    depths: dict[str, int]
    stats: dict[str, dict[str, int]]
    latencies: dict[str, list[tuple[float, float]]]
    nodes: dict[str, dict[str, str]]


def read_snapshot(client: redis.Redis, keys: Keys, models: Sequence[str]) -> Snapshot:
    """The fleet's counters, queues, latest latencies and live workers, in two round trips."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for model in models:
        pipe.xlen(keys.stream(model))
        pipe.hgetall(keys.stats(model))
        pipe.lrange(keys.latencies(model), 0, -1)
        pipe.zrange(keys.workers(model), 0, -1, withscores=True)
    replies: list[Any] = pipe.execute()
    seconds, micros = replies[0]
    server_now = seconds + micros / 1e6
    depths, stats, latencies, hostnames = {}, {}, {}, set()
    for index, model in enumerate(models):
        depth, counts, recent, members = replies[1 + 4 * index : 5 + 4 * index]
        depths[model] = int(depth)
        stats[model] = {to_text(field): int(count) for field, count in counts.items()}
        latencies[model] = [_latency(item) for item in recent]
        hostnames |= {
            to_text(member).rpartition("|")[0]
            for member, alive_until in members
            if alive_until > server_now
        }
    return Snapshot(server_now, depths, stats, latencies, node_statuses(client, keys, hostnames))


def node_statuses(
    client: redis.Redis, keys: Keys, hostnames: Iterable[str]
) -> dict[str, dict[str, str]]:
    """The status each worker process last published (``config.node_status``), by name; an
    expired one is empty."""
    pipe = client.pipeline(transaction=False)
    names = sorted(hostnames)
    for hostname in names:
        pipe.hgetall(keys.node(hostname))
    return {
        hostname: {to_text(field): to_text(value) for field, value in status.items()}
        for hostname, status in zip(names, pipe.execute(), strict=True)
    }


def _latency(item: bytes | str) -> tuple[float, float]:
    finished_at, _, latency_s = to_text(item).partition(":")
    return float(finished_at), float(latency_s)


def _per_s(now: int, before: int, elapsed_s: float) -> float:
    return max(0, now - before) / elapsed_s if elapsed_s > 0 else 0.0


def _answered(stats: dict[str, int]) -> tuple[int, int]:
    failed = sum(
        count
        for field, count in stats.items()
        if stats_fields.parse(field)[0] == stats_fields.FAILED
    )
    return stats.get(stats_fields.COMPLETED, 0), failed


MODEL_COLUMNS: tuple[str, ...] = ("model", "queue", "in/s", "out/s", "batch", "p50", "p99", "err")
# Below this many terminal columns the model view splits in two tables (traffic, latency), so
# that no column is cut off.
WIDE_MODEL_TABLE = 56
NARROW_SPLIT: tuple[tuple[str, ...], ...] = (
    ("model", "queue", "in/s", "out/s", "err"),
    ("model", "batch", "p50", "p99"),
)


def model_rows(before: Snapshot, now: Snapshot) -> list[dict[str, str]]:
    """Per model, its figures over the refresh by column name (``MODEL_COLUMNS``)."""
    elapsed_s = now.now - before.now
    rows = []
    for model, depth in now.depths.items():
        stats, old = now.stats[model], before.stats.get(model, {})
        ok, failed = _answered(stats)
        old_ok, old_failed = _answered(old)
        done = max(0, ok + failed - old_ok - old_failed)
        recent = [
            latency_s
            for finished_at, latency_s in now.latencies[model]
            if finished_at >= now.now - LATENCY_WINDOW_S
        ]
        p50, p99 = _percentiles(recent)
        accepted = stats.get(stats_fields.ACCEPTED, 0)
        old_accepted = old.get(stats_fields.ACCEPTED, 0)
        rows.append(
            {
                "model": model,
                "queue": str(depth),
                "in/s": _figure(_per_s(accepted, old_accepted, elapsed_s)),
                "out/s": _figure(done / elapsed_s if elapsed_s > 0 else 0.0),
                "batch": _mean_batch(model, before, now),
                "p50": p50,
                "p99": p99,
                "err": f"{max(0, failed - old_failed) / done:.0%}" if done else "-",
            }
        )
    return rows


def model_tables(before: Snapshot, now: Snapshot, width: int) -> list[Table]:
    """The models' view: one table, or on a terminal narrower than ``WIDE_MODEL_TABLE``
    columns two (traffic, then latency), so that no column is cut off."""
    rows = model_rows(before, now)
    if width >= WIDE_MODEL_TABLE:
        layouts: list[tuple[str, tuple[str, ...]]] = [("models (latency in ms)", MODEL_COLUMNS)]
    else:
        layouts = list(zip(("models", "latency (ms)"), NARROW_SPLIT, strict=True))
    tables = []
    for title, columns in layouts:
        table = _table(title, columns)
        for row in rows:
            table.add_row(*(row[column] for column in columns))
        tables.append(table)
    return tables


def _figure(value: float) -> str:
    """A figure in at most five characters: tenths below 100, whole numbers above."""
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _percentiles(latencies_s: list[float]) -> tuple[str, str]:
    if len(latencies_s) < 2:
        return ("-", "-") if not latencies_s else (_figure(latencies_s[0] * 1000),) * 2
    cuts = statistics.quantiles(latencies_s, n=100, method="inclusive")
    return _figure(cuts[49] * 1000), _figure(cuts[98] * 1000)


def _mean_batch(model: str, before: Snapshot, now: Snapshot) -> str:
    """Requests per call of ``model`` over the refresh, across the workers serving it."""

    def change(field: str) -> int:
        return sum(
            int(status.get(field, 0)) - int(before.nodes.get(hostname, {}).get(field, 0))
            for hostname, status in now.nodes.items()
        )

    batches = change(node_status.batches_of(model))
    return f"{change(node_status.requests_of(model)) / batches:.1f}" if batches > 0 else "-"


def worker_table(before: Snapshot, now: Snapshot) -> Table:
    table = _table("workers", ("worker", "device", "busy", "GPU", "memory", "last batch"))
    for hostname, status in sorted(now.nodes.items()):
        busy = _busy(before.nodes.get(hostname, {}), status)
        utilisation = status.get(node_status.GPU_UTILISATION)
        used = status.get(node_status.GPU_MEMORY_USED_BYTES)
        total = status.get(node_status.GPU_MEMORY_TOTAL_BYTES)
        last = status.get(node_status.LAST_BATCH_AT)
        table.add_row(
            hostname,
            status.get(node_status.GPU_NAME, status.get(node_status.DEVICE, "?")),
            f"{busy:.0%}" if busy is not None else "-",
            f"{float(utilisation):.0%}" if utilisation else "-",
            f"{int(used) / 2**30:.1f}/{int(total) / 2**30:.0f}G" if used and total else "-",
            f"{now.now - float(last):.1f}s ago" if last else "never",
        )
    return table


def _busy(old: dict[str, str], status: dict[str, str]) -> float | None:
    """A worker's busy fraction between two of its statuses, on its own clock (its status
    changes once a heartbeat, not once a refresh); None before two are seen."""
    worked_s = float(status.get(node_status.BUSY_S, 0)) - float(old.get(node_status.BUSY_S, 0))
    beats_s = float(status.get(node_status.AT, 0)) - float(old.get(node_status.AT, 0))
    return worked_s / beats_s if old and beats_s > 0 else None


def cost_line(before: Snapshot, now: Snapshot, price_per_hour: float) -> str:
    """What the live workers' devices cost at ``price_per_hour`` each: per 1,000 requests at
    the rate answered over the window, and per hour of their idle time. A GPU that several
    processes share (``worker.processes_per_gpu``) is one device, busy for the sum of their
    busy shares (at most all the time)."""
    elapsed_s = now.now - before.now
    answered = sum(
        sum(_answered(now.stats[model])) - sum(_answered(before.stats.get(model, {})))
        for model in now.stats
    )
    shares_by_device: dict[str, list[float]] = {}
    for hostname, status in now.nodes.items():
        shares = shares_by_device.setdefault(node_status.device_of(hostname, status), [])
        if (busy := _busy(before.nodes.get(hostname, {}), status)) is not None:
            shares.append(busy)
    devices = len(shares_by_device)
    idle = sum(1 - min(sum(shares), 1.0) for shares in shares_by_device.values() if shares)
    per_1k = (
        f"{money(price_per_hour * devices * elapsed_s / 3600 / answered * 1000)} per 1,000 requests"
        if answered > 0 and elapsed_s > 0
        else "no requests answered"
    )
    return (
        f"at {price_per_hour:g}/GPU-hour: {per_1k}, idle GPUs {money(price_per_hour * idle)}/hour"
    )


def _table(title: str, headers: Sequence[str]) -> Table:
    """A compact table (no vertical rules) whose first column is never cut: the view stays
    readable on a narrow terminal."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for index, header in enumerate(headers):
        table.add_column(
            header,
            justify="left" if index == 0 or header == "device" else "right",
            no_wrap=index == 0,
            min_width=len(header),
        )
    return table


def run_top(
    client: redis.Redis,
    keys: Keys,
    models: Sequence[str],
    refresh_s: float = 1.0,
    price_per_hour: float | None = None,
) -> int:
    """Redraws the view every ``refresh_s`` until Ctrl-C; rates span the last
    ``RATE_WINDOW_S``; with ``price_per_hour`` (one GPU), a line of what it costs."""
    console = Console()
    history = deque([read_snapshot(client, keys, models)])
    try:
        with Live(console=console, auto_refresh=False) as live:
            while True:
                time.sleep(refresh_s)
                now = read_snapshot(client, keys, models)
                while len(history) > 1 and now.now - history[1].now >= RATE_WINDOW_S:
                    history.popleft()
                before = history[0]
                history.append(now)
                parts: list[RenderableType] = [
                    *model_tables(before, now, console.width),
                    worker_table(before, now),
                ]
                if price_per_hour is not None:
                    parts.append(cost_line(before, now, price_per_hour))
                live.update(Group(*parts))
                live.refresh()
    except KeyboardInterrupt:
        return 0
