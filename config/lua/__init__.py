"""batchfleet's Lua scripts: one ``.lua`` file each in this folder, loaded by name and
registered with a sync or async redis-py client, or queued on a pipeline (``queue``,
``execute``).

Each file opens with what the script does and names its KEYS and ARGV as locals. Every key
a script touches comes in through KEYS, built by ``config.keys``, but for the inboxes an
answer is pushed to (named in its admission record, in the model's slot too); the keys of one
call share one hash slot, as Redis Cluster requires. Stats field names come in through ARGV
(``config.stats_fields``).

A line ``--#include NAME.lua`` is replaced by that file's text when the script is loaded
(``publish_answer.lua``, shared by ``finalize`` and ``cancel``; ``waiters.lua``, by the
scripts that add or read the waiters an admission record names; ``server_now.lua``, by the
scripts that use Redis server time; an included file may include another).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Literal, cast, overload

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from config.connection import send_now

ScriptName = Literal[
    "claim_request_id",
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


def call(client: redis.Redis, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """``script``'s reply to ``keys`` and ``args``, as ``script(keys=keys, args=args)`` gives
    it, sent and read on a connection of the pool's past redis-py's per-command layers
    (``send_now``): a finalize call of a batch of 32 costs the client ~40 µs less, an eighth
    (``benchmarks/README.md``). Where Redis has not loaded the script (it restarted, failed
    over, or flushed its scripts) redis-py's own call loads it and runs it, as it does on a
    Redis Cluster, whose client follows a slot that moved. The call goes to the node of
    ``keys[0]`` (there is at least one). Every script called so must be safe to run again:
    one whose reply was lost with the connection runs once more."""
    if isinstance(client, redis.cluster.RedisCluster):
        return script(keys=keys, args=args)
    try:
        (reply,) = send_now(client, keys[0], ("EVALSHA", script.sha, len(keys), *keys, *args))()
    except NoScriptError:
        return script(keys=keys, args=args)
    return reply


def queue(
    pipe: Pipeline | AsyncPipeline,
    script: Script | AsyncScript,
    keys: Sequence[Any],
    args: Sequence[Any],
) -> None:
    """Queues a call of ``script`` on ``pipe`` by its SHA alone, for ``execute``: redis-py's
    own way asks Redis whether the script is loaded, one more round trip, on every run."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


class Deferred:
    """Stands in for a pipeline on a Redis Cluster, whose redis-py pipeline refuses script
    calls: it records each command ``build`` queues, for ``execute`` to run one by one."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.commands.append((name, args, kwargs))

        return record


def execute(
    client: redis.Redis, build: Callable[[Pipeline], None], scripts: Sequence[Script]
) -> list[Any]:
    """The replies of a pipeline (no transaction) that ``build`` fills, with ``scripts``'
    calls queued by ``queue``; on a Redis Cluster, of its commands run one by one. Where Redis
    has not loaded one of the scripts (it restarted, failed over, or flushed its scripts) they
    are loaded and it all runs once more: every command in it must be safe to repeat."""

    def run() -> list[Any]:
        if isinstance(client, redis.cluster.RedisCluster):
            deferred = Deferred()
            build(cast(Pipeline, deferred))
            return [getattr(client, name)(*a, **kw) for name, a, kw in deferred.commands]
        with client.pipeline(transaction=False) as pipe:
            build(pipe)
            return pipe.execute()

    try:
        return run()
    except NoScriptError:
        for script in scripts:
            client.script_load(script.script)
        return run()


async def execute_async(
    client: aioredis.Redis,
    build: Callable[[AsyncPipeline], None],
    scripts: Sequence[AsyncScript],
) -> list[Any]:
    """``execute`` on an asyncio client."""

    async def run() -> list[Any]:
        if isinstance(client, aioredis.cluster.RedisCluster):
            deferred = Deferred()
            build(cast(AsyncPipeline, deferred))
            return [await getattr(client, name)(*a, **kw) for name, a, kw in deferred.commands]
        async with client.pipeline(transaction=False) as pipe:
            build(pipe)
            return await pipe.execute()

    try:
        return await run()
    except NoScriptError:
        for script in scripts:
            await client.script_load(script.script)
        return await run()
