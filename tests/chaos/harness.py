"""A real fleet under a fault, and the account of every request a ledger sent to it.

A ``ChaosFleet`` owns a private ``redis-server`` (restartable on its port and data folder), a
batcher and workers started through the CLI, and a ``WriteObserver`` that counts every write
of every result key from Redis keyspace notifications. A ``Ledger`` (``ledger.py``) sends
requests and notes what the producer said at submit. After the fault is healed and the stream
has drained, ``ChaosFleet.account`` says for each accepted id how it ended:

- ok / error (by code): its stored result;
- lost: accepted, but no result was ever written;
- duplicated: its result key was written more than once (two final answers);
- wrong: an ok output that is not the echo of the request's own input;
- re-executions: model runs beyond the first (allowed; the model records every run).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from config.connection import connect
from config.errors import BatchfleetError, BrokerUnavailable
from config.keys import CONSUMER_GROUP, Keys, held_on_device, worker_consumer
from config.schema import Result
from config.settings import Settings, load_settings
from producer.client import Producer
from tests.chaos.hosts import Hosts
from tests.chaos.ledger import MODEL, Ledger, LedgerReport
from tests.chaos.ledger_model import read_executions
from workers.local.local_cluster import LocalCluster
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis
from workers.local.sentinel_group import NAME as SENTINEL_NAME
from workers.local.sentinel_group import SentinelGroup
from workers.protocol.entries import to_text

PREFIX = "chaos"
REDIS_HOST = "redis"
# Production's ordering (soft < hard < lease, reserved batches x hard < lease), in seconds
# instead of tens of seconds, so that recovery is quick.
CHAOS_LIMITS = {
    "BATCHFLEET_WORKER__SOFT_TIME_LIMIT_S": "1",
    "BATCHFLEET_WORKER__TIME_LIMIT_S": "2",
    "BATCHFLEET_BATCHER__RECLAIM_LEASE_S": "8",
}
READY_TIMEOUT_S = 60.0


class WriteObserver:
    """Counts the writes of each result key, from ``SET`` keyspace events; resubscribes when
    Redis comes back after a restart. A write made while it resubscribes can be missed: it can
    then hide a duplicate, never invent one.

    A Redis restarted on its AOF announces again, to whoever subscribed while it loads, the
    writes it replays (seen here: 37 and 106 results written before a kill, announced again,
    with no re-execution). So after each (re)subscription nothing is counted until a marker,
    published once Redis says it has finished loading, comes back on the same connection:
    every replayed event is before it.
    """

    SET_EVENTS = "__keyevent@0__:set"

    def __init__(self, url: str, keys: Keys, models: Sequence[str]) -> None:
        self.url = url
        self.result_prefixes = [keys.result(model, "") for model in models]
        self.writes: Counter[str] = Counter()
        self.subscribed = threading.Event()
        self._marker = f"write-observer:{uuid.uuid4().hex}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="write-observer", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.subscribed.wait(10):
            raise BrokerUnavailable("the write observer could not subscribe")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            # No retries inside redis-py: every reconnection comes through the marker below.
            client = redis.Redis.from_url(
                self.url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
            )
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.SET_EVENTS, self._marker)
                self._wait_until_loaded(client)
                client.publish(self._marker, "loaded")
                self._listen(pubsub)
            except redis.RedisError:
                self.subscribed.clear()
                self._stop.wait(0.05)
            finally:
                client.close()

    def _wait_until_loaded(self, client: redis.Redis) -> None:
        while client.info("persistence")["loading"] and not self._stop.is_set():
            self._stop.wait(0.01)

    def _listen(self, pubsub: Any) -> None:
        counting = False
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=0.2)
            if message is None:
                continue
            if message["channel"].decode() == self._marker:
                counting = True
                self.subscribed.set()
            elif counting:
                self._count(message["data"].decode())

    def _count(self, key: str) -> None:
        for prefix in self.result_prefixes:
            if key.startswith(prefix):
                self.writes[key.removeprefix(prefix)] += 1


class ChaosFleet:
    """A private Redis (or, with ``sentinel``, a Sentinel group: ``group``; with ``hosts``,
    on the host ``redis`` of those; with ``cluster``, a Redis Cluster of three masters:
    ``cluster``, the batches on a Redis of their own), the processes of a fleet serving the
    ledger model as each of ``models`` (its writes waiting for ``wait_replicas`` replicas),
    and an observer of each Redis node's writes."""

    def __init__(
        self,
        folder: Path,
        *redis_args: str,
        policy: dict[str, Any] | None = None,
        model_options: dict[str, Any] | None = None,
        sentinel: bool = False,
        wait_replicas: int = 0,
        hosts: Hosts | None = None,
        cluster: bool = False,
        models: Sequence[str] = (MODEL,),
        **env: str,
    ) -> None:
        events = ("--notify-keyspace-events", "E$", *redis_args)
        self.group = SentinelGroup(*events) if sentinel else None
        self.cluster = LocalCluster(*events) if cluster else None
        self.broker = LocalRedis() if cluster else None
        if self.group is not None:
            self.redis = self.group.nodes[0]
        elif self.cluster is not None:
            self.redis = self.cluster.nodes[0]
        elif hosts is not None:  # reached from the other hosts: no loopback-only mode
            self.redis = LocalRedis(
                *events,
                *("--protected-mode", "no"),
                host=hosts.address[REDIS_HOST],
                wrapper=hosts.run_in(REDIS_HOST),
            )
        else:
            self.redis = LocalRedis(*events)
        where: dict[str, str] = {"redis_url": self.redis.url}
        if self.group is not None:
            where = {"redis_url": self.group.url, "redis_sentinel_master": SENTINEL_NAME}
        if self.cluster is not None and self.broker is not None:
            where = {"redis_url": self.cluster.url, "redis_cluster": "true"}
            where["broker_url"] = self.broker.url
        if wait_replicas:
            where["redis_wait_replicas"] = str(wait_replicas)
        self.executions_path = str(folder / "executions.log")
        model = {
            "backend": "tests.chaos.ledger_model:LedgerModel",
            "options": {"executions_path": self.executions_path, **(model_options or {})},
            **(policy or {}),
        }
        self.models = {name: model for name in models}
        self.keys = Keys(PREFIX)
        self.settings: Settings = load_settings(**where, key_prefix=PREFIX, models=self.models)
        self.processes = LocalFleet(
            {
                **{f"BATCHFLEET_{name.upper()}": value for name, value in where.items()},
                "BATCHFLEET_KEY_PREFIX": PREFIX,
                "BATCHFLEET_MODELS": json.dumps(self.models),
                **CHAOS_LIMITS,
                **env,
            }
        )
        nodes = [self.redis]
        if self.group is not None:
            nodes = self.group.nodes
        elif self.cluster is not None:
            nodes = self.cluster.nodes
        self.observers = [WriteObserver(node.url, self.keys, models) for node in nodes]
        self._client: redis.Redis | None = None
        self._supervisors: list[threading.Thread] = []
        self.starts: Counter[str] = Counter()
        self._closing = threading.Event()

    @property
    def client(self) -> redis.Redis:
        """A client of the fleet's Redis, made once it runs (a cluster's client asks it for
        its slots at once)."""
        if self._client is None:
            self._client = connect(self.settings)
        return self._client

    def start(self) -> ChaosFleet:
        if self.group is not None:
            self.group.start()
        elif self.cluster is not None and self.broker is not None:
            self.cluster.start()
            self.broker.start()
        else:
            self.redis.start()
        for observer in self.observers:
            observer.start()
        return self

    def writes(self) -> Counter[str]:
        """Writes of each request's result, as the observer of the Redis that holds the data
        now counted them: on a Sentinel group, the master's (a replica sees its master's
        writes too, and writes the sentinels' failover took back never reach it); on a
        cluster, every master's (each holds its own keys)."""
        if self.cluster is not None:
            return sum((observer.writes for observer in self.observers), Counter())
        if self.group is None:
            return self.observers[0].writes
        master = self.group.master()
        return self.observers[self.group.nodes.index(master)].writes

    def close(self) -> None:
        self._closing.set()
        self.processes.stop_all()
        for supervisor in self._supervisors:
            supervisor.join(timeout=15)
        self.processes.close()  # and what a supervisor started while the first pass ran
        for observer in self.observers:
            observer.stop()
        if self._client is not None:
            self._client.close()
        if self.group is not None:
            self.group.stop()
        elif self.cluster is not None and self.broker is not None:
            self.cluster.stop()
            self.broker.stop()
        else:
            self.redis.stop()

    def producer(self) -> Producer:
        return Producer(self.settings)

    def serve(self) -> None:
        """Starts a batcher and one CPU worker."""
        self.processes.start("batcher")
        self.processes.start("worker", "--cpu")

    def enqueue_again(self, entry: tuple[bytes, dict[bytes, bytes]]) -> None:
        """Appends a stream entry read earlier to the stream once more, as a request given to
        the fleet a second time (a duplicate delivery) would be: it runs again. A late Celery
        redelivery of a finished batch would not: its entries left the stream with their
        answers (``tests/unit/test_batch_path.py``)."""
        _, fields = entry
        self.client.xadd(self.keys.stream(MODEL), fields)  # type: ignore[arg-type]

    def supervise(self, *args: str) -> None:
        """Runs ``batchfleet ARGS`` and restarts it whenever it exits, as a supervisor does."""

        def keep_running() -> None:
            while not self._closing.is_set():
                self.starts[" ".join(args)] += 1
                self.processes.start(*args).wait()

        thread = threading.Thread(target=keep_running, name=f"supervise {args}", daemon=True)
        thread.start()
        self._supervisors.append(thread)

    def wait_ready(self, producer: Producer) -> None:
        """Barrier: one request makes the whole path before the load starts."""
        try:
            producer.result(producer.submit(MODEL, {"n": "warmup"}), timeout_s=READY_TIMEOUT_S)
        except BatchfleetError:
            print(self.processes.logs())
            raise

    def backlog(self) -> int:
        """Requests still in the stream: queued, running, or waiting to be reclaimed."""
        return sum(int(self.client.xlen(self.keys.stream(model))) for model in self.models)

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Waits until every accepted request has left the stream (its answer written)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.backlog() == 0:
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.05)
        return False

    def stored_results(self, model: str, request_ids: list[str]) -> dict[str, Result]:
        stored = {}
        for start in range(0, len(request_ids), 500):
            chunk = request_ids[start : start + 500]
            raws = self.client.mget([self.keys.result(model, request_id) for request_id in chunk])
            for request_id, raw in zip(chunk, raws, strict=True):
                if raw is not None:
                    stored[request_id] = Result.model_validate_json(raw)
        return stored

    def account(self, scenario: str, ledger: Ledger, notes: str = "") -> LedgerReport:
        """The ledger's report after the fleet settled."""
        ids = list(ledger.accepted)
        stored = self.stored_results(ledger.model, ids)
        writes = self.writes()
        runs = Counter(read_executions(self.executions_path))
        errors: Counter[str] = Counter(
            result.error.code for result in stored.values() if result.error is not None
        )
        return LedgerReport(
            scenario=scenario,
            accepted=len(ids),
            ok=sum(result.ok for result in stored.values()),
            errors=dict(errors),
            refused=dict(ledger.refused),
            lost=[i for i in ids if i not in stored and writes[i] == 0],
            duplicated=[i for i in ids if writes[i] > 1],
            wrong=[
                i
                for i, result in stored.items()
                if result.ok and result.output != {"echo": ledger.accepted[i]}
            ],
            reexecutions=sum(max(0, runs[ledger.accepted[i]["n"]] - 1) for i in ids),
            notes=notes,
        )


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Barrier on observable state: returns once ``condition`` holds, fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def held_by(fleet: ChaosFleet, consumer: str) -> int:
    """How many requests ``consumer`` holds in the stream (read, not yet answered)."""
    return sum(pending for name, pending in _holders(fleet) if name == consumer)


