"""The batch-forming decision, with a fake clock."""

from __future__ import annotations

from config.schema import Request
from config.settings import ModelPolicy
from workers.batcher.policy import DISPATCH_MARGIN_S, Pending, Plan, plan_batch

POLICY = ModelPolicy(max_batch_size=4, max_wait_s=0.015, late_binding=False)
LATE_BINDING = ModelPolicy(max_batch_size=4, max_wait_s=0.015)


def pending(
    index: int,
    arrived_at: float,
    deadline_at: float = 100.0,
    cost: int = 1,
    handicap_s: float = 0.0,
) -> Pending:
    request = Request(
        request_id=f"r{index}",
        model="m",
        input=index,
        digest="d",
        submitted_at=0.0,
        deadline_at=0.0,
    )
    return Pending(
        entry_id=f"{index}-0",
        request=request,
        arrived_at=arrived_at,
        deadline_at=deadline_at,
        cost=cost,
        handicap_s=handicap_s,
    )


def test_full_batch_flushes_at_once_on_size() -> None:
    """max_batch_size requests leave together, oldest first, without waiting."""
    items = [pending(i, arrived_at=10.0 + i * 0.001) for i in (5, 1, 3, 2, 4)]
    plan = plan_batch(items, POLICY, now=10.006, free_slots=1)
    assert plan.flush_reason == "size"
    assert [item.request.request_id for item in plan.batch] == ["r1", "r2", "r3", "r4"]


def test_partial_batch_waits_for_the_oldest_request_window() -> None:
    """Fewer than max_batch_size wait until the oldest has waited max_wait_s, and no longer."""
    items = [pending(1, arrived_at=10.0), pending(2, arrived_at=10.010)]
    early = plan_batch(items, POLICY, now=10.005, free_slots=1)
    assert early.batch == () and early.wait_s is not None
    assert abs(early.wait_s - 0.010) < 1e-9
    due = plan_batch(items, POLICY, now=10.015, free_slots=1)
    assert due.flush_reason == "wait"
    assert len(due.batch) == 2


def test_window_is_measured_from_the_oldest_request_not_a_timer() -> None:
    """A newer request does not restart the window of an older one."""
    items = [pending(1, arrived_at=10.0), pending(2, arrived_at=10.014)]
    assert plan_batch(items, POLICY, now=10.0151, free_slots=1).flush_reason == "wait"


def test_no_free_slot_holds_requests_to_gather_a_fuller_batch() -> None:
    """While every worker slot is busy nothing is sent, even past the window or at full size."""
    items = [pending(i, arrived_at=10.0) for i in range(6)]
    plan = plan_batch(items, POLICY, now=11.0, free_slots=0)
    assert plan.batch == ()
    assert plan.wait_s is not None and plan.wait_s > 0


def test_a_full_batch_goes_ahead_of_the_busy_slots_and_a_partial_one_waits() -> None:
    """With every slot busy, a full batch still leaves while there is room ahead (one per
    live worker), since waiting could not make it fuller; a partial batch, a batch holding a
    request taken back from a dead process, or one beyond the room waits for a slot."""
    full = [pending(i, arrived_at=10.0) for i in range(4)]
    plan = plan_batch(full, LATE_BINDING, now=10.0, free_slots=0, full_ahead=1)
    assert plan.flush_reason == "size" and len(plan.batch) == 4
    assert plan_batch(full, LATE_BINDING, now=10.0, free_slots=-1, full_ahead=1).batch == ()
    assert plan_batch(full[:3], LATE_BINDING, now=10.0, free_slots=0, full_ahead=1).batch == ()
    suspect = [full[0]._replace(attempts=1), *full[1:]]
    assert plan_batch(suspect, LATE_BINDING, now=10.0, free_slots=0, full_ahead=1).batch == ()


