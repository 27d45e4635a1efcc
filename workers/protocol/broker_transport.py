"""The Celery broker's transport: kombu's Redis transport, reusing one Redis client per channel,
registered for ``redis://``, ``rediss://`` and (kombu's Sentinel transport) ``sentinel://``
broker URLs, and ``kombu_url``, which names a Redis on a Unix socket as kombu does.

kombu builds a new redis-py client object for every publish, ack and reservation it makes
outside its polling loop (``Channel.conn_or_acquire``), and building one costs about as much
CPU as the command it sends: three times a batch in a worker (its received/started/succeeded
events, the reservation, the ack) and twice in a batcher. This channel builds one per channel
and connection pool and reuses it; connections still come from the same pool, per command.
A channel that kombu closed under a producer raises a connection error, which kombu's retry
recovers from. In a worker, the transport adds each socket's reader to Celery's event loop
once, not on every turn of the loop (``ReadersAddedOnce``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

from config.settings import SENTINEL_SCHEME, UNIX_SCHEME

SINGLE_REDIS_SCHEMES = ("redis", "rediss")
# kombu's scheme for a Redis on a Unix socket (its Redis transport, connecting to a path).
KOMBU_SOCKET_SCHEME = "redis+socket"
# The broker URLs on Redis, which take Redis transport options.
REDIS_SCHEMES = (*SINGLE_REDIS_SCHEMES, KOMBU_SOCKET_SCHEME, SENTINEL_SCHEME)


def kombu_url(url: str) -> str:
    """``url`` as kombu takes it: a Redis on a Unix socket as redis-py writes it,
    ``unix://[[user]:password@]/path?db=N`` (or with ``password=`` in the query), becomes
    kombu's ``redis+socket://[[user]:password@]/path?virtual_host=N``; other URLs stay."""
    parts = urlsplit(url)
    if parts.scheme != UNIX_SCHEME:
        return url
    query = parse_qs(parts.query)
    credentials = parts.netloc
    if not credentials and "password" in query:
        credentials = f":{quote(query['password'][0], safe='')}@"
    db = query.get("db", ["0"])[0]
    return f"{KOMBU_SOCKET_SCHEME}://{credentials}{parts.path}?virtual_host={db}"


class ReusedClient:
    """The channel part that reuses one redis-py client (see the module's docstring)."""

    _reused_client: redis.Redis | None = None
    pool: Any
    connection: Any

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self.connection is None:
            # kombu closed this channel when it reconnected (a declare retried inside a
            # publish does); a connection error makes kombu's ensure() give the producer an
            # open one and try again, where the closed channel would fail on an attribute.
            raise redis.ConnectionError("the broker channel was closed by a reconnect")
        reused = self._reused_client
        if reused is None or reused.connection_pool is not self.pool:
            reused = self._reused_client = self._create_client()  # type: ignore[attr-defined]
        yield reused


class Channel(ReusedClient, kombu_redis.Channel):
    pass


class SentinelChannel(ReusedClient, kombu_redis.SentinelChannel):
    pass


class ReadersAddedOnce:
    """The worker's event loop (kombu's ``Hub``) as kombu's Redis transport is given it: a
    reader the loop has already, same socket and callback, is not added again.

    The transport adds the reader of each of its sockets on every turn of the loop, and the
    loop's epoll refuses each (``EEXIST``, raised and caught in Python): ~8% of Celery's loop
    at a fast model's batch rate (``benchmarks/README.md``). A reader the transport takes
    away (a paused ``BRPOP``, a dropped connection) it takes through the loop's
    ``remove_reader`` or ``remove``, which forget it, so its next turn adds it again; a new
    socket it registers with the poller itself, at once.
    """

    def __init__(self, loop: Any) -> None:
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    def add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        if self._loop.readers.get(fd) != (callback, args):
            self._loop.add_reader(fd, callback, *args)


class AddsReadersOnce:
    """The transport part that hands kombu's Redis transport the loop as
    ``ReadersAddedOnce``."""

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, ReadersAddedOnce(loop))  # type: ignore[misc]


class Transport(AddsReadersOnce, kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(AddsReadersOnce, kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def register_transport() -> None:
    """Makes these the transports of ``redis://``, ``rediss://`` and ``sentinel://`` URLs in
    this process, in kombu's table of transport aliases: the URL keeps its scheme, so kombu's
    TLS defaults for ``rediss://`` and the URL Celery logs stay as they are. kombu keeps the
    class it first finds for a scheme: a kombu connection this process made to such a URL
    before (outside ``make_celery_app``) keeps kombu's own for good."""
    for scheme in SINGLE_REDIS_SCHEMES:
        TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
    TRANSPORT_ALIASES[SENTINEL_SCHEME] = f"{__name__}:SentinelTransport"
