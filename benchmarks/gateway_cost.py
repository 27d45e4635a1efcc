"""What the HTTP gateway adds over ``AsyncProducer``: the same one-text embedding calls on the
synthetic model (its default 20 ms + 0.5 ms per item, answering 16-float vectors), sent
straight through an ``AsyncProducer`` and through ``batchfleet gateway``, at saturation (a
closed loop, ``--inflight`` calls in flight); then saturation through two gateway
processes, calls split between them; then at a fixed rate (an open loop): ``--rate`` calls
a second each way, interleaved in one window (the fleet takes twice that), so that both
ways see the same fleet and the difference is the gateway's.

Run: .venv/bin/python benchmarks/gateway_cost.py [--requests 4000] [--inflight 256]
     [--rate 200] [--duration 20] [--rounds 2] [--base-ms MS] [--per-item-ms MS]
     [--max-batch N]
(the last three set the synthetic model: a fast one, such as 2 ms + 0.02 ms an item in
batches of 256, outruns one gateway, which then bounds the saturation runs)
Each round runs every path in turn on one private fleet (a batcher, a worker). Prints per
run: calls answered, calls a second, p50 and p99 in ms, and for the runs through one gateway
the CPU its process used a call (user + system, from /proc); then, per round, what the gateway
adds at p50 at the fixed rate and how two gateways compare with one at saturation. The load
generator runs in this process, on the same machine as the fleet; it uses aiohttp, whose
client costs about a third of a millisecond of CPU a call here (httpx's async client cost
2-13 ms a call at 16-256 connections, and capped the gateway it measured at 70-180 calls/s).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from pipeline_cpu import process_cpu_s  # this folder, as a script runs

from producer.async_client import AsyncProducer
from workers.local.local_fleet import LocalFleet
from workers.local.local_gateway import start_gateway
from workers.local.private_fleet import PrivateFleet, private_fleet
from workers.tools.load_stats import percentile

MODEL = "embed"
API_KEY = f"sk-bench-{uuid.uuid4().hex}"
Call = Callable[[str], Awaitable[object]]


@dataclass
class Run:
    """One load run: each answered call's latency, the run's wall time, and the CPU seconds
    the first gateway used meanwhile (0 for a run that does not go through it)."""

    latencies_s: list[float]
    wall_s: float
    gateway_cpu_s: float = 0.0

    def line(self, name: str) -> str:
        ms = sorted(1000 * s for s in self.latencies_s)
        rate = len(ms) / self.wall_s if self.wall_s else 0.0
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        cpu = f"{1000 * self.gateway_cpu_s / len(ms):.2f}" if self.gateway_cpu_s else "-"
        return f"{name:<28} {len(ms):>6} {rate:>9.1f} {p50:>8.1f} {p99:>8.1f} {cpu:>10}"

    @property
    def p50_ms(self) -> float:
        return percentile(sorted(1000 * s for s in self.latencies_s), 50)

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.wall_s


async def timed(call: Call, text: str, latencies: list[float]) -> None:
    started = time.perf_counter()
    await call(text)
    latencies.append(time.perf_counter() - started)


async def saturate(call: Call, requests: int, inflight: int) -> Run:
    """``requests`` calls, ``inflight`` at a time (a new one as soon as one is answered)."""
    latencies: list[float] = []
    texts = iter(f"text {n} {uuid.uuid4().hex}" for n in range(requests))

    async def lane() -> None:
        for text in texts:
            await timed(call, text, latencies)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(inflight)))
    return Run(latencies, time.perf_counter() - started)


async def at_rate(calls: Sequence[Call], rate: float, duration_s: float) -> list[Run]:
    """A call every ``1 / (rate * len(calls))`` seconds for ``duration_s``, taking
    ``calls`` in turn (each at ``rate``, in the same window and on the same fleet), each
    timed from its start; a run per call."""
    latencies: list[list[float]] = [[] for _ in calls]
    tasks = []
    every_s = 1 / (rate * len(calls))
    started = time.perf_counter()
    for n in range(int(duration_s / every_s)):
        await asyncio.sleep(max(0.0, started + n * every_s - time.perf_counter()))
        which = n % len(calls)
        text = f"text {n} {uuid.uuid4().hex}"
        tasks.append(asyncio.create_task(timed(calls[which], text, latencies[which])))
    await asyncio.gather(*tasks)
    wall_s = time.perf_counter() - started
    return [Run(times, wall_s) for times in latencies]


def through_gateways(urls: list[str], client: aiohttp.ClientSession) -> Call:
    """Calls ``/v1/embeddings``, round robin over ``urls``."""
    turns = itertools.cycle(urls)
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def call(text: str) -> object:
        body = {"model": MODEL, "input": text, "encoding_format": "float"}
        async with client.post(f"{next(turns)}/v1/embeddings", json=body, headers=headers) as r:
            r.raise_for_status()
            return await r.json()

    return call


async def using_cpu(pid: int, run: Awaitable[list[Run]], through: int) -> list[Run]:
    """``run``'s runs, its ``through``-th charged with the CPU process ``pid`` used."""
    started = process_cpu_s(pid)
    runs = await run
    runs[through].gateway_cpu_s = process_cpu_s(pid) - started
    return runs


