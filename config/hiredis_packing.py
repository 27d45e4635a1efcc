"""Commands packed by hiredis without redis-py's per-argument pass, on sync and asyncio
connections alike.

redis-py packs a sync connection's commands with ``hiredis.pack_command`` when hiredis is
installed, but first copies every argument through a Python generator that turns a
``bytearray`` or ``memoryview`` into ``bytes``: ~0.6 µs an argument, 60% of the client's CPU
for a finalize call of 300 arguments (``benchmarks/README.md``). ``LeanHiredisSerializer``
hands the arguments to hiredis as they are and takes redis-py's own way only for what hiredis
refuses (a ``bytearray``; a type no Redis command takes, which redis-py turns into a
``DataError``): the same bytes go out.

redis-py always packs an asyncio connection's commands in Python (redis/redis-py#4176, fix
open as #4191). The asyncio producer's admission of 256 requests at once (2,307 arguments)
takes 2.24 ms to pack in Python, 0.59 ms with hiredis (``timeit``, same bytes out).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import ConnectionPool
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis


class LeanHiredisSerializer(HiredisRespSerializer):
    """redis-py's hiredis packing, arguments passed to hiredis as they are."""

    def __init__(self) -> None:
        # redis-py 8.2's serializer takes a fallback packer and an encoder, untyped. With
        # neither, its pack (for what hiredis refuses) turns a bytearray into bytes and what
        # hiredis still refuses into a DataError.
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]

    def pack(self, *args: Any) -> list[bytes]:
        command = args[0]
        # A command name of several words ("SCRIPT LOAD") goes out as several arguments.
        if isinstance(command, str):
            args = (*command.encode().split(), *args[1:])
        elif b" " in command:
            args = (*command.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return super().pack(*args)  # type: ignore[no-any-return]


def command_packer() -> dict[str, Any]:
    """The connection option that packs a sync client's commands with
    ``LeanHiredisSerializer``, where hiredis is installed (``redis[hiredis]`` brings it)."""
    return {"command_packer": LeanHiredisSerializer()} if HIREDIS_AVAILABLE else {}


_SERIALIZER = LeanHiredisSerializer()


class HiredisPacking:
    """Mixin before an asyncio connection class: packs each command with hiredis (its
    ``pack_commands`` packs a pipeline command by command through ``pack_command``)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return _SERIALIZER.pack(*args)


_PACKED: dict[type, type] = {}


def packed_by_hiredis(connection_class: type) -> type:
    """``connection_class`` (TCP, TLS, Unix socket, Sentinel-managed) packing with hiredis;
    one class per ``connection_class``."""
    if connection_class not in _PACKED:
        name = f"Hiredis{connection_class.__name__}"
        _PACKED[connection_class] = type(name, (HiredisPacking, connection_class), {})
    return _PACKED[connection_class]


def pack_with_hiredis(pool: ConnectionPool) -> None:
    """Makes the connections ``pool`` opens from now on pack with hiredis, where hiredis is
    installed."""
    if HIREDIS_AVAILABLE:
        pool.connection_class = packed_by_hiredis(pool.connection_class)
