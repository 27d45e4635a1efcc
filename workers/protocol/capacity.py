"""Who is alive and how busy: worker heartbeats, batches in flight, and the slot-free wake-up.

Every timestamp here is Redis server time (``TIME`` inside the scripts: ``heartbeat.lua``,
``device_heartbeat.lua``, ``renew_claim.lua``, ``count_capacity.lua`` in
``config/lua``), so hosts with skewed clocks still agree on who is alive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from redis.exceptions import NoScriptError

from config import lua, stats_fields
from config.connection import Replies, send_now
from config.errors import ConfigError
from config.keys import Keys

# A batcher needs one token to wake; a few more cover several batchers per model.
SLOT_TOKENS_KEPT = 8


@dataclass(frozen=True)
class Capacity:
    """The model's live worker slots and its batches in flight."""

    workers: int
    slots: int
    inflight: int

    def free_slots(self, batches_per_slot: int) -> int:
        return self.slots * batches_per_slot - self.inflight

    @property
    def idle_workers(self) -> int:
        """Workers with no batch at all, assuming batches spread over workers."""
        return max(0, self.workers - self.inflight)


def _counted(reply: Sequence[Any]) -> Capacity:
    """A ``Capacity`` from ``count_capacity.lua``'s reply: live members, batches in flight
    (and what a script that returns it adds after them)."""
    members, inflight = reply[0], reply[1]
    slots = 0
    for member in members:
        text = member.decode() if isinstance(member, bytes) else member
        _, _, count = text.rpartition("|")
        slots += int(count) if count.isdigit() else 1
    return Capacity(workers=len(members), slots=slots, inflight=int(inflight))


class RoomRule(NamedTuple):
    """When a full batch has room to go (the batcher's policy, ``plan_batch``): free slots,
    ``batches_per_slot`` a worker slot, plus ``full_ahead`` full batches a live worker."""

    batches_per_slot: int
    full_ahead: int


class Dispatch(NamedTuple):
    """What a dispatch did: the capacity it left, and whether it sent its batch."""

    capacity: Capacity
    sent: bool


class SlotRelease(NamedTuple):
    """A finished batch's slot release: its commands, all on the hash slot of ``key``."""

    key: str
    commands: tuple[tuple[Any, ...], ...]

    def send(self, client: redis.Redis) -> Replies:
        """Sent at once to ``key``'s node; the returned function reads the replies
        (``send_now``)."""
        return send_now(client, self.key, *self.commands)


def worker_member(hostname: str, slots: int) -> str:
    """A worker's member in the workers zset: its name and how many batches it runs at once."""
    return f"{hostname}|{slots}"


