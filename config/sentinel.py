"""Redis Sentinel from the client's side: the sentinels a ``sentinel://`` URL names, and
connection pools that follow the master through a failover within ``MASTER_CHECK_S``.

The URL is kombu's form, ``sentinel://[:password@]host1:26379;sentinel://host2:26379[/db]``:
the password is the master's, the sentinels' own is ``redis_sentinel_password``.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio.sentinel
import redis.sentinel

from config.settings import Settings

SENTINEL_PORT = 26379


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """How to talk to the sentinels themselves: socket timeouts, their own password, TLS."""
    options: dict[str, Any] = {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
        **sentinel_tls(settings),
    }
    if settings.redis_sentinel_password is not None:
        options["password"] = settings.redis_sentinel_password.get_secret_value()
    return options


def sentinel_tls(settings: Settings) -> dict[str, Any]:
    """redis-py's options for TLS to the sentinels and their master
    (``redis_sentinel_tls_ca``); none without it."""
    if settings.redis_sentinel_tls_ca is None:
        return {}
    return {"ssl": True, **broker_tls(settings)}


def broker_tls(settings: Settings) -> dict[str, Any]:
    """kombu's (``broker_use_ssl``) options for TLS to a Sentinel group's master, verified
    against ``redis_sentinel_tls_ca``; none without it."""
    if settings.redis_sentinel_tls_ca is None:
        return {}
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(settings.redis_sentinel_tls_ca)}


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
        **sentinel_tls(settings),
    )
