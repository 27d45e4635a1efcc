"""Redis's own CPU for each call on a request's path: what ``redis-server`` spends per request
on the scripts and reads that carry one request from admission to its answer.

Run: .venv/bin/python benchmarks/script_cost.py [--batch-sizes 32 256] [--rounds 30]
On a private redis-server, for a batch of the synthetic model's requests built by the
project's own code, it makes each call of the request path in turn: the admission script
(``Producer.submit_many``), the watch script (``results``), the batcher's read, the worker's
start and finalize scripts, and the producer's read of its inbox. Around each it reads the
server's CPU time (``INFO cpu``, user + system), less what a read of it alone costs, and
prints the median over ``--rounds`` rounds in µs per request, for each call and in all. No
other process uses that server meanwhile, so the figures hold Redis's work alone; their sum
against ``pipeline_cpu.py``'s redis-server column says what the rest (Celery's broker
traffic, the capacity counts, the round trips themselves) costs.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any
from unittest import mock

import redis

from config import lua
from config.keys import CONSUMER_GROUP, Keys
from config.settings import load_settings
from producer.admission import ProducerCore, read_inbox
from workers.local.local_redis import LocalRedis
from workers.models.synthetic import SyntheticModel
from workers.protocol.entries import ensure_group, read_entries
from workers.protocol.results import ResultWriter
from workers.runtime.answers import answers_of
from workers.runtime.batch_run import BatchRun
from workers.runtime.device import ModelRun

MODEL = "synthetic"
CALLS = ("admit", "watch", "batcher's read", "start", "finalize", "inbox read")


def server_cpu_s(client: redis.Redis) -> float:
    """The server's CPU seconds so far (user + system, its every thread)."""
    cpu: dict[str, float] = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def info_cost_s(client: redis.Redis, reads: int = 200) -> float:
    """What one ``server_cpu_s`` read costs the server, the median of ``reads``."""
    costs = []
    for _ in range(reads):
        before = server_cpu_s(client)
        costs.append(server_cpu_s(client) - before)
    return statistics.median(costs)


def one_round(client: redis.Redis, size: int) -> dict[str, float]:
    """Server CPU seconds of each call for one batch of ``size`` new requests."""
    settings = load_settings(models={MODEL: {"max_queue_len": 10 * size}})
    keys = Keys(settings.key_prefix)
    core = ProducerCore(settings)
    stream = keys.stream(MODEL)
    ensure_group(client, stream, CONSUMER_GROUP)
    writer = ResultWriter(client, keys, MODEL)
    admit, watch = lua.register(client, "admit"), lua.register(client, "watch")
    prepared = core.prepare_all(MODEL, [f"request {n}" for n in range(size)])
    request_ids = [item.request_id for item in prepared]
    model = SyntheticModel(base_ms=0, per_item_ms=0)
    read: dict[str, Any] = {}

    def batcher_read() -> None:
        reply: Any = client.xreadgroup(CONSUMER_GROUP, "batcher", {stream: ">"}, count=size)
        read["entries"] = read_entries(reply[0][1], MODEL, 600).decoded

    def start() -> None:
        entry_ids = [entry_id for entry_id, _, _ in read["entries"]]
        writer.start_batch("b-1", "w0|1", "w0@host", entry_ids, request_ids)

    def finalize() -> None:
        requests = [request for _, _, request in read["entries"]]
        run = ModelRun(
            [(entry_id, request) for entry_id, _, request in read["entries"]],
            model.predict([request.input for request in requests]),
            None,
            0.0026,
            requests[0].submitted_at + 0.01,
        )
        batch = BatchRun(MODEL, "b-1", "size", writer, mock.Mock(), ttl_s=600, lease_s=55)
        statuses = writer.finalize(answers_of(batch, [run], model.version, "w0@host"))
        assert statuses == ["written"] * size, statuses

    def inbox_read() -> None:
        raws: Any = client.lpop(core.inbox(MODEL), size)
        assert len(read_inbox(raws)) == size

    calls: dict[str, Callable[[], Any]] = {
        "admit": lambda: admit(*core.admit_call(prepared)),
        "watch": lambda: watch(*core.watch_call(MODEL, request_ids)),
        "batcher's read": batcher_read,
        "start": start,
        "finalize": finalize,
        "inbox read": inbox_read,
    }
    used = {}
    for name, call in calls.items():
        before = server_cpu_s(client)
        call()
        used[name] = server_cpu_s(client) - before
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print("redis-server CPU per request by call, µs (median of rounds, less an INFO read)")
    print(f"{'batch':>6} " + " ".join(f"{name:>14}" for name in (*CALLS, "in all")))
    with LocalRedis() as server:
        client = redis.Redis.from_url(server.url)
        for size in args.batch_sizes:
            rounds = [one_round(client, size) for _ in range(args.rounds)]
            info_s = info_cost_s(client)
            per_request = {
                name: max(0.0, statistics.median(r[name] for r in rounds) - info_s) / size * 1e6
                for name in CALLS
            }
            figures = [*per_request.values(), sum(per_request.values())]
            print(f"{size:>6} " + " ".join(f"{us:>14.2f}" for us in figures))
            client.flushall()
        client.close()


if __name__ == "__main__":
    main()