class FleetState:
    """Reads and writes one model's liveness and in-flight records."""

    def __init__(self, client: redis.Redis, keys: Keys, model: str) -> None:
        self._client = client
        self._keys = keys
        self._model = model
        self._heartbeat = lua.register(client, "heartbeat")
        self._capacity = lua.register(client, "capacity")
        self._dispatch = lua.register(client, "dispatch")

    def heartbeat(self, member: str, ttl_s: float) -> None:
        self._heartbeat(keys=[self._keys.workers(self._model)], args=[member, ttl_s, ""])

    def leave(self, member: str) -> None:
        self._heartbeat(keys=[self._keys.workers(self._model)], args=[member, 0, "remove"])

    def capacity(self, lease_s: float) -> Capacity:
        """Prunes expired workers and stale in-flight batches, then counts what is left."""
        return _counted(self._capacity(keys=self._counted_keys(), args=[lease_s]))

    def dispatched(
        self, batch_id: str, reason: str, lease_s: float, message: str | None = None
    ) -> Capacity:
        """Records a batch sent (in flight, and counted by flush reason in the stats) and,
        given its Celery message (``workers.protocol.task_message``), pushes that onto the
        model's batch queue; returns the capacity left, counted as ``capacity`` does, in the
        same round trip."""
        keys, args = self._dispatch_call(batch_id, reason, lease_s, message)
        return _counted(self._dispatch(keys=keys, args=args))

    def queue_dispatch(
        self,
        pipe: Any,
        batch_id: str,
        reason: str,
        lease_s: float,
        message: str,
        room: RoomRule | None = None,
    ) -> Callable[[Any], Dispatch]:
        """Queues on ``pipe`` what ``dispatched`` does, among commands of the caller's own in
        the same round trip; returns the function that reads its reply (the pipeline executed
        with ``raise_on_error=False``). With ``room``, the batch is sent only if the capacity
        counted first has room for it by that rule. A dispatch Redis refused for want of its
        script is made again alone, not the commands around it.

        Raises (the returned function):
            redis.ResponseError: Redis refused the dispatch otherwise.
        """
        keys, args = self._dispatch_call(batch_id, reason, lease_s, message)
        if room is not None:
            args += [room.batches_per_slot, room.full_ahead]
        lua.queue(pipe, self._dispatch, keys, args)

        def dispatch(reply: Any) -> Dispatch:
            if isinstance(reply, NoScriptError):
                reply = self._dispatch(keys=keys, args=args)
            elif isinstance(reply, Exception):
                raise reply
            return Dispatch(_counted(reply), room is None or bool(reply[2]))

        return dispatch

    def _dispatch_call(
        self, batch_id: str, reason: str, lease_s: float, message: str | None
    ) -> tuple[list[str], list[str | float]]:
        """The keys and args of ``dispatch.lua``'s call for ``dispatched``."""
        keys = [
            *self._counted_keys(),
            self._keys.stats(self._model),
            self._keys.slot_free(self._model),
        ]
        args: list[str | float] = [lease_s, batch_id, stats_fields.batches(reason)]
        if message is not None:
            keys.append(self._keys.celery_queue(self._model))
            args.append(message)
        return keys, args

    def _counted_keys(self) -> list[str]:
        """The keys ``count_capacity.lua`` counts, first in both scripts that include it."""
        return [
            self._keys.workers(self._model),
            self._keys.inflight(self._model),
            self._keys.inflight_owners(self._model),
        ]

    def undispatched(self, batch_id: str) -> None:
        self._client.zrem(self._keys.inflight(self._model), batch_id)

    def batch_done(self, batch_id: str, lease_s: float) -> Replies:
        """Clears the batch from in-flight and wakes a batcher waiting for a free slot: sent
        at once; the returned function reads Redis's replies (``send_now``)."""
        return self.slot_release(batch_id, lease_s).send(self._client)

    def slot_release(self, batch_id: str, lease_s: float) -> SlotRelease:
        """What ``batch_done`` sends, for a caller that sends it itself: idempotent but for
        the wake-up token, of which a batcher needs one."""
        inflight, slot_free = self._keys.inflight(self._model), self._keys.slot_free(self._model)
        commands = (
            ("ZREM", inflight, batch_id),
            ("HDEL", self._keys.inflight_owners(self._model), batch_id),
            ("LPUSH", slot_free, batch_id),
            ("LTRIM", slot_free, 0, SLOT_TOKENS_KEPT - 1),
            ("EXPIRE", slot_free, max(1, int(lease_s))),
        )
        return SlotRelease(inflight, commands)

    def wait_for_slot(self, timeout_s: float, lease_s: float) -> Capacity:
        """Blocks until a worker finishes a batch or ``timeout_s`` passes (at least 10 ms:
        Redis 6.2 rounds a smaller BLPOP timeout down to 0, which blocks forever), then
        returns the capacity, counted as ``capacity`` does, in the same round trip: Redis
        counts once the BLPOP returns."""

        def build(pipe: Any) -> None:
            self.queue_wait(pipe, timeout_s)
            self.queue_count(pipe, lease_s)

        _, counted = lua.execute(self._client, build, [self._capacity])
        return _counted(counted)

    def queue_wait(self, pipe: Any, timeout_s: float) -> None:
        """Queues on ``pipe`` the wait ``wait_for_slot`` makes: the commands after it run once
        it returns."""
        pipe.blpop([self._keys.slot_free(self._model)], timeout=max(timeout_s, 0.01))

    def queue_count(self, pipe: Any, lease_s: float) -> None:
        """Queues the count ``capacity`` makes on ``pipe``, after a command whose reply
        matters (``counted`` reads it where that command must not run twice)."""
        lua.queue(pipe, self._capacity, self._counted_keys(), [lease_s])

    def counted(self, reply: Any, lease_s: float) -> Capacity:
        """The capacity from the reply of the count ``queue_count`` queued, read with
        ``raise_on_error=False``. The commands before it are not made again: a count Redis
        refused for want of its script (it restarted or flushed its scripts) is made again
        alone.

        Raises:
            redis.ResponseError: Redis refused the count otherwise.
        """
        if isinstance(reply, NoScriptError):
            return self.capacity(lease_s)
        if isinstance(reply, Exception):
            raise reply
        return _counted(reply)


