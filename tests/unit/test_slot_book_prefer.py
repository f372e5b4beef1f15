"""The slot book's preferring requests: a lease that wants a slot of one container (a fork
wants the server that holds its snapshot) gets a free one there, waits a bounded time for one
there while others pass it, then takes any slot in its place. A state machine checks that no
slot is ever handed out twice, that a freed slot goes to the oldest waiter that accepts it,
and that no waiter is starved."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trajcore.domain.errors import InvalidInput
from trajcore.domain.slot_book import Grant, SlotBook, Ticket
from trajcore.domain.slots import Lease, SlotId


def granted(result: Lease | Ticket) -> Lease:
    assert isinstance(result, Lease), result
    return result


def waiting(result: Lease | Ticket) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def book_of(*sizes: int) -> SlotBook:
    book = SlotBook()
    for number, size in enumerate(sizes):
        book.add_container(f"c{number}", size, 0.0)
    return book


def test_a_preferring_request_takes_a_free_slot_of_its_container_over_older_free_ones() -> None:
    book = book_of(2, 2)  # free queue: c0/0 c0/1 c1/0 c1/1
    lease = granted(book.request("fork", 1.0, prefer="c1", prefer_until=5.0))
    assert lease.slot == SlotId(container="c1", index=0)
    assert granted(book.request("plain", 1.0)).slot == SlotId(container="c0", index=0)
    book.check_valid()


def test_it_waits_for_its_container_while_others_pass_it_then_takes_any_slot() -> None:
    book = book_of(1, 1)
    held = granted(book.request("holder", 0.0, prefer="c0"))
    fork = waiting(book.request("fork", 1.0, prefer="c0", prefer_until=3.0))
    assert book.prefers(fork) == "c0"
    assert book.statistics().free == 1  # it waits although c1/0 is free
    other = granted(book.request("plain", 1.5))
    assert other.slot.container == "c1"  # a later plain request passes it
    book.check_valid()
    assert book.relax(2.9) == []  # before its bound nothing changes
    assert book.next_relax() == 3.0
    book.release(other, 3.0)
    assert book.reset_done(other.slot, ok=True, now=3.0) == []  # c1's slot is not for it
    (grant,) = book.relax(3.0)
    assert (grant.ticket, grant.lease.slot.container) == (fork, "c1")
    assert book.next_relax() is None
    book.release(held, 4.0)
    book.check_valid()


def test_a_slot_of_its_container_that_comes_free_in_time_is_its() -> None:
    book = book_of(1, 1)
    held = granted(book.request("holder", 0.0, prefer="c0"))
    fork = waiting(book.request("fork", 1.0, prefer="c0", prefer_until=10.0))
    book.release(held, 2.0)
    (grant,) = book.reset_done(held.slot, ok=True, now=2.0)
    assert grant == Grant(ticket=fork, lease=grant.lease)
    assert grant.lease.slot == held.slot
    book.check_valid()


def test_an_older_plain_waiter_gets_the_freed_slot_first() -> None:
    book = book_of(1)
    held = granted(book.request("holder", 0.0))
    plain = waiting(book.request("plain", 1.0))
    fork = waiting(book.request("fork", 1.0, prefer="c0", prefer_until=10.0))
    book.release(held, 2.0)
    (grant,) = book.reset_done(held.slot, ok=True, now=2.0)
    assert grant.ticket == plain
    assert book.waiting() == [fork]
    book.check_valid()


def test_a_preference_past_its_bound_or_for_an_unknown_container_waits_for_nothing() -> None:
    book = book_of(1, 1)
    held = granted(book.request("holder", 0.0, prefer="c0"))
    assert granted(book.request("late", 1.0, prefer="c0", prefer_until=1.0)).slot == SlotId(
        container="c1", index=0
    )
    book.release(held, 1.0)
    book.reset_done(held.slot, ok=True, now=1.0)
    assert granted(book.request("gone", 1.0, prefer="nowhere", prefer_until=9.0)).holder == "gone"
    with pytest.raises(InvalidInput, match="prefer_until"):
        book.request("nan", 1.0, prefer="c0", prefer_until=math.nan)


def test_expiry_and_cancel_end_a_preference() -> None:
    book = book_of(1, 1)
    granted(book.request("a", 0.0, prefer="c0"))
    fork = waiting(book.request("fork", 0.0, deadline=1.0, prefer="c0", prefer_until=5.0))
    assert book.expire(1.0) == [fork]
    assert book.prefers(fork) is None
    other = waiting(book.request("other", 1.0, prefer="c0", prefer_until=5.0))
    assert book.cancel(other)
    assert book.next_relax() is None
    book.check_valid()


class PreferringMachine(RuleBasedStateMachine):
    """Random requests (plain and preferring), releases, resets, expiry, relaxing and time;
    a model of who holds which slot beside the book."""

    def __init__(self) -> None:
        super().__init__()
        self.book = book_of(1, 2)
        self.now = 0.0
        self.held: dict[SlotId, Lease] = {}
        self.resetting: list[SlotId] = []
        self.waiting: dict[int, Ticket] = {}
        self.wants: dict[int, tuple[str, float]] = {}  # ticket -> preferred container, bound
        self.names = 0

    def _hand(self, lease: Lease) -> None:
        assert lease.slot not in self.held, f"{lease.slot} handed out twice"
        assert lease.slot not in self.resetting, f"{lease.slot} handed out while resetting"
        self.held[lease.slot] = lease

    def _grants(self, grants: list[Grant]) -> None:
        ids = [grant.ticket.id for grant in grants]
        assert ids == sorted(ids), "grants not oldest first"
        for grant in grants:
            # the oldest waiter that accepts the slot gets it
            for older in self.book.waiting():
                if older.id < grant.ticket.id:
                    other = self.book.prefers(older)
                    passed = f"ticket {older.id} passed over for {grant.lease.slot}"
                    assert other is not None, passed
                    assert other != grant.lease.slot.container, passed
            assert self.waiting.pop(grant.ticket.id) == grant.ticket
            want = self.wants.pop(grant.ticket.id, None)
            if want is not None and self.now < want[1]:
                assert grant.lease.slot.container == want[0], (
                    f"ticket {grant.ticket.id} prefers {want[0]} until {want[1]}, got "
                    f"{grant.lease.slot} at {self.now}"
                )
            self._hand(grant.lease)

    @rule(
        prefer=st.sampled_from(["c0", None, "c1", "gone"]),
        wait=st.sampled_from([3.0, 0.5, 0.0]),
        deadline=st.sampled_from([None, 5.0, 1.0]),
    )
    def request(self, prefer: str | None, wait: float, deadline: float | None) -> None:
        self.names += 1
        result = self.book.request(
            f"h{self.names}",
            self.now,
            None if deadline is None else self.now + deadline,
            prefer=prefer,
            prefer_until=self.now + wait,
        )
        if isinstance(result, Lease):
            self._hand(result)
        else:
            self.waiting[result.id] = result
            if self.book.prefers(result) is not None:
                self.wants[result.id] = (prefer or "", self.now + wait)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.held, key=str)))
        lease = self.held.pop(slot)
        assert self.book.release(lease, self.now) == slot
        self.resetting.append(slot)

    @precondition(lambda self: self.resetting)
    @rule(data=st.data(), ok=st.booleans())
    def reset_done(self, data: st.DataObject, ok: bool) -> None:
        slot = data.draw(st.sampled_from(self.resetting))
        self.resetting.remove(slot)
        self._grants(self.book.reset_done(slot, ok=ok, now=self.now))

    @rule(step=st.sampled_from([0.25, 1.0, 0.0]))
    def tick(self, step: float) -> None:
        self.now += step
        for ticket in self.book.expire(self.now):
            del self.waiting[ticket.id]
        self._grants(self.book.relax(self.now))
        later = self.book.next_relax()
        assert later is None or later > self.now, "a preference outlived its bound"

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting.values(), key=lambda t: t.id)))
        assert self.book.cancel(ticket)
        del self.waiting[ticket.id]

    @invariant()
    def valid(self) -> None:
        self.book.check_valid()
        assert {t.id for t in self.book.waiting()} == set(self.waiting)
        assert self.book.statistics().leased == len(self.held)

    def teardown(self) -> None:
        # Not starved: once every preference's bound passed and every slot came back, every
        # waiter holds a slot or waits only because every slot is held, oldest first.
        self.now += 10.0
        self._grants(self.book.relax(self.now))
        for slot in list(self.resetting):
            self.resetting.remove(slot)
            self._grants(self.book.reset_done(slot, ok=True, now=self.now))
        while self.held and self.waiting:
            slot = min(self.held, key=str)
            self.book.release(self.held.pop(slot), self.now)
            self._grants(self.book.reset_done(slot, ok=True, now=self.now))
        assert not self.waiting or not self.book.statistics().free
        self.book.check_valid()


TestPreferringMachine = PreferringMachine.TestCase
TestPreferringMachine.settings = settings(max_examples=150, stateful_step_count=40)
