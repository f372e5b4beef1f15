"""The slot book: decisions its examples and state machine (``test_slot_book``) left open, found
by mutation testing (docs/testing.md)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import pytest

from tests.unit.test_slot_book import granted, slot, waiting
from trajcore.domain.errors import ConfigError, InvalidInput, StateError
from trajcore.domain.slot_book import Grant, SlotBook, Ticket, _Container, _Slot
from trajcore.domain.slots import Lease, SlotState


def booked() -> tuple[SlotBook, Lease]:
    """A book with container ``c`` of one slot, leased, at time 5."""
    book = SlotBook()
    book.add_container("c", 1, now=0.0)
    lease = granted(book.request("t1", now=5.0))
    return book, lease


@pytest.mark.parametrize(
    ("event", "name"),
    [
        (lambda book, lease: book.add_container("d", 1, now=1.0), "add_container"),
        (lambda book, lease: book.release(lease, now=1.0), "release"),
        (lambda book, lease: book.reset_done(lease.slot, True, now=1.0), "reset_done"),
        (lambda book, lease: book.expire(now=1.0), "expire"),
        (lambda book, lease: book.request("t2", now=1.0), "request"),
    ],
)
def test_time_going_backwards_is_refused_naming_the_event(
    event: Callable[[SlotBook, Lease], object], name: str
) -> None:
    book, lease = booked()
    with pytest.raises(InvalidInput) as caught:
        event(book, lease)
    assert str(caught.value) == f"{name}: time went backwards (1.0 < 5.0) @ now"


def test_bad_containers_and_deadlines_are_refused_with_the_reason() -> None:
    book, _ = booked()
    with pytest.raises(ConfigError) as empty:
        book.add_container("", 1, now=5.0)
    assert str(empty.value) == "must not be empty @ container"
    with pytest.raises(InvalidInput) as nan:
        book.request("t2", now=5.0, deadline=float("nan"))
    assert str(nan.value) == "must be a number or None, got nan @ deadline"


def test_adding_a_container_twice_says_whether_it_is_active_or_draining() -> None:
    book, _ = booked()
    with pytest.raises(
        StateError, match=r"^add_container: container 'c' is already in the book \(active\)$"
    ):
        book.add_container("c", 1, now=5.0)
    book.drain_container("c")
    with pytest.raises(StateError, match=r"\(draining\)$"):
        book.add_container("c", 1, now=5.0)


def test_removing_a_busy_container_names_every_busy_slot() -> None:
    book = SlotBook()
    book.add_container("c", 3, now=0.0)
    first = granted(book.request("t1", now=0.0))
    granted(book.request("t2", now=0.0))
    book.release(first, now=0.0)  # resetting
    book.drain_container("c")
    with pytest.raises(StateError) as caught:
        book.remove_container("c")
    assert str(caught.value).endswith("still has slots leased or resetting: c/0, c/1")


def test_tickets_are_numbered_one_by_one_and_stamped_with_their_request_time() -> None:
    book, _ = booked()
    tickets = [waiting(book.request(f"w{i}", now=6.0 + i)) for i in range(3)]
    assert [t.id for t in tickets] == [tickets[0].id, tickets[0].id + 1, tickets[0].id + 2]
    assert [t.requested_at for t in tickets] == [6.0, 7.0, 8.0]
    assert isinstance(tickets[0], Ticket)


def test_a_lease_equal_to_the_current_one_releases_it() -> None:
    # A lease rebuilt from its fields (as one that crossed the wire) is the same lease.
    book, lease = booked()
    copy = Lease(slot=lease.slot, epoch=lease.epoch, holder=lease.holder)
    assert copy is not lease
    assert book.release(copy, now=6.0) == slot("c", 0)


def test_check_valid_says_what_it_found_broken() -> None:
    book, _ = booked()
    book.check_valid()
    book._free.append(book._slots[slot("c", 0)])
    with pytest.raises(AssertionError, match=r"^check_valid: "):
        book.check_valid()


# ---------------------------------------------------------------------- preferences


def two_full() -> tuple[SlotBook, Lease, Lease]:
    """A book with containers ``c`` and ``d`` of one slot each, both leased, at time 1."""
    book = SlotBook()
    book.add_container("c", 1, now=0.0)
    book.add_container("d", 1, now=0.0)
    on_c = granted(book.request("c-holder", now=1.0))
    on_d = granted(book.request("d-holder", now=1.0))
    assert (on_c.slot, on_d.slot) == (slot("c", 0), slot("d", 0))
    return book, on_c, on_d


def free_again(book: SlotBook, lease: Lease, now: float) -> list[Grant]:
    book.release(lease, now=now)
    return book.reset_done(lease.slot, True, now=now)


def test_a_nan_preference_bound_is_refused_naming_the_field() -> None:
    """``prefer_until`` NaN is refused with field ``prefer_until`` and the reason."""
    book, _ = booked()
    with pytest.raises(InvalidInput) as caught:
        book.request("t2", now=5.0, prefer="c", prefer_until=float("nan"))
    assert str(caught.value) == "must be a number, got nan @ prefer_until"
    assert caught.value.field == "prefer_until"


def test_a_preferring_request_gets_a_free_slot_of_its_container_first() -> None:
    """A free slot of the preferred container is granted, to the holder, over older free
    slots of other containers."""
    book = SlotBook()
    book.add_container("c", 2, now=0.0)
    book.add_container("d", 2, now=0.0)
    lease = book.request("t1", now=1.0, prefer="d")
    assert lease == Lease(slot=slot("d", 0), epoch=1, holder="t1")
    assert book.state(slot("d", 0)) is SlotState.LEASED
    assert [s.id for s in book._free] == [slot("c", 0), slot("c", 1), slot("d", 1)]
    book.check_valid()


@pytest.mark.parametrize("until", [-math.inf, 1.0], ids=["no-bound", "bound-is-now"])
def test_a_preference_not_after_now_takes_any_free_slot(until: float) -> None:
    """A ``prefer_until`` at or before ``now`` only picks; with its container full it takes
    another free slot at once."""
    book = SlotBook()
    book.add_container("c", 1, now=0.0)
    book.add_container("d", 1, now=0.0)
    assert granted(book.request("d-holder", now=1.0, prefer="d")).slot == slot("d", 0)
    lease = book.request("t1", now=1.0, prefer="d", prefer_until=until)
    assert lease == Lease(slot=slot("c", 0), epoch=1, holder="t1")


def test_a_preference_for_an_unknown_or_draining_container_takes_any_free_slot() -> None:
    """No container of that name, or a draining one: the request takes a free slot now."""
    book = SlotBook()
    book.add_container("c", 2, now=0.0)
    book.add_container("d", 1, now=0.0)
    assert granted(book.request("d-holder", now=1.0, prefer="d")).slot == slot("d", 0)
    book.drain_container("d")
    assert book.request("t1", now=1.0, prefer="x", prefer_until=9.0) == Lease(
        slot=slot("c", 0), epoch=1, holder="t1"
    )
    assert book.request("t2", now=1.0, prefer="d", prefer_until=9.0) == Lease(
        slot=slot("c", 1), epoch=1, holder="t2"
    )


def test_a_bounded_preference_waits_for_its_container_while_another_slot_is_free() -> None:
    """Before its bound, a request whose container is full waits (other slots free), its
    preference and bound recorded; the book stays valid."""
    book, on_c, _ = two_full()
    free_again(book, on_c, now=2.0)
    ticket = waiting(book.request("t1", now=3.0, prefer="d", prefer_until=10.0))
    assert book.prefers(ticket) == "d"
    assert book.next_relax() == 10.0
    assert book.waiting() == [ticket]
    book.check_valid()


def test_a_slot_of_the_preferred_container_goes_to_its_waiter() -> None:
    """When the preferred container's slot comes free, the preferring waiter gets it."""
    book, _, on_d = two_full()
    ticket = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    grants = free_again(book, on_d, now=3.0)
    assert grants == [Grant(ticket=ticket, lease=Lease(slot=slot("d", 0), epoch=2, holder="t1"))]
    assert book.prefers(ticket) is None
    assert book.waiting() == []
    book.check_valid()


