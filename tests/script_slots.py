"""Which hash slots each Lua script call touches: Redis Cluster runs a script only when all
the keys it is given share one slot.

``recorded_script_calls`` records every script call made in this process, by any of the
three ways batchfleet makes one (``Script``, ``AsyncScript``, and ``config.lua.queue`` on a
pipeline), with the script's name and the slot of each key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
from redis.commands.core import AsyncScript, Script
from redis.crc import key_slot

from config import lua
from config.lua import ScriptName


@dataclass(frozen=True)
class ScriptCall:
    name: str
    keys: tuple[str, ...]

    @property
    def slots(self) -> set[int]:
        return {key_slot(key.encode()) for key in self.keys}


@dataclass
class ScriptCalls:
    """The script calls made while recording."""

    calls: list[ScriptCall] = field(default_factory=list)
    _names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in get_args(ScriptName):
            self._names[hashlib.sha1(lua.source(name).encode()).hexdigest()] = name

    def add(self, sha: str, keys: Sequence[Any] | None) -> None:
        texts = tuple(key.decode() if isinstance(key, bytes) else str(key) for key in keys or ())
        self.calls.append(ScriptCall(self._names.get(sha, sha), texts))

    def names(self) -> set[str]:
        return {call.name for call in self.calls}

    def cross_slot(self) -> list[ScriptCall]:
        """The calls whose keys span more than one hash slot."""
        return [call for call in self.calls if len(call.slots) > 1]


@contextmanager
def recorded_script_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptCalls]:
    calls = ScriptCalls()
    script_call, async_script_call, queue = Script.__call__, AsyncScript.__call__, lua.queue

    def call(self: Script, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        calls.add(self.sha, keys)
        return script_call(self, keys, args, client)

    async def async_call(
        self: AsyncScript, keys: Any = None, args: Any = None, client: Any = None
    ) -> Any:
        calls.add(self.sha, keys)
        return await async_script_call(self, keys, args, client)

    def queued(pipe: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        calls.add(script.sha, keys)
        queue(pipe, script, keys, args)

    monkeypatch.setattr(Script, "__call__", call)
    monkeypatch.setattr(AsyncScript, "__call__", async_call)
    monkeypatch.setattr(lua, "queue", queued)
    yield calls
