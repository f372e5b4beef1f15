"""The Nomad reconciler: examples, and a stateful test against a model of Nomad and the pool.

The state machine below plays Nomad (placing allocations for the job's count, failing,
restarting, losing and forgetting them, stopping the highest indices when the count drops) and
the pool's adapter (joining or failing to join, leasing and releasing slots, quarantining,
failing batches), and carries out every action the reconciler returns. A twin reconciler is
fed the same events with the listing in the opposite order and must answer the same.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.nomad_reconcile import (
    Action,
    Allocation,
    Discard,
    Drain,
    Join,
    Lose,
    MemberState,
    NomadReconciler,
    ReconcileConfig,
    Remove,
    Replace,
    SetCount,
    Undrain,
)
from trajcore.domain.scaling import ScaleReason, ScaleSettings


def reconciler(**scale: Any) -> NomadReconciler:
    settings: dict[str, Any] = {"min_containers": 1, "max_containers": 4, "cooldown_s": 0.0}
    restart_attempts = scale.pop("restart_attempts", 0)
    slots = scale.pop("slots_per_container", 2)
    settings.update(scale)
    return NomadReconciler(
        ReconcileConfig(
            scale=ScaleSettings(**settings),
            slots_per_container=slots,
            restart_attempts=restart_attempts,
        )
    )


def running(alloc_id: str, index: int, **fields: Any) -> Allocation:
    return Allocation(id=alloc_id, index=index, client_status="running", **fields)


# ---------------------------------------------------------------------- examples


def test_running_allocations_are_joined_then_capacity_counts_them() -> None:
    machine = reconciler()
    machine.registered(1)
    actions = machine.observe([running("a", 0)], demand=0, now=0.0)
    assert actions == [Join(alloc_id="a", index=0, restarts=0)]
    assert machine.capacity == 0  # joining is not capacity
    assert machine.joined("a", now=1.0) == []
    assert machine.capacity == 1
    assert machine.observe([running("a", 0)], demand=0, now=2.0) == []


def test_demand_raises_the_count_at_once() -> None:
    machine = reconciler()
    machine.registered(1)
    actions = machine.observe([running("a", 0)], demand=5, now=0.0)
    assert actions[-1] == SetCount(count=3, reason=ScaleReason.UP)
    # until Nomad confirms, it is asked again
    assert machine.observe([running("a", 0)], demand=5, now=1.0)[-1] == SetCount(
        count=3, reason=ScaleReason.HOLD
    )
    machine.scaled(3)
    assert not any(isinstance(a, SetCount) for a in machine.observe([], demand=5, now=2.0))


def test_scale_down_drains_first_and_lowers_the_count_once_nothing_is_held() -> None:
    machine = reconciler()
    machine.registered(2)
    machine.observe([running("a", 0), running("b", 1)], demand=4, now=0.0)
    machine.joined("a", 0.0)
    machine.joined("b", 0.0)
    machine.observe([running("a", 0), running("b", 1)], demand=4, now=0.0)
    held = [running("a", 0), running("b", 1, held=1)]
    actions = machine.observe(held, demand=1, now=1.0)
    assert actions == [Drain(alloc_id="b", reason="index 1 is at or above the target 1")]
    assert machine.capacity == 1
    assert machine.observe(held, demand=1, now=2.0) == []  # b still holds a slot
    free = [running("a", 0), running("b", 1)]
    assert machine.observe(free, demand=1, now=3.0) == [SetCount(count=1, reason=ScaleReason.HOLD)]
    machine.scaled(1)
    stopped = [running("a", 0), running("b", 1, desired_status="stop")]
    actions = machine.observe(stopped, demand=1, now=4.0)
    assert [type(a) for a in actions] == [Remove]


def test_a_drained_container_wanted_again_comes_back() -> None:
    machine = reconciler()
    machine.registered(2)
    listing = [running("a", 0), running("b", 1)]
    machine.observe(listing, demand=4, now=0.0)
    machine.joined("a", 0.0)
    machine.joined("b", 0.0)
    machine.observe(listing, demand=0, now=1.0)
    assert machine.members()["b"] is MemberState.DRAINING
    actions = machine.observe(listing, demand=4, now=2.0)
    assert actions == [Undrain(alloc_id="b", reason="index below 2")]
    quarantined = reconciler()
    quarantined.registered(2)
    quarantined.observe(listing, demand=4, now=0.0)
    quarantined.joined("a", 0.0)
    quarantined.joined("b", 0.0)
    quarantined.observe(listing, demand=0, now=1.0)
    actions = quarantined.observe([running("a", 0), running("b", 1, quarantined=1)], 4, 2.0)
    assert [type(a) for a in actions] == [Lose, Replace]


def test_a_draining_container_that_still_holds_slots_is_neither_back_nor_removed() -> None:
    machine = reconciler()
    machine.registered(2)
    listing = [running("a", 0), running("b", 1, held=1)]
    machine.observe(listing, demand=4, now=0.0)
    machine.joined("a", 0.0)
    machine.joined("b", 0.0)
    assert machine.observe(listing, demand=1, now=1.0) == [
        Drain(alloc_id="b", reason="index 1 is at or above the target 1")
    ]
    # wanted again while a trajectory still holds its slot: it stays draining
    assert machine.observe(listing, demand=4, now=2.0) == []
    assert machine.members()["b"] is MemberState.DRAINING
    # its allocation stops while it holds a slot: lost (the lease turns stale), not removed
    gone = [running("a", 0), Allocation(id="b", index=1, client_status="lost", held=1)]
    lost = "its scheduler lost it: its server may come back with old leases"
    assert machine.observe(gone, demand=4, now=3.0) == [
        Lose(alloc_id="b", reason="its allocation is lost (desired run)"),
        Replace(alloc_id="b", restarts=0, reason=lost),
    ]


def test_gone_and_failed_allocations_are_lost_and_replaced() -> None:
    machine = reconciler(min_containers=2)
    machine.registered(2)
    machine.observe([running("a", 0), running("b", 1)], demand=0, now=0.0)
    machine.joined("a", 0.0)
    machine.joined("b", 0.0)
    failed = Allocation(id="b", index=1, client_status="failed")
    assert machine.observe([running("a", 0), failed], demand=0, now=1.0) == [
        Lose(alloc_id="b", reason="its allocation is failed (desired run)")
    ]
    assert machine.failed("a", "batch failed: connection refused", now=2.0) == [
        Lose(alloc_id="a", reason="batch failed: connection refused"),
        Replace(alloc_id="a", restarts=0, reason="batch failed: connection refused"),
    ]
    # the same run of a is never joined again; its rescheduled replacement is
    assert machine.observe([running("a", 0), running("c", 1)], demand=0, now=3.0) == [
        Join(alloc_id="c", index=1, restarts=0)
    ]


def test_restarts_beyond_the_attempts_are_replaced_and_within_them_rejoined() -> None:
    machine = reconciler(restart_attempts=1)
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    machine.joined("a", 0.0)
    actions = machine.observe([running("a", 0, restarts=1)], demand=0, now=1.0)
    assert actions == [
        Lose(alloc_id="a", reason="its slot server restarted in place"),
        Join(alloc_id="a", index=0, restarts=1),
    ]
    machine.joined("a", 1.0)
    actions = machine.observe([running("a", 0, restarts=2)], demand=0, now=2.0)
    assert [type(a) for a in actions] == [Lose, Replace]
    assert machine.observe([running("a", 0, restarts=2)], demand=0, now=3.0) == []


def test_a_join_that_takes_too_long_is_replaced_and_a_late_answer_discarded() -> None:
    machine = NomadReconciler(
        ReconcileConfig(scale=ScaleSettings(min_containers=1, max_containers=1), join_timeout_s=5)
    )
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    actions = machine.observe([running("a", 0)], demand=0, now=5.5)
    assert actions == [Replace(alloc_id="a", restarts=0, reason="not healthy within 5 s")]
    assert machine.joined("a", 6.0) == [
        Discard(alloc_id="a", reason="it joined after the pool gave it up")
    ]
    assert machine.join_failed("a", "late", 6.0) == []


def test_two_running_allocations_on_one_index_give_one_container_of_capacity() -> None:
    machine = reconciler(min_containers=2)
    machine.registered(2)
    listing = [running("a", 0), running("b", 0), running("c", 1)]
    machine.observe(listing, demand=0, now=0.0)
    for alloc_id in ("a", "b", "c"):
        machine.joined(alloc_id, 1.0)
    assert machine.capacity == 2
    assert machine.members()["b"] is MemberState.DRAINING
    machine.check_valid()


def test_bad_input_names_the_argument() -> None:
    machine = reconciler()
    with pytest.raises(InvalidInput, match="demand"):
        machine.observe([], demand=-1, now=0.0)
    with pytest.raises(InvalidInput, match="listed twice @ allocations"):
        machine.observe([running("a", 0), running("a", 1)], demand=0, now=0.0)
    machine.observe([], demand=0, now=5.0)
    with pytest.raises(InvalidInput, match="now"):
        machine.observe([], demand=0, now=4.0)
    with pytest.raises(InvalidInput, match="index"):
        Allocation(id="a", index=-1, client_status="running")
    with pytest.raises(ConfigError, match="join_timeout_s"):
        ReconcileConfig(scale=ScaleSettings(), join_timeout_s=0)
    with pytest.raises(ConfigError, match="restart_attempts"):
        ReconcileConfig(scale=ScaleSettings(), restart_attempts=-1)
    with pytest.raises(ConfigError, match="slots_per_container"):
        ReconcileConfig(scale=ScaleSettings(), slots_per_container=0)


# ---------------------------------------------------------------------- stateful


class NomadAndPool(RuleBasedStateMachine):
    """Nomad, the pool's slot book and the reconciler, driven by generated events."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = (f"alloc-{n:03d}" for n in itertools.count())
        self.now = 0.0
        self.demand = 0
        self.count = 0
        # Nomad: id -> {index, client, desired, restarts}
        self.nomad: dict[str, dict[str, Any]] = {}
        # the pool's book: id -> {held, quarantined, draining}
        self.book: dict[str, dict[str, Any]] = {}
        self.in_flight: dict[str, int] = {}
        self.replaced: set[tuple[str, int]] = set()
        self.joins: set[tuple[str, int]] = set()
        self.slow_joins = False

    @initialize(
        minimum=st.integers(0, 2),
        extra=st.integers(0, 2),
        slots=st.integers(1, 3),
        margin=st.integers(0, 2),
        cooldown=st.sampled_from([0.0, 5.0]),
        attempts=st.integers(0, 2),
    )
    def start(  # noqa: PLR0917 - hypothesis passes the drawn settings by keyword
        self, minimum: int, extra: int, slots: int, margin: int, cooldown: float, attempts: int
    ) -> None:
        config = ReconcileConfig(
            scale=ScaleSettings(
                min_containers=minimum,
                max_containers=minimum + 1 + extra,
                scale_down_margin=margin,
                cooldown_s=cooldown,
            ),
            slots_per_container=slots,
            restart_attempts=attempts,
            join_timeout_s=10.0,
        )
        self.config = config
        self.machine = NomadReconciler(config)
        self.twin = NomadReconciler(config)
        self.count = minimum
        self.machine.registered(minimum)
        self.twin.registered(minimum)

    # ------------------------------------------------------------------ carrying out

    def both(self, event: str, *args: Any) -> list[Action]:
        actions: list[Action] = getattr(self.machine, event)(*args)
        twin_args = list(args)
        if event == "observe":
            twin_args[0] = list(reversed(args[0]))
        assert getattr(self.twin, event)(*twin_args) == actions, "not deterministic"
        self.apply(actions)
        return actions

    def apply(self, actions: list[Action]) -> None:
        attempts = self.config.restart_attempts
        for action in actions:
            match action:
                case Join(alloc_id=alloc_id, restarts=restarts):
                    assert (alloc_id, restarts) not in self.replaced
                    assert (alloc_id, restarts) not in self.joins, "a run is joined twice"
                    assert restarts <= attempts
                    assert self.nomad[alloc_id]["client"] == "running"
                    self.joins.add((alloc_id, restarts))
                    self.in_flight[alloc_id] = self.nomad[alloc_id]["index"]
                case Drain(alloc_id=alloc_id):
                    assert not self.book[alloc_id]["draining"]
                    self.book[alloc_id]["draining"] = True
                case Undrain(alloc_id=alloc_id):
                    entry = self.book[alloc_id]
                    assert entry["draining"]
                    assert entry["held"] == entry["quarantined"] == 0
                    entry["draining"] = False
                case Lose(alloc_id=alloc_id):
                    del self.book[alloc_id]
                case Remove(alloc_id=alloc_id):
                    entry = self.book.pop(alloc_id)
                    assert entry["draining"]
                    assert entry["held"] == 0
                case Discard(alloc_id=alloc_id):
                    assert alloc_id not in self.book
                case Replace(alloc_id=alloc_id, restarts=restarts):
                    key = (alloc_id, restarts)
                    assert key not in self.replaced, f"{key} replaced twice"
                    self.replaced.add(key)
                    if alloc_id in self.nomad:
                        self.nomad[alloc_id]["desired"] = "stop"
                case SetCount(count=count):
                    scale = self.config.scale
                    assert scale.min_containers <= count <= scale.max_containers
                    assert count == self.machine.target
                    if count < self.count:  # Nomad stops the highest indices: all drained
                        for entry in self.book.values():
                            if entry["index"] >= count:
                                assert entry["draining"], entry
                                assert entry["held"] == 0, entry
                    self.count = count
                    for entry in self.nomad.values():
                        if entry["index"] >= count:
                            entry["desired"] = "stop"
                    self.machine.scaled(count)
                    self.twin.scaled(count)

    def listing(self) -> list[Allocation]:
        return [
            Allocation(
                id=alloc_id,
                index=entry["index"],
                client_status=entry["client"],
                desired_status=entry["desired"],
                restarts=entry["restarts"],
                held=self.book.get(alloc_id, {}).get("held", 0),
                quarantined=self.book.get(alloc_id, {}).get("quarantined", 0),
            )
            for alloc_id, entry in self.nomad.items()
        ]

    # ------------------------------------------------------------------ Nomad

    def place(self, *, start: bool) -> None:
        """Nomad stops what it no longer wants, places an allocation for every index of the
        count without a live one, and starts the pending ones (unless ``start`` is false)."""
        for entry in self.nomad.values():
            if entry["desired"] != "run" and entry["client"] in ("pending", "running"):
                entry["client"] = "complete"
        live = {
            e["index"]
            for e in self.nomad.values()
            if e["desired"] == "run" and e["client"] in ("pending", "running")
        }
        for index in range(self.count):
            if index not in live:
                self.nomad[next(self.ids)] = {
                    "index": index, "client": "pending", "desired": "run", "restarts": 0
                }  # fmt: skip
        if start:
            for entry in self.nomad.values():
                if entry["client"] == "pending":
                    entry["client"] = "running"

    def poll(self, *, start: bool = True) -> None:
        """Nomad moves on, then the pool polls (the twin reads the listing reversed)."""
        self.place(start=start)
        listing = self.listing()
        self.both("observe", listing, self.demand, self.now)
        attempts = self.config.restart_attempts
        for allocation in listing:
            if allocation.running and allocation.restarts > attempts:
                assert self.machine.retired(allocation.id, allocation.restarts)
        members = self.machine.members()
        for allocation in listing:
            if allocation.id in members:
                assert allocation.running
        assert set(members) <= {a.id for a in listing}
        if not self.slow_joins:
            for alloc_id in sorted(self.in_flight):
                self.complete_join(alloc_id, healthy=True)

    def complete_join(self, alloc_id: str, *, healthy: bool) -> None:
        index = self.in_flight.pop(alloc_id)
        if not healthy:
            self.both("join_failed", alloc_id, "not healthy", self.now)
            return
        wanted = self.machine.members().get(alloc_id) is MemberState.JOINING
        if wanted:
            self.book[alloc_id] = {
                "held": 0, "quarantined": 0, "draining": False, "index": index
            }  # fmt: skip
        actions = self.both("joined", alloc_id, self.now)
        assert wanted == (not any(isinstance(a, Discard) for a in actions))

    def pick(self, data: st.DataObject, client: str | None = None) -> str | None:
        choices = sorted(
            a for a, e in self.nomad.items() if client is None or e["client"] == client
        )
        return data.draw(st.sampled_from(choices)) if choices else None

    @rule()
    def placement_is_slow(self) -> None:
        self.poll(start=False)

    @rule(data=st.data(), status=st.sampled_from(["failed", "lost", "complete"]))
    def allocation_ends(self, data: st.DataObject, status: str) -> None:
        alloc_id = self.pick(data, "running")
        if alloc_id is not None:
            self.nomad[alloc_id]["client"] = status
        self.poll()

    @rule(data=st.data())
    def lost_allocation_runs_again(self, data: st.DataObject) -> None:
        """A lost client comes back (a disconnected Nomad client, a resumed Slurm job): its
        allocation runs again with whatever its last leases left."""
        alloc_id = self.pick(data, "lost")
        if alloc_id is not None and self.nomad[alloc_id]["desired"] == "run":
            self.nomad[alloc_id]["client"] = "running"
        self.poll()

    @rule(data=st.data())
    def restart_in_place(self, data: st.DataObject) -> None:
        alloc_id = self.pick(data, "running")
        if alloc_id is not None:
            self.nomad[alloc_id]["restarts"] += 1
        self.poll()

    @rule()
    def garbage_collected(self) -> None:
        for alloc_id, entry in list(self.nomad.items()):
            if entry["client"] not in ("pending", "running"):
                del self.nomad[alloc_id]
        self.poll()

    # ------------------------------------------------------------------ the pool

    @rule(demand=st.integers(0, 12))
    def demand_changes(self, demand: int) -> None:
        self.demand = demand
        self.poll()

    @rule(seconds=st.sampled_from([0.5, 3.0, 11.0]))
    def clock(self, seconds: float) -> None:
        self.now += seconds
        self.poll()

    @rule(slow=st.booleans())
    def joins_take_time(self, slow: bool) -> None:
        """While joins are slow, they complete only in ``joins_complete`` (or time out)."""
        self.slow_joins = slow

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def joins_complete(self, data: st.DataObject) -> None:
        for alloc_id in sorted(self.in_flight):
            failing = data.draw(st.booleans(), label=f"{alloc_id} fails its health check")
            self.complete_join(alloc_id, healthy=not failing)
        self.poll()

    def pick_joined(self, data: st.DataObject, *, draining: bool | None = None) -> str | None:
        choices = sorted(
            a for a, e in self.book.items() if draining is None or e["draining"] == draining
        )
        return data.draw(st.sampled_from(choices)) if choices else None

    @rule(data=st.data())
    def lease(self, data: st.DataObject) -> None:
        alloc_id = self.pick_joined(data, draining=False)
        if alloc_id is not None:
            entry = self.book[alloc_id]
            entry["held"] = min(self.config.slots_per_container, entry["held"] + 1)
        self.poll()

    @rule(data=st.data(), quarantine=st.booleans())
    def release(self, data: st.DataObject, quarantine: bool) -> None:
        alloc_id = self.pick_joined(data)
        if alloc_id is not None and self.book[alloc_id]["held"]:
            self.book[alloc_id]["held"] -= 1
            self.book[alloc_id]["quarantined"] += quarantine
        self.poll()

    @rule(data=st.data())
    def batch_fails(self, data: st.DataObject) -> None:
        alloc_id = self.pick_joined(data)
        if alloc_id is not None:
            actions = self.both("failed", alloc_id, "batch failed", self.now)
            assert [type(a) for a in actions] == [Lose, Replace]
        self.poll()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def valid(self) -> None:
        if hasattr(self, "machine"):
            self.machine.check_valid()

    @invariant()
    def capacity_is_the_joined_members_within_the_target(self) -> None:
        if not hasattr(self, "machine"):
            return
        machine = self.machine
        capacity = sum(not e["draining"] for e in self.book.values())
        assert capacity == machine.capacity <= machine.target <= self.config.scale.max_containers
        states = machine.members()
        for alloc_id, entry in self.book.items():
            want = MemberState.DRAINING if entry["draining"] else MemberState.JOINED
            assert states.get(alloc_id) is want

    @invariant()
    def nothing_retired_is_a_member(self) -> None:
        if not hasattr(self, "machine"):
            return
        for alloc_id, state in self.machine.members().items():
            restarts = self.nomad[alloc_id]["restarts"] if alloc_id in self.nomad else None
            if restarts is not None and state is not MemberState.JOINING:
                assert not self.machine.retired(alloc_id, restarts)