def on_device_of(fleet: ChaosFleet, hostname: str) -> int:
    """How many requests the worker ``hostname`` has on its device (any of its processes)."""
    return sum(
        pending
        for name, pending in _holders(fleet)
        if name.startswith(worker_consumer(hostname) + ":") and held_on_device(name)
    )


def _holders(fleet: ChaosFleet) -> list[tuple[str, int]]:
    try:
        consumers = fleet.client.xinfo_consumers(fleet.keys.stream(MODEL), CONSUMER_GROUP)
    except redis.ResponseError:
        return []
    return [(to_text(c["name"]), int(c["pending"])) for c in consumers]


class Background:
    """A load run in a thread while the scenario injects its fault; ``join`` re-raises what
    the load raised."""

    def __init__(self, target: Callable[[], None]) -> None:
        self._target = target
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._target()
        except BaseException as exc:
            self._error = exc

    def join_for(self, seconds: float) -> None:
        """Waits up to ``seconds`` for the load, without asserting that it ended."""
        self._thread.join(seconds)

    def join(self, timeout_s: float = 120.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the load did not finish"
        if self._error is not None:
            raise self._error


@contextlib.contextmanager
def load_running(
    fleet: ChaosFleet, ledger: Ledger, seconds: float, rate: float = 100.0
) -> Iterator[tuple[Producer, Background]]:
    """Once the fleet answers, an open-loop load at ``rate`` for ``seconds`` runs in the
    background while the block injects its fault; it is joined, at the latest, on exit."""
    with fleet.producer() as producer:
        fleet.wait_ready(producer)
        load = Background(lambda: ledger.open_loop(producer, rate, seconds))
        yield producer, load
        load.join()


OUTLASTS_ANY_FAULT_S = 120


class Waiter:
    """A caller blocked in a thread on some requests' results, with a timeout longer than any
    fault here; ``outcome`` is what it ended with: the outputs by id, or the error."""

    def __init__(self, producer: Producer, request_ids: list[str]) -> None:
        self._outcome: dict[str, object] | BatchfleetError = {}
        self._done = Background(lambda: self._wait(producer, request_ids))

    def _wait(self, producer: Producer, request_ids: list[str]) -> None:
        try:
            results = producer.results(request_ids, timeout_s=OUTLASTS_ANY_FAULT_S)
            self._outcome = {result.request_id: result.unwrap() for result in results}
        except BatchfleetError as exc:
            self._outcome = exc

    def outcome(self) -> dict[str, object] | BatchfleetError:
        self._done.join(timeout_s=OUTLASTS_ANY_FAULT_S + 30)
        return self._outcome


class Callers:
    """Callers waiting while the fault strikes: ten requests that take a moment each
    (``stall_s``), one caller per request and one for all ten."""

    def __init__(self, producer: Producer, ledger: Ledger) -> None:
        self.ids = [ledger.send_new(producer, stall_s=0.5) for _ in range(10)]
        self.expected = {i: {"echo": ledger.accepted[i]} for i in self.ids}
        self.waiters = [Waiter(producer, [request_id]) for request_id in self.ids]
        self.waiters.append(Waiter(producer, self.ids))

    def outcomes(self) -> list[dict[str, object] | BatchfleetError]:
        return [waiter.outcome() for waiter in self.waiters]

    def all_answered(self) -> bool:
        """Whether every caller got every one of its answers, right, with no exception."""
        wanted = [{i: self.expected[i]} for i in self.ids] + [self.expected]
        return self.outcomes() == wanted
