"""The Celery broker's URL: a Redis on a Unix socket, as redis-py names it, is handed to kombu
under kombu's own name for it, with its database and credentials."""

from __future__ import annotations

from config.settings import load_settings
from workers.protocol.celery_app import broker_url


def test_a_unix_socket_redis_reaches_kombu_with_its_database_and_password() -> None:
    def broker_of(redis_url: str) -> str:
        return broker_url(load_settings(redis_url=redis_url))

    assert broker_of("unix:///run/redis.sock") == "redis+socket:///run/redis.sock?virtual_host=0"
    assert broker_of("unix://fleet:p%40ss@/run/redis.sock?db=3") == (
        "redis+socket://fleet:p%40ss@/run/redis.sock?virtual_host=3"
    )
    assert broker_of("unix:///run/redis.sock?db=2&password=p@ss") == (
        "redis+socket://:p%40ss@/run/redis.sock?virtual_host=2"
    )
    assert broker_of("rediss://h:6380/1") == "rediss://h:6380/1"


def test_a_broker_url_of_its_own_on_a_unix_socket_is_named_as_kombu_names_it() -> None:
    settings = load_settings(redis_url="redis://h:6379/0", broker_url="unix:///run/broker.sock")
    assert broker_url(settings) == "redis+socket:///run/broker.sock?virtual_host=0"
