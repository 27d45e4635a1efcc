"""Writes a failover cannot take back: script calls that wait until N replicas have their
writes (Redis ``WAIT``), for ``redis_wait_replicas``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.commands.core import Script

from config import lua
from config.errors import BrokerUnavailable
from config.settings import Settings


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

    def queue(self, pipe: Pipeline | AsyncPipeline) -> None:
        """Queues the wait on ``pipe``, after the writes it covers; ``confirmed`` reads its
        reply."""
        pipe.wait(self.replicas, int(self.timeout_s * 1000))

    def confirmed(self, acknowledged: Any) -> bool:
        """Whether enough replicas acknowledged the writes in time (the wait's reply)."""
        return int(acknowledged) >= self.replicas

    def call(self, script: Script, keys: list[Any], args: list[Any]) -> tuple[Any, bool]:
        """``script``'s reply, and whether enough replicas acknowledged its writes in time."""

        def build(pipe: Pipeline) -> None:
            lua.queue(pipe, script, keys, args)
            self.queue(pipe)

        client = cast(redis.Redis, script.registered_client)
        reply, acknowledged = lua.execute(client, build, [script])
        return reply, self.confirmed(acknowledged)

    def unconfirmed(self) -> BrokerUnavailable:
        """The error for a write fewer replicas acknowledged than asked (it is on the master:
        trying again is safe, the scripts being idempotent)."""
        return BrokerUnavailable(
            f"fewer than {self.replicas} replicas acknowledged the write within"
            f" {self.timeout_s} s (redis_wait_replicas)"
        )
