"""The slot book: decisions its examples and state machine (``test_slot_book``) left open, found
by mutation testing (docs/testing.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.test_slot_book import granted, slot, waiting
from trajcore.domain.errors import ConfigError, InvalidInput, StateError
from trajcore.domain.slot_book import SlotBook, Ticket
from trajcore.domain.slots import Lease


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
