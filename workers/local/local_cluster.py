"""A Redis Cluster on loopback: masters only (no replicas), each a ``redis-server`` with AOF,
the 16,384 hash slots split evenly among them, for the tests and the benchmarks.

``url`` names the first node (a cluster client finds the rest); ``node_of(key)`` is the
master that holds a key. A node SIGKILLed with ``crash()`` and started again comes back on
its AOF and its cluster configuration (both in its data folder). The cluster keeps serving
the other masters' slots meanwhile (``cluster-require-full-coverage no``).
"""

from __future__ import annotations

import time

import redis
from redis.crc import key_slot

from config.errors import BrokerUnavailable
from workers.local.local_redis import LocalRedis, free_port, port_is_free
from workers.local.startable import Startable

SLOTS = 16384
# A cluster node also listens on its port + 10000 (the cluster bus).
BUS_PORT_OFFSET = 10000
NODE_TIMEOUT_MS = 2000
SETTLE_TIMEOUT_S = 60.0


def master_of(key: str, masters: int) -> int:
    """Which of ``masters`` evenly split masters holds ``key``, by index."""
    return min(key_slot(key.encode()) // (SLOTS // masters), masters - 1)


def cluster_port() -> int:
    """A free port whose cluster bus port (+ 10000) is free too."""
    while True:
        port = free_port()
        if port + BUS_PORT_OFFSET <= 65535 and port_is_free(port + BUS_PORT_OFFSET):
            return port


class LocalCluster(Startable):
    """``masters`` cluster-enabled ``redis-server`` processes joined into one cluster."""

    def __init__(self, *extra_args: str, masters: int = 3) -> None:
        cluster_args = (
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
            *("--cluster-require-full-coverage", "no", "--appendonly", "yes"),
        )
        self.nodes = [
            LocalRedis(*cluster_args, *extra_args, port=cluster_port()) for _ in range(masters)
        ]
        self.url = self.nodes[0].url

    def _start(self) -> None:
        for node in self.nodes:
            node.start()
        first = self._client(self.nodes[0])
        try:
            for index, node in enumerate(self.nodes):
                client = self._client(node)
                client.cluster("ADDSLOTS", *self._slots(index))
                client.close()
                if index:
                    first.cluster("MEET", "127.0.0.1", str(node.port))
        finally:
            first.close()
        self.wait_ok()

    def _slots(self, index: int) -> range:
        per_node = SLOTS // len(self.nodes)
        end = SLOTS if index == len(self.nodes) - 1 else (index + 1) * per_node
        return range(index * per_node, end)

    def node_of(self, key: str) -> LocalRedis:
        """The master that holds ``key``."""
        return self.nodes[master_of(key, len(self.nodes))]

    def wait_ok(self) -> None:
        """Waits until every node sees every master and the whole cluster serving."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not all(self._serving(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise BrokerUnavailable("the Redis Cluster did not settle")
            time.sleep(0.05)

    def marked_failed(self, down: LocalRedis) -> bool:
        """Whether the other nodes have marked ``down``'s slots failed (after the node
        timeout): commands for them are refused with CLUSTERDOWN until it is back."""
        live = next(node for node in self.nodes if node is not down)
        client = self._client(live)
        try:
            return int(client.cluster("INFO").get("cluster_slots_fail", 0)) > 0
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _serving(self, node: LocalRedis) -> bool:
        client = self._client(node)
        try:
            fields = client.cluster("INFO")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return bool(
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
            and fields.get("cluster_slots_ok") == str(SLOTS)
        )

    @staticmethod
    def _client(node: LocalRedis) -> redis.Redis:
        return redis.Redis(port=node.port, socket_timeout=2, socket_connect_timeout=2)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
