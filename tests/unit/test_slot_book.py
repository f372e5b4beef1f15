"""The slot book: examples of each transition, and a stateful check against a simple model."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trajcore.domain.errors import ConfigError, InvalidInput, StaleLease, StateError, UnknownSlot
from trajcore.domain.scaling import ContainerLoad, drain_order
from trajcore.domain.slot_book import Grant, SlotBook, Ticket
from trajcore.domain.slots import Lease, SlotCall, SlotId, SlotState, time_left_spent
from trajcore.domain.tools import ToolCall


def slot(container: str, index: int) -> SlotId:
    return SlotId(container=container, index=index)


def granted(result: Lease | Ticket) -> Lease:
    assert isinstance(result, Lease), result
    return result


def waiting(result: Lease | Ticket) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


# ---------------------------------------------------------------------- examples


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("inf"), float("nan"), True])
def test_a_slot_call_takes_finite_seconds_only(bad: float) -> None:
    """A call's limit is finite seconds > 0: an infinite one would be refused by the slot
    server for the whole batch, taking the server out of service."""
    lease = Lease(slot=SlotId(container="c", index=0), epoch=1, holder="t")
    call = ToolCall(id="a", name="bash", arguments={"command": "true"})
    assert SlotCall(lease=lease, call=call, timeout_s=0.5).timeout_s == 0.5
    with pytest.raises(InvalidInput) as caught:
        SlotCall(lease=lease, call=call, timeout_s=bad)
    assert caught.value.field == "timeout_s"


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("inf"), float("nan"), True, "1"])
def test_a_slot_calls_turn_time_is_finite_seconds_or_none(bad: object) -> None:
    """A turn's time left is finite seconds > 0, or ``None`` (the call has only its limit)."""
    lease = Lease(slot=SlotId(container="c", index=0), epoch=1, holder="t")
    call = ToolCall(id="a", name="bash", arguments={"command": "true"})
    assert SlotCall(lease=lease, call=call, timeout_s=9.0).time_left_s is None
    assert SlotCall(lease=lease, call=call, timeout_s=9.0, time_left_s=1.5).time_left_s == 1.5
    with pytest.raises(InvalidInput) as caught:
        SlotCall(lease=lease, call=call, timeout_s=9.0, time_left_s=bad)  # type: ignore[arg-type]
    assert caught.value.field == "time_left_s"
    assert "finite seconds > 0" in caught.value.reason


def test_a_call_left_no_time_by_its_turn_says_so_with_the_time_it_had() -> None:
    reason = time_left_spent(1.5)
    assert reason.startswith("not run: its turn's time ran out before it could start")
    assert "1.5 s left" in reason
    assert "calls before it in this slot" in reason


def test_a_free_slot_is_leased_at_once_and_its_epoch_grows_on_every_grant() -> None:
    book = SlotBook()
    assert book.add_container("c", 1, 0.0) == []
    first = granted(book.request("t1", 0.0))
    assert (first.slot, first.epoch, first.holder) == (slot("c", 0), 1, "t1")
    assert book.is_current(first)
    assert book.release(first, 1.0) == slot("c", 0)
    assert not book.is_current(first)
    assert book.state(slot("c", 0)) is SlotState.RESETTING
    assert book.reset_done(slot("c", 0), True, 2.0) == []
    second = granted(book.request("t2", 2.0))
    assert second.epoch == 2
    book.check_valid()


def test_waiters_are_served_first_come_first_served_after_a_reset() -> None:
    book = SlotBook()
    book.add_container("c", 1, 0.0)
    held = granted(book.request("t0", 0.0))
    early = waiting(book.request("t1", 1.0, deadline=10.0))
    late = waiting(book.request("t2", 2.0))
    assert [t.id for t in book.waiting()] == [early.id, late.id]
    book.release(held, 3.0)
    assert book.statistics().waiting == 2  # nobody is served from a slot that is resetting
    [grant] = book.reset_done(held.slot, True, 4.0)
    assert grant.ticket == early
    assert (grant.lease.holder, grant.lease.epoch) == ("t1", 2)
    assert [t.id for t in book.waiting()] == [late.id]
    book.check_valid()


