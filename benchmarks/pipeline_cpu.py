"""The pipeline's own CPU cost: CPU seconds of every process per request and per batch.

Run: .venv/bin/python benchmarks/pipeline_cpu.py [--requests 20000] [--batch-sizes 32 256]
     [--base-ms 2] [--per-item-ms 0.02] [--infer | --callers 256 | --one-at-a-time] [--unix]
     [--input-chars N] [--no-pin]
For each max batch size it starts a private fleet (its own redis-server, reached on loopback
TCP or with ``--unix`` on its Unix socket; a batcher, one CPU worker serving the synthetic
model, pinned to a CPU core as ``batchfleet bench`` pins it, but with ``--no-pin``), sends the
requests (``--input-chars``: each input text padded to that many characters, which the model
echoes back) with ``Producer.submit_many`` and collects them with ``results`` (with
``--infer``: one ``Producer.infer`` call, whose admission makes the producer the requests'
waiter, with no watch call; with ``--callers N``: N coroutines on one ``AsyncProducer``, each a
``submit`` then a ``result``; with ``--one-at-a-time``: one ``Producer``, a ``submit`` then a
``result`` for each request in turn, its throughput the inverse of one request's latency), and
reads the CPU time (user + system) each process used meanwhile from ``/proc`` (this process's
own for the producer). It prints µs per request and ms per batch by process, then the Redis
commands each batch cost and Redis's time a request by command (``INFO commandstats``: a
script's own commands count too, under their names, and again in its ``evalsha``), each
process's context switches a batch (``/proc/PID/task/*/status``) and the worker's CPU a batch
in its main thread (Celery's loop) and in the others. With two batch sizes or more it reads
each process's CPU as a cost a batch plus a cost a request (the line through the per-request
costs against one over the mean batch size, least squares). The synthetic model sleeps, so its
model time costs no CPU: what is left is the pipeline's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis

from config import stats_fields
from config.keys import Keys
from config.settings import Settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from workers.local.local_redis import LocalRedis
from workers.local.private_fleet import PrivateFleet, private_fleet
from workers.protocol.entries import to_text

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
COMMANDS_SHOWN = 16
CELERY_LOOP = "worker's Celery loop"


def process_cpu_s(pid: int, thread: int | None = None) -> float:
    """CPU seconds (user + system) ``pid`` has used, every thread's or ``thread``'s alone,
    from ``/proc``."""
    with open(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def context_switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of ``pid`` so far, from ``/proc``;
    a thread that ends meanwhile takes its count with it."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # the thread ended
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def batches_sent(fleet: PrivateFleet) -> int:
    """The batches the batcher has sent so far, from the model's stats hash."""
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        stats = client.hgetall(Keys(fleet.settings.key_prefix).stats("synthetic"))
    finally:
        client.close()
    return sum(
        int(count)
        for field, count in stats.items()
        if stats_fields.parse(to_text(field))[0] == stats_fields.BATCHES
    )


def command_stats(server: LocalRedis) -> tuple[Counter[str], Counter[str]]:
    """Calls, and µs spent, by Redis command since the server started."""
    client = redis.Redis.from_url(server.url)
    try:
        stats: dict[str, dict[str, Any]] = client.info("commandstats")
    finally:
        client.close()
    rows = {name.removeprefix("cmdstat_"): row for name, row in stats.items()}
    calls = Counter({name: int(row["calls"]) for name, row in rows.items()})
    return calls, Counter({name: int(row["usec"]) for name, row in rows.items()})