async def measure(
    fleet: PrivateFleet, urls: list[str], gateway_pid: int, args: argparse.Namespace
) -> list[Run]:
    connections = aiohttp.TCPConnector(limit=args.inflight)
    async with (
        AsyncProducer(fleet.settings) as producer,
        aiohttp.ClientSession(connector=connections) as client,
    ):

        async def direct(text: str) -> object:
            return await producer.infer(MODEL, [text])

        one, two = through_gateways(urls[:1], client), through_gateways(urls, client)

        async def saturating(call: Call) -> list[Run]:
            return [await saturate(call, args.requests, args.inflight)]

        return [
            *await saturating(direct),
            *await using_cpu(gateway_pid, saturating(one), through=0),
            *await saturating(two),
            *await using_cpu(gateway_pid, at_rate([direct, one], args.rate, args.duration), 1),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base-ms", type=float, help="the model's time per batch")
    parser.add_argument("--per-item-ms", type=float, help="the model's time per input")
    parser.add_argument("--max-batch", type=int, help="the model's largest batch")
    args = parser.parse_args()
    model: dict[str, Any] = {"options": {"dims": 16}}
    for option, value in (("base_ms", args.base_ms), ("per_item_ms", args.per_item_ms)):
        if value is not None:
            model["options"][option] = value
    if args.max_batch is not None:
        model["max_batch_size"] = args.max_batch
    models = {MODEL: model}
    names = [
        f"saturate, AsyncProducer ({args.inflight})",
        f"saturate, 1 gateway ({args.inflight})",
        f"saturate, 2 gateways ({args.inflight})",
        f"{args.rate:g}/s each, AsyncProducer",
        f"{args.rate:g}/s each, 1 gateway",
    ]
    with private_fleet(models) as fleet:
        env = {
            "BATCHFLEET_REDIS_URL": fleet.redis_url,
            "BATCHFLEET_KEY_PREFIX": fleet.settings.key_prefix,
            "BATCHFLEET_MODELS": json.dumps(models),
            "BATCHFLEET_GATEWAY__API_KEYS": API_KEY,
        }
        with LocalFleet(env) as gateways:
            urls = [start_gateway(gateways), start_gateway(gateways)]
            gateway_pid = gateways.processes[0].pid
            heading = f"{'calls':>6} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'gw CPU ms':>10}"
            print(f"{'run':<28} {heading}")
            for round_number in range(1, args.rounds + 1):
                runs = asyncio.run(measure(fleet, urls, gateway_pid, args))
                for name, run in zip(names, runs, strict=True):
                    print(run.line(f"{round_number}: {name}"))
                added = runs[4].p50_ms - runs[3].p50_ms
                scale = runs[2].rate / runs[1].rate
                print(
                    f"{round_number}: the gateway adds {added:+.1f} ms at p50 at "
                    f"{args.rate:g}/s; two gateways give {scale:.2f}x one at saturation"
                )


if __name__ == "__main__":
    main()
