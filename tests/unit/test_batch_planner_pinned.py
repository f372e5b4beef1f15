"""The batch planner: decisions its examples and state machine (``test_batch_planner``) left
open, found by mutation testing (docs/testing.md)."""

from __future__ import annotations

import pytest

from tests.unit.test_batch_planner import ids, lease, slot_call
from trajcore.domain.batch_planner import BatchConfig, BatchPlanner
from trajcore.domain.errors import InvalidInput, StateError


def test_containers_due_at_the_same_time_go_out_in_the_order_they_became_ready() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50, eager=False))
    for name in ("c", "b", "a"):
        planner.offer(slot_call(lease(name), f"call-{name}"), 0.0)
    assert [b.container for b in planner.due(0.05)] == ["c", "b", "a"]


def test_completing_a_batch_twice_or_one_never_sent_says_which() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50))
    planner.offer(slot_call(lease("a"), "x"), 0.0)
    [batch] = planner.due(0.0)
    planner.complete(batch.id, 0.1)
    with pytest.raises(StateError, match=r"batch 1 is not in flight \(already completed\)"):
        planner.complete(batch.id, 0.2)
    for never in (0, 2):
        with pytest.raises(StateError, match=rf"batch {never} is not in flight \(never sent\)"):
            planner.complete(never, 0.2)
    with pytest.raises(InvalidInput) as caught:
        planner.complete(batch.id, 0.0)
    assert str(caught.value).startswith("complete: time went backwards")


def test_statistics_count_every_completed_batch() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50))
    for n, at in enumerate((0.0, 1.0, 2.0)):
        planner.offer(slot_call(lease("a"), f"x{n}"), at)
        [batch] = planner.due(at)
        assert ids(batch) == [f"x{n}"]
        planner.complete(batch.id, at)
    assert planner.statistics().batches_completed == 3


def test_deadlines_stay_right_through_many_reschedules() -> None:
    # Each withdrawn first call moves the container's deadline; the stale heap entries are
    # compacted away now and then, and no deadline may be lost or invented by that.
    planner = BatchPlanner(config=BatchConfig(window_ms=10, eager=False))
    planner.offer(slot_call(lease("other"), "o"), 0.0)
    previous = slot_call(lease("busy", 0), "x0")
    planner.offer(previous, 0.0)
    for n in range(1, 150):
        now = n * 0.00005
        call = slot_call(lease("busy", n), f"x{n}")
        planner.offer(call, now)
        assert planner.withdraw(previous)
        previous = call
        planner.check_valid()
    assert planner.next_deadline() == pytest.approx(0.01)  # the other container's
    assert [b.container for b in planner.due(0.01)] == ["other"]
    assert planner.next_deadline() == pytest.approx(149 * 0.00005 + 0.01)
    [batch] = planner.due(0.02)
    assert (batch.container, ids(batch)) == ("busy", ["x149"])


def test_check_valid_says_what_it_found_broken() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10, eager=False))
    planner.offer(slot_call(lease("a"), "x"), 0.0)
    planner.check_valid()
    planner._ready += 1
    with pytest.raises(AssertionError, match=r"^check_valid: ready count 2 != 1$"):
        planner.check_valid()