def test_requests_past_their_deadline_expire_and_never_join_a_batch() -> None:
    """Expired requests are returned separately; the rest still batch."""
    items = [pending(1, arrived_at=10.0, deadline_at=10.01), pending(2, arrived_at=10.0)]
    plan = plan_batch(items, POLICY, now=10.02, free_slots=1)
    assert [item.request.request_id for item in plan.expired] == ["r1"]
    assert [item.request.request_id for item in plan.batch] == ["r2"]


def test_wait_is_bounded_by_the_next_deadline() -> None:
    """With no slot free the batcher still wakes when the earliest request would expire."""
    items = [pending(1, arrived_at=10.0, deadline_at=10.5)]
    plan = plan_batch(items, POLICY, now=10.1, free_slots=0)
    assert plan.wait_s is not None and abs(plan.wait_s - 0.4) < 1e-9


def test_nothing_pending_means_nothing_due() -> None:
    """An empty buffer sends nothing and has no timer."""
    plan = plan_batch([], POLICY, now=10.0, free_slots=3)
    assert plan.batch == () and plan.expired == () and plan.wait_s is None


def test_an_idle_worker_gets_what_is_queued_at_once() -> None:
    """Work-conserving: with a worker holding no batch, even one request leaves without waiting."""
    plan = plan_batch([pending(1, arrived_at=10.0)], POLICY, now=10.0, free_slots=2, idle_workers=1)
    assert plan.flush_reason == "idle"
    assert len(plan.batch) == 1


def test_with_late_binding_a_free_slot_takes_what_is_queued_now() -> None:
    """Late binding: a free slot behind a busy device gets the partial batch at once, since the
    batch tops itself up in the worker when the device frees."""
    plan = plan_batch([pending(1, arrived_at=10.0)], LATE_BINDING, now=10.0, free_slots=1)
    assert plan.flush_reason == "slot" and len(plan.batch) == 1


def test_without_late_binding_a_free_slot_waits_for_the_window() -> None:
    """Without late binding, a free slot behind a busy device holds a partial batch up to
    max_wait_s, then sends it."""
    items = [pending(1, arrived_at=10.0)]
    assert plan_batch(items, POLICY, now=10.001, free_slots=1, idle_workers=0).batch == ()
    assert plan_batch(items, POLICY, now=10.016, free_slots=1, idle_workers=0).flush_reason == (
        "wait"
    )


def ids(plan: Plan) -> list[str]:
    return [item.request.request_id for item in plan.batch]


GROUPED = ModelPolicy(max_batch_size=3, group_by_cost=True)


def test_grouping_by_cost_fills_the_batch_with_inputs_like_the_oldest() -> None:
    """With group_by_cost the oldest request leaves with the requests nearest its cost, not
    with the next oldest: long inputs ride with long ones, short with short."""
    costs = {1: 40, 2: 5, 3: 38, 4: 6, 5: 44, 6: 4}
    items = [pending(i, arrived_at=10.0 + i * 0.001, cost=c) for i, c in costs.items()]
    first = plan_batch(items, GROUPED, now=10.01, free_slots=1)
    assert first.flush_reason == "size"
    assert ids(first) == ["r1", "r3", "r5"]
    rest = [item for item in items if item not in first.batch]
    assert ids(plan_batch(rest, GROUPED, now=10.01, free_slots=1)) == ["r2", "r4", "r6"]


def test_the_oldest_request_always_leaves_in_the_next_batch() -> None:
    """However many cheaper requests wait, an expensive oldest request is never passed over:
    grouping chooses its companions, never skips it."""
    items = [pending(0, arrived_at=10.0, cost=90)]
    items += [pending(i, arrived_at=10.0 + i * 0.001, cost=3) for i in range(1, 20)]
    plan = plan_batch(items, GROUPED, now=10.05, free_slots=1)
    assert ids(plan)[0] == "r0"


def test_a_batch_stops_before_the_input_that_would_overflow_its_budget() -> None:
    """max_batch_cost caps the padded cost (longest x size): the request that would overflow
    waits for the next batch, and the batch leaves at once (``budget``)."""
    policy = ModelPolicy(max_batch_size=8, max_batch_cost=100)
    items = [
        pending(i, arrived_at=10.0 + i * 0.001, cost=c) for i, c in enumerate([20, 30, 30, 40])
    ]
    plan = plan_batch(items, policy, now=10.01, free_slots=1)
    assert plan.flush_reason == "budget"
    assert ids(plan) == ["r0", "r1", "r2"]  # 3 x 30 = 90; with r3, 4 x 40 = 160 > 100