TestNomadAndPool = NomadAndPool.TestCase


# ---------------------------------------------------------------------- pinned decisions


def test_a_join_is_waited_for_up_to_its_deadline_inclusive() -> None:
    # join_timeout_s is the longest a join may take: at exactly that age it is still waited for,
    # only past it is the allocation replaced.
    machine = NomadReconciler(
        ReconcileConfig(scale=ScaleSettings(min_containers=1, max_containers=1), join_timeout_s=5)
    )
    machine.registered(1)
    assert machine.observe([running("a", 0)], demand=0, now=0.0) == [
        Join(alloc_id="a", index=0, restarts=0)
    ]
    assert machine.observe([running("a", 0)], demand=0, now=5.0) == []
    assert machine.members() == {"a": MemberState.JOINING}
    assert machine.joined("a", 5.0) == []
    assert machine.capacity == 1


def test_the_count_is_lowered_only_when_every_leaving_member_is_free() -> None:
    # Nomad stops the highest indices when the count drops; while any container at or above
    # the new target still holds a leased slot, the count stays, even if others there are free.
    machine = reconciler()
    machine.registered(3)
    listing = [running("a", 0), running("b", 1), running("c", 2)]
    machine.observe(listing, demand=6, now=0.0)
    for alloc_id in ("a", "b", "c"):
        machine.joined(alloc_id, 0.0)
    assert machine.capacity == 3
    held = [running("a", 0), running("b", 1, held=1), running("c", 2)]
    actions = machine.observe(held, demand=1, now=1.0)
    assert [type(a) for a in actions] == [Drain, Drain]
    assert machine.target == 1
    # c is free, b still holds a slot: no SetCount yet
    assert machine.observe(held, demand=1, now=2.0) == []
    assert machine.job_count == 3
    free = [running("a", 0), running("b", 1), running("c", 2)]
    assert machine.observe(free, demand=1, now=3.0) == [SetCount(count=1, reason=ScaleReason.HOLD)]


