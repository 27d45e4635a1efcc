"""A producer follows the fleet's model policies: one started with nothing but the Redis URL
serves the models its batchers publish, with their cache, priorities, caps and deadlines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import fakeredis
import pytest

from config.errors import QueueFull, UnknownModel
from config.keys import Keys
from config.published_policy import encode_policy
from config.settings import ModelPolicy, Settings
from producer.client import Producer

KEYS = Keys("bf")
FLEET = ModelPolicy(
    backend="secret.module:Model",
    options={"api_key": "not-for-producers"},
    max_queue_len=2,
    cache_ttl_s=60,
    priorities=True,
    request_timeout_s=5,
)


def publish(client: fakeredis.FakeRedis, model: str, policy: ModelPolicy | str) -> None:
    """What a batcher serving ``model`` writes at start."""
    raw = policy if isinstance(policy, str) else encode_policy(policy)
    client.hset(KEYS.policies(), model, raw)


def producer_with(settings: Settings, client: fakeredis.FakeRedis) -> Producer:
    return Producer(settings, client=client, listen_client=client)


@pytest.fixture
def bare(fake_redis: fakeredis.FakeRedis) -> Iterator[Producer]:
    """A producer configured with nothing but where Redis is."""
    with producer_with(Settings(redis_url="redis://fake:6379/0"), fake_redis) as producer:
        yield producer


def test_a_bare_producer_serves_the_fleets_models_by_the_fleets_policy(
    bare: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """A model only the fleet knows is served; its queue cap, priorities, cache and deadline
    are the fleet's; the worker-only backend and options are not published."""
    publish(fake_redis, "embed", FLEET)
    policy = bare.policy("embed")
    assert (policy.max_queue_len, policy.cache_ttl_s, policy.priorities) == (2, 60, True)
    assert policy.options == {} and "not-for-producers" not in str(
        fake_redis.hgetall(KEYS.policies())
    )
    bare.submit_many("embed", ["a", "b"], priority="high")
    with pytest.raises(QueueFull):
        bare.submit("embed", "c")


def test_without_published_policies_a_producer_keeps_its_own(
    bare: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """No batcher has published: the producer's own configuration decides, as before."""
    assert bare.policy("synthetic") == ModelPolicy()
    with pytest.raises(UnknownModel, match="served: \\['synthetic'\\]"):
        bare.submit("embed", "x")


def test_a_producer_configured_otherwise_warns_once_and_follows_the_fleet(
    fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Its own policy for a model the fleet serves differs: one warning naming the fields,
    then the fleet's policy is the one admitted by."""
    configured = Settings(
        redis_url="redis://fake:6379/0", models={"synthetic": ModelPolicy(max_queue_len=10)}
    )
    publish(fake_redis, "synthetic", FLEET)
    with caplog.at_level(logging.WARNING), producer_with(configured, fake_redis) as producer:
        producer.submit_many("synthetic", ["a", "b"])
        with pytest.raises(QueueFull):
            producer.submit("synthetic", "c")
        producer.validate("synthetic", "d")
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1, warnings
    assert "max_queue_len: 10 here, 2 in the fleet" in warnings[0]
    assert "following the fleet" in warnings[0]


def test_a_policy_this_release_cannot_read_leaves_the_producers_own(
    settings: Settings, fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy from a newer batcher, with a field this release lacks, is said and skipped."""
    publish(fake_redis, "synthetic", '{"max_batch_size": 8, "a_newer_field": 1}')
    with caplog.at_level(logging.WARNING), producer_with(settings, fake_redis) as producer:
        assert producer.policy("synthetic") == settings.models["synthetic"]
    assert "cannot be read" in caplog.text