def test_costs_turn_late_binding_off() -> None:
    """A batch formed by cost is never topped up by the worker, which does not see costs."""
    assert ModelPolicy().tops_up
    assert not ModelPolicy(group_by_cost=True).tops_up
    assert not ModelPolicy(max_batch_cost=512).tops_up
    assert not ModelPolicy(late_binding=False).tops_up


def test_a_batch_formed_by_cost_waits_for_an_idle_device_not_for_a_free_slot() -> None:
    """By cost, a partial batch is not sent into a slot behind a running batch (it could not
    grow there); it leaves when a worker is idle, with every request queued by then."""
    items = [pending(i, arrived_at=10.0 + i * 0.001, cost=5) for i in range(2)]
    busy = plan_batch(items, GROUPED, now=11.0, free_slots=1, idle_workers=0)
    assert busy.batch == () and busy.flush_reason is None
    idle = plan_batch(items, GROUPED, now=11.0, free_slots=1, idle_workers=1)
    assert idle.flush_reason == "idle" and ids(idle) == ["r0", "r1"]


def test_requests_with_their_own_deadlines_leave_earliest_deadline_first() -> None:
    items = [
        pending(1, arrived_at=10.0, deadline_at=90.0),
        pending(2, arrived_at=10.1, deadline_at=12.0),
        pending(3, arrived_at=10.2, deadline_at=50.0),
    ]
    plan = plan_batch(items, ModelPolicy(max_batch_size=2), now=10.3, free_slots=1)
    assert ids(plan) == ["r2", "r3"]


def test_a_low_priority_request_is_passed_only_by_requests_due_within_two_aging_periods() -> None:
    """Aging 10 s: a low request (handicap 20 s) arriving at t=0 goes after high requests due
    up to 20 s after it, and before any due later, however many keep coming."""
    policy = ModelPolicy(max_batch_size=4, priorities=True)
    low = pending(0, arrived_at=0.0, deadline_at=60.0, handicap_s=20.0)
    early_highs = [pending(i, arrived_at=i * 5.0, deadline_at=60.0 + i * 5.0) for i in (1, 2, 3)]
    late_highs = [pending(i, arrived_at=i * 5.0, deadline_at=60.0 + i * 5.0) for i in (5, 6, 7)]
    plan = plan_batch([*late_highs, low, *early_highs], policy, now=40.0, free_slots=1)
    assert ids(plan) == ["r1", "r2", "r3", "r0"]


def test_a_held_batch_leaves_early_when_waiting_would_miss_its_earliest_deadline() -> None:
    """No late binding, max wait 1 s: a batch whose earliest deadline is 100 ms away leaves
    at once when the model takes 97 ms at its size, and otherwise waits only until it must."""
    policy = ModelPolicy(max_batch_size=8, max_wait_s=1.0, late_binding=False)
    items = [pending(1, arrived_at=10.0, deadline_at=10.1), pending(2, arrived_at=10.0)]
    slow = plan_batch(items, policy, now=10.0, free_slots=1, model_s=lambda size: 0.097)
    assert slow.flush_reason == "deadline" and ids(slow) == ["r1", "r2"]
    fast = plan_batch(items, policy, now=10.0, free_slots=1, model_s=lambda size: 0.01)
    assert fast.batch == () and fast.wait_s is not None
    assert abs(fast.wait_s - (0.1 - 0.01 - DISPATCH_MARGIN_S)) < 1e-9
    plain = ModelPolicy(max_batch_size=8, max_wait_s=1.0, late_binding=False, deadline_aware=False)
    assert plan_batch(items, plain, now=10.0, free_slots=1, model_s=lambda size: 0.097).batch == ()
