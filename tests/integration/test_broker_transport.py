"""The Celery broker's transport: kombu's Redis transport, building one Redis client per
channel instead of one per publish and ack, under the URL the operator gave."""

from __future__ import annotations

import uuid

import redis
from kombu import Queue

from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis
from workers.protocol.celery_app import make_celery_app

from .conftest import FleetEnv, settings_for
from .test_flower import AUTH, serve_and_show_in_flower


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


def test_a_fleet_on_a_unix_socket_sends_every_command_there_and_never_logs_the_password() -> None:
    """Given a ``unix://`` Redis URL with an ACL user's password, the producer, the batcher,
    the worker and Flower (Celery's broker connections included) all reach Redis on its
    socket: the batches are answered and Flower shows them. The password is in no log."""
    password = "s0cket-" + uuid.uuid4().hex[:8]
    acl = ("--user", "fleet", "on", f">{password}", "~*", "&*", "+@all")
    with LocalRedis(*acl, unix_socket=True) as server:
        assert server.url.startswith("unix://")
        env = {
            "BATCHFLEET_REDIS_URL": server.url.replace("unix://", f"unix://fleet:{password}@"),
            "BATCHFLEET_KEY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            "FLOWER_BASIC_AUTH": ":".join(AUTH),
        }
        with LocalFleet(env) as fleet:
            serve_and_show_in_flower(fleet, "w1@unix")
            admin = redis.Redis.from_url(server.url)
            clients = [client for client in admin.client_list() if client["user"] == "fleet"]
            admin.close()
            fleet.stop_all()
            logs = fleet.logs()
    over_tcp = [client for client in clients if not client["laddr"].startswith("/")]
    assert len(clients) >= 3, clients  # the batcher's, the worker's, Flower's at least
    assert not over_tcp, over_tcp
    assert password not in logs
