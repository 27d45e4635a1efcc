"""batchfleet's Lua scripts: one ``.lua`` file each in this folder, loaded by name and
registered with a sync or async redis-py client.

Each file opens with what the script does and names its KEYS and ARGV as locals. Every key
a script touches comes in through KEYS, built by ``config.keys``; stats field names come in
through ARGV (``config.stats_fields``).

A line ``--#include NAME.lua`` is replaced by that file's text when the script is loaded
(``publish_answer.lua``, shared by ``finalize`` and ``cancel``, and ``server_now.lua``, by
the scripts that use Redis server time, are included that way; an included file may include
another).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Literal, overload

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

ScriptName = Literal[
    "admit",
    "watch",
    "stream_admit",
    "cancel",
    "finalize",
    "count_device_deaths",
    "heartbeat",
    "device_heartbeat",
    "renew_claim",
    "capacity",
    "dispatch",
    "lower_batch_cap",
    "raise_batch_cap",
    "prune_consumers",
]

INCLUDE = re.compile(r"^--#include (?P<file>[\w.]+\.lua)$", re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of script ``name`` (``NAME.lua`` here) with its includes in place, read once."""
    text = resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return INCLUDE.sub(lambda match: source(match["file"].removesuffix(".lua")).rstrip("\n"), text)


@overload
def register(client: aioredis.Redis, name: ScriptName) -> AsyncScript: ...


@overload
def register(client: redis.Redis, name: ScriptName) -> Script: ...


def register(client: redis.Redis | aioredis.Redis, name: ScriptName) -> Script | AsyncScript:
    """Script ``name`` registered with ``client``: call it with ``keys=`` and ``args=``
    (redis-py runs it by its SHA and loads it on a miss)."""
    return client.register_script(source(name))