def test_one_freed_slot_serves_one_waiter_and_the_later_ones_keep_waiting() -> None:
    """With a preference in the queue, a freed slot goes to the oldest waiter that accepts
    it; the waiters behind it get nothing and keep their places."""
    book, _, on_d = two_full()
    preferring = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    plain = waiting(book.request("t2", now=2.0))
    later = waiting(book.request("t3", now=2.0))
    grants = free_again(book, on_d, now=3.0)
    assert grants == [
        Grant(ticket=preferring, lease=Lease(slot=slot("d", 0), epoch=2, holder="t1"))
    ]
    assert book.waiting() == [plain, later]
    book.check_valid()


def test_a_plain_waiter_passes_a_preferring_one_for_another_container_slot() -> None:
    """A freed slot the preferring waiter does not accept goes to the next waiter, which
    accepts any; the preferring one keeps waiting."""
    book, on_c, _ = two_full()
    preferring = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    plain = waiting(book.request("t2", now=2.0))
    grants = free_again(book, on_c, now=3.0)
    assert grants == [Grant(ticket=plain, lease=Lease(slot=slot("c", 0), epoch=2, holder="t2"))]
    assert book.waiting() == [preferring]
    assert book.prefers(preferring) == "d"
    book.check_valid()


def test_a_freed_slot_nobody_accepts_stays_free() -> None:
    """A slot of another container freed while only a preferring request waits stays free."""
    book, on_c, _ = two_full()
    ticket = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    assert free_again(book, on_c, now=3.0) == []
    assert book.state(slot("c", 0)) is SlotState.FREE
    assert book.waiting() == [ticket]
    book.check_valid()


