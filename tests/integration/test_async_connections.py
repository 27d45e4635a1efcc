"""The clients batchfleet opens, sync (``config.connection.connect``) and asyncio (every
AsyncProducer and the gateway): their commands, packed by hiredis (``config.hiredis_packing``),
reach Redis byte for byte, on TCP and on a Unix socket."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from config.connection import connect
from config.hiredis_packing import HiredisPacking, LeanHiredisSerializer
from producer.async_client import connect_async
from tests.integration.conftest import FleetEnv, settings_for
from workers.local.local_redis import LocalRedis

# Text beyond ASCII, a CRLF and a RESP marker inside a value, bytes that are not UTF-8, and a
# value past redis-py's 6,000-byte buffer cut-off.
VALUES: list[str | bytes | int | float] = [
    "naïve café 東京 🚀",
    "line\r\n$5\r\n*2\r\n",
    b"\x00\xff\xfe not utf-8",
    "x" * 100_000,
    -42,
    2.5,
]


@pytest.fixture
def socket_redis() -> Iterator[LocalRedis]:
    with LocalRedis(unix_socket=True) as server:
        yield server


async def round_trip(env: FleetEnv) -> tuple[list[bytes | None], list[type]]:
    """Writes each of VALUES under keys of its own, one by one and in a pipeline, and reads
    them back; also the classes of the connections the client opened."""
    client = connect_async(settings_for(env))
    prefix = env["BATCHFLEET_KEY_PREFIX"]
    try:
        for n, value in enumerate(VALUES):
            await client.set(f"{prefix}:one:{n}", value)
        async with client.pipeline(transaction=False) as pipe:
            for n, value in enumerate(VALUES):
                pipe.set(f"{prefix}:piped:{n}", value)
            await pipe.execute()
        keys = [f"{prefix}:{how}:{n}" for how in ("one", "piped") for n in range(len(VALUES))]
        read = await client.mget(keys)
        await client.delete(*keys)
        pool = client.connection_pool
        return read, [type(connection) for connection in pool._available_connections]
    finally:
        await client.aclose()


def expected() -> list[bytes]:
    as_bytes = [value if isinstance(value, bytes) else str(value).encode() for value in VALUES]
    return as_bytes * 2


def sync_round_trip(env: FleetEnv) -> tuple[list[bytes | None], list[object]]:
    """``round_trip`` on a sync client, with bytes also given as a ``bytearray`` and a
    ``memoryview``; the packers of the connections it opened."""
    values = [*VALUES, bytearray(b"in a bytearray"), memoryview(b"in a memoryview")]
    client = connect(settings_for(env))
    prefix = env["BATCHFLEET_KEY_PREFIX"]
    try:
        for n, value in enumerate(values):
            client.set(f"{prefix}:one:{n}", value)
        with client.pipeline(transaction=False) as pipe:
            for n, value in enumerate(values):
                pipe.set(f"{prefix}:piped:{n}", value)
            pipe.execute()
        keys = [f"{prefix}:{how}:{n}" for how in ("one", "piped") for n in range(len(values))]
        read = client.mget(keys)
        client.delete(*keys)
        pool = client.connection_pool
        return read, [connection._command_packer for connection in pool._available_connections]
    finally:
        client.close()


def test_a_sync_clients_commands_reach_redis_intact(fleet_env: FleetEnv) -> None:
    read, packers = sync_round_trip(fleet_env)
    assert read == [*expected()[: len(VALUES)], b"in a bytearray", b"in a memoryview"] * 2
    assert packers and all(isinstance(packer, LeanHiredisSerializer) for packer in packers)


def test_commands_reach_redis_intact_over_tcp(fleet_env: FleetEnv) -> None:
    read, connections = asyncio.run(round_trip(fleet_env))
    assert read == expected()
    assert connections and all(issubclass(kind, HiredisPacking) for kind in connections)


def test_commands_reach_redis_intact_over_a_unix_socket(socket_redis: LocalRedis) -> None:
    assert socket_redis.url.startswith("unix://")
    env = {"BATCHFLEET_REDIS_URL": socket_redis.url, "BATCHFLEET_KEY_PREFIX": uuid.uuid4().hex}
    read, connections = asyncio.run(round_trip(env))
    assert read == expected()
    assert connections and all(issubclass(kind, HiredisPacking) for kind in connections)
    assert all(kind.__name__ == "HiredisUnixDomainSocketConnection" for kind in connections)
