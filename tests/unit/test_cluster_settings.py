"""Redis Cluster settings: the cluster carries the request path only, never the batch hop."""

from __future__ import annotations

import pytest

from config.errors import ConfigError
from config.settings import load_settings

CLUSTER = {"redis_url": "redis://node-1:6379/0", "redis_cluster": True}


def test_a_cluster_needs_a_broker_of_its_own_and_takes_no_sentinel_or_replica_wait() -> None:
    with pytest.raises(ConfigError, match="needs broker_url"):
        load_settings(**CLUSTER)
    settings = load_settings(**CLUSTER, broker_url="amqp://guest:guest@rabbit:5672//")
    assert settings.redis_cluster
    with pytest.raises(ConfigError, match="does not apply to a Redis Cluster"):
        load_settings(**CLUSTER, broker_url="redis://broker:6379/0", redis_wait_replicas=1)


def test_a_cluster_is_named_by_a_node_address_not_a_unix_socket() -> None:
    with pytest.raises(ConfigError, match="not a unix:// URL"):
        load_settings(
            redis_url="unix:///run/redis.sock", redis_cluster=True, broker_url="redis://b:6379/0"
        )
