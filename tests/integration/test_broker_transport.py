"""The Celery broker's transport: kombu's Redis transport, building one Redis client per
channel instead of one per publish and ack, under the URL the operator gave."""

from __future__ import annotations

import redis
from kombu import Queue

from workers.protocol.celery_app import make_celery_app

from .conftest import FleetEnv, settings_for


def test_the_broker_channel_reuses_one_client_and_keeps_the_url_scheme(
    fleet_env: FleetEnv,
) -> None:
    """Every publish and ack of a channel goes through the same client, on the channel's
    pool; the connection still reads (and logs) as the ``redis://`` URL it was given."""
    app = make_celery_app(settings_for(fleet_env))
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
            assert first.ping()
        assert connection.as_uri().startswith("redis://")


def test_a_producer_left_with_a_closed_channel_publishes_on_a_new_one(
    fleet_env: FleetEnv, redis_client: redis.Redis
) -> None:
    """kombu closes every channel of a connection when it reconnects, also one a producer
    is still publishing on (a queue declare retried inside a publish does that during a
    network cut): the publish reopens a channel and reaches its queue, instead of failing
    on the closed channel (a batcher died of that)."""
    queue = f"{fleet_env['BATCHFLEET_KEY_PREFIX']}.probes"
    app = make_celery_app(settings_for(fleet_env))
    with app.connection_for_write() as connection:
        producer = connection.Producer()
        Queue(queue, channel=producer.channel).declare()
        connection.collect()  # what kombu's ensure() does on a connection error
        producer.publish({"probe": 1}, routing_key=queue, retry=True)
    assert redis_client.llen(queue) == 1