@dataclass(frozen=True)
class GpuClaim:
    """A ``--gpu auto`` worker's claim on its GPU: the key, and the owner string it holds."""

    key: str
    owner: str


@dataclass(frozen=True)
class NodeBeat:
    """What a worker process tells Redis every heartbeat."""

    hostname: str
    device_consumer: str
    status: Mapping[Any, str]
    models: Sequence[str]
    ttl_s: float
    gpu_claim: GpuClaim | None = None
    model_times: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)


def node_heartbeat(client: redis.Redis, keys: Keys, beat: NodeBeat) -> tuple[dict[str, int], bool]:
    """A worker process's heartbeat, in one round trip: marks its device consumer alive (a
    batch delivered again leaves what a live device holds to it, and counts a death for what
    a gone one held), replaces its status hash and renews its GPU claim, all kept for
    ``ttl_s``, and publishes its measured model times. Returns its models' queue depths, and
    False when another worker holds its GPU claim (Redis lost it while frozen or
    restarted)."""
    device_heartbeat = lua.register(client, "device_heartbeat")
    renew_claim = lua.register(client, "renew_claim")

    def build(pipe: Any) -> None:
        for model in beat.models:
            lua.queue(
                pipe, device_heartbeat, [keys.devices(model)], [beat.device_consumer, beat.ttl_s]
            )
        node = keys.node(beat.hostname)
        pipe.delete(node)
        if beat.status:
            pipe.hset(node, mapping=beat.status)
            pipe.pexpire(node, int(beat.ttl_s * 1000))
        for model, times in beat.model_times.items():
            pipe.hset(keys.model_time(model), mapping=times)
        for model in beat.models:
            pipe.xlen(keys.stream(model))
        if beat.gpu_claim is not None:
            claim = beat.gpu_claim
            lua.queue(pipe, renew_claim, [claim.key], [claim.owner, int(beat.ttl_s * 1000)])

    replies = lua.execute(client, build, [device_heartbeat, renew_claim])
    held = bool(replies.pop()) if beat.gpu_claim is not None else True
    depths = replies[len(replies) - len(beat.models) :]
    return {model: int(depth) for model, depth in zip(beat.models, depths, strict=True)}, held


@dataclass(frozen=True)
class ClaimedGpu:
    """Where ``claim_gpu`` placed a worker: the GPU's index, its place on that GPU (0 up to
    ``per_gpu``), and the claim its heartbeat renews."""

    index: int
    share: int
    claim: GpuClaim


def claim_gpu(
    client: redis.Redis,
    keys: Keys,
    gpu_uuids: Sequence[str],
    owner: str,
    ttl_s: float,
    per_gpu: int = 1,
) -> ClaimedGpu:
    """The first place no live worker holds, ``per_gpu`` on each of ``gpu_uuids``, now
    claimed by ``owner`` for ``ttl_s`` (its heartbeat renews it): replicas of one worker
    service, each seeing every GPU of the host, spread over the GPUs first (every GPU's first
    place before any second one), then share them.

    Raises:
        ConfigError: there is no GPU, or every place is taken.
    """
    for share in range(per_gpu):
        for index, gpu_uuid in enumerate(gpu_uuids):
            key = keys.gpu_claim(gpu_uuid, share)
            if client.set(key, owner, nx=True, px=int(ttl_s * 1000)):
                return ClaimedGpu(index, share, GpuClaim(key, owner))
    raise ConfigError(
        f"--gpu auto: all {len(gpu_uuids)} GPU(s) of this machine are taken by live workers"
        f" ({per_gpu} per GPU, worker.processes_per_gpu)"
        if gpu_uuids
        else "--gpu auto: NVML finds no GPU on this machine"
    )