def test_by_default_an_allocation_restarted_in_place_is_replaced_not_rejoined() -> None:
    # restart_attempts defaults to 0: a slot server that restarted in place even once is
    # replaced (the default trusts no restarted run).
    config = ReconcileConfig(scale=ScaleSettings(min_containers=1, max_containers=1))
    assert config.restart_attempts == 0
    machine = NomadReconciler(config)
    machine.registered(1)
    actions = machine.observe([running("a", 0, restarts=1)], demand=0, now=0.0)
    assert actions == [
        Replace(alloc_id="a", restarts=1, reason="restarted in place 1 times (restart_attempts 0)")
    ]
    assert machine.members() == {}


def test_a_failed_join_retires_the_run_and_asks_for_a_replacement_once() -> None:
    machine = reconciler()
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    assert machine.join_failed("a", "wrong slot count", now=1.0) == [
        Replace(alloc_id="a", restarts=0, reason="it did not join: wrong slot count")
    ]
    assert machine.members() == {}
    assert machine.retired("a", 0)
    assert machine.observe([running("a", 0)], demand=0, now=2.0) == []  # never joined again
    assert machine.join_failed("a", "again", now=3.0) == []


def test_a_join_failure_reported_for_a_joined_member_changes_nothing() -> None:
    machine = reconciler()
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    machine.joined("a", 1.0)
    assert machine.join_failed("a", "late report", now=2.0) == []
    assert machine.members() == {"a": MemberState.JOINED}
    assert not machine.retired("a", 0)


