"""The Celery broker's transport: kombu's Redis transport, building one Redis client per
channel instead of one per publish and ack, under the URL the operator gave."""

from __future__ import annotations

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
