"""One setting names a Sentinel group for every process: what the clients and the Celery
broker are built with (no sockets: nothing connects until a command is sent)."""

from __future__ import annotations

import ssl

import pytest
import redis.sentinel

from config.connection import connect
from config.errors import ConfigError
from config.sentinel import sentinel_group
from config.settings import Settings, load_settings
from workers.protocol.broker_transport import SentinelTransport
from workers.protocol.celery_app import make_celery_app

URL = "sentinel://:master%20pw@s1:26379;sentinel://s2:26380;sentinel://s3/2"


def sentinel_settings(**extra: object) -> Settings:
    return load_settings(redis_url=URL, redis_sentinel_master="mymaster", **extra)


def test_a_sentinel_url_needs_its_master_name_and_a_name_needs_the_url() -> None:
    with pytest.raises(ConfigError, match="redis_sentinel_master"):
        load_settings(redis_url=URL)
    with pytest.raises(ConfigError, match="not sentinel://"):
        load_settings(redis_url="redis://127.0.0.1:6379/0", redis_sentinel_master="mymaster")


def test_clients_ask_every_sentinel_with_their_password_for_the_master_with_its_own() -> None:
    """The URL's password is the master's, its path the database; the sentinels get theirs."""
    settings = sentinel_settings(redis_sentinel_password="sentinel pw")
    seen: dict[str, object] = {}

    def sentinel(hosts: list[tuple[str, int]], **options: object) -> None:
        seen.update(options, hosts=hosts)

    sentinel_group(settings, sentinel)
    assert seen["hosts"] == [("s1", 26379), ("s2", 26380), ("s3", 26379)]
    assert seen["password"] == "master pw"
    assert seen["db"] == 2
    assert seen["sentinel_kwargs"] == {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
        "password": "sentinel pw",
    }
    client = connect(settings)
    assert client.connection_pool.service_name == "mymaster"  # type: ignore[attr-defined]
    client.close()


def test_the_celery_broker_uses_kombus_sentinel_transport_with_the_same_names() -> None:
    settings = sentinel_settings(redis_sentinel_password="sentinel pw")
    app = make_celery_app(settings)
    options = app.conf.broker_transport_options
    assert options["master_name"] == "mymaster"
    assert options["sentinel_kwargs"]["password"] == "sentinel pw"
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, SentinelTransport)


def test_tls_to_the_sentinels_reaches_every_client_and_the_broker() -> None:
    """With a CA file, the sentinels, the master and Celery's broker are reached over TLS,
    certificates verified; a CA without a Sentinel URL is refused."""
    settings = sentinel_settings(redis_sentinel_tls_ca="/etc/batchfleet/ca.pem")
    sentinels = sentinel_group(settings, redis.sentinel.Sentinel)
    assert sentinels.sentinel_kwargs["ssl"] is True
    assert sentinels.connection_kwargs["ssl_ca_certs"] == "/etc/batchfleet/ca.pem"
    assert sentinels.connection_kwargs["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    app = make_celery_app(settings)
    assert app.conf.broker_use_ssl["ssl_ca_certs"] == "/etc/batchfleet/ca.pem"
    assert app.conf.broker_transport_options["sentinel_kwargs"]["ssl"] is True
    with pytest.raises(ConfigError, match="redis_sentinel_tls_ca"):
        load_settings(redis_url="redis://127.0.0.1:6379/0", redis_sentinel_tls_ca="/ca.pem")