# ---------------------------------------------------------------------- what mutation found


def joined_machine(listing: list[Allocation], count: int, demand: int) -> NomadReconciler:
    """A reconciler with every allocation of ``listing`` joined at time 0."""
    machine = reconciler()
    machine.registered(count)
    machine.observe(listing, demand=demand, now=0.0)
    for allocation in listing:
        machine.joined(allocation.id, 0.0)
    return machine


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (lambda m: m.scaled(-1), "scaled: must be an integer >= 0, got -1 @ count"),
        (lambda m: m.observe([], -1, 0.0), "observe: must be an integer >= 0, got -1 @ demand"),
        (lambda m: m.observe([], 1.5, 0.0), "observe: must be an integer >= 0, got 1.5 @ demand"),
        (lambda m: m.observe([], True, 0.0), "observe: must be an integer >= 0, got True @ demand"),
        (lambda m: m.observe([], 0, math.inf),
         "time went backwards or is not a number: inf @ now"),
        (lambda m: m.joined("a", True), "time went backwards or is not a number: True @ now"),
        (lambda m: m.observe(["a"], 0, 0.0),
         "expected Allocation values, got 'a' @ allocations"),
        (lambda m: Allocation(id="", index=0, client_status="running"),
         "must be non-empty text, got '' @ id"),
        (lambda m: Allocation(id=7, index=0, client_status="running"),  # type: ignore[arg-type]  # bad input on purpose
         "must be non-empty text, got 7 @ id"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_its_field_and_reason(
    event: Callable[[NomadReconciler], object], message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        event(reconciler())
    assert str(caught.value) == message


def test_time_may_not_go_backwards_in_any_event() -> None:
    # observe's scaling rules checks the time too; the join and failure reports only here
    machine = reconciler()
    machine.observe([running("a", 0)], demand=0, now=5.0)
    events: list[Callable[[], list[Action]]] = [
        lambda: machine.joined("a", 4.0),
        lambda: machine.join_failed("a", "x", 4.0),
        lambda: machine.failed("a", "x", 4.0),
    ]
    for event in events:
        with pytest.raises(InvalidInput, match="@ now"):
            event()
    assert machine.members() == {"a": MemberState.JOINING}


def test_gone_members_are_lost_or_removed_with_the_reason() -> None:
    machine = joined_machine([running("a", 0), running("b", 1)], count=2, demand=4)
    machine.observe([running("a", 0), running("b", 1)], demand=0, now=1.0)  # b drains
    assert machine.observe([], demand=0, now=2.0)[:2] == [
        Lose(alloc_id="a", reason="its allocation is no longer listed"),
        Remove(alloc_id="b", reason="drained and its allocation is no longer listed"),
    ]


def test_a_joining_members_held_slots_from_the_listing_are_ignored() -> None:
    # ``held`` counts the pool's container on an allocation, which a joining one does not
    # have yet: a listing that claims otherwise does not make its drained container "held".
    machine = reconciler()
    machine.registered(2)
    claims = [running("a", 0), running("b", 1, held=1)]
    machine.observe(claims, demand=4, now=0.0)
    machine.joined("a", 0.0)
    machine.observe(claims, demand=0, now=1.0)  # the target drops to 1 while b joins
    assert machine.joined("b", 2.0) == [
        Drain(alloc_id="b", reason="index 1 is at or above the target 1")
    ]
    assert machine.observe([running("a", 0)], demand=0, now=3.0)[:1] == [
        Remove(alloc_id="b", reason="drained and its allocation is no longer listed")
    ]


def test_the_container_that_joined_first_keeps_a_shared_index() -> None:
    machine = reconciler(min_containers=2)
    machine.registered(2)
    machine.observe([running("a", 0), running("b", 0)], demand=0, now=0.0)
    assert machine.joined("b", 1.0) == []
    assert machine.joined("a", 2.0) == [
        Drain(alloc_id="a", reason="another container already serves index 0")
    ]
    assert machine.members() == {"a": MemberState.DRAINING, "b": MemberState.JOINED}


def test_a_join_deadline_counts_from_when_the_join_began() -> None:
    machine = NomadReconciler(
        ReconcileConfig(scale=ScaleSettings(min_containers=1, max_containers=1), join_timeout_s=5)
    )
    machine.registered(1)
    machine.observe([], demand=0, now=10.0)
    machine.observe([running("a", 0)], demand=0, now=10.0)
    assert machine.observe([running("a", 0)], demand=0, now=14.0) == []
    assert [type(a) for a in machine.observe([running("a", 0)], demand=0, now=15.5)] == [Replace]


def test_a_failure_reported_for_a_joining_member_changes_nothing() -> None:
    machine = reconciler()
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    assert machine.failed("a", "batch failed", now=1.0) == []
    assert machine.members() == {"a": MemberState.JOINING}


def test_every_run_beyond_its_restarts_is_replaced_not_only_the_first() -> None:
    machine = reconciler(min_containers=3)
    machine.registered(3)
    listing = [running("a", 0, restarts=1), running("b", 1, restarts=1), running("c", 2)]
    actions = machine.observe(listing, demand=0, now=0.0)
    assert [(type(a), a.alloc_id) for a in actions if not isinstance(a, SetCount)] == [
        (Replace, "a"),
        (Replace, "b"),
        (Join, "c"),
    ]


def test_a_quarantined_drained_container_is_replaced_and_the_next_one_still_comes_back() -> None:
    listing = [running("a", 0), running("b", 1), running("c", 2)]
    machine = joined_machine(listing, count=3, demand=6)
    machine.observe(listing, demand=0, now=1.0)  # b and c drain
    assert machine.members() == {
        "a": MemberState.JOINED,
        "b": MemberState.DRAINING,
        "c": MemberState.DRAINING,
    }
    back = [running("a", 0), running("b", 1, quarantined=2), running("c", 2)]
    why = "2 quarantined slots when the pool grew again"
    assert machine.observe(back, demand=6, now=2.0) == [
        Lose(alloc_id="b", reason=why),
        Replace(alloc_id="b", restarts=0, reason=why),
        Undrain(alloc_id="c", reason="index below 3"),
    ]
    assert machine.members() == {"a": MemberState.JOINED, "c": MemberState.JOINED}
    assert machine.capacity == 2


def test_a_kept_container_holding_slots_does_not_hold_back_the_count() -> None:
    # Only the members Nomad will stop (at or above the new target) must be free.
    machine = joined_machine([running("a", 0), running("b", 1)], count=2, demand=4)
    busy = [running("a", 0, held=2), running("b", 1)]
    machine.observe(busy, demand=1, now=1.0)
    assert machine.observe(busy, demand=1, now=2.0) == [SetCount(count=1, reason=ScaleReason.HOLD)]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda m: setattr(m, "_target", 9), "check_valid: target 9 is out of bounds"),
        (lambda m: setattr(m._members["b"], "index", 0),
         "check_valid: two joined members share an index: [0, 0]"),
        (lambda m: setattr(m, "_target", 1), "check_valid: joined index at or above 1"),
        (lambda m: m._retired.add(("a", 0)), "check_valid: retired a is still a member"),
    ],
)  # fmt: skip
def test_check_valid_names_the_broken_rule(
    corrupt: Callable[[NomadReconciler], None], message: str
) -> None:
    machine = joined_machine([running("a", 0), running("b", 1)], count=2, demand=4)
    machine.check_valid()
    corrupt(machine)
    with pytest.raises(AssertionError) as caught:
        machine.check_valid()
    assert str(caught.value) == message


