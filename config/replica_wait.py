"""Writes a failover cannot take back: script calls that wait until N replicas have their
writes (Redis ``WAIT``), for ``redis_wait_replicas``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript, Script

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
