"""Commands packed without redis-py's per-argument pass (``config.hiredis_packing``) go out
as the same bytes redis-py's own hiredis packing writes, and a value no command takes is
refused as redis-py refuses it."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import HiredisRespSerializer

from config.hiredis_packing import LeanHiredisSerializer

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "key", "naïve café 東京 🚀"),
    ("SCRIPT LOAD", "return 1"),
    (b"CLIENT SETNAME", b"worker"),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", -42, 2.5, b"\x00\xff"),
    ("SET", "key", bytearray(b"bytes in a bytearray")),
    ("SET", "key", memoryview(b"bytes in a memoryview")),
    ("SET", "key", "x" * 100_000),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: str(command[0]))
def test_a_command_packs_to_the_bytes_redis_py_writes(command: tuple[Any, ...]) -> None:
    assert LeanHiredisSerializer().pack(*command) == HiredisRespSerializer().pack(*command)


def test_a_value_no_command_takes_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(redis.DataError):
        LeanHiredisSerializer().pack("SET", "key", object())