# ---------------------------------------------------------------------- runs that end soon


def test_a_run_that_ends_soon_is_never_joined() -> None:
    machine = reconciler()
    machine.registered(1)
    assert machine.observe([running("a", 0, ending=True)], demand=0, now=0.0) == []
    assert machine.members() == {}


def test_a_joined_run_that_ends_soon_drains_then_is_removed_and_replaced_once_free() -> None:
    machine = joined_machine([running("a", 0)], count=1, demand=0)
    held = [running("a", 0, ending=True, held=1)]
    assert machine.observe(held, demand=2, now=1.0) == [
        Drain(alloc_id="a", reason="its run ends soon")
    ]
    assert machine.observe(held, demand=2, now=2.0) == []  # wanted, but never undrained
    assert machine.members() == {"a": MemberState.DRAINING}
    why = "its run ends soon and it drained"
    assert machine.observe([running("a", 0, ending=True)], demand=2, now=3.0) == [
        Remove(alloc_id="a", reason=why),
        Replace(alloc_id="a", restarts=0, reason=why),
    ]
    assert machine.members() == {}
    assert machine.retired("a", 0)


def test_a_run_that_ends_soon_is_drained_before_any_other() -> None:
    # The ending run's Drain comes first, even when another joined earlier.
    machine = joined_machine([running("b", 1)], count=2, demand=4)
    machine.observe([running("a", 0), running("b", 1)], demand=4, now=1.0)
    machine.joined("a", 2.0)
    listing = [running("a", 0, ending=True), running("b", 1)]
    assert machine.observe(listing, demand=1, now=3.0)[:2] == [
        Drain(alloc_id="a", reason="its run ends soon"),
        Drain(alloc_id="b", reason="index 1 is at or above the target 1"),
    ]


