"""Integration fixtures: one real redis-server per session on a free loopback port, a fresh key
prefix per test, and real batcher and Celery worker processes started through the CLI."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from config.settings import Settings, load_settings
from producer.client import Producer
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis

READY_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    with LocalRedis() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


FleetEnv = dict[str, str]


@pytest.fixture
def fleet_env(redis_server: LocalRedis) -> FleetEnv:
    """The environment of this test's fleet: its own key prefix on the session's Redis."""
    return {
        "BATCHFLEET_REDIS_URL": redis_server.url,
        "BATCHFLEET_KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}",
    }


def settings_for(env: FleetEnv) -> Settings:
    """The settings a fleet process started with ``env`` loads."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def make_fleet(fleet_env: FleetEnv) -> Iterator[Callable[..., LocalFleet]]:
    """Builds a LocalFleet with extra settings; every process is stopped after the test."""
    fleets: list[LocalFleet] = []

    def make(**extra: str) -> LocalFleet:
        fleet = LocalFleet({**fleet_env, **extra})
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def takes_ctrl_c() -> None:
    """A ``preexec_fn`` for a child that a test stops with Ctrl-C (SIGINT): the child takes it
    as a terminal user's, also when this run inherited SIGINT ignored (as a background job
    of a shell script does, and its children after it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def producer_for(fleet: LocalFleet) -> Producer:
    env = {key: value for key, value in fleet.env.items() if key.startswith("BATCHFLEET_")}
    return Producer(settings_for(env))


def wait_ready(
    producer: Producer, fleet: LocalFleet, model: str = "synthetic", warmup: Any = None
) -> None:
    """Barrier: one request makes the whole path (batcher, worker, result) before the test."""
    warmup = {"warmup": True} if warmup is None else warmup
    try:
        producer.result(producer.submit(model, warmup), timeout_s=READY_TIMEOUT_S)
    except Exception:
        print(fleet.logs())
        raise


def check_outputs(results: dict[str, Any], expected: dict[str, Any]) -> None:
    missing = sorted(set(expected) - set(results))
    assert not missing, f"{len(missing)} requests without a result, e.g. {missing[:3]}"
    wrong = [key for key in expected if results[key] != expected[key]]
    assert not wrong, f"{len(wrong)} wrong outputs, e.g. {wrong[:3]}"
