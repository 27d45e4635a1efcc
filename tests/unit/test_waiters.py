"""Held ids (``Waiters``): an answer pushed before its wait is kept for that wait, a bounded
number of them; whatever is not kept is read by a watch call, never waited for in vain."""

from __future__ import annotations

import asyncio
import math
import queue

import pytest

from config.schema import Result
from producer import waiters
from producer.waiters import (
    DEADLINE_TICK_S,
    RECONNECTED,
    Arrival,
    AsyncArrivals,
    DeadlineTicks,
    Waiters,
)


def answer(request_id: str) -> Result:
    return Result(request_id=request_id, model="synthetic", output=request_id, finished_at=0.0)


def taken(arrivals: queue.SimpleQueue[Arrival]) -> list[Arrival]:
    items = []
    while not arrivals.empty():
        items.append(arrivals.get_nowait())
    return items


def test_an_answer_that_comes_before_its_wait_is_handed_to_the_wait() -> None:
    registry, arrivals = Waiters(), queue.SimpleQueue[Arrival]()
    registry.hold(["early", "late"])
    registry.deliver([answer("early")])
    assert registry.add(["early", "late"], arrivals) == {"early", "late"}
    assert taken(arrivals) == [[answer("early")]]
    registry.deliver([answer("late")])
    assert taken(arrivals) == [[answer("late")]]


def test_a_wait_takes_an_early_answer_once() -> None:
    """A second wait for the same id is not covered: it reads the stored answer."""
    registry, first, second = Waiters(), queue.SimpleQueue[Arrival](), queue.SimpleQueue[Arrival]()
    registry.hold(["id"])
    registry.deliver([answer("id")])
    assert registry.add(["id"], first) == {"id"}
    assert registry.add(["id"], second) == set()
    assert taken(first) == [[answer("id")]] and taken(second) == []


def test_a_delivery_wakes_each_wait_once_with_all_of_its_answers() -> None:
    registry, first, second = Waiters(), queue.SimpleQueue[Arrival](), queue.SimpleQueue[Arrival]()
    registry.add(["a", "b"], first)
    registry.add(["c", "d"], second)
    registry.deliver([answer("a"), answer("c"), answer("stranger"), answer("b")])
    assert taken(first) == [[answer("a"), answer("b")]]
    assert taken(second) == [[answer("c")]]
    registry.deliver([answer("d")])
    assert taken(second) == [[answer("d")]]


def test_answers_of_ids_not_held_are_not_kept() -> None:
    registry, arrivals = Waiters(), queue.SimpleQueue[Arrival]()
    registry.hold(["released"])
    registry.release(["released"])
    registry.deliver([answer("released"), answer("stranger")])
    assert registry.add(["released", "stranger"], arrivals) == set()
    assert taken(arrivals) == []


