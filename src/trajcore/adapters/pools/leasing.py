"""``SlotLeasing``: the domain slot book plus waiting, as the ``lease`` context manager pools share.

The slot book (``trajcore.domain.slot_book``) decides everything about leases: who gets the next
free slot (first come, first served), which epoch a lease carries, when a waiting request has run
past its deadline, which leases a lost container takes with it. It does no I/O and never waits.
This module adds exactly what the book cannot do: a task that finds no free slot sleeps until
the book serves its ticket, expires it, or the pool closes; a released slot is reset (the pool's
I/O, passed in as ``reset``) before the book hears ``reset_done``. Both the local pool and the
fake pool lease through it, so both keep one policy.

Rules it keeps:

- Leaving a ``lease`` block, however it ends, releases the lease exactly once. Release runs
  shielded from cancellation: the book moves the slot to RESETTING, ``reset`` runs (bounded by
  ``reset_timeout_s`` itself, with ``RESET_BACKSTOP_S`` more here as a backstop), and
  ``reset_done`` frees the slot (or quarantines it when the reset failed, raised or ran out of
  time). A slot never leaves service silently: a warning
  names it and why (the reset's own for a reset that failed, this module's for one that raised
  or ran out of time). Grants the book makes then are handed to their waiters at once, so no
  slot stays free while someone waits.
- A waiter's deadline is the book's ticket deadline. Each waiter sleeps at most until its own
  deadline and then asks the book to ``expire``; every ticket the book returns (its own and any
  other that was due) ends in ``AcquireTimeout``, and the book counts it in ``leases_expired``.
  A waiter the book served before it woke keeps its lease, whatever the time.
- A lease may prefer a container for ``prefer_s`` seconds (``lease(..., prefer=c,
  prefer_s=t)``, what a fork from a snapshot on ``c`` asks): the book grants a free slot of
  ``c`` at once, else the waiter waits for one there; at ``t`` it asks the book to ``relax``
  (every preference then due ends, and the grants it makes are handed over) and waits on for
  any slot until its deadline.
- A waiter cancelled while queued withdraws its ticket (``cancel``). When the book had already
  served it (the grant and the cancellation crossed), the lease it was given is released like
  any other, shielded, so nothing leaks.
- A pool whose slots cannot come back (a Nomad job stopped or taken over outside the pool)
  ``suspend``s its leasing with the error that says why: every waiter ends in that error at
  once, and so does every new lease until ``resume``; held leases go on (their calls and
  releases are their containers' business).
- A lost container (its server died) leaves the book at once. Its leases are stale from then on:
  their later release raises ``StaleLease`` in the book, and a reset that was running for one of
  its slots ends in ``UnknownSlot``; both are expected here and ignored, as nothing is left to
  free.
- The book needs a clock that never goes back; it gets ``anyio.current_time()`` (outside an event
  loop, as when a pool adds its containers while it is built, ``time.monotonic()``), held to the
  latest value it has seen, so a book that outlives one event loop keeps working in the next.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
import attrs

from trajcore.domain.errors import AcquireTimeout, InvalidInput, PoolClosed, StaleLease, UnknownSlot
from trajcore.domain.slot_book import Grant, SlotBook, Ticket
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall, SlotId, SlotState

__all__ = ["RESET_BACKSTOP_S", "LeaseRefusal", "ResetSlot", "SlotLeasing"]

RESET_BACKSTOP_S = 5.0
"""How long past ``reset_timeout_s`` a release waits for its reset before it quarantines the
slot itself: a pool's reset bounds itself at ``reset_timeout_s`` (a slot server's client gives
the server up there and the pool loses it), and this catches one that does not."""

_log = logging.getLogger(__name__)

LeaseRefusal = Callable[[], Exception]
"""Makes the error a suspended leasing fails a lease with (a fresh one for each lease)."""

ResetSlot = Callable[[Lease], Awaitable[bool]]
"""Tear a released slot down; ``True`` when it is clean and may be leased again, ``False`` (the
slot is quarantined) once it has logged a warning naming the slot and why."""


@attrs.define(eq=False)
class _Waiter:
    """One task waiting on a ticket, and how its wait ended (set before ``woken`` fires)."""

    ticket: Ticket
    woken: anyio.Event = attrs.field(factory=anyio.Event)
    lease: Lease | None = None  # served
    expired: bool = False
    closed: bool = False
    refused: Exception | None = None  # the leasing was suspended

    @property
    def settled(self) -> bool:
        return self.lease is not None or self.expired or self.closed or self.refused is not None


@attrs.define(eq=False)
class SlotLeasing:
    """The slot book plus waiting: ``lease(holder)`` as an async context manager.

    Attributes:
        reset: Tears a released slot down (``True``: clean, lease it again; ``False``, an
            exception or running past ``reset_timeout_s``: quarantine it).
        default_timeout_s: The lease deadline when ``lease`` gets none (``None``: none).
        reset_timeout_s: How long a release's reset may take.
        reset_backstop_s: How long past ``reset_timeout_s`` the release waits for a reset that
            does not bound itself before it quarantines the slot (``RESET_BACKSTOP_S``).
    """

    reset: ResetSlot
    default_timeout_s: float | None = None
    reset_timeout_s: float = 30.0
    reset_backstop_s: float = RESET_BACKSTOP_S
    _book: SlotBook = attrs.field(init=False, factory=SlotBook)
    _waiters: dict[int, _Waiter] = attrs.field(init=False, factory=dict)
    _closed: bool = attrs.field(init=False, default=False)
    _suspended: LeaseRefusal | None = attrs.field(init=False, default=None)
    _now: float = attrs.field(init=False, default=-math.inf)
    _lost: set[str] = attrs.field(init=False, factory=set)  # containers lost (names are not reused)

    # ------------------------------------------------------------------------- leases

    @contextlib.asynccontextmanager
    async def lease(
        self,
        holder: str,
        *,
        timeout_s: float | None = None,
        prefer: str | None = None,
        prefer_s: float = 0.0,
        environment: str | None = None,
    ) -> AsyncIterator[Lease]:
        """Hold one slot for ``holder`` for the block; see ``SandboxPool.lease``.

        ``timeout_s`` (else ``default_timeout_s``; ``None``: no deadline) bounds the wait.
        ``prefer``: a slot of that container when one is free or comes free within
        ``prefer_s`` seconds (within the deadline), else any slot. ``environment``: the task
        environment the lease runs over, which picks among the free slots (the book's rule: a
        slot whose last lease ran over it first, whose server readied the next one over it).
        Raises on entry:
            AcquireTimeout: no slot came free before the deadline.
            PoolClosed: the leasing is closed, or closes while this waits.
            Exception: the error of a suspended leasing (``suspend``), also when it is
                suspended while this waits.
            InvalidInput: ``timeout_s`` or ``prefer_s`` is NaN.
        """
        lease = await self._acquire(holder, timeout_s, prefer, prefer_s, environment)
        try:
            yield lease
        finally:
            await self._release(lease)

    async def _acquire(
        self,
        holder: str,
        timeout_s: float | None,
        prefer: str | None,
        prefer_s: float,
        environment: str | None,
    ) -> Lease:
        if self._closed:
            raise PoolClosed("the sandbox pool is closed")
        if self._suspended is not None:
            raise self._suspended()
        if timeout_s is not None and math.isnan(timeout_s):
            raise InvalidInput("timeout_s", "must be seconds or None, got nan")
        if math.isnan(prefer_s):
            raise InvalidInput("prefer_s", "must be seconds, got nan")
        limit = self.default_timeout_s if timeout_s is None else max(timeout_s, 0.0)
        now = self._clock()
        deadline = math.inf if limit is None else now + limit
        until = min(now + max(prefer_s, 0.0), deadline)
        granted = self._book.request(
            holder, now, None if limit is None else deadline, prefer=prefer, prefer_until=until,
            environment=environment,
        )  # fmt: skip
        if isinstance(granted, Lease):
            return granted
        waiter = self._waiters[granted.id] = _Waiter(ticket=granted)
        try:
            if self._book.prefers(granted) is not None:
                with anyio.move_on_after(until - now):
                    await waiter.woken.wait()
                if not waiter.settled:  # preferred long enough (at the deadline: any slot)
                    self._deliver(self._book.relax(self._clock(at_least=until)))
            with anyio.move_on_after(deadline - self._clock()):
                await waiter.woken.wait()
            if not waiter.settled:  # our own deadline came first
                self._expire(granted)
        except BaseException:
            # Cancelled (or failed) while waiting: give back a lease served meanwhile, else
            # withdraw the ticket. ``cancel`` is False only when the book settled it already.
            if waiter.lease is not None:
                await self._release(waiter.lease)
            elif not waiter.settled:
                self._book.cancel(granted)
            raise
        finally:
            del self._waiters[granted.id]
        if waiter.lease is not None:
            return waiter.lease
        if waiter.closed:
            raise PoolClosed("the sandbox pool closed while waiting for a slot")
        if waiter.refused is not None:
            raise waiter.refused
        raise AcquireTimeout(f"no slot came free for {holder!r} within {limit} s")

    def _expire(self, ticket: Ticket) -> None:
        """Expire every due ticket; ``ticket``'s deadline has passed by our waiting clock."""
        # The event loop may wake a sleeper a hair before its deadline: expire at the deadline.
        deadline = ticket.deadline
        assert deadline is not None
        for expired in self._book.expire(self._clock(at_least=deadline)):
            waiter = self._waiters[expired.id]
            waiter.expired = True
            waiter.woken.set()

    async def _release(self, lease: Lease) -> None:
        """Release ``lease``, reset its slot and hand the slot on. Shielded; never raises."""
        with anyio.CancelScope(shield=True):
            try:
                slot = self._book.release(lease, self._clock())
            except (StaleLease, UnknownSlot):
                return  # its container was lost: nothing is left to reset or free
            ok, why = False, None
            # past the reset's own limit (a slot server's client gives the server up there,
            # and the pool loses it): a backstop for a reset that does not bound itself
            with anyio.move_on_after(self.reset_timeout_s + self.reset_backstop_s) as limit:
                try:
                    ok = await self.reset(lease)
                except Exception as error:  # noqa: BLE001 - a failed reset quarantines the slot
                    why = f"its reset raised {type(error).__name__}: {error}"
            if limit.cancelled_caught:
                why = (
                    f"its reset ran past reset_timeout_s ({self.reset_timeout_s} s) "
                    f"plus {self.reset_backstop_s} s"
                )
            try:
                grants = self._book.reset_done(slot, ok, self._clock())
            except UnknownSlot:
                return  # its container was lost while the slot reset
            if why is not None:  # a reset that answers False has said why itself
                _log.warning("slot %s quarantined: %s", lease.slot, why)
            self._deliver(grants)

    def _deliver(self, grants: Sequence[Grant]) -> None:
        for grant in grants:
            waiter = self._waiters[grant.ticket.id]
            waiter.lease = grant.lease
            waiter.woken.set()

    def _clock(self, at_least: float = -math.inf) -> float:
        try:
            now = anyio.current_time()
        except RuntimeError:  # no event loop yet: a pool built (and filled) before it runs
            now = time.monotonic()
        self._now = max(self._now, now, at_least)
        return self._now

    # ------------------------------------------------------------------------- containers

    def refusal(self, container: str, call: SlotCall) -> str | None:
        """Why ``call`` may not run in ``container`` now, or ``None`` when it may."""
        if call.lease.slot.container != container:  # ``call.container``, without its call
            return (
                f"the call is for a slot of {call.container}, not of {container} "
                "@ $.lease.slot.container"
            )
        if not self._book.is_current(call.lease):
            return f"lease {call.lease.slot}#{call.lease.epoch} is stale or released @ $.epoch"
        return None

    def was_lost(self, container: str) -> bool:
        """Whether ``container`` was lost (``lose_container``): its leases ended with it, not
        by their holders' release."""
        return container in self._lost

    def add_container(self, name: str, slots: int) -> None:
        """Put ``slots`` fresh slots of ``name`` in service; waiters get them first.

        Raises ``ConfigError`` (empty name, bad count) or ``StateError`` (name in use).
        """
        self._deliver(self._book.add_container(name, slots, self._clock()))

    def lose_container(self, name: str) -> list[Lease]:
        """Take ``name`` out of service at once because it died.

        Returns the leases that were held there; they are stale from now on, and releasing one
        later changes nothing. Waiters keep waiting. Raises ``UnknownSlot`` for an unknown name.
        """
        leases = self._book.lose_container(name)
        self._lost.add(name)
        return leases

    def drain_container(self, name: str) -> None:
        """No new leases in ``name``; its free slots drain now, the others when released."""
        self._book.drain_container(name)

    def drained_containers(self) -> set[str]:
        """Draining containers with no slot leased or resetting."""
        return set(self._book.drained_containers())

    def remove_container(self, name: str) -> None:
        """Forget a drained container (raises ``StateError`` when it is not drained)."""
        self._book.remove_container(name)

    def quarantined(self, name: str, slots: int) -> int:
        """How many of ``name``'s first ``slots`` slots are quarantined."""
        return sum(state is SlotState.QUARANTINED for state in self._states(name, slots))

    def held(self, name: str, slots: int) -> int:
        """How many of ``name``'s first ``slots`` slots are leased or resetting."""
        busy = (SlotState.LEASED, SlotState.RESETTING)
        return sum(state in busy for state in self._states(name, slots))

    def _states(self, name: str, slots: int) -> list[SlotState]:
        return [self._book.state(SlotId(container=name, index=i)) for i in range(slots)]

    def close(self) -> None:
        """Refuse new leases; every waiter gets ``PoolClosed``. Held leases release as usual."""
        self._closed = True
        self._end_waits(lambda waiter: setattr(waiter, "closed", True))

    def suspend(self, refusal: LeaseRefusal) -> None:
        """Fail every waiter now, and every new lease until ``resume``, with ``refusal()``:
        the slots cannot come (say, the pool's scheduler no longer runs its servers). Held
        leases go on and release as usual. The latest refusal wins."""
        self._suspended = refusal
        self._end_waits(lambda waiter: setattr(waiter, "refused", refusal()))

    def resume(self) -> None:
        """Lease again after ``suspend`` (the slots can come again)."""
        self._suspended = None

    @property
    def suspended(self) -> bool:
        """Whether ``suspend`` refuses leases now."""
        return self._suspended is not None

    def _end_waits(self, settle: Callable[[_Waiter], None]) -> None:
        """Withdraw every waiting ticket from the book and wake its waiter, ``settle``d."""
        for ticket_id, waiter in self._waiters.items():
            if not waiter.settled and self._book.cancel(waiter.ticket):
                settle(waiter)
                waiter.woken.set()
            assert waiter.settled, f"ticket {ticket_id} left unsettled"

    # ------------------------------------------------------------------------- inspection

    def statistics(self) -> PoolStatistics:
        """The slot book's snapshot (slots by state, waiters, leases granted and expired)."""
        return self._book.statistics()

    def check_valid(self) -> None:
        """The slot book's invariants, and one waiting task per waiting ticket.

        Raises ``AssertionError`` naming the first broken.
        """
        self._book.check_valid()
        waiting = {ticket.id for ticket in self._book.waiting()}
        pending = {tid for tid, waiter in self._waiters.items() if not waiter.settled}
        if waiting != pending:
            raise AssertionError(
                f"check_valid: tickets waiting in the book {sorted(waiting)} != tasks waiting "
                f"{sorted(pending)}"
            )