def test_a_new_container_serves_the_waiters() -> None:
    book = SlotBook()
    tickets = [waiting(book.request(f"t{i}", 0.0)) for i in range(3)]
    grants = book.add_container("c", 2, 1.0)
    assert [g.ticket for g in grants] == tickets[:2]
    assert sorted(g.lease.slot.index for g in grants) == [0, 1]
    assert book.waiting() == tickets[2:]
    book.check_valid()


def test_a_stale_or_double_release_is_refused_and_changes_nothing() -> None:
    book = SlotBook()
    book.add_container("c", 1, 0.0)
    first = granted(book.request("t1", 0.0))
    book.release(first, 0.0)
    before = book.statistics()
    with pytest.raises(StaleLease, match=r"release: lease c/0#1 of 't1' was already released"):
        book.release(first, 0.0)
    assert book.statistics() == before
    book.reset_done(first.slot, True, 0.0)
    second = granted(book.request("t2", 0.0))
    with pytest.raises(StaleLease, match="stale: the slot was granted again"):
        book.release(first, 0.0)
    forged = Lease(slot=second.slot, epoch=second.epoch, holder="intruder")
    with pytest.raises(StaleLease, match="never granted"):
        book.release(forged, 0.0)
    with pytest.raises(StaleLease, match="never granted"):
        book.release(Lease(slot=second.slot, epoch=9, holder="t2"), 0.0)
    with pytest.raises(UnknownSlot, match="was never in the book"):
        book.release(Lease(slot=slot("x", 0), epoch=1, holder="t"), 0.0)
    assert book.is_current(second)
    book.check_valid()


def test_a_failed_reset_quarantines_the_slot_for_good() -> None:
    book = SlotBook()
    book.add_container("c", 1, 0.0)
    held = granted(book.request("t", 0.0))
    book.release(held, 0.0)
    ticket = waiting(book.request("u", 0.0))
    assert book.reset_done(held.slot, False, 0.0) == []
    assert book.state(held.slot) is SlotState.QUARANTINED
    assert book.waiting() == [ticket]
    with pytest.raises(StateError, match=r"reset_done: slot c/0 is quarantined, not resetting"):
        book.reset_done(held.slot, True, 0.0)
    assert book.statistics().quarantined == 1


def test_waiters_expire_at_their_deadline_earliest_first_and_can_be_cancelled() -> None:
    book = SlotBook()
    late = waiting(book.request("late", 0.0, deadline=5.0))
    forever = waiting(book.request("forever", 0.0))
    early = waiting(book.request("early", 0.0, deadline=2.0))
    gone = waiting(book.request("gone", 0.0, deadline=1.0))
    assert book.cancel(gone)
    assert not book.cancel(gone)
    assert book.next_deadline() == 2.0
    assert book.expire(1.99) == []
    assert book.expire(5.0) == [early, late]
    assert book.next_deadline() is None
    assert book.waiting() == [forever]
    assert not book.cancel(early)
    stats = book.statistics()
    assert (stats.waiting, stats.leases_expired) == (1, 2)
    book.check_valid()


def test_a_served_ticket_cannot_be_cancelled() -> None:
    book = SlotBook()
    ticket = waiting(book.request("t", 0.0, deadline=1.0))
    [grant] = book.add_container("c", 1, 0.5)
    assert grant == Grant(ticket=ticket, lease=grant.lease)
    assert not book.cancel(ticket)
    assert book.expire(2.0) == []
    assert book.is_current(grant.lease)


