"""The sync and async producers are twins: the same public methods with the same parameters,
so that code moves between them by adding ``await``."""

from __future__ import annotations

import asyncio
import inspect

import fakeredis
import pytest

from config.errors import InputTooLarge, UnknownModel
from config.keys import Keys
from config.settings import Settings
from producer.async_client import AsyncProducer
from producer.client import Producer

# The names that differ by design: closing, and the context-manager protocol.
SYNC_ONLY = {"close"}
ASYNC_ONLY = {"aclose"}


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member)
    }


def test_both_producers_offer_the_same_methods_with_the_same_parameters() -> None:
    """Each public method of one has its twin in the other: same parameters, same defaults."""
    sync, asynchronous = public_methods(Producer), public_methods(AsyncProducer)
    assert set(sync) - SYNC_ONLY == set(asynchronous) - ASYNC_ONLY
    for name in set(sync) - SYNC_ONLY:
        assert list(sync[name].parameters) == list(asynchronous[name].parameters), name
        assert [p.default for p in sync[name].parameters.values()] == [
            p.default for p in asynchronous[name].parameters.values()
        ], name


def test_every_async_method_but_the_property_is_awaited_or_iterated() -> None:
    """An async producer's I/O methods are coroutines or async generators."""
    for name in public_methods(AsyncProducer):
        method = getattr(AsyncProducer, name)
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name


def test_the_async_producer_validates_like_the_sync_one(settings: Settings) -> None:
    """validate refuses what submit would, and enqueues nothing either way."""
    client = fakeredis.aioredis.FakeRedis()
    producer = AsyncProducer(settings, client=client, listen_client=client)
    with pytest.raises(UnknownModel):
        asyncio.run(producer.validate("nope", "x"))
    with pytest.raises(InputTooLarge):
        asyncio.run(producer.validate("synthetic", "x" * 5000))
    assert asyncio.run(producer.validate("synthetic", "fine")) is None
    assert asyncio.run(client.keys("*")) == []


def test_the_async_producer_validates_a_whole_call_before_its_first_chunk(
    settings: Settings,
) -> None:
    """A bad input past the first chunk (of 10: the queue cap) enqueues nothing."""
    client = fakeredis.aioredis.FakeRedis()
    producer = AsyncProducer(settings, client=client, listen_client=client)
    with pytest.raises(InputTooLarge):
        asyncio.run(producer.submit_many("synthetic", [*range(10), "x" * 5000]))
    assert asyncio.run(client.exists(Keys(settings.key_prefix).stream("synthetic"))) == 0
