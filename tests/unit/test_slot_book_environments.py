"""The slot book's choice of a free slot by the task environment a lease names: a slot whose
last lease ran over the same image first (its server readied the next lease over it), then a
slot whose last lease named none, then any; the order of service is untouched."""

from __future__ import annotations

import pytest

from tests.unit.test_slot_book import granted, slot, waiting
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.slot_book import SlotBook
from trajcore.domain.slots import Lease, SlotId

A, B, C = "oci:/images/a", "oci:/images/b", "oci:/images/c"


def release(book: SlotBook, lease: Lease, now: float) -> None:
    book.release(lease, now)
    assert book.reset_done(lease.slot, ok=True, now=now) == []


def last_leases(book: SlotBook, *environments: str | None) -> list[Lease]:
    """Lease slot i of container c over ``environments[i]`` and free them again in order."""
    book.add_container("c", len(environments), now=0.0)
    leases = [
        granted(book.request(f"t{i}", 1.0, environment=e)) for i, e in enumerate(environments)
    ]
    assert [lease.slot.index for lease in leases] == list(range(len(environments)))
    for lease in leases:
        release(book, lease, 2.0)
    return leases


def test_a_lease_takes_the_slot_whose_last_lease_ran_over_its_image() -> None:
    book = SlotBook()
    last_leases(book, A, B, A)  # free longest first: c/0 (a), c/1 (b), c/2 (a)
    assert granted(book.request("b", 3.0, environment=B)).slot == slot("c", 1)
    assert granted(book.request("a", 3.0, environment=A)).slot == slot("c", 0)
    assert granted(book.request("a", 3.0, environment=A)).slot == slot("c", 2)
    book.check_valid()


def test_then_a_slot_whose_last_lease_named_none_then_any() -> None:
    book = SlotBook()
    last_leases(book, A, None, B, None)
    assert granted(book.request("c", 3.0, environment=C)).slot == slot("c", 1)
    assert granted(book.request("plain", 3.0)).slot == slot("c", 3)  # none's, not a's
    assert granted(book.request("c", 3.0, environment=C)).slot == slot("c", 0)  # any
    assert granted(book.request("plain", 3.0)).slot == slot("c", 2)
    book.check_valid()


def test_a_plain_book_hands_out_its_slots_longest_free_first() -> None:
    book = SlotBook()
    last_leases(book, None, None, None)
    held = [granted(book.request("p", 3.0)).slot.index for _ in range(3)]
    assert held == [0, 1, 2]


def test_waiters_are_served_in_order_each_with_its_image_s_slot() -> None:
    book = SlotBook()
    book.add_container("c", 1, now=0.0)
    first = granted(book.request("t", 1.0, environment=A))
    older = waiting(book.request("b", 1.0, environment=B))
    newer = waiting(book.request("a", 1.0, environment=A))
    book.release(first, 2.0)
    (grant,) = book.reset_done(first.slot, ok=True, now=2.0)
    assert grant.ticket == older  # first come, first served, whatever its image
    assert (older.environment, newer.environment) == (B, A)
    book.release(grant.lease, 3.0)
    (grant,) = book.reset_done(first.slot, ok=True, now=3.0)
    assert grant.ticket == newer
    assert book.waiting() == []
    book.check_valid()


def test_a_new_container_serves_waiters_by_their_images() -> None:
    book = SlotBook()
    last_leases(book, A)
    only = granted(book.request("x", 3.0, environment=B))
    assert only.slot == slot("c", 0)
    tickets = [waiting(book.request(f"w{e}", 3.0, environment=e)) for e in (A, None)]
    grants = book.add_container("d", 2, now=4.0)
    assert [g.ticket for g in grants] == tickets
    assert [g.lease.slot for g in grants] == [slot("d", 0), slot("d", 1)]
    release(book, only, 5.0)
    assert granted(book.request("b", 6.0, environment=B)).slot == slot("c", 0)
    book.check_valid()


def test_a_preferring_request_takes_its_image_s_slot_of_that_container() -> None:
    book = SlotBook()
    last_leases(book, A, None, B)
    book.add_container("d", 1, now=3.0)
    lease = granted(book.request("fork", 4.0, prefer="c", environment=B))
    assert lease.slot == slot("c", 2)
    lease = granted(book.request("fork", 4.0, prefer="c", environment=C))
    assert lease.slot == slot("c", 1)  # none's before a's
    lease = granted(book.request("fork", 4.0, prefer="c", environment=C))
    assert lease.slot == slot("c", 0)
    assert granted(book.request("plain", 4.0)).slot == slot("d", 0)
    book.check_valid()