def test_a_draining_container_leases_nothing_and_empties_as_leases_come_back() -> None:
    book = SlotBook()
    book.add_container("old", 2, 0.0)
    book.add_container("new", 1, 1.0)
    held = granted(book.request("t", 1.0))
    assert held.slot.container == "old"
    assert not book.drain_container("old")
    assert book.state(slot("old", 1)) is SlotState.DRAINING
    assert book.drained_containers() == []
    with pytest.raises(StateError, match=r"still has slots leased or resetting: old/0"):
        book.remove_container("old")
    assert granted(book.request("u", 1.0)).slot == slot("new", 0)
    waiting(book.request("v", 1.0))
    book.release(held, 2.0)
    assert book.reset_done(held.slot, True, 2.0) == []  # not handed to the waiter
    assert book.state(held.slot) is SlotState.DRAINING
    assert book.drained_containers() == ["old"]
    assert book.drain_container("old")
    book.remove_container("old")
    with pytest.raises(UnknownSlot, match="state: slot old/0 is not in the book"):
        book.state(held.slot)
    stats = book.statistics()
    assert (stats.containers, stats.leased, stats.draining, stats.waiting) == (1, 1, 0, 1)
    book.check_valid()


def test_an_active_container_must_be_drained_before_removal() -> None:
    book = SlotBook()
    book.add_container("c", 1, 0.0)
    with pytest.raises(StateError, match=r"remove_container: container 'c' is active"):
        book.remove_container("c")
    assert book.drain_container("c")
    book.remove_container("c")
    with pytest.raises(UnknownSlot, match=r"remove_container: container 'c' is not in the book"):
        book.remove_container("c")


def test_a_lost_container_returns_its_leases_which_are_stale_from_then_on() -> None:
    book = SlotBook()
    book.add_container("c", 3, 0.0)
    a = granted(book.request("a", 0.0))
    b = granted(book.request("b", 0.0))
    book.release(b, 0.0)
    assert book.lose_container("c") == [a]
    assert not book.is_current(a)
    with pytest.raises(StaleLease, match="container 'c' was lost or removed"):
        book.release(a, 1.0)
    with pytest.raises(UnknownSlot, match="reset_done: slot c/1 is not in the book"):
        book.reset_done(b.slot, True, 1.0)
    assert book.statistics() == book.statistics().__class__(
        containers=0,
        free=0,
        leased=0,
        resetting=0,
        quarantined=0,
        draining=0,
        waiting=0,
        leases_granted=2,
        leases_expired=0,
    )
    # The server comes back under the same name: epochs go on, the old lease stays stale.
    book.add_container("c", 1, 2.0)
    again = granted(book.request("a2", 2.0))
    assert (again.slot, again.epoch) == (a.slot, 2)
    with pytest.raises(StaleLease):
        book.release(a, 2.0)
    book.check_valid()


def test_container_names_and_slot_counts_are_checked() -> None:
    book = SlotBook()
    book.add_container("c", 1, 0.0)
    with pytest.raises(StateError, match=r"add_container: container 'c' is already in the book"):
        book.add_container("c", 1, 0.0)
    with pytest.raises(ConfigError, match="@ slots"):
        book.add_container("d", 0, 0.0)
    with pytest.raises(ConfigError, match="@ container"):
        book.add_container("", 1, 0.0)
    with pytest.raises(UnknownSlot, match="drain_container: container 'x'"):
        book.drain_container("x")
    with pytest.raises(UnknownSlot, match="lose_container: container 'x'"):
        book.lose_container("x")


def test_time_may_not_run_backwards() -> None:
    book = SlotBook()
    book.add_container("c", 1, 5.0)
    with pytest.raises(InvalidInput, match=r"request: time went backwards .* @ now"):
        book.request("t", 4.0)
    granted(book.request("u", 5.0))
    with pytest.raises(InvalidInput, match="@ deadline"):
        book.request("t", 5.0, deadline=float("nan"))
    stats = book.statistics()
    assert (stats.leased, stats.waiting) == (1, 0)


