"""A Redis Sentinel group on loopback: a master, one replica and three sentinels, each a
``redis-server`` (the same binary runs as a sentinel), on free ports.

``url`` is what the fleet is given (kombu's ``sentinel://`` form, with ``NAME`` as the
master's name); ``failover()`` asks the sentinels for a graceful failover, ``kill_master()``
SIGKILLs the master and waits until the sentinels have promoted the replica, ``rejoin()``
restarts the killed node as the new master's replica.

With ``tls`` (a folder holding ``ca.pem`` and ``server.pem``/``server.key`` signed by it, for
127.0.0.1) every process also listens for TLS, replicates and announces itself over it, and
``url`` names the sentinels' TLS ports; with ``password`` the sentinels require it. The plain
ports stay open on loopback for this helper's own checks.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from config.errors import BrokerUnavailable
from workers.local.local_redis import LocalRedis, free_port, redis_server_binary
from workers.local.startable import Startable

NAME = "bfmaster"
QUORUM = 2
DOWN_AFTER_MS = 1000
SETTLE_TIMEOUT_S = 60.0


class SentinelGroup(Startable):
    """Two ``redis-server`` nodes (``extra_args`` for both) and three sentinels watching them,
    all run by ``binary`` (the first ``redis-server`` on PATH by default)."""

    def __init__(
        self,
        *extra_args: str,
        password: str | None = None,
        tls: Path | None = None,
        binary: str | None = None,
    ) -> None:
        self._password = password
        self._tls = tls
        self._binary = binary or redis_server_binary()
        # Where clients reach each node: its TLS port with ``tls``.
        self._announced: dict[int, int] = {}
        master = self._node(*extra_args)
        master_port = str(self._announced[master.port])
        replica = self._node(*extra_args, "--replicaof", "127.0.0.1", master_port)
        self.nodes = [master, replica]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._sentinel_tls_ports = {port: free_port() for port in self.sentinel_ports}
        listened = [self._sentinel_tls_ports[p] if tls else p for p in self.sentinel_ports]
        self.url = ";".join(f"sentinel://127.0.0.1:{port}" for port in listened) + "/0"
        self._dir = Path(tempfile.mkdtemp(prefix="batchfleet-sentinels-"))
        self._sentinels: list[subprocess.Popen[bytes]] = []

    def _node(self, *args: str) -> LocalRedis:
        tls_port = free_port()
        tls = self._tls_args(tls_port) if self._tls else ()
        node = LocalRedis(*args, *tls, binary=self._binary)
        self._announced[node.port] = tls_port if self._tls else node.port
        return node

    def _tls_args(self, tls_port: int) -> list[str]:
        """A process's TLS options: it listens on ``tls_port`` too, replicates over TLS and
        announces its TLS port."""
        assert self._tls is not None
        return [
            *("--tls-cert-file", str(self._tls / "server.pem")),
            *("--tls-key-file", str(self._tls / "server.key")),
            *("--tls-ca-cert-file", str(self._tls / "ca.pem")),
            *("--tls-auth-clients", "no", "--tls-replication", "yes"),
            *("--tls-port", str(tls_port)),
        ]

    def _start(self) -> None:
        for node in self.nodes:
            node.start()
        self._wait(lambda: self._replication(self.nodes[1]).get("master_link_status") == "up")
        master_port = self._announced[self.nodes[0].port]
        for port in self.sentinel_ports:
            config = self._dir / f"sentinel-{port}.conf"
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self._dir}",
                f"sentinel monitor {NAME} 127.0.0.1 {master_port} {QUORUM}",
                f"sentinel down-after-milliseconds {NAME} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {NAME} 10000",
            ]
            if self._password:
                lines += [
                    f"requirepass {self._password}",
                    f"sentinel sentinel-pass {self._password}",
                ]
            config.write_text("\n".join(lines) + "\n")
            tls = self._tls_args(self._sentinel_tls_ports[port]) if self._tls else []
            with open(self._log(port), "ab") as log:
                self._sentinels.append(
                    subprocess.Popen(
                        [self._binary, str(config), "--sentinel", *tls],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        self._wait(self._sentinels_agree, self._sentinels_view)

    def master(self) -> LocalRedis:
        """The node the sentinels name as master now."""
        port = self.master_port()
        return next(node for node in self.nodes if self._announced[node.port] == port)

    def master_port(self) -> int:
        """The port the sentinels give clients for the master (its TLS port with ``tls``)."""
        with self._sentinel(self.sentinel_ports[0]) as sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(NAME)
        return int(port)

    def failover(self) -> None:
        """A graceful failover (``SENTINEL FAILOVER``): the replica is promoted once it has
        everything, and the old master becomes its replica. Returns when the new master
        takes writes."""
        old = self.master_port()
        with self._sentinel(self.sentinel_ports[0]) as sentinel:
            sentinel.execute_command("SENTINEL FAILOVER", NAME)
        self._wait_for_new_master(old)

    def kill_master(self) -> LocalRedis:
        """SIGKILLs the master and returns it once the sentinels have promoted the replica."""
        old = self.master()
        old.crash()
        self._wait_for_new_master(self._announced[old.port])
        return old

    def rejoin(self, node: LocalRedis) -> None:
        """Restarts a killed node as a replica of the master, as its supervisor would, and
        returns once it has caught up (asking it again to follow the master while it has not:
        the sentinels may reconfigure it meanwhile).

        Raises:
            BrokerUnavailable: it did not catch up within a minute; says what it reported.
        """
        node.start()

        def caught_up() -> bool:
            replication = self._replication(node)
            if replication.get("master_link_status") == "up":
                return True
            master_port = self.master_port()
            if replication.get("master_port") != master_port:
                client = redis.Redis(port=node.port, socket_timeout=1, socket_connect_timeout=1)
                with contextlib.suppress(redis.RedisError):
                    client.replicaof("127.0.0.1", master_port)
                client.close()
            return False

        try:
            self._wait(caught_up)
        except BrokerUnavailable as exc:
            report = self._replication(node)
            raise BrokerUnavailable(f"{exc}: the rejoined node reports {report}") from exc

    def stop(self) -> None:
        for sentinel in self._sentinels:
            sentinel.terminate()
        for sentinel in self._sentinels:
            try:
                sentinel.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sentinel.kill()
                sentinel.wait()
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wait_for_new_master(self, old_port: int) -> None:
        """Waits until the sentinels name another master than the one at ``old_port`` (as
        ``master_port`` gives it), and it takes writes."""

        def promoted() -> bool:
            port = self.master_port()
            if port == old_port:
                return False
            return self._replication(self.master()).get("role") == "master"

        self._wait(promoted)

    def _sentinels_agree(self) -> bool:
        """Every sentinel sees the replica and the two other sentinels.

        Raises:
            BrokerUnavailable: a sentinel has exited; says how, with the end of its log.
        """
        for process, port in zip(self._sentinels, self.sentinel_ports, strict=True):
            if process.poll() is not None:
                log = self._log(port).read_text(errors="replace").splitlines()[-5:]
                raise BrokerUnavailable(
                    f"the sentinel on port {port} exited with {process.returncode}: "
                    + " | ".join(log)
                )
            seen = self._seen_by(port)
            if seen is None or seen[0] < 1 or seen[1] < len(self.sentinel_ports) - 1:
                return False
        return True

    def _seen_by(self, port: int) -> tuple[int, int] | None:
        """How many replicas and other sentinels the sentinel on ``port`` knows, or None
        while it does not answer."""
        with self._sentinel(port) as sentinel:
            try:
                replicas = sentinel.execute_command("SENTINEL REPLICAS", NAME)
                others = sentinel.execute_command("SENTINEL SENTINELS", NAME)
            except redis.RedisError:
                return None
        return len(replicas), len(others)

    def _sentinels_view(self) -> str:
        """What each sentinel knows, for an error that says why the group did not settle."""
        views = []
        for port in self.sentinel_ports:
            seen = self._seen_by(port)
            known = "no answer" if seen is None else f"{seen[0]} replicas, {seen[1]} sentinels"
            views.append(f"sentinel {port}: {known}")
        return "; ".join(views)

    def _log(self, port: int) -> Path:
        return self._dir / f"sentinel-{port}.log"

    @staticmethod
    def _replication(node: LocalRedis) -> dict[str, object]:
        client = redis.Redis(port=node.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            return dict(client.info("replication"))
        except redis.RedisError:
            return {}
        finally:
            client.close()

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port, password=self._password, socket_timeout=2, socket_connect_timeout=2
        )

    @staticmethod
    def _wait(condition: Callable[[], bool], view: Callable[[], str] | None = None) -> None:
        """Polls ``condition`` until it holds.

        Raises:
            BrokerUnavailable: it did not within a minute; says what ``view`` reports.
        """
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                seen = f": {view()}" if view is not None else ""
                raise BrokerUnavailable(f"the Sentinel group did not settle{seen}")
            time.sleep(0.05)
