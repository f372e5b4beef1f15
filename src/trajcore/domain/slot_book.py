"""The slot book: which sandbox slot is in which state, who holds it, and who waits for one.

A pool (local or Nomad) keeps one book. The book decides; the pool performs the I/O the
decisions call for (resetting a slot, handing a lease to a waiting task, stopping a container)
and reports back. Time comes in as ``now`` (the caller's monotonic clock, in seconds).

Rules it keeps:

- Every slot ``(container, index)`` of a known container is in exactly one ``SlotState``.
- A lease names its slot and the slot's *epoch*, which grows on every grant of that slot and
  never goes back, not even when a container is removed and a container of the same name is
  added later. So a release with an old epoch (stale) or a second release of the same lease is
  recognised and refused with ``StaleLease``, and nothing changes.
- Lease requests are served first-come first-served. A request waits (gets a ``Ticket``) only
  when no slot is free; when a slot comes free and someone waits, the oldest waiter gets it at
  once. Hence: nobody waits while a slot is free.
- A waiter's deadline is enforced only by ``expire(now)``; a waiter served before its expiry
  is served, whatever the time.
- A request may *prefer* a container (``request(..., prefer=c, prefer_until=t)``: a fork
  wants a slot on the server that holds its snapshot). It takes a free slot of ``c`` when there
  is one; else, until ``t``, it waits for one of ``c`` only, even while other slots are free,
  and other requests pass it for those. Once ``relax(now)`` sees ``t`` pass, it accepts any
  slot and keeps its place in the queue. So the rule above reads: nobody waits while a slot
  it accepts is free, and a freed slot goes to the oldest waiter that accepts it. A preference
  is bounded by its ``t``, so nobody is starved by one; a preference for a container that is
  not in the book (or drains) is waited out until ``t`` all the same.
- Every released slot is reset before anyone else gets it: release moves it to RESETTING, and
  only ``reset_done`` frees it (or quarantines it when the reset failed).
- A request may name the task *environment* its lease runs over (``request(...,
  environment=e)``, an image reference): among the free slots it accepts it takes one whose
  last lease named ``e``, else one whose last lease named none, else any (a request naming
  none: one whose last lease named none, else any); the one free longest of its kind, except
  that "any" takes the first of the environment whose free slots were queued first. A slot
  server readies a slot's next lease over its last lease's image, so members of a group on
  one image find theirs ready. It only picks among free slots: who is served, and when, is
  as above.

Slot transitions (any other move raises ``StateError`` naming the event, the slot and its state):

    ==========  ===================================  ===============================
    state       event                                next state
    ==========  ===================================  ===============================
    (new)       add_container                        FREE
    FREE        request / a waiter is served          LEASED (epoch + 1)
    LEASED      release                              RESETTING
    RESETTING   reset_done(ok=True)                  FREE, or DRAINING if draining
    RESETTING   reset_done(ok=False)                 QUARANTINED
    FREE        drain_container                      DRAINING
    DRAINING,   remove_container (once no slot of    (gone)
    QUARANTINED the container is LEASED/RESETTING)
    any         lose_container                       (gone)
    ==========  ===================================  ===============================

A draining container gets no new leases; its leased slots stay leased until released, then reset
as usual and end DRAINING instead of FREE (a pool may skip the real reset of a slot whose
container is leaving and report ``reset_done(ok=True)`` at once). ``drained_containers()`` names
the draining containers that may be removed.

A *lost* container (its server died) is forgotten at once: its slots leave the book, and
``lose_container`` returns the leases that were held there so the pool can fail their calls.
Those leases are stale from then on: releasing one raises ``StaleLease`` (the pool ignores it),
and ``reset_done`` for one of its slots raises ``UnknownSlot``. The slots are not kept as
QUARANTINED because nothing could ever come of them; a restarted server joins as a new
``add_container``, and the epochs it starts from continue those of the lost one.

Cost: ``request``, ``release``, ``reset_done``, ``cancel`` and ``is_current`` are O(1) (plus
O(log waiters) for a waiter's deadline; the free slots are queued per environment);
``expire`` is O(log waiters) per expired ticket; while a request prefers a container, serving
is O(waiters + free slots) (a preferring request that gets a slot at once costs O(free slots));
``add_container``, ``drain_container``, ``lose_container`` and ``remove_container`` are
O(slots in the book).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Container, Iterable

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, InvalidInput, StaleLease, StateError, UnknownSlot
from trajcore.domain.scaling import ContainerLoad
from trajcore.domain.slots import Lease, PoolStatistics, SlotId, SlotState

__all__ = ["Grant", "SlotBook", "Ticket"]


@attrs.frozen(kw_only=True)
class Ticket:
    """A lease request that waits for a slot.

    Attributes:
        id: The book's number for it, unique per book, growing in request order.
        holder: Who asked (a trajectory id).
        requested_at: The ``now`` of the request.
        deadline: When ``expire`` gives up on it; None waits until served or cancelled.
        environment: The task environment its lease runs over (None: none named).
    """

    id: int
    holder: str
    requested_at: float
    deadline: float | None
    environment: str | None = None


@attrs.frozen(kw_only=True)
class Grant:
    """A waiting request that was served: hand ``lease`` to whoever waits on ``ticket``."""

    ticket: Ticket
    lease: Lease


# States as small integers on the hot paths (hashing an enum member costs a Python call).
_STATES: tuple[SlotState, ...] = (
    SlotState.FREE,
    SlotState.LEASED,
    SlotState.RESETTING,
    SlotState.QUARANTINED,
    SlotState.DRAINING,
)
_FREE, _LEASED, _RESETTING, _QUARANTINED, _DRAINING = range(len(_STATES))


class _Slot:
    """One slot's record: its state (as a code), its epoch, its lease, its container and the
    environment its latest lease named."""

    __slots__ = ("code", "container", "environment", "epoch", "id", "lease")

    def __init__(self, slot: SlotId, epoch: int, container: _Container) -> None:
        self.id = slot
        self.container = container
        self.code = _FREE
        self.epoch = epoch  # of the latest grant (0 before the first ever)
        self.lease: Lease | None = None  # set exactly while LEASED
        self.environment: str | None = None

    @property
    def state(self) -> SlotState:
        return _STATES[self.code]


class _Container:
    """One container: its slots, whether it drains, when it joined, its counts by state."""

    __slots__ = ("added_at", "counts", "draining", "name", "slots")

    def __init__(self, name: str, added_at: float) -> None:
        self.name = name
        self.added_at = added_at
        self.draining = False
        self.slots: list[_Slot] = []
        self.counts = [0] * len(_STATES)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"check_valid: {message}")


def _earliest_live(heap: list[tuple[float, int]], live: Container[int]) -> float | None:
    """The earliest time in ``heap`` whose ticket is still in ``live``, or None; the entries
    before it, whose tickets left (served, cancelled, expired or relaxed), are dropped."""
    while heap:
        when, ticket_id = heap[0]
        if ticket_id in live:
            return when
        heapq.heappop(heap)
    return None


def _tag(lease: Lease) -> str:
    return f"lease {lease.slot}#{lease.epoch} of {lease.holder!r}"


@attrs.define
class SlotBook:
    """Sandbox slots, their leases and the requests waiting for them, as a sans-IO state machine.

    Every method that takes ``now`` refuses a ``now`` earlier than one seen before
    (``InvalidInput`` on field ``now``).
    """

    _slots: dict[SlotId, _Slot] = attrs.field(init=False, factory=dict)
    _containers: dict[str, _Container] = attrs.field(init=False, factory=dict)
    # FREE slots, longest free first: those whose latest lease named no environment, and the
    # others by that environment (no empty queue kept)
    _free: deque[_Slot] = attrs.field(init=False, factory=deque)
    _free_by: OrderedDict[str, OrderedDict[_Slot, None]] = attrs.field(
        init=False, factory=OrderedDict
    )
    _waiters: OrderedDict[int, Ticket] = attrs.field(init=False, factory=OrderedDict)
    _deadlines: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    _prefers: dict[int, str] = attrs.field(init=False, factory=dict)  # ticket -> container
    _relaxing: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    _epochs: dict[SlotId, int] = attrs.field(init=False, factory=dict)  # outlives its container
    _counts: list[int] = attrs.field(init=False, factory=lambda: [0] * len(_STATES))
    _next_ticket: int = attrs.field(init=False, default=1)
    _granted: int = attrs.field(init=False, default=0)
    _expired: int = attrs.field(init=False, default=0)
    _now: float = attrs.field(init=False, default=-math.inf)

    # ------------------------------------------------------------------ containers

    def add_container(self, container: str, slots: int, now: float) -> list[Grant]:
        """Add ``container`` with slots ``0 .. slots-1``, all FREE, and serve waiters with them.

        Returns the grants made to waiting requests, oldest request first. Raises:
            ConfigError: ``container`` is empty or ``slots`` is not a positive integer.
            StateError: a container of that name is already in the book.
        """
        self._tick(now, "add_container")
        if not container:
            raise ConfigError("container", "must not be empty")
        validators.check_argument(validators.positive_int, "slots", slots)
        if container in self._containers:
            state = "draining" if self._containers[container].draining else "active"
            raise StateError(
                f"add_container: container {container!r} is already in the book ({state})"
            )
        record = self._containers[container] = _Container(container, now)
        for index in range(slots):
            slot_id = SlotId(container=container, index=index)
            slot = _Slot(slot_id, self._epochs.get(slot_id, 0), record)
            self._slots[slot_id] = slot
            record.slots.append(slot)
            self._free.append(slot)
        record.counts[_FREE] = slots
        self._counts[_FREE] += slots
        return self._serve()

    def drain_container(self, container: str) -> bool:
        """Stop leasing in ``container``: its FREE slots become DRAINING now, the others later.

        Returns True when the container may be removed at once (no slot leased or resetting).
        Draining a draining container changes nothing. Raises:
            UnknownSlot: the container is not in the book.
        """
        record = self._container(container, "drain_container")
        if not record.draining:
            record.draining = True
            free = record.counts[_FREE]
            if free:
                self._unqueue(record)
                for slot in record.slots:
                    if slot.code == _FREE:
                        self._move(slot, _DRAINING)
        return self._drained(record)

    def drained_containers(self) -> list[str]:
        """The draining containers with no slot leased or resetting, oldest first."""
        return [c.name for c in self._containers.values() if c.draining and self._drained(c)]

    def remove_container(self, container: str) -> None:
        """Forget a drained container and its slots (their epochs are remembered).

        Raises:
            UnknownSlot: the container is not in the book.
            StateError: it is not draining, or a slot of it is still leased or resetting.
        """
        record = self._container(container, "remove_container")
        if not record.draining:
            raise StateError(f"remove_container: container {container!r} is active; drain it first")
        if not self._drained(record):
            busy = [str(s.id) for s in record.slots if s.code in (_LEASED, _RESETTING)]
            raise StateError(
                f"remove_container: container {container!r} still has slots leased or "
                f"resetting: {', '.join(busy)}"
            )
        self._forget(record)

    def lose_container(self, container: str) -> list[Lease]:
        """Forget ``container`` at once because it died; return the leases that were held there.

        The returned leases are stale from now on (the pool fails their calls as infrastructure
        errors); its slots, whatever their state, leave the book. Waiters keep waiting. Raises:
            UnknownSlot: the container is not in the book.
        """
        record = self._container(container, "lose_container")
        lost = [s.lease for s in record.slots if s.lease is not None]
        if record.counts[_FREE]:
            self._unqueue(record)
        self._forget(record)
        return lost

    def container_loads(self) -> list[ContainerLoad]:
        """Each active (not draining) container's leased slot count and when it joined."""
        return [
            ContainerLoad(name=c.name, leased=c.counts[_LEASED], added_at=c.added_at)
            for c in self._containers.values()
            if not c.draining
        ]

    # ------------------------------------------------------------------ leases

    def request(
        self,
        holder: str,
        now: float,
        deadline: float | None = None,
        *,
        prefer: str | None = None,
        prefer_until: float = -math.inf,
        environment: str | None = None,
    ) -> Lease | Ticket:
        """Ask for a slot for ``holder``, of container ``prefer`` when one is free or comes
        free before ``prefer_until``, for a lease over ``environment`` (which picks the slot).

        Returns a ``Lease`` when a slot it accepts is free (a slot of ``prefer`` first), else
        a ``Ticket`` queued behind the earlier ones; it is later served through the grants that
        ``reset_done``, ``add_container`` or ``relax`` return, or returned by ``expire`` once
        ``deadline`` passed, or withdrawn by ``cancel``. A ``prefer_until`` not after ``now``
        (the default) only picks a free slot of ``prefer`` over the others. Raises:
            InvalidInput: ``deadline`` or ``prefer_until`` is NaN.
        """
        self._tick(now, "request")
        if math.isnan(prefer_until):
            raise InvalidInput("prefer_until", "must be a number, got nan")
        if prefer is not None:
            record = self._containers.get(prefer)
            if record is not None and record.counts[_FREE]:
                return self._grant(self._take(record, environment), holder, environment)
            if prefer_until <= now or record is None or record.draining:
                prefer = None
        if prefer is None:
            free = self._free
            if free and (environment is None or environment not in self._free_by):
                return self._grant(free.popleft(), holder, environment)  # the common case
            if self._counts[_FREE]:
                return self._grant(self._pop(environment), holder, environment)
        if deadline is not None and math.isnan(deadline):
            raise InvalidInput("deadline", "must be a number or None, got nan")
        ticket = Ticket(
            id=self._next_ticket, holder=holder, requested_at=now, deadline=deadline,
            environment=environment,
        )  # fmt: skip
        self._next_ticket += 1
        self._waiters[ticket.id] = ticket
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, ticket.id))
        if prefer is not None:
            self._prefers[ticket.id] = prefer
            heapq.heappush(self._relaxing, (prefer_until, ticket.id))
        return ticket

    def relax(self, now: float) -> list[Grant]:
        """End the preferences whose ``prefer_until`` is at or before ``now``: those waiters
        accept any slot from now on, in their places. Returns the grants made, oldest request
        first."""
        self._tick(now, "relax")
        heap, prefers = self._relaxing, self._prefers
        relaxed = False
        while heap and heap[0][0] <= now:
            _, ticket_id = heapq.heappop(heap)
            relaxed |= prefers.pop(ticket_id, None) is not None
        return self._serve() if relaxed else []

    def next_relax(self) -> float | None:
        """The earliest ``prefer_until`` of a waiting request that still prefers (call
        ``relax`` then), or None."""
        return _earliest_live(self._relaxing, self._prefers)

    def prefers(self, ticket: Ticket) -> str | None:
        """The container ``ticket`` waits for, while it still prefers one, else None."""
        return self._prefers.get(ticket.id)

    def release(self, lease: Lease, now: float) -> SlotId:
        """Give back ``lease``: its slot goes to RESETTING, and the caller must reset it.

        Returns the slot, to reset and then report with ``reset_done``. Raises (changing
        nothing):
            StaleLease: the lease is not current: already released, or its container was lost
                or removed, or its epoch is not the slot's latest.
            UnknownSlot: the book never knew the slot.
        """
        self._tick(now, "release")
        slot = self._slots.get(lease.slot)
        if slot is None or (slot.lease is not lease and slot.lease != lease):
            raise self._not_current(lease, slot, "release")
        slot.lease = None
        self._move(slot, _RESETTING)
        return lease.slot

    def reset_done(self, slot: SlotId, ok: bool, now: float) -> list[Grant]:
        """Record the end of a slot's reset; a good one frees the slot for the oldest waiter.

        ``ok=True``: the slot becomes FREE (DRAINING when its container drains) and waiters are
        served. ``ok=False``: the slot is QUARANTINED for good. Returns the grants made, oldest
        request first (at most one). Raises:
            UnknownSlot: the slot is not in the book (never was, or its container was lost).
            StateError: the slot is not RESETTING.
        """
        self._tick(now, "reset_done")
        record_slot = self._slots.get(slot)
        if record_slot is None:
            raise UnknownSlot(f"reset_done: slot {slot} is not in the book")
        if record_slot.code != _RESETTING:
            raise StateError(f"reset_done: slot {slot} is {record_slot.state.value}, not resetting")
        if not ok:
            self._move(record_slot, _QUARANTINED)
            return []
        if record_slot.container.draining:
            self._move(record_slot, _DRAINING)
            return []
        self._move(record_slot, _FREE)
        if record_slot.environment is None:
            self._free.append(record_slot)
        else:
            self._queue(record_slot, record_slot.environment)
        return self._serve()

    def cancel(self, ticket: Ticket) -> bool:
        """Withdraw a waiting request. Returns True when it was waiting, False when it was
        already served, expired or cancelled (if served, the caller holds that lease and must
        release it)."""
        # Its deadline entry, if any, is dropped lazily by ``expire``/``next_deadline``.
        self._prefers.pop(ticket.id, None)
        return self._waiters.pop(ticket.id, None) is not None

    def expire(self, now: float) -> list[Ticket]:
        """Remove and return the waiting requests whose deadline is at or before ``now``,
        earliest deadline first (the caller fails them with ``AcquireTimeout``)."""
        self._tick(now, "expire")
        expired: list[Ticket] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, ticket_id = heapq.heappop(heap)
            ticket = self._waiters.pop(ticket_id, None)
            if ticket is not None:
                self._prefers.pop(ticket_id, None)
                expired.append(ticket)
        self._expired += len(expired)
        return expired

    # ------------------------------------------------------------------ queries

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiting request (call ``expire`` then), or None."""
        return _earliest_live(self._deadlines, self._waiters)

    def is_current(self, lease: Lease) -> bool:
        """True while ``lease`` holds its slot (granted, not released, container not lost)."""
        slot = self._slots.get(lease.slot)
        return slot is not None and slot.lease == lease

    def state(self, slot: SlotId) -> SlotState:
        """The slot's state. Raises ``UnknownSlot`` when the slot is not in the book."""
        record = self._slots.get(slot)
        if record is None:
            raise UnknownSlot(f"state: slot {slot} is not in the book")
        return record.state

    def waiting(self) -> list[Ticket]:
        """The waiting requests, oldest first."""
        return list(self._waiters.values())

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot: containers in the book, slots by state, waiters, totals."""
        counts = self._counts
        return PoolStatistics(
            containers=len(self._containers),
            free=counts[_FREE],
            leased=counts[_LEASED],
            resetting=counts[_RESETTING],
            quarantined=counts[_QUARANTINED],
            draining=counts[_DRAINING],
            waiting=len(self._waiters),
            leases_granted=self._granted,
            leases_expired=self._expired,
        )

    def check_valid(self) -> None:
        """Check every invariant; raise AssertionError naming the first one broken.

        Every slot in exactly one state and counted there; a lease exactly on the LEASED slots,
        at the slot's latest epoch; the free queue is exactly the FREE slots; nobody waits
        while a slot is free; no draining container has a FREE slot. O(slots + waiters).
        """
        totals = [0] * len(_STATES)
        seen = 0
        for name, record in self._containers.items():
            counts = [0] * len(_STATES)
            for index, slot in enumerate(record.slots):
                _check(slot.id == SlotId(container=name, index=index), f"{slot.id} misfiled")
                _check(self._slots.get(slot.id) is slot, f"slot {slot.id} not indexed")
                _check(slot.epoch == self._epochs.get(slot.id, 0), f"slot {slot.id} epoch")
                _check(slot.container is record, f"slot {slot.id} points at another container")
                counts[slot.code] += 1
                if slot.state is SlotState.LEASED:
                    lease = slot.lease
                    _check(lease is not None, f"leased slot {slot.id} lost its lease")
                    assert lease is not None
                    _check(lease.slot == slot.id and lease.epoch == slot.epoch, f"{slot.id} lease")
                else:
                    _check(slot.lease is None, f"{slot.state.value} slot {slot.id} has a lease")
                if record.draining:
                    _check(slot.state is not SlotState.FREE, f"draining {name} has a free slot")
            _check(counts == record.counts, f"container {name} counts {record.counts}")
            for code, count in enumerate(counts):
                totals[code] += count
            seen += len(record.slots)
        _check(seen == len(self._slots), "slots indexed outside their containers")
        _check(totals == self._counts, f"state counts {self._counts} != {totals}")
        queued = [*self._free, *(s for queue in self._free_by.values() for s in queue)]
        _check(len(set(map(id, queued))) == len(queued), "a slot is queued free twice")
        _check(
            all(
                slot.state is SlotState.FREE and self._slots.get(slot.id) is slot for slot in queued
            ),
            "the free queue holds a slot that is not free",
        )
        _check(len(queued) == totals[_FREE], "a free slot is missing from the queue")
        for environment, queue in [(None, self._free), *self._free_by.items()]:
            _check(bool(queue) or environment is None, f"an empty queue for {environment!r}")
            _check(
                all(slot.environment == environment for slot in queue),
                f"a slot is queued for another environment than {environment!r}",
            )
        for ticket_id in self._waiters:
            want = self._prefers.get(ticket_id)
            if want is None:
                _check(not queued, f"ticket {ticket_id} waits while a slot is free")
            else:
                wanted = self._containers.get(want)
                _check(
                    wanted is None or not wanted.counts[_FREE],
                    f"ticket {ticket_id} waits while a slot of {want} is free",
                )
        _check(set(self._prefers) <= set(self._waiters), "a preference outlived its ticket")
        relaxing = {ticket_id for _, ticket_id in self._relaxing}
        _check(set(self._prefers) <= relaxing, "a preference has no end scheduled")
        _check(list(self._waiters) == sorted(self._waiters), "waiters are not first-come order")
        pending = {ticket_id for _, ticket_id in self._deadlines}
        for ticket in self._waiters.values():
            if ticket.deadline is not None:
                _check(ticket.id in pending, f"ticket {ticket.id}'s deadline is not scheduled")

    # ------------------------------------------------------------------ internals

    def _tick(self, now: float, event: str) -> None:
        if not now >= self._now:  # also refuses NaN
            raise InvalidInput("now", f"{event}: time went backwards ({now!r} < {self._now!r})")
        self._now = now

    def _container(self, container: str, event: str) -> _Container:
        record = self._containers.get(container)
        if record is None:
            raise UnknownSlot(f"{event}: container {container!r} is not in the book")
        return record

    def _move(self, slot: _Slot, code: int) -> None:
        counts, totals, old = slot.container.counts, self._counts, slot.code
        counts[old] -= 1
        totals[old] -= 1
        counts[code] += 1
        totals[code] += 1
        slot.code = code

    def _grant(self, slot: _Slot, holder: str, environment: str | None) -> Lease:
        slot.environment = environment
        slot.epoch += 1
        self._epochs[slot.id] = slot.epoch
        lease = Lease(slot=slot.id, epoch=slot.epoch, holder=holder)
        slot.lease = lease
        self._move(slot, _LEASED)
        self._granted += 1
        return lease

    def _serve(self) -> list[Grant]:
        # Served whatever the time: deadlines act through ``expire`` only.
        grants: list[Grant] = []
        waiters, counts, prefers = self._waiters, self._counts, self._prefers
        if not prefers:
            while waiters and counts[_FREE]:
                _, ticket = waiters.popitem(last=False)
                lease = self._grant(
                    self._pop(ticket.environment), ticket.holder, ticket.environment
                )
                grants.append(Grant(ticket=ticket, lease=lease))
            return grants
        for ticket in list(waiters.values()):  # oldest first; skip who accepts no free slot
            if not counts[_FREE]:
                break
            want, environment = prefers.get(ticket.id), ticket.environment
            if want is None:
                slot = self._pop(environment)
            else:
                record = self._containers.get(want)
                if record is None or not record.counts[_FREE]:
                    continue
                slot = self._take(record, environment)
                del prefers[ticket.id]
            del waiters[ticket.id]
            grants.append(Grant(ticket=ticket, lease=self._grant(slot, ticket.holder, environment)))
        return grants

    def _queue(self, slot: _Slot, environment: str) -> None:
        """Queue a FREE slot whose latest lease named ``environment``, behind the others."""
        queue = self._free_by.get(environment)
        if queue is None:
            queue = self._free_by[environment] = OrderedDict()
        queue[slot] = None

    def _pop(self, environment: str | None) -> _Slot:
        """Remove and return the free slot a lease over ``environment`` takes (one is free)."""
        by = self._free_by
        if environment is not None and environment in by:
            queue = by[environment]
        elif self._free:
            return self._free.popleft()
        else:
            environment, queue = next(iter(by.items()))
        slot, _ = queue.popitem(last=False)
        if not queue:
            del by[environment]
        return slot

    def _take(self, record: _Container, environment: str | None) -> _Slot:
        """Remove and return the free slot of ``record`` (it has one) that a lease over
        ``environment`` takes, chosen as ``_pop`` chooses among all free slots."""
        by = self._free_by
        mine = None if environment is None else by.get(environment)
        queues: list[Iterable[_Slot]] = [] if mine is None else [mine]
        queues += [self._free, *(queue for key, queue in by.items() if key != environment)]
        for queue in queues:
            for slot in queue:
                if slot.container is record:
                    self._unqueue_slot(slot)
                    return slot
        raise AssertionError(f"container {record.name} counts a free slot it does not have")

    def _unqueue_slot(self, slot: _Slot) -> None:
        key = slot.environment
        if key is None:
            self._free.remove(slot)
            return
        queue = self._free_by[key]
        del queue[slot]
        if not queue:
            del self._free_by[key]

    def _unqueue(self, record: _Container) -> None:
        """Take every FREE slot of ``record`` out of the free queues."""
        self._free = deque(s for s in self._free if s.container is not record)
        for slot in record.slots:
            if slot.code == _FREE and slot.environment is not None:
                self._unqueue_slot(slot)

    def _drained(self, record: _Container) -> bool:
        counts = record.counts
        return not (counts[_LEASED] or counts[_RESETTING] or counts[_FREE])

    def _forget(self, record: _Container) -> None:
        for slot in record.slots:
            del self._slots[slot.id]
        for code, count in enumerate(record.counts):
            self._counts[code] -= count
        del self._containers[record.name]

    def _not_current(self, lease: Lease, slot: _Slot | None, event: str) -> StateError:
        if slot is None:
            if lease.slot in self._epochs:
                return StaleLease(
                    f"{event}: {_tag(lease)} is stale: container {lease.slot.container!r} was "
                    "lost or removed"
                )
            return UnknownSlot(f"{event}: slot {lease.slot} of {_tag(lease)} was never in the book")
        if lease.epoch < slot.epoch:
            return StaleLease(
                f"{event}: {_tag(lease)} is stale: the slot was granted again (epoch "
                f"{slot.epoch}, {slot.state.value})"
            )
        if lease.epoch == slot.epoch and slot.state is not SlotState.LEASED:
            return StaleLease(
                f"{event}: {_tag(lease)} was already released (the slot is {slot.state.value})"
            )
        return StaleLease(
            f"{event}: {_tag(lease)} was never granted (the slot is at epoch {slot.epoch}, "
            f"{slot.state.value})"
        )
