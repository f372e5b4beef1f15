"""The batching window: examples of each rule, and a stateful model check of them all."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trajcore.domain.batch_planner import (
    Batch,
    BatchClose,
    BatchConfig,
    BatchPlanner,
)
from trajcore.domain.errors import ConfigError, InvalidInput, StateError
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall


def lease(container: str, index: int = 0, epoch: int = 1) -> Lease:
    return Lease(
        slot=SlotId(container=container, index=index), epoch=epoch, holder=f"{container}{index}"
    )


def slot_call(held: Lease, call_id: str) -> SlotCall:
    return SlotCall(lease=held, call=ToolCall(id=call_id, name="bash"), timeout_s=5.0)


def ids(batch: Batch) -> list[str]:
    return [c.call.id for c in batch.calls]


# ---------------------------------------------------------------------- examples


def test_lone_call_goes_out_at_once_in_eager_mode() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50))
    planner.offer(slot_call(lease("a"), "x"), 10.0)
    assert planner.next_deadline() == 10.0
    [batch] = planner.due(10.0)
    assert (batch.container, ids(batch), batch.reason) == ("a", ["x"], BatchClose.EAGER)
    assert batch.sent_at == batch.opened_at == 10.0
    assert planner.due(10.0) == []


def test_calls_coalesce_while_a_batch_is_in_flight_and_go_out_when_it_completes() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50))
    planner.offer(slot_call(lease("a", 0), "x"), 0.0)
    [first] = planner.due(0.0)
    planner.offer(slot_call(lease("a", 1), "y"), 0.001)
    planner.offer(slot_call(lease("a", 2), "z"), 0.002)
    assert planner.due(0.002) == []
    assert planner.next_deadline() == pytest.approx(0.051)
    planner.complete(first.id, 0.010)
    [second] = planner.due(0.010)
    assert (ids(second), second.reason, second.opened_at) == (["y", "z"], BatchClose.EAGER, 0.001)


def test_coalesced_calls_go_out_when_the_window_passes() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=50))
    planner.offer(slot_call(lease("a", 0), "x"), 0.0)
    planner.due(0.0)
    planner.offer(slot_call(lease("a", 1), "y"), 0.01)
    deadline = planner.next_deadline()
    assert deadline == pytest.approx(0.06)
    assert deadline is not None
    assert planner.due(deadline - 1e-9) == []
    [batch] = planner.due(deadline)
    assert (ids(batch), batch.reason) == (["y"], BatchClose.WINDOW)
    assert planner.statistics().in_flight_batches == 2


def test_a_full_batch_closes_at_once() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=1000, max_batch_size=2, eager=False))
    planner.offer(slot_call(lease("a", 0), "x"), 0.0)
    assert planner.due(0.0) == []
    planner.offer(slot_call(lease("a", 1), "y"), 0.5)
    [batch] = planner.due(0.5)
    assert (ids(batch), batch.reason) == (["x", "y"], BatchClose.FULL)


def test_without_eager_mode_a_lone_call_waits_for_its_window() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=20, eager=False))
    planner.offer(slot_call(lease("a"), "x"), 1.0)
    assert planner.due(1.0) == []
    assert planner.next_deadline() == pytest.approx(1.02)
    [batch] = planner.due(1.02)
    assert batch.reason is BatchClose.WINDOW


def test_a_zero_window_without_eager_mode_sends_at_once() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=0, eager=False))
    planner.offer(slot_call(lease("a", 0), "x"), 1.0)
    planner.offer(slot_call(lease("a", 1), "y"), 1.0)
    [batch] = planner.due(1.0)
    assert (ids(batch), batch.reason) == (["x", "y"], BatchClose.WINDOW)


def test_containers_are_batched_separately() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10, eager=False))
    planner.offer(slot_call(lease("a"), "x"), 0.0)
    planner.offer(slot_call(lease("b"), "y"), 0.005)
    planner.offer(slot_call(lease("a", 1), "z"), 0.006)
    [first] = planner.due(0.01)
    assert (first.container, ids(first)) == ("a", ["x", "z"])
    [second] = planner.due(0.015)
    assert (second.container, ids(second)) == ("b", ["y"])


def test_one_slots_calls_share_a_batch_in_order_but_never_overtake_one_in_flight() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10))
    held = lease("a")
    planner.offer(slot_call(held, "1"), 0.0)
    [first] = planner.due(0.0)
    planner.offer(slot_call(held, "2"), 0.0)
    planner.offer(slot_call(held, "3"), 0.0)
    # The window passes, but "2" must wait for "1": nothing of the slot is ready.
    assert planner.next_deadline() is None
    assert planner.due(1.0) == []
    assert planner.statistics().held == 2
    planner.complete(first.id, 1.0)
    [second] = planner.due(1.0)
    assert ids(second) == ["2", "3"]


def test_a_full_batch_holds_back_the_rest_of_a_slot() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10, max_batch_size=2, eager=False))
    held = lease("a")
    for name in "123":
        planner.offer(slot_call(held, name), 0.0)
    [batch] = planner.due(0.0)
    assert ids(batch) == ["1", "2"]
    assert planner.due(5.0) == []
    stats = planner.statistics()
    assert (stats.ready, stats.held) == (0, 1)
    planner.complete(batch.id, 5.0)
    assert planner.next_deadline() == pytest.approx(5.01)
    [rest] = planner.due(5.01)
    assert ids(rest) == ["3"]


def test_withdraw_takes_back_only_a_queued_call() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10, eager=False))
    x, y = slot_call(lease("a", 0), "x"), slot_call(lease("a", 1), "y")
    planner.offer(x, 0.0)
    planner.offer(y, 0.001)
    assert planner.withdraw(x)
    assert not planner.withdraw(x)
    # The window was anchored at x; without it, y's own window counts (never later).
    assert planner.next_deadline() == pytest.approx(0.011)
    [batch] = planner.due(0.011)
    assert ids(batch) == ["y"]
    assert not planner.withdraw(y)
    assert planner.statistics().withdrawn == 1
    planner.check_valid()


def test_withdrawing_the_last_queued_call_forgets_the_container() -> None:
    planner = BatchPlanner()
    x = slot_call(lease("a"), "x")
    planner.offer(x, 0.0)
    assert planner.withdraw(x)
    assert planner.next_deadline() is None
    assert planner.due(0.0) == []
    planner.check_valid()


def test_a_pending_call_cannot_be_offered_again_but_a_finished_one_can() -> None:
    planner = BatchPlanner()
    x = slot_call(lease("a", 3, epoch=7), "x")
    planner.offer(x, 0.0)
    with pytest.raises(StateError, match=r"offer: call 'x' of lease a/3#7 is already queued"):
        planner.offer(x, 0.0)
    [batch] = planner.due(0.0)
    with pytest.raises(StateError, match="already in flight"):
        planner.offer(x, 0.0)
    planner.complete(batch.id, 0.0)
    planner.offer(x, 0.0)  # a retry; the slot server answers a seen call id from its memory
    assert [ids(b) for b in planner.due(0.0)] == [["x"]]


def test_completing_a_batch_not_in_flight_names_it() -> None:
    planner = BatchPlanner()
    with pytest.raises(StateError, match=r"complete: batch 1 is not in flight \(never sent\)"):
        planner.complete(1, 0.0)
    planner.offer(slot_call(lease("a"), "x"), 0.0)
    [batch] = planner.due(0.0)
    planner.complete(batch.id, 0.0)
    with pytest.raises(StateError, match=r"batch 1 is not in flight .already completed"):
        planner.complete(batch.id, 0.0)


def test_time_may_not_run_backwards() -> None:
    planner = BatchPlanner()
    planner.due(5.0)
    with pytest.raises(InvalidInput, match=r"offer: time went backwards .* @ now"):
        planner.offer(slot_call(lease("a"), "x"), 4.0)
    with pytest.raises(InvalidInput, match="due: time went backwards"):
        planner.due(float("nan"))
    assert planner.statistics().offered == 0


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"window_ms": -1}, "batching.window_ms"),
        ({"window_ms": float("inf")}, "batching.window_ms"),
        ({"window_ms": "5"}, "batching.window_ms"),
        ({"max_batch_size": 0}, "batching.max_batch_size"),
        ({"max_batch_size": 2.5}, "batching.max_batch_size"),
        ({"max_batch_size": True}, "batching.max_batch_size"),
    ],
)
def test_bad_config_names_the_field(settings: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        BatchConfig(**settings)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_statistics_count_every_call_and_batch() -> None:
    planner = BatchPlanner(config=BatchConfig(window_ms=10, max_batch_size=2))
    for i in range(5):
        planner.offer(slot_call(lease("a", i), str(i)), 0.0)
    batches = planner.due(0.0)
    assert [b.reason for b in batches] == [BatchClose.FULL, BatchClose.FULL]
    assert [b.id for b in planner.in_flight()] == [b.id for b in batches]
    planner.complete(batches[0].id, 0.001)
    stats = planner.statistics()
    assert (stats.ready, stats.held, stats.in_flight_batches, stats.in_flight_calls) == (1, 0, 1, 2)
    assert (stats.offered, stats.batches_sent, stats.calls_sent, stats.batches_completed) == (
        5,
        2,
        4,
        1,
    )
    assert (stats.closed_full, stats.closed_eager, stats.closed_window, stats.queued) == (
        2,
        0,
        0,
        1,
    )


# ---------------------------------------------------------------------- the stateful model


@dataclass
class ModelCall:
    call: SlotCall
    slot: SlotId
    offered_at: float
    status: str = "queued"  # queued | sent | done | withdrawn
    sendable_since: float | None = None  # None while an earlier call of its slot is in flight


@dataclass
class Model:
    calls: list[ModelCall] = field(default_factory=list)
    by_id: dict[str, ModelCall] = field(default_factory=dict)
    slot_batch: dict[SlotId, int] = field(default_factory=dict)
    in_flight: dict[int, Batch] = field(default_factory=dict)

    def queued(self, slot: SlotId) -> list[ModelCall]:
        return [c for c in self.calls if c.slot == slot and c.status == "queued"]

    def busy(self, container: str) -> bool:
        return any(b.container == container for b in self.in_flight.values())


CONTAINERS = ("a", "b", "c")
STEPS = st.one_of(
    st.sampled_from([0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.2]),
    st.floats(min_value=0.0, max_value=0.1, allow_nan=False),
)


class BatchPlannerMachine(RuleBasedStateMachine):
    """Drives a planner with random offers, time steps, completions and withdrawals."""

    def __init__(self) -> None:
        super().__init__()
        self.planner = BatchPlanner()
        self.model = Model()
        self.now = 0.0
        self.counter = 0
        self.leases: dict[SlotId, Lease] = {}

    @initialize(
        window_ms=st.sampled_from([0.0, 1.0, 5.0, 50.0]),
        max_batch_size=st.sampled_from([1, 2, 3, 5]),
        eager=st.booleans(),
    )
    def configure(self, window_ms: float, max_batch_size: int, eager: bool) -> None:
        self.config = BatchConfig(window_ms=window_ms, max_batch_size=max_batch_size, eager=eager)
        self.planner = BatchPlanner(config=self.config)

    # -------------------------------------------------------------- checks on every batch

    def take(self, batches: list[Batch]) -> None:
        for batch in batches:
            model = self.model
            assert 0 < len(batch.calls) <= self.config.max_batch_size
            assert batch.sent_at == self.now
            assert batch.opened_at <= self.now
            assert batch.id not in model.in_flight
            if batch.reason is BatchClose.FULL:
                assert len(batch.calls) == self.config.max_batch_size
            if batch.reason is BatchClose.EAGER:
                assert self.config.eager
                assert not model.busy(batch.container)
            if batch.reason is BatchClose.WINDOW:
                assert batch.opened_at + self.config.window_s <= self.now
            by_slot: dict[SlotId, list[str]] = {}
            for sent in batch.calls:
                assert sent.container == batch.container, "one container per batch"
                by_slot.setdefault(sent.lease.slot, []).append(sent.call.id)
            for slot, sent_ids in by_slot.items():
                assert slot not in model.slot_batch, f"{slot} overtook its call in flight"
                expected = [c.call.call.id for c in model.queued(slot)][: len(sent_ids)]
                assert sent_ids == expected, "one slot's calls go out in offer order"
            for sent in batch.calls:
                entry = model.by_id[sent.call.id]
                assert entry.status == "queued", f"{sent.call.id} sent while {entry.status}"
                entry.status = "sent"
            for slot in by_slot:
                model.slot_batch[slot] = batch.id
                for waiting in model.queued(slot):
                    waiting.sendable_since = None
            model.in_flight[batch.id] = batch
        self.after_due()

    def after_due(self) -> None:
        """Nothing sendable is left overdue; in eager mode nothing waits on an idle container."""
        for entry in self.model.calls:
            if entry.status != "queued" or entry.sendable_since is None:
                continue
            assert entry.sendable_since + self.config.window_s > self.now, (
                f"{entry.call.call.id} waited past its window"
            )
            if self.config.eager:
                assert self.model.busy(entry.slot.container), "eager: a lone call waited"

    # -------------------------------------------------------------- rules

    @rule(container=st.sampled_from(CONTAINERS), index=st.integers(0, 2))
    def offer(self, container: str, index: int) -> None:
        slot = SlotId(container=container, index=index)
        held = self.leases.setdefault(slot, lease(container, index))
        self.counter += 1
        call = slot_call(held, f"call-{self.counter}")
        self.planner.offer(call, self.now)
        sendable = None if slot in self.model.slot_batch else self.now
        entry = ModelCall(call=call, slot=slot, offered_at=self.now, sendable_since=sendable)
        self.model.calls.append(entry)
        self.model.by_id[call.call.id] = entry
        if self.config.eager and not self.model.busy(container) and sendable is not None:
            deadline = self.planner.next_deadline()
            assert deadline is not None
            assert deadline <= self.now, "eager: a lone call must be due at once"

    @rule()
    def due_now(self) -> None:
        self.take(self.planner.due(self.now))

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        target = self.now + step
        deadline = self.planner.next_deadline()
        if deadline is None or deadline > self.now:
            assert self.planner.due(self.now) == [], "due before its deadline"
        while (deadline := self.planner.next_deadline()) is not None and deadline <= target:
            self.now = max(self.now, deadline)
            batches = self.planner.due(self.now)
            assert batches, "a deadline passed and nothing was due"
            self.take(batches)
        self.now = target
        self.take(self.planner.due(self.now))

    @precondition(lambda self: bool(self.model.in_flight))
    @rule(pick=st.integers(min_value=0, max_value=100))
    def complete(self, pick: int) -> None:
        batch_ids = sorted(self.model.in_flight)
        batch = self.model.in_flight.pop(batch_ids[pick % len(batch_ids)])
        self.planner.complete(batch.id, self.now)
        for sent in batch.calls:
            self.model.by_id[sent.call.id].status = "done"
        for slot in {sent.lease.slot for sent in batch.calls}:
            assert self.model.slot_batch.pop(slot) == batch.id
            for waiting in self.model.queued(slot):
                waiting.sendable_since = self.now

    @precondition(lambda self: bool(self.model.calls))
    @rule(pick=st.integers(min_value=0, max_value=1000))
    def withdraw(self, pick: int) -> None:
        entry = self.model.calls[pick % len(self.model.calls)]
        was_queued = entry.status == "queued"
        assert self.planner.withdraw(entry.call) is was_queued
        if was_queued:
            entry.status = "withdrawn"

    @precondition(
        lambda self: any(c.status in ("queued", "sent") for c in self.model.calls),
    )
    @rule(pick=st.integers(min_value=0, max_value=1000))
    def offer_a_pending_call_again(self, pick: int) -> None:
        pending = [c for c in self.model.calls if c.status in ("queued", "sent")]
        before = self.planner.statistics()
        with pytest.raises(StateError, match="already"):
            self.planner.offer(pending[pick % len(pending)].call, self.now)
        assert self.planner.statistics() == before

    @rule()
    def complete_a_batch_not_in_flight(self) -> None:
        with pytest.raises(StateError, match="not in flight"):
            self.planner.complete(10_000, self.now)

    # -------------------------------------------------------------- invariants

    @invariant()
    def valid(self) -> None:
        self.planner.check_valid()

    @invariant()
    def counts_agree_with_the_model(self) -> None:
        stats = self.planner.statistics()
        statuses = [c.status for c in self.model.calls]
        assert stats.offered == len(statuses)
        assert stats.queued == statuses.count("queued")
        assert stats.in_flight_calls == statuses.count("sent")
        assert stats.withdrawn == statuses.count("withdrawn")
        assert stats.in_flight_batches == len(self.model.in_flight)
        held = sum(
            1 for c in self.model.calls if c.status == "queued" and c.slot in self.model.slot_batch
        )
        assert stats.held == held

    def teardown(self) -> None:
        """Finish every batch and let time run: every call is delivered once or withdrawn."""
        if not hasattr(self, "config"):
            return
        for _ in range(10 * len(self.model.calls) + 10):
            for _ in list(self.model.in_flight):
                self.complete(0)
            if self.planner.next_deadline() is None and not self.model.in_flight:
                break
            self.advance(self.config.window_s + 0.001)
        assert {c.status for c in self.model.calls} <= {"done", "withdrawn"}
        self.planner.check_valid()
        assert self.planner.statistics().queued == 0


TestBatchPlanner = BatchPlannerMachine.TestCase
