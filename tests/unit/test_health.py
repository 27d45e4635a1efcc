"""/livez and /readyz: a loop is live while it turns and ready while it also reaches Redis;
a batcher whose Redis is away stays live (a restart would not help) and is not ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import fakeredis
from prometheus_client import CollectorRegistry, make_wsgi_app

from config.settings import Settings
from tests.unit.test_batch_path import RecordingCelery, new_batcher
from workers.protocol.health import Health
from workers.protocol.metrics_endpoint import health_app

# Longer than a batcher's turn while Redis is away (it pauses REDIS_RETRY_PAUSE_S, 0.5 s).
STALE_S = 3.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_is_live_while_it_turns_and_ready_while_it_reaches_redis() -> None:
    clock = Clock()
    health = Health(stale_after_s=30, clock=clock)
    assert health.live() and not health.ready()  # started: not serving yet
    health.reached()
    clock.now += 29
    assert health.live() and health.ready()
    clock.now += 2
    assert not health.live() and not health.ready()  # the loop hangs
    health.turned()
    assert health.live() and not health.ready()  # it turns, Redis is away


def get(app: Any, path: str) -> tuple[str, bytes]:
    status: list[str] = []

    def start_response(code: str, headers: list[tuple[str, str]]) -> None:
        status.append(code)

    body: Iterable[bytes] = app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, start_response)
    return status[0], b"".join(body)


def test_the_endpoint_answers_the_probes_from_every_loop_and_serves_metrics_too() -> None:
    clock = Clock()
    serving, waiting = Health(clock=clock), Health(clock=clock)
    serving.reached()
    app = health_app(make_wsgi_app(CollectorRegistry()), [serving, waiting])
    assert get(app, "/livez")[0].startswith("200")
    assert get(app, "/readyz")[0].startswith("503")  # one loop is not ready
    waiting.reached()
    assert get(app, "/readyz")[0].startswith("200")
    status, body = get(app, "/metrics")
    assert status.startswith("200") and b"/livez" not in body


def test_a_batcher_without_redis_stays_live_and_is_not_ready(
    settings: Settings, fake_redis: fakeredis.FakeRedis
) -> None:
    """Redis goes away under a serving batcher: it lapses from ready, and turns on, live."""
    batcher = new_batcher(settings, fake_redis, RecordingCelery(fake_redis))
    batcher.health = Health(stale_after_s=STALE_S)
    stop = threading.Event()
    thread = threading.Thread(target=batcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(batcher.health.ready)
        fake_redis.connection_pool.connection_kwargs["server"].connected = False
        wait_for(lambda: not batcher.health.ready())
        assert batcher.health.live()
    finally:
        stop.set()
        thread.join(timeout=10)


def wait_for(condition: Callable[[], bool]) -> None:
    give_up = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < give_up, "the batcher's health never changed"
        time.sleep(0.01)
