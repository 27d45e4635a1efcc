"""Unit fixtures: fakeredis through the injected client, settings without a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest

from config.settings import ModelPolicy, Settings
from producer.client import Producer


@pytest.fixture
def settings() -> Settings:
    return Settings(
        redis_url="redis://fake:6379/0",
        models={
            "synthetic": ModelPolicy(
                max_batch_size=4,
                max_queue_len=10,
                max_input_bytes=1000,
                options={"base_ms": 0, "per_item_ms": 0},
            ),
        },
    )


@pytest.fixture
def fake_redis() -> Iterator[fakeredis.FakeRedis]:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    yield client
    client.close()


@pytest.fixture
def producer(settings: Settings, fake_redis: fakeredis.FakeRedis) -> Iterator[Producer]:
    listen = fakeredis.FakeRedis(server=fake_redis.connection_pool.connection_kwargs["server"])
    with Producer(settings, client=fake_redis, listen_client=listen) as client:
        yield client