def test_container_loads_feed_the_drain_order() -> None:
    book = SlotBook()
    book.add_container("a", 2, 0.0)
    book.add_container("b", 2, 1.0)
    book.add_container("c", 2, 2.0)
    book.add_container("d", 2, 3.0)
    book.drain_container("d")
    leases = [granted(book.request(f"t{i}", 3.0)) for i in range(4)]
    book.release(next(le for le in leases if le.slot.container == "a"), 3.0)
    loads = book.container_loads()
    assert loads == [
        ContainerLoad(name="a", leased=1, added_at=0.0),
        ContainerLoad(name="b", leased=2, added_at=1.0),
        ContainerLoad(name="c", leased=0, added_at=2.0),
    ]
    assert drain_order(loads) == ["c", "a", "b"]


# ---------------------------------------------------------------------- the stateful model

NAMES = ("c0", "c1", "c2", "c3")
ENVIRONMENTS = (None, "oci:/images/a", "oci:/images/b")


@dataclass
class Model:
    """The book, as plainly as it can be said."""

    states: dict[SlotId, SlotState] = field(default_factory=dict)
    leases: dict[SlotId, Lease] = field(default_factory=dict)
    epochs: dict[SlotId, int] = field(default_factory=dict)
    draining: dict[str, bool] = field(default_factory=dict)
    waiters: list[Ticket] = field(default_factory=list)
    old_leases: list[Lease] = field(default_factory=list)
    tickets: list[Ticket] = field(default_factory=list)
    granted: int = 0
    expired: int = 0
    queued: list[SlotId] = field(default_factory=list)  # the FREE slots, in the order freed
    environments: dict[SlotId, str | None] = field(default_factory=dict)  # of the latest lease

    def free(self) -> list[SlotId]:
        return [s for s, state in self.states.items() if state is SlotState.FREE]

    def in_state(self, state: SlotState) -> list[SlotId]:
        return [s for s, st_ in self.states.items() if st_ is state]

    def of(self, container: str) -> list[SlotId]:
        return [s for s in self.states if s.container == container]


class SlotBookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = SlotBook()
        self.model = Model()
        self.now = 0.0
        self.holders = 0

    def accept_grant(self, lease: Lease, holder: str, environment: str | None) -> None:
        model = self.model
        assert model.states.get(lease.slot) is SlotState.FREE, f"{lease.slot} was not free"
        assert sorted(model.queued) == sorted(model.free()), "the model's free order"
        last = model.environments.get
        same = [s for s in model.queued if environment is not None and last(s) == environment]
        plain = [s for s in model.queued if last(s) is None]
        if same or plain:  # a slot of its own environment, else of none: the one free longest
            assert lease.slot == (same or plain)[0], f"{environment!r} got {lease.slot}"
        else:  # any: the one free longest of its environment
            theirs = [s for s in model.queued if last(s) == last(lease.slot)]
            assert lease.slot == theirs[0], f"{environment!r} got {lease.slot}"
        model.queued.remove(lease.slot)
        model.environments[lease.slot] = environment
        assert not model.draining[lease.slot.container], "leased in a draining container"
        assert lease.holder == holder
        assert lease.epoch == model.epochs.get(lease.slot, 0) + 1, "epochs grow by one per grant"
        model.epochs[lease.slot] = lease.epoch
        model.states[lease.slot] = SlotState.LEASED
        model.leases[lease.slot] = lease
        model.granted += 1

    def accept_grants(self, grants: list[Grant]) -> None:
        model = self.model
        expected = model.waiters[: len(grants)]
        assert [g.ticket for g in grants] == expected, "waiters are served in request order"
        del model.waiters[: len(grants)]
        for grant in grants:
            self.accept_grant(grant.lease, grant.ticket.holder, grant.ticket.environment)
        assert not (model.waiters and model.free()), "a waiter was left while a slot was free"

    # -------------------------------------------------------------- rules

    @rule(name=st.sampled_from(NAMES), slots=st.integers(1, 3))
    def add_container(self, name: str, slots: int) -> None:
        if name in self.model.draining:
            with pytest.raises(StateError, match="already in the book"):
                self.book.add_container(name, slots, self.now)
            return
        grants = self.book.add_container(name, slots, self.now)
        self.model.draining[name] = False
        for index in range(slots):
            self.model.states[slot(name, index)] = SlotState.FREE
            self.model.queued.append(slot(name, index))
        self.accept_grants(grants)

    @rule(
        deadline=st.sampled_from([None, 0.0, 0.5, 1.0, 3.0]),
        environment=st.sampled_from(ENVIRONMENTS),
    )
    def request(self, deadline: float | None, environment: str | None) -> None:
        self.holders += 1
        holder = f"t{self.holders}"
        absolute = None if deadline is None else self.now + deadline
        result = self.book.request(holder, self.now, absolute, environment=environment)
        if self.model.free():
            assert isinstance(result, Lease), "a slot was free, yet the request waits"
            assert not self.model.waiters
            self.accept_grant(result, holder, environment)
        else:
            assert isinstance(result, Ticket), "no slot was free, yet one was granted"
            assert (result.holder, result.deadline) == (holder, absolute)
            assert result.environment == environment
            self.model.waiters.append(result)
            self.model.tickets.append(result)

    @precondition(lambda self: bool(self.model.leases))
    @rule(pick=st.integers(0, 100))
    def release(self, pick: int) -> None:
        leases = sorted(self.model.leases.values(), key=lambda le: le.slot)
        lease = leases[pick % len(leases)]
        assert self.book.release(lease, self.now) == lease.slot
        del self.model.leases[lease.slot]
        self.model.states[lease.slot] = SlotState.RESETTING
        self.model.old_leases.append(lease)

    @precondition(lambda self: bool(self.model.old_leases))
    @rule(pick=st.integers(0, 100))
    def release_a_stale_lease(self, pick: int) -> None:
        lease = self.model.old_leases[pick % len(self.model.old_leases)]
        before = self.book.statistics()
        with pytest.raises(StaleLease):
            self.book.release(lease, self.now)
        assert self.book.statistics() == before

    @precondition(lambda self: bool(self.model.in_state(SlotState.RESETTING)))
    @rule(pick=st.integers(0, 100), ok=st.booleans())
    def reset_done(self, pick: int, ok: bool) -> None:
        resetting = sorted(self.model.in_state(SlotState.RESETTING))
        done = resetting[pick % len(resetting)]
        grants = self.book.reset_done(done, ok, self.now)
        if not ok:
            self.model.states[done] = SlotState.QUARANTINED
        elif self.model.draining[done.container]:
            self.model.states[done] = SlotState.DRAINING
        else:
            self.model.states[done] = SlotState.FREE
            self.model.queued.append(done)
        self.accept_grants(grants)
        assert all(g.lease.slot == done for g in grants)

    @precondition(lambda self: bool(self.model.states))
    @rule(pick=st.integers(0, 100), ok=st.booleans())
    def reset_done_out_of_turn(self, pick: int, ok: bool) -> None:
        slots = sorted(self.model.states)
        target = slots[pick % len(slots)]
        if self.model.states[target] is SlotState.RESETTING:
            return
        with pytest.raises(StateError, match="not resetting"):
            self.book.reset_done(target, ok, self.now)

    @rule(step=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]))
    def advance_and_expire(self, step: float) -> None:
        self.now += step
        expired = self.book.expire(self.now)
        expected = [
            t for t in self.model.waiters if t.deadline is not None and t.deadline <= self.now
        ]
        assert sorted(t.id for t in expired) == sorted(t.id for t in expected)
        deadlines = [t.deadline for t in expired]
        assert deadlines == sorted(deadlines, key=lambda d: d or 0.0), "earliest deadline first"
        self.model.waiters = [t for t in self.model.waiters if t not in expired]
        self.model.expired += len(expired)

    @precondition(lambda self: bool(self.model.tickets))
    @rule(pick=st.integers(0, 100))
    def cancel(self, pick: int) -> None:
        ticket = self.model.tickets[pick % len(self.model.tickets)]
        assert self.book.cancel(ticket) is (ticket in self.model.waiters)
        if ticket in self.model.waiters:
            self.model.waiters.remove(ticket)

    @rule(name=st.sampled_from(NAMES))
    def drain_container(self, name: str) -> None:
        if name not in self.model.draining:
            with pytest.raises(UnknownSlot):
                self.book.drain_container(name)
            return
        self.model.draining[name] = True
        for s in self.model.of(name):
            if self.model.states[s] is SlotState.FREE:
                self.model.states[s] = SlotState.DRAINING
                self.model.queued.remove(s)
        busy = {SlotState.LEASED, SlotState.RESETTING}
        drained = not any(self.model.states[s] in busy for s in self.model.of(name))
        assert self.book.drain_container(name) is drained

    @rule(name=st.sampled_from(NAMES))
    def remove_container(self, name: str) -> None:
        if name not in self.model.draining:
            with pytest.raises(UnknownSlot):
                self.book.remove_container(name)
            return
        leaving = {SlotState.DRAINING, SlotState.QUARANTINED}
        if self.model.draining[name] and all(
            self.model.states[s] in leaving for s in self.model.of(name)
        ):
            self.book.remove_container(name)
            self.forget(name)
        else:
            with pytest.raises(StateError):
                self.book.remove_container(name)

    @precondition(lambda self: bool(self.model.draining))
    @rule(pick=st.integers(0, 100))
    def lose_container(self, pick: int) -> None:
        names = sorted(self.model.draining)
        name = names[pick % len(names)]
        lost = self.book.lose_container(name)
        expected = [le for s, le in self.model.leases.items() if s.container == name]
        assert sorted(lost, key=lambda le: le.slot) == sorted(expected, key=lambda le: le.slot)
        self.forget(name)

    def forget(self, name: str) -> None:
        model = self.model
        for s in model.of(name):
            if model.states[s] is SlotState.FREE:
                model.queued.remove(s)
            del model.states[s]
            model.environments.pop(s, None)  # a container added again starts with none
            lease = model.leases.pop(s, None)
            if lease is not None:
                model.old_leases.append(lease)
        del model.draining[name]

    # -------------------------------------------------------------- invariants

    @invariant()
    def valid(self) -> None:
        self.book.check_valid()

    @invariant()
    def agrees_with_the_model(self) -> None:
        model = self.model
        stats = self.book.statistics()
        assert stats.containers == len(model.draining)
        assert stats.free == len(model.in_state(SlotState.FREE))
        assert stats.leased == len(model.in_state(SlotState.LEASED)) == len(model.leases)
        assert stats.resetting == len(model.in_state(SlotState.RESETTING))
        assert stats.quarantined == len(model.in_state(SlotState.QUARANTINED))
        assert stats.draining == len(model.in_state(SlotState.DRAINING))
        assert stats.waiting == len(model.waiters)
        assert (stats.leases_granted, stats.leases_expired) == (model.granted, model.expired)
        assert self.book.waiting() == model.waiters
        for s, state in model.states.items():
            assert self.book.state(s) is state
        deadlines = [t.deadline for t in model.waiters if t.deadline is not None]
        assert self.book.next_deadline() == (min(deadlines) if deadlines else None)
        drained = [
            name
            for name, draining in model.draining.items()
            if draining
            and all(
                model.states[s] in (SlotState.DRAINING, SlotState.QUARANTINED)
                for s in model.of(name)
            )
        ]
        assert sorted(self.book.drained_containers()) == sorted(drained)

    @invariant()
    def only_current_leases_are_current(self) -> None:
        for lease in self.model.leases.values():
            assert self.book.is_current(lease)
        for lease in self.model.old_leases:
            assert not self.book.is_current(lease)


TestSlotBook = SlotBookMachine.TestCase