def measure(
    args: argparse.Namespace, max_batch_size: int
) -> tuple[dict[str, float], Counter[str], Counter[str], Counter[str]]:
    """CPU seconds by process for one run, plus the batches it took (``batches``); the Redis
    commands it sent, and the µs Redis spent on each; the context switches of each
    process."""
    options = {"base_ms": args.base_ms, "per_item_ms": args.per_item_ms}
    models = {
        "synthetic": {
            "max_batch_size": max_batch_size,
            "max_queue_len": args.requests * 2,
            "options": options,
        }
    }
    with LocalRedis(unix_socket=args.unix) as server:
        os.environ["BATCHFLEET_REDIS_URL"] = server.url
        with private_fleet(models, pin_cores=not args.no_pin) as fleet:
            batcher, worker = fleet.processes.processes
            pids = {
                "batcher": batcher.pid,
                "worker": worker.pid,
                "redis-server": server.pid,
                "producer": os.getpid(),
            }
            readers: dict[str, Callable[[], float]] = {
                role: partial(process_cpu_s, pid) for role, pid in pids.items()
            }
            readers["producer"] = own_cpu_s  # this process: its own rusage
            # The worker's main thread runs Celery's loop; its other threads, the batches.
            readers[CELERY_LOOP] = partial(process_cpu_s, worker.pid, worker.pid)
            switches_before = {role: context_switches(pid) for role, pid in pids.items()}
            before = {name: read() for name, read in readers.items()}
            calls_before, usec_before = command_stats(server)
            batches_before = batches_sent(fleet)
            started = time.monotonic()
            inputs = [f"request {n}".ljust(args.input_chars, "x") for n in range(args.requests)]
            if args.callers:
                asyncio.run(closed_loop(fleet.settings, inputs, args.callers))
            else:
                with Producer(fleet.settings) as producer:
                    if args.infer:
                        producer.infer("synthetic", inputs)  # raises a request's error
                    elif args.one_at_a_time:
                        for value in inputs:
                            producer.result(producer.submit("synthetic", value))
                    else:
                        for result in producer.results(producer.submit_many("synthetic", inputs)):
                            if result.error is not None:
                                raise SystemExit(f"request failed: {result.error}")
            elapsed_s = time.monotonic() - started
            used = {name: read() - before[name] for name, read in readers.items()}
            used["batches"] = batches_sent(fleet) - batches_before
            used["elapsed_s"] = elapsed_s
            calls, usec = command_stats(server)
            calls -= calls_before
            usec -= usec_before
            switches = Counter(
                {role: context_switches(pid) - switches_before[role] for role, pid in pids.items()}
            )
        del os.environ["BATCHFLEET_REDIS_URL"]
    return used, calls, usec, switches