def test_only_one_drained_container_per_index_comes_back() -> None:
    listing = [running("a", 0), running("b", 1), running("c", 1)]
    machine = reconciler()
    machine.registered(2)
    machine.observe(listing, demand=4, now=0.0)
    for alloc_id in ("a", "b", "c"):
        machine.joined(alloc_id, 0.0)
    assert machine.members()["c"] is MemberState.DRAINING  # b serves index 1
    machine.observe(listing, demand=0, now=1.0)  # b drains too
    assert machine.observe(listing, demand=4, now=2.0) == [
        Undrain(alloc_id="b", reason="index below 2")
    ]
    machine.check_valid()


def test_a_lost_run_is_stopped_at_once_and_never_joined_again() -> None:
    machine = reconciler(max_containers=1)
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    machine.joined("a", 0.0)
    lost = [Allocation(id="a", index=0, client_status="lost")]
    why = "its scheduler lost it: its server may come back with old leases"
    assert machine.observe(lost, demand=0, now=1.0) == [
        Lose(alloc_id="a", reason="its allocation is lost (desired run)"),
        Replace(alloc_id="a", restarts=0, reason=why),
    ]
    assert machine.retired("a", 0)
    assert machine.observe(lost, demand=0, now=2.0) == []  # asked to stop once
    # it runs again (a client reconnects, a suspended job resumes): never joined
    assert machine.observe([running("a", 0)], demand=0, now=3.0) == []
    assert machine.members() == {}
    machine.check_valid()


