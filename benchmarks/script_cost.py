"""Redis's own CPU for each call on a request's path: what ``redis-server`` spends per request
on the scripts and reads that carry one request from admission to its answer.

Run: .venv/bin/python benchmarks/script_cost.py [--batch-sizes 32 256] [--rounds 30]
On a private redis-server, for a batch of the synthetic model's requests built by the
project's own code, it makes each call of the request path in turn: the admission script
(``Producer.submit_many``), the watch script (``results``), the batcher's read, the worker's
start (its claim) and finalize script, and the producer's read of its inbox. Around each it
reads the server's CPU time (``INFO cpu``, user + system), less what a read of it alone costs, and
prints the median over ``--rounds`` rounds in µs per request, for each call and in all. No
other process uses that server meanwhile, so the figures hold Redis's work alone; their sum
against ``pipeline_cpu.py``'s redis-server column says what the rest (Celery's broker
traffic, the capacity counts, the round trips themselves) costs. A second table holds the
client's side of each call (``time.thread_time`` around it, on the project's own Redis client):
building the call, redis-py sending it and reading the reply.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis
from hot_paths import MODEL, WORKER, synthetic_run  # this folder, as a script runs

from config import lua
from config.connection import connect
from config.keys import CONSUMER_GROUP, Keys
from config.settings import load_settings
from producer.admission import Prepared, ProducerCore, read_inbox
from workers.local.local_redis import LocalRedis
from workers.protocol.entries import DecodedEntry, ensure_group, read_entries
from workers.protocol.results import ResultWriter
from workers.runtime.answers import answers_of

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


class RequestPath:
    """The calls that carry a batch of ``size`` requests from admission to its answers, on
    ``client``'s Redis, one batch of new requests a round."""

    def __init__(self, client: redis.Redis, size: int) -> None:
        settings = load_settings(models={MODEL: {"max_queue_len": 10 * size}})
        keys = Keys(settings.key_prefix)
        self._client = client
        self._size = size
        self._core = ProducerCore(settings)
        self._stream = keys.stream(MODEL)
        self._writer = ResultWriter(client, keys, MODEL)
        self._admit = lua.register(client, "admit")
        self._watch = lua.register(client, "watch")
        ensure_group(client, self._stream, CONSUMER_GROUP)
        self._prepared: list[Prepared] = []
        self._entries: list[DecodedEntry] = []

    def round(self) -> tuple[dict[str, float], dict[str, float]]:
        """The server's CPU seconds of each call (``CALLS``) for one batch of new requests,
        and this thread's (the call built, sent and read by redis-py)."""
        inputs = [f"request {n}" for n in range(self._size)]
        self._prepared = self._core.build(self._core.check_all(MODEL, inputs))
        calls: list[Callable[[], None]] = [
            self.admit,
            self.watch,
            self.batcher_read,
            self.start,
            self.finalize,
            self.inbox_read,
        ]
        used, spent = {}, {}
        for name, call in zip(CALLS, calls, strict=True):
            before = server_cpu_s(self._client)
            started = time.thread_time()
            call()
            spent[name] = time.thread_time() - started
            used[name] = server_cpu_s(self._client) - before
        return used, spent

    def request_ids(self) -> list[str]:
        return [item.request_id for item in self._prepared]

    def admit(self) -> None:
        self._admit(*self._core.admit_call(self._prepared))

    def watch(self) -> None:
        self._watch(*self._core.watch_call(MODEL, self.request_ids()))

    def batcher_read(self) -> None:
        streams: Any = {self._stream: ">"}
        reply: Any = self._client.xreadgroup(CONSUMER_GROUP, "batcher", streams, count=self._size)
        self._entries = read_entries(reply[0][1], MODEL, 600).decoded

    def start(self) -> None:
        entry_ids = [entry_id for entry_id, _, _ in self._entries]
        self._writer.start_batch("b-1", "w0|1", WORKER, entry_ids)

    def finalize(self) -> None:
        batch, run, version = synthetic_run(
            [(entry_id, request) for entry_id, _, request in self._entries]
        )
        statuses = self._writer.finalize(answers_of(batch, [run], version, WORKER))
        assert statuses == ["written"] * self._size, statuses

    def inbox_read(self) -> None:
        raws: Any = self._client.lpop(self._core.inbox(MODEL), self._size)
        assert len(read_inbox(raws)) == self._size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    header = f"{'batch':>6} " + " ".join(f"{name:>14}" for name in (*CALLS, "in all"))
    server_rows, client_rows = [], []
    with LocalRedis() as server:
        os.environ["BATCHFLEET_REDIS_URL"] = server.url
        client = connect(load_settings(models={MODEL: {}}))
        for size in args.batch_sizes:
            path = RequestPath(client, size)
            rounds = [path.round() for _ in range(args.rounds)]
            info_s = info_cost_s(client)
            server_rows.append(row(size, [used for used, _ in rounds], info_s))
            client_rows.append(row(size, [spent for _, spent in rounds]))
            client.flushall()
        client.close()
    print("redis-server CPU per request by call, µs (median of rounds, less an INFO read)")
    print("\n".join([header, *server_rows]))
    print("The client's CPU per request by call, µs (median of rounds: this thread's, building")
    print("each call, sending it and reading its reply)")
    print("\n".join([header, *client_rows]))


def row(size: int, rounds: list[dict[str, float]], less_s: float = 0.0) -> str:
    """One batch size's line: each call's median over ``rounds`` less ``less_s``, in µs a
    request, and their sum."""
    per_request = [
        max(0.0, statistics.median(r[name] for r in rounds) - less_s) / size * 1e6 for name in CALLS
    ]
    return f"{size:>6} " + " ".join(f"{us:>14.2f}" for us in [*per_request, sum(per_request)])


if __name__ == "__main__":
    main()