def test_a_slot_remembers_the_image_of_a_lease_a_waiter_or_a_fork_was_given() -> None:
    book = SlotBook()
    book.add_container("c", 2, now=0.0)
    book.add_container("d", 1, now=0.0)
    first, second = (granted(book.request(f"t{i}", 1.0)) for i in range(2))
    held = granted(book.request("d", 1.0))
    ticket = waiting(book.request("waiter", 1.0, environment=A))
    book.release(first, 2.0)
    (grant,) = book.reset_done(first.slot, ok=True, now=2.0)
    assert grant.ticket == ticket
    for lease in (second, grant.lease, held):
        release(book, lease, 3.0)  # free longest first: c/1 (none), c/0 (a), d/0 (none)
    assert granted(book.request("a", 4.0, environment=A)).slot == slot("c", 0)
    fork = granted(book.request("fork", 4.0, prefer="d", environment=B))
    release(book, fork, 5.0)  # free: c/1 (none), d/0 (b)
    assert granted(book.request("b", 6.0, environment=B)).slot == slot("d", 0)
    book.check_valid()


def test_a_relaxed_preference_takes_its_image_s_slot_among_the_free_ones() -> None:
    book = SlotBook()
    last_leases(book, None, A)  # free: c/0 (none), c/1 (a)
    book.add_container("d", 1, now=3.0)
    held = granted(book.request("d", 3.0, prefer="d"))
    ticket = waiting(book.request("fork", 3.0, prefer="d", prefer_until=5.0, environment=A))
    later = waiting(book.request("later", 3.0, prefer="d", prefer_until=50.0))
    (grant,) = book.relax(5.0)  # ``later`` still prefers d: each waiter is looked at in turn
    assert (grant.ticket, grant.lease.slot) == (ticket, slot("c", 1))
    release(book, grant.lease, 6.0)  # free: c/0 (none), c/1 (a)
    book.release(held, 6.0)
    (grant,) = book.reset_done(held.slot, ok=True, now=6.0)
    assert grant.ticket == later
    assert granted(book.request("a", 7.0, environment=A)).slot == slot("c", 1)
    book.check_valid()


def test_the_last_preference_to_end_takes_its_image_s_slot_among_the_free_ones() -> None:
    """Once no waiter prefers a container any more, a waiter is served as a plain one, still
    with its image's slot first (not the longest free)."""
    book = SlotBook()
    last_leases(book, None, A)  # free: c/0 (none), c/1 (a)
    book.add_container("d", 1, now=3.0)
    granted(book.request("d", 3.0, prefer="d"))
    ticket = waiting(book.request("fork", 3.0, prefer="d", prefer_until=5.0, environment=A))
    (grant,) = book.relax(5.0)
    assert (grant.ticket, grant.lease.slot) == (ticket, slot("c", 1))
    book.check_valid()


def test_draining_or_losing_a_container_takes_its_free_slots_out_of_every_queue() -> None:
    book = SlotBook()
    last_leases(book, A, None, B)
    book.add_container("d", 1, now=3.0)
    book.drain_container("c")
    book.check_valid()
    assert granted(book.request("a", 4.0, environment=A)).slot == slot("d", 0)
    book.remove_container("c")
    assert waiting(book.request("b", 4.0, environment=B)).environment == B
    book.check_valid()
    other = SlotBook()
    last_leases(other, A, B)
    other.lose_container("c")
    other.check_valid()
    assert other.statistics().free == 0


# ---------------------------------------------------------------------- through a pool


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_pool_gives_a_lease_over_an_image_the_slot_whose_last_lease_ran_over_it() -> None:
    files = {"/etc/os-release": "ID=test\n"}
    pool = FakeSandboxPool(containers=1, slots_per_container=3, images={A: files, B: files})
    async with pool:
        slots: dict[str | None, SlotId] = {}
        async with (
            pool.lease("a", environment=A) as on_a,
            pool.lease("b", environment=B) as on_b,
            pool.lease("plain") as plain,
        ):
            slots = {A: on_a.slot, B: on_b.slot, None: plain.slot}
        assert len(set(slots.values())) == 3
        for environment in (None, B, A, A, B, None):  # whatever the order they come free in
            async with pool.lease("again", environment=environment) as lease:
                assert lease.slot == slots[environment], environment
        assert pool.statistics().leased == 0