def test_a_gone_run_seen_running_again_is_stopped_once_and_never_joined() -> None:
    machine = reconciler(max_containers=1)
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    machine.joined("a", 0.0)
    assert machine.observe([], demand=0, now=1.0) == [
        Lose(alloc_id="a", reason="its allocation is no longer listed")
    ]
    why = "it runs again after the pool gave it up"
    assert machine.observe([running("a", 0), running("b", 0)], demand=0, now=2.0) == [
        Replace(alloc_id="a", restarts=0, reason=why),
        Join(alloc_id="b", index=0, restarts=0),
    ]
    assert machine.observe([running("a", 0), running("b", 0)], demand=0, now=3.0) == []
    assert list(machine.members()) == ["b"]


def test_a_joining_run_that_is_lost_is_never_joined_when_it_runs_again() -> None:
    machine = reconciler(max_containers=1)
    machine.registered(1)
    machine.observe([running("a", 0)], demand=0, now=0.0)
    actions = machine.observe([Allocation(id="a", index=0, client_status="lost")], 0, 1.0)
    assert [type(a) for a in actions] == [Replace]
    assert machine.joined("a", 1.5) == [
        Discard(alloc_id="a", reason="it joined after the pool gave it up")
    ]
    assert machine.observe([running("a", 0)], demand=0, now=2.0) == []