def test_a_preference_for_a_lost_container_is_waited_out_then_any_slot_serves() -> None:
    """The preferred container lost while the request waits: it still waits until its bound
    (a free slot elsewhere stays free), then ``relax`` gives it that slot."""
    book, on_c, _ = two_full()
    ticket = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    book.lose_container("d")
    assert free_again(book, on_c, now=3.0) == []
    book.check_valid()
    assert book.relax(now=9.0) == []
    assert book.prefers(ticket) == "d"
    grants = book.relax(now=10.0)
    assert grants == [Grant(ticket=ticket, lease=Lease(slot=slot("c", 0), epoch=2, holder="t1"))]
    assert book.next_relax() is None
    book.check_valid()


def test_relax_ends_only_the_preferences_whose_bound_passed() -> None:
    """``relax(now)`` ends a preference at its bound exactly, not before (even when the ticket
    number is below ``now``), and serves the relaxed waiter with a free slot."""
    book, on_c, _ = two_full()
    ticket = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=6.0))
    assert ticket.id < 5.0
    free_again(book, on_c, now=3.0)
    assert book.relax(now=5.0) == []
    assert book.prefers(ticket) == "d"
    assert book.next_relax() == 6.0
    grants = book.relax(now=6.0)
    assert grants == [Grant(ticket=ticket, lease=Lease(slot=slot("c", 0), epoch=2, holder="t1"))]
    assert book.prefers(ticket) is None
    book.check_valid()


def test_relax_with_nothing_to_relax_grants_nothing() -> None:
    """No preference at all: ``relax`` returns no grant and keeps the book valid."""
    book, _ = booked()
    assert book.relax(now=6.0) == []
    assert book.next_relax() is None
    book.check_valid()


def test_relax_past_a_withdrawn_preference_still_serves_the_live_one() -> None:
    """Ending a live preference and a cancelled one at the same bound serves the live one."""
    book, on_c, _ = two_full()
    live = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=6.0))
    gone = waiting(book.request("t2", now=2.0, prefer="d", prefer_until=6.0))
    assert book.cancel(gone)
    free_again(book, on_c, now=3.0)
    grants = book.relax(now=6.0)
    assert grants == [Grant(ticket=live, lease=Lease(slot=slot("c", 0), epoch=2, holder="t1"))]
    book.check_valid()


def test_relax_refuses_time_going_backwards_and_moves_the_clock() -> None:
    """``relax`` is an event of the clock: an earlier ``now`` is refused naming ``relax``, and
    its own ``now`` is the latest seen."""
    book, _ = booked()
    with pytest.raises(InvalidInput) as caught:
        book.relax(now=1.0)
    assert str(caught.value) == "relax: time went backwards (1.0 < 5.0) @ now"
    book.relax(now=7.0)
    with pytest.raises(InvalidInput) as later:
        book.request("t2", now=6.0)
    assert str(later.value) == "request: time went backwards (6.0 < 7.0) @ now"


def test_cancel_and_expire_end_the_preference_with_the_ticket() -> None:
    """A cancelled or expired ticket prefers nothing any more; the book stays valid."""
    book, _, _ = two_full()
    cancelled = waiting(book.request("t1", now=2.0, prefer="d", prefer_until=10.0))
    expired = waiting(book.request("t2", now=2.0, deadline=4.0, prefer="d", prefer_until=10.0))
    assert book.cancel(cancelled)
    assert book.prefers(cancelled) is None
    assert book.expire(now=4.0) == [expired]
    assert book.prefers(expired) is None
    assert book.next_relax() is None
    book.check_valid()


def test_a_container_counting_a_free_slot_it_lacks_is_reported() -> None:
    """Taking a preferred container's free slot that is not in the free queue raises,
    naming the container."""
    book, _, _ = two_full()
    book._containers["d"].counts[0] = 1
    with pytest.raises(AssertionError) as caught:
        book.request("t1", now=2.0, prefer="d")
    assert str(caught.value) == "container d counts a free slot it does not have"


# ---------------------------------------------------------------------- check_valid