def test_beyond_the_bound_the_oldest_early_answers_are_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer that submits and never waits keeps at most HELD_KEPT answers; a wait for a
    forgotten one is not covered, so it reads the stored answer."""
    monkeypatch.setattr(waiters, "HELD_KEPT", 3)
    registry, arrivals = Waiters(), queue.SimpleQueue[Arrival]()
    ids = [f"r{n}" for n in range(5)]
    registry.hold(ids)
    registry.deliver([answer(request_id) for request_id in ids])
    assert registry.add(ids, arrivals) == {"r2", "r3", "r4"}
    assert taken(arrivals) == [[answer("r2"), answer("r3"), answer("r4")]]


def test_beyond_the_bound_the_oldest_held_ids_are_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiters, "HELD_KEPT", 2)
    registry, arrivals = Waiters(), queue.SimpleQueue[Arrival]()
    registry.hold(["a", "b", "c"])
    assert registry.add(["a", "b", "c"], arrivals) == {"b", "c"}


def test_after_a_reconnection_no_id_is_held() -> None:
    """A push may have been lost while the listener was away: later waits read the stored
    answers; waits already registered are told to read them again."""
    registry, waiting, later = Waiters(), queue.SimpleQueue[Arrival](), queue.SimpleQueue[Arrival]()
    registry.hold(["waited", "not yet"])
    assert registry.add(["waited"], waiting) == {"waited"}
    registry.reconnected()
    assert taken(waiting) == [RECONNECTED]
    assert registry.add(["not yet"], later) == set()
    registry.deliver([answer("waited")])
    assert taken(waiting) == [[answer("waited")]]


def test_a_burst_of_single_submits_holds_only_the_newest() -> None:
    """At the real bound: three bounds' worth of held ids keep the newest bound's worth."""
    registry, arrivals = Waiters(), queue.SimpleQueue[Arrival]()
    ids = [f"r{n}" for n in range(3 * waiters.HELD_KEPT)]
    registry.hold(ids)
    assert registry.add(ids, arrivals) == set(ids[-waiters.HELD_KEPT :])


def test_an_async_wait_gets_what_came_before_and_while_it_waits() -> None:
    async def scenario() -> list[Arrival]:
        arrivals = AsyncArrivals(DeadlineTicks())
        arrivals.put_nowait([answer("before")])
        first = await arrivals.get(timeout_s=30)
        asyncio.get_running_loop().call_soon(arrivals.put_nowait, [answer("while")])
        return [first, await arrivals.get(timeout_s=30)]

    assert asyncio.run(scenario()) == [[answer("before")], [answer("while")]]


def test_an_async_wait_with_nothing_coming_times_out_and_takes_what_comes_later() -> None:
    async def scenario() -> Arrival:
        arrivals = AsyncArrivals(DeadlineTicks())
        with pytest.raises(TimeoutError):
            await arrivals.get(timeout_s=0.01)
        arrivals.put_nowait(RECONNECTED)
        return await arrivals.get(timeout_s=0)

    assert asyncio.run(scenario()) is RECONNECTED


def test_a_cancelled_async_wait_leaves_the_arrivals_usable() -> None:
    async def scenario() -> Arrival:
        arrivals = AsyncArrivals(DeadlineTicks())
        waiting = asyncio.create_task(arrivals.get(timeout_s=30))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        arrivals.put_nowait([answer("after")])
        return await arrivals.get(timeout_s=30)

    assert asyncio.run(scenario()) == [answer("after")]


def test_a_wait_timing_out_leaves_the_waits_that_share_its_deadlines_waiting() -> None:
    async def scenario() -> list[Arrival]:
        deadlines = DeadlineTicks()
        soon, late, answered = (AsyncArrivals(deadlines) for _ in range(3))
        waiting = [asyncio.create_task(late.get(timeout_s=30))]
        waiting.append(asyncio.create_task(answered.get(timeout_s=0.01)))
        await asyncio.sleep(0)
        answered.put_nowait([answer("in time")])
        with pytest.raises(TimeoutError):
            await soon.get(timeout_s=0.01)
        late.put_nowait([answer("late")])
        return list(await asyncio.gather(*waiting))

    assert asyncio.run(scenario()) == [[answer("late")], [answer("in time")]]


def test_async_waits_of_a_later_event_loop_time_out_as_well() -> None:
    """A producer used on one loop, then another: a wait whose deadline falls in a tick the
    first loop had a timer for still ends at its deadline."""
    deadlines = DeadlineTicks()

    async def first() -> float:
        loop = asyncio.get_running_loop()
        # Midway through a tick about a second away: far from its edges on either loop.
        end = (math.ceil((loop.time() + 1.0) / DEADLINE_TICK_S) - 0.5) * DEADLINE_TICK_S
        deadlines.add(loop, end - loop.time(), loop.create_future())
        return end

    async def second(end: float) -> BaseException | None:
        arrivals = AsyncArrivals(deadlines)
        waiting = asyncio.create_task(arrivals.get(end - asyncio.get_running_loop().time()))
        done, _ = await asyncio.wait({waiting}, timeout=60)  # a guard: it ends in ~1 s
        assert done, "the wait never timed out"
        return waiting.exception()

    assert isinstance(asyncio.run(second(asyncio.run(first()))), TimeoutError)