async def closed_loop(settings: Settings, inputs: list[str], callers: int) -> None:
    """``callers`` coroutines on one ``AsyncProducer``, each sending its next input once the
    last one's output came (``submit``, then ``result``, which raises a request's error)."""
    unsent = iter(inputs)
    async with AsyncProducer(settings) as producer:

        async def caller() -> None:
            for value in unsent:
                await producer.result(await producer.submit("synthetic", value))

        await asyncio.gather(*(caller() for _ in range(callers)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--base-ms", type=float, default=2.0)
    parser.add_argument("--per-item-ms", type=float, default=0.02)
    parser.add_argument(
        "--input-chars", type=int, default=0, help="pad each input text to this many characters"
    )
    parser.add_argument(
        "--unix", action="store_true", help="reach Redis on its Unix socket, not loopback TCP"
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the worker unpinned (as bench's --no-pin)"
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--infer", action="store_true", help="send and collect with infer")
    how.add_argument(
        "--callers", type=int, default=0, help="AsyncProducer callers, each submit then result"
    )
    how.add_argument(
        "--one-at-a-time", action="store_true", help="Producer.submit then result, in turn"
    )
    args = parser.parse_args()
    roles = ("batcher", "worker", "redis-server", "producer")
    print(
        f"{args.requests} requests, synthetic model {args.base_ms} ms + {args.per_item_ms} "
        f"ms/item, inputs of {args.input_chars or 'about 10'} characters, one CPU worker"
        f"{'' if args.no_pin else ' pinned to a CPU core'}, "
        f"Redis on {'a Unix socket' if args.unix else 'loopback TCP'}; "
        "CPU (user + system) by process; "
        + (
            f"AsyncProducer, {args.callers} callers each submit then result"
            if args.callers
            else "Producer.infer"
            if args.infer
            else "Producer.submit then result, one request at a time"
            if args.one_at_a_time
            else "Producer.submit_many, then results"
        )
    )
    print(f"{'max batch':>9} {'batches':>8} {'req/s':>7}  per request, µs{'':22}per batch, ms")
    header = " ".join(f"{role[:8]:>8}" for role in (*roles, "total"))
    print(f"{'':>26}  {header}  {header}")
    commands, timed, switched, loops = [], [], [], []
    fit_points: list[tuple[float, list[float]]] = []  # (1 / mean batch, µs a request by role)
    for size in args.batch_sizes:
        used, calls, usec, switches = measure(args, size)
        batches = max(1, int(used["batches"]))
        per_request = [used[role] / args.requests * 1e6 for role in roles]
        per_batch = [used[role] / batches * 1e3 for role in roles]
        rate = args.requests / used["elapsed_s"]
        fit_points.append((batches / args.requests, [*per_request, sum(per_request)]))
        print(
            f"{size:>9} {batches:>8} {rate:>7.0f}  "
            + " ".join(f"{value:>8.0f}" for value in (*per_request, sum(per_request)))
            + "  "
            + " ".join(f"{value:>8.2f}" for value in (*per_batch, sum(per_batch)))
        )
        per_batch_calls = ", ".join(
            f"{name} {count / batches:.1f}" for name, count in calls.most_common(COMMANDS_SHOWN)
        )
        commands.append(f"{size:>9}: {calls.total() / batches:.1f} in all; {per_batch_calls}")
        timed.append(f"{size:>9}: {redis_time(usec, args.requests)}")
        switched.append(
            f"{size:>9}: " + ", ".join(f"{role} {switches[role] / batches:.1f}" for role in roles)
        )
        loop_ms = used[CELERY_LOOP] / batches * 1e3
        loops.append(
            f"{size:>9}: Celery's loop (its main thread) {loop_ms:.2f}, the batch threads and "
            f"the heartbeat {used['worker'] / batches * 1e3 - loop_ms:.2f}"
        )
    print("Redis commands per batch (the most called first)")
    print("\n".join(commands))
    print("Redis's time per request by command, µs (the most first)")
    print("\n".join(timed))
    print("Context switches per batch (every thread of each process)")
    print("\n".join(switched))
    print("The worker's CPU per batch by thread, ms")
    print("\n".join(loops))
    if len({inverse for inverse, _ in fit_points}) >= 2:
        print(fixed_and_marginal(fit_points, (*roles, "total")))


def redis_time(usec: Counter[str], requests: int) -> str:
    """Redis's µs a request by command (``INFO commandstats``), the most first. A script's
    commands count under their own names and again in its ``evalsha``: the script's own
    work (its Lua, its arguments, each ``redis.call``'s) is its figure less theirs."""
    return ", ".join(
        f"{name} {spent / requests:.1f}" for name, spent in usec.most_common(COMMANDS_SHOWN)
    )


def fixed_and_marginal(points: list[tuple[float, list[float]]], roles: tuple[str, ...]) -> str:
    """Each role's CPU read as a cost a batch (ms) plus a cost a request (µs): the least-squares
    line through its µs a request against one over the mean batch size, whose slope is the
    cost a batch and whose intercept the cost a request."""
    inverses = [inverse for inverse, _ in points]
    parts = []
    for index, role in enumerate(roles):
        slope, intercept = statistics.linear_regression(
            inverses, [costs[index] for _, costs in points]
        )
        parts.append(f"{role} {slope / 1000:.2f} ms + {intercept:.0f} µs")
    return "A batch's cost + a request's, least squares over the batch sizes: " + ", ".join(parts)


if __name__ == "__main__":
    main()