def corrupted(damage: Callable[[SlotBook], object]) -> str:
    """The message of ``check_valid`` on a valid book of ``c`` (slot 0 leased to t1 at epoch 1,
    slot 1 free) and ``d`` (its slot leased), with a waiter preferring ``d`` (ticket 1, until
    10) and another with deadline 20 (ticket 2), after ``damage``."""
    book = SlotBook()
    book.add_container("c", 2, now=0.0)
    book.add_container("d", 1, now=0.0)
    granted(book.request("t1", now=1.0))
    granted(book.request("d-holder", now=1.0, prefer="d"))
    filler = granted(book.request("filler", now=1.0))
    waiting(book.request("t2", now=1.0, prefer="d", prefer_until=10.0))
    waiting(book.request("t3", now=1.0, deadline=20.0, prefer="d", prefer_until=10.0))
    assert free_again(book, filler, now=2.0) == []
    book.check_valid()
    damage(book)
    with pytest.raises(AssertionError) as caught:
        book.check_valid()
    return str(caught.value).removeprefix("check_valid: ")


def _swap_slots(book: SlotBook) -> None:
    slots = book._containers["c"].slots
    slots[0], slots[1] = slots[1], slots[0]


def _reindex(book: SlotBook) -> None:
    book._slots[slot("c", 0)] = _Slot(slot("c", 0), 1, book._containers["c"])


def _rehome(book: SlotBook) -> None:
    book._slots[slot("c", 0)].container = _Container("c", 0.0)


def _rewrite_lease(book: SlotBook) -> None:
    book._slots[slot("c", 0)].lease = Lease(slot=slot("c", 0), epoch=9, holder="t1")


def _lease_free(book: SlotBook) -> None:
    book._slots[slot("c", 1)].lease = Lease(slot=slot("c", 1), epoch=1, holder="t1")


def _stray_slot(book: SlotBook) -> None:
    book._slots[slot("x", 0)] = _Slot(slot("x", 0), 0, _Container("x", 0.0))


def _queue_leased(book: SlotBook) -> None:
    book._free[0] = book._slots[slot("c", 0)]


def _queue_twice(book: SlotBook) -> None:
    book._free_by["e"] = OrderedDict.fromkeys(book._free)


def _queue_empty(book: SlotBook) -> None:
    book._free_by["e"] = OrderedDict()


def _queue_misfiled(book: SlotBook) -> None:
    book._free[0].environment = "e"


def _free_preferred(book: SlotBook) -> None:
    on_d = book._slots[slot("d", 0)]
    on_d.lease = None
    book._move(on_d, 0)
    book._free.append(on_d)


def _plain_waiter(book: SlotBook) -> None:
    book._waiters[5] = Ticket(id=5, holder="t5", requested_at=1.0, deadline=None)


def _reorder(book: SlotBook) -> None:
    book._waiters.move_to_end(1)


def _stray_preference(book: SlotBook) -> None:
    book._prefers[7] = "d"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_swap_slots, "c/1 misfiled"),
        (_reindex, "slot c/0 not indexed"),
        (lambda book: book._epochs.__setitem__(slot("c", 0), 7), "slot c/0 epoch"),
        (_rehome, "slot c/0 points at another container"),
        (
            lambda book: setattr(book._slots[slot("c", 0)], "lease", None),
            "leased slot c/0 lost its lease",
        ),
        (_rewrite_lease, "c/0 lease"),
        (_lease_free, "free slot c/1 has a lease"),
        (
            lambda book: setattr(book._containers["c"], "draining", True),
            "draining c has a free slot",
        ),
        (
            lambda book: book._containers["c"].counts.__setitem__(0, 2),
            "container c counts [2, 1, 0, 0, 0]",
        ),
        (_stray_slot, "slots indexed outside their containers"),
        (
            lambda book: book._counts.__setitem__(0, 2),
            "state counts [2, 2, 0, 0, 0] != [1, 2, 0, 0, 0]",
        ),
        (lambda book: book._free.append(book._free[0]), "a slot is queued free twice"),
        (_queue_leased, "the free queue holds a slot that is not free"),
        (lambda book: book._free.clear(), "a free slot is missing from the queue"),
        (_queue_twice, "a slot is queued free twice"),
        (_queue_empty, "an empty queue for 'e'"),
        (_queue_misfiled, "a slot is queued for another environment than None"),
        (_plain_waiter, "ticket 5 waits while a slot is free"),
        (_free_preferred, "ticket 1 waits while a slot of d is free"),
        (_stray_preference, "a preference outlived its ticket"),
        (lambda book: book._relaxing.clear(), "a preference has no end scheduled"),
        (_reorder, "waiters are not first-come order"),
        (lambda book: book._deadlines.clear(), "ticket 2's deadline is not scheduled"),
    ],
)
def test_check_valid_names_each_broken_invariant(
    damage: Callable[[SlotBook], object], message: str
) -> None:
    """Each invariant, broken alone on an otherwise valid book, is refused with its own
    whole message."""
    assert corrupted(damage) == message
