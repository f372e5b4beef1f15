"""The batching window: which tool calls go to a container together, and when.

Many trajectories share a container (a slot server holds N slots), and one request per container
carrying many calls is far cheaper than one request per call. The planner decides how calls are
grouped into such requests (*batches*) and when each batch must go out. It is sans-IO: the caller
offers calls, asks which batches are ``due(now)``, sends them, and reports ``complete`` when a
batch's request returns. ``next_deadline()`` says when to ask again; the planner never sleeps.

Rules it keeps:

- A batch holds calls for one container only, at most ``max_batch_size`` of them.
- Nothing offered is lost or duplicated: every call goes out in exactly one batch, unless it is
  withdrawn while still queued.
- The calls of one slot (one lease, one trajectory) keep their order. They go out in offer order,
  and a call never goes out while an earlier call of its slot is in a batch that has not
  completed. Several calls of one slot may share a batch; the slot server runs the calls of one
  slot one at a time in batch order, so they still run in offer order.
- A call is *ready* once nothing earlier of its slot is in flight. A container's ready calls
  form its next batch, which closes (is due) when the first of these holds:

  ======  =================================================================  ===============
  reason  condition                                                          due at
  ======  =================================================================  ===============
  full    ``max_batch_size`` calls are ready                                 once it is full
  eager   eager mode, and no batch of the container is in flight             at once
  window  ``window_ms`` passed since the oldest ready slot became ready      that time
  ======  =================================================================  ===============

  So in eager mode (the default) a lone call never waits for a window, and while a container
  is busy its further calls coalesce until the busy batch completes, the window passes or the
  next batch is full: group commit. Without eager mode every batch waits for its window or
  until it is full. No ready call waits longer than ``window_ms`` once it could have been sent,
  provided the caller calls ``due`` at ``next_deadline()``.

Each slot with calls in the planner moves through these states (``complete`` and ``offer`` of a
batch or call for it; *ready* and *in flight* exclude each other, so each slot is in at most one
unfinished batch):

    ===========  =============================  =====================================
    state        event                          next state
    ===========  =============================  =====================================
    (absent)     offer                          ready, ready since now
    ready        offer                          ready (the call queued behind the rest)
    ready        withdraw its last queued call  (absent)
    ready        its calls go out in a batch    in flight; calls left over by a full
                                                batch are held
    in flight    offer                          in flight, the call held
    in flight    complete, calls held           ready, ready since now
    in flight    complete, nothing held         (absent)
    ===========  =============================  =====================================

Illegal moves (offering a call that is already pending, completing a batch that is not in flight,
time running backwards) raise errors that name the event, the call or batch, and its state.

Cost: ``offer``, ``withdraw`` of a queued call and ``next_deadline`` are O(1) amortized (a
withdrawal scans its own slot's few queued calls); ``due`` and ``complete`` cost O(log
containers) plus the size of the batches they produce or finish.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict, deque

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import InvalidInput, StateError
from trajcore.domain.slots import Lease, SlotCall, SlotId

__all__ = ["Batch", "BatchClose", "BatchConfig", "BatchPlanner", "BatchPlannerStatistics"]


class BatchClose(enum.Enum):
    """Why a batch closed (went out)."""

    FULL = "full"  # max_batch_size calls were ready
    EAGER = "eager"  # eager mode and nothing of the container was in flight
    WINDOW = "window"  # window_ms passed since its oldest ready call became ready


_window_ms = validators.finite_number(None, at_least=0.0, prefix="batching.")
_max_batch_size = validators.whole_number(1, prefix="batching.")


@attrs.frozen(kw_only=True)
class BatchConfig:
    """How the planner batches.

    Attributes:
        window_ms: Longest a ready call waits for company, in milliseconds (0: never waits).
        max_batch_size: Most calls in one batch.
        eager: Send a container's calls at once when none of its batches is in flight.
    """

    window_ms: float = attrs.field(default=5.0, validator=_window_ms)
    max_batch_size: int = attrs.field(default=64, validator=_max_batch_size)
    eager: bool = True

    @property
    def window_s(self) -> float:
        """The window in seconds, the unit of ``now``."""
        return self.window_ms / 1000.0


@attrs.frozen(kw_only=True)
class Batch:
    """Calls that go to one container in one request.

    Attributes:
        id: The planner's id for the batch, to pass back to ``complete``; unique per planner.
        container: The container (slot server) every call is for.
        calls: The calls in the order they must be sent; one slot's calls in offer order.
        opened_at: When the oldest of its calls' slots became ready (the window's start).
        sent_at: The ``now`` of the ``due`` call that released it.
        reason: Why it closed.
    """

    id: int
    container: str
    calls: tuple[SlotCall, ...]
    opened_at: float
    sent_at: float
    reason: BatchClose


@attrs.frozen(kw_only=True)
class BatchPlannerStatistics:
    """A snapshot of the planner.

    Attributes:
        ready: Queued calls that may go out in the next batch of their container.
        held: Queued calls waiting for an earlier call of their slot to complete.
        in_flight_batches: Batches sent and not completed.
        in_flight_calls: Calls in those batches.
        offered: Calls offered since the start.
        withdrawn: Calls withdrawn while still queued.
        batches_sent: Batches released by ``due``; ``closed_*`` split them by reason.
        calls_sent: Calls in those batches.
        batches_completed: Batches reported complete.
    """

    ready: int
    held: int
    in_flight_batches: int
    in_flight_calls: int
    offered: int
    withdrawn: int
    batches_sent: int
    calls_sent: int
    batches_completed: int
    closed_full: int
    closed_eager: int
    closed_window: int

    @property
    def queued(self) -> int:
        """Calls offered and not yet sent (ready or held)."""
        return self.ready + self.held


_CallKey = tuple[Lease, str]  # a call's identity: its lease and its id


class _Line:
    """One slot's calls in the planner: its queue (ready or held) and its batch in flight."""

    __slots__ = ("container", "in_flight", "queue", "ready_at", "slot")

    def __init__(self, slot: SlotId) -> None:
        self.slot = slot
        self.container = slot.container
        self.queue: deque[_Pending] = deque()
        self.ready_at: float | None = None  # set exactly while the line is ready
        self.in_flight = 0  # the batch id holding its calls, 0 when none


class _Pending:
    """One offered call, from offer until its batch completes (or it is withdrawn)."""

    __slots__ = ("batch", "call", "key", "line")

    def __init__(self, call: SlotCall, key: _CallKey, line: _Line) -> None:
        self.call = call
        self.key = key
        self.line = line
        self.batch = 0  # 0 while queued, else the batch it went out in


class _Container:
    """A container's ready lines (oldest first), its batches in flight and its deadline."""

    __slots__ = ("deadline", "in_flight", "name", "ready", "ready_calls")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: OrderedDict[SlotId, _Line] = OrderedDict()
        self.ready_calls = 0
        self.in_flight = 0
        self.deadline: float | None = None  # when its next batch is due; always in the heap


class _Flight:
    """A batch in flight: the batch, its pending calls and the lines it holds."""

    __slots__ = ("batch", "entries", "lines")

    def __init__(self, batch: Batch, entries: list[_Pending], lines: list[_Line]) -> None:
        self.batch = batch
        self.entries = entries
        self.lines = lines


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"check_valid: {message}")


@attrs.define
class BatchPlanner:
    """The batching window for tool calls, as a sans-IO state machine.

    Use: ``offer`` each call; whenever the clock reaches ``next_deadline()`` (and right after an
    ``offer`` or ``complete``), call ``due(now)`` and send each batch it returns; when a batch's
    request returns, call ``complete(batch.id, now)``. A caller that gives up on a queued call
    calls ``withdraw``. ``now`` is the caller's monotonic clock in seconds and must never go
    backwards.
    """

    config: BatchConfig = attrs.field(factory=BatchConfig)
    _pending: dict[_CallKey, _Pending] = attrs.field(init=False, factory=dict)
    _lines: dict[SlotId, _Line] = attrs.field(init=False, factory=dict)
    _containers: dict[str, _Container] = attrs.field(init=False, factory=dict)
    _flights: dict[int, _Flight] = attrs.field(init=False, factory=dict)
    _heap: list[tuple[float, int, str]] = attrs.field(init=False, factory=list)
    _seq: int = attrs.field(init=False, default=0)
    _next_batch: int = attrs.field(init=False, default=1)
    _now: float = attrs.field(init=False, default=-math.inf)
    _ready: int = attrs.field(init=False, default=0)
    _held: int = attrs.field(init=False, default=0)
    _in_flight_calls: int = attrs.field(init=False, default=0)
    _offered: int = attrs.field(init=False, default=0)
    _withdrawn: int = attrs.field(init=False, default=0)
    _calls_sent: int = attrs.field(init=False, default=0)
    _completed: int = attrs.field(init=False, default=0)
    _closed: dict[BatchClose, int] = attrs.field(
        init=False, factory=lambda: dict.fromkeys(BatchClose, 0)
    )

    # ------------------------------------------------------------------ events

    def offer(self, call: SlotCall, now: float) -> None:
        """Queue ``call`` for its container.

        The call goes out in a batch that a later ``due`` returns (at the same ``now`` when it is
        due at once). Raises:
            StateError: a call with the same lease and call id is already queued or in flight.
            InvalidInput: ``now`` is earlier than a ``now`` seen before.
        """
        self._tick(now, "offer")
        key = (call.lease, call.call.id)
        if key in self._pending:
            state = "in flight" if self._pending[key].batch else "queued"
            raise StateError(
                f"offer: call {call.call.id!r} of lease {call.lease.slot}#{call.lease.epoch} "
                f"is already {state}"
            )
        slot = call.lease.slot
        line = self._lines.get(slot)
        if line is None:
            line = self._lines[slot] = _Line(slot)
        entry = _Pending(call, key, line)
        self._pending[key] = entry
        line.queue.append(entry)
        self._offered += 1
        if line.in_flight:
            self._held += 1
            return
        container = self._containers.get(line.container)
        if container is None:
            container = self._containers[line.container] = _Container(line.container)
        if line.ready_at is None:
            line.ready_at = now
            container.ready[slot] = line
        container.ready_calls += 1
        self._ready += 1
        self._schedule(container)

    def due(self, now: float) -> list[Batch]:
        """Close and return every batch that is due at ``now``; they are in flight from here.

        Returns the batches in the order they became due (containers by deadline; within a
        container, oldest calls first). The caller must send each and report ``complete``.
        Raises:
            InvalidInput: ``now`` is earlier than a ``now`` seen before.
        """
        self._tick(now, "due")
        out: list[Batch] = []
        heap = self._heap
        expired: list[tuple[float, str]] = []
        while heap and heap[0][0] <= now:
            deadline, _, name = heapq.heappop(heap)
            expired.append((deadline, name))
        # Each container is served once per call, from the entries popped above.
        for deadline, name in expired:
            container = self._containers.get(name)
            if container is None or container.deadline != deadline:
                continue  # superseded by a later schedule
            container.deadline = None
            while container.ready:
                reason = self._closing(container, now)
                if reason is None:
                    break
                out.append(self._send(container, now, reason))
            self._schedule(container)
        return out

    def complete(self, batch_id: int, now: float) -> None:
        """Record that batch ``batch_id`` returned (whatever its results).

        Calls of its slots that were held become ready at ``now``; in eager mode the
        container's ready calls become due at once. Raises:
            StateError: the batch is not in flight (never sent, or already completed).
            InvalidInput: ``now`` is earlier than a ``now`` seen before.
        """
        self._tick(now, "complete")
        flight = self._flights.pop(batch_id, None)
        if flight is None:
            state = "already completed" if 0 < batch_id < self._next_batch else "never sent"
            raise StateError(f"complete: batch {batch_id} is not in flight ({state})")
        pending = self._pending
        for entry in flight.entries:
            del pending[entry.key]
        self._in_flight_calls -= len(flight.entries)
        self._completed += 1
        container = self._containers[flight.batch.container]
        container.in_flight -= 1
        for line in flight.lines:
            line.in_flight = 0
            if line.queue:
                held = len(line.queue)
                line.ready_at = now
                container.ready[line.slot] = line
                container.ready_calls += held
                self._held -= held
                self._ready += held
            else:
                del self._lines[line.slot]
        self._schedule(container)

    def withdraw(self, call: SlotCall) -> bool:
        """Take back ``call`` if it is still queued (its caller was cancelled).

        Returns True when it was queued and is now gone for good; False when it is unknown,
        already withdrawn, or already in flight (then its batch carries it and ``complete``
        still applies).
        """
        entry = self._pending.get((call.lease, call.call.id))
        if entry is None or entry.batch:
            return False
        del self._pending[entry.key]
        line = entry.line
        line.queue.remove(entry)
        self._withdrawn += 1
        if line.in_flight:
            self._held -= 1
            return True
        self._ready -= 1
        container = self._containers[line.container]
        container.ready_calls -= 1
        if not line.queue:
            # The slot leaves the ready order; its window anchor goes with it.
            del container.ready[line.slot]
            del self._lines[line.slot]
            line.ready_at = None
        self._schedule(container)
        return True

    # ------------------------------------------------------------------ queries

    def next_deadline(self) -> float | None:
        """When ``due`` will next return a batch if nothing else happens, or None if never.

        A value at or before the last ``now`` means a batch is due already.
        """
        heap = self._heap
        while heap:
            deadline, _, name = heap[0]
            container = self._containers.get(name)
            if container is not None and container.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def in_flight(self) -> list[Batch]:
        """The batches sent and not completed, oldest first."""
        return [flight.batch for flight in self._flights.values()]

    def statistics(self) -> BatchPlannerStatistics:
        """A frozen snapshot of the counts."""
        closed = self._closed
        return BatchPlannerStatistics(
            ready=self._ready,
            held=self._held,
            in_flight_batches=len(self._flights),
            in_flight_calls=self._in_flight_calls,
            offered=self._offered,
            withdrawn=self._withdrawn,
            batches_sent=self._next_batch - 1,
            calls_sent=self._calls_sent,
            batches_completed=self._completed,
            closed_full=closed[BatchClose.FULL],
            closed_eager=closed[BatchClose.EAGER],
            closed_window=closed[BatchClose.WINDOW],
        )

    def check_valid(self) -> None:
        """Check every internal invariant; raise AssertionError naming the first one broken.

        O(everything): for tests and debugging, not for hot paths.
        """
        seen: set[_CallKey] = set()
        ready, held = self._check_lines(seen)
        in_flight_calls = self._check_flights(seen)
        _check(seen == set(self._pending), "pending calls and queues disagree")
        _check(ready == self._ready, f"ready count {self._ready} != {ready}")
        _check(held == self._held, f"held count {self._held} != {held}")
        _check(in_flight_calls == self._in_flight_calls, "in-flight call count")
        self._check_containers()
        _check(
            self._offered == self._ready + self._held + self._calls_sent + self._withdrawn,
            "offered calls are not all accounted for",
        )

    def _check_lines(self, seen: set[_CallKey]) -> tuple[int, int]:
        ready = held = 0
        for slot, line in self._lines.items():
            _check(line.slot == slot and line.container == slot.container, f"line {slot} filed")
            _check(bool(line.queue) or line.in_flight != 0, f"slot {slot} is empty but kept")
            container = self._containers.get(line.container)
            _check(container is not None, f"slot {slot} has no container")
            assert container is not None
            if line.in_flight:
                _check(line.ready_at is None, f"slot {slot} is both ready and in flight")
                _check(slot not in container.ready, f"in-flight slot {slot} in ready order")
                _check(line.in_flight in self._flights, f"slot {slot} holds a finished batch")
                _check(line in self._flights[line.in_flight].lines, f"slot {slot} not in batch")
                held += len(line.queue)
            else:
                _check(line.ready_at is not None, f"ready slot {slot} has no ready time")
                _check(container.ready.get(slot) is line, f"ready slot {slot} not in order")
                ready += len(line.queue)
            for entry in line.queue:
                _check(entry.line is line and entry.batch == 0, f"queued call in {slot} sent")
                _check(self._pending.get(entry.key) is entry, f"queued call in {slot} unknown")
                _check(entry.key not in seen, f"call {entry.key[1]!r} queued twice")
                seen.add(entry.key)
        return ready, held

    def _check_flights(self, seen: set[_CallKey]) -> int:
        in_flight_calls = 0
        for batch_id, flight in self._flights.items():
            batch = flight.batch
            _check(batch.id == batch_id, f"batch {batch_id} filed under another id")
            _check(
                0 < len(batch.calls) <= self.config.max_batch_size,
                f"batch {batch_id} has {len(batch.calls)} calls",
            )
            _check([e.call for e in flight.entries] == list(batch.calls), f"batch {batch_id} calls")
            for entry in flight.entries:
                _check(entry.batch == batch_id, f"call {entry.key[1]!r} in two batches")
                _check(entry.call.container == batch.container, f"batch {batch_id} mixes")
                _check(self._pending.get(entry.key) is entry, f"sent call {entry.key[1]!r} lost")
                _check(entry.key not in seen, f"call {entry.key[1]!r} pending twice")
                seen.add(entry.key)
                _check(entry.line in flight.lines, f"batch {batch_id} misses a line")
            for line in flight.lines:
                _check(line.in_flight == batch_id, f"batch {batch_id} lost slot {line.slot}")
                _check(self._lines.get(line.slot) is line, f"batch {batch_id} slot unfiled")
            in_flight_calls += len(flight.entries)
        return in_flight_calls

    def _check_containers(self) -> None:
        live = {(d, name) for d, _, name in self._heap}
        for name, container in self._containers.items():
            _check(container.name == name, f"container {name} filed under another name")
            _check(bool(container.ready) or container.in_flight > 0, f"{name} empty but kept")
            counted = sum(len(line.queue) for line in container.ready.values())
            _check(counted == container.ready_calls, f"{name} ready count")
            flights = sum(1 for f in self._flights.values() if f.batch.container == name)
            _check(flights == container.in_flight, f"{name} in-flight count")
            previous = -math.inf
            for line in container.ready.values():
                assert line.ready_at is not None
                _check(line.ready_at >= previous, f"{name} ready order is not oldest first")
                previous = line.ready_at
            _check(container.deadline == self._deadline(container), f"{name} deadline stale")
            if container.deadline is not None:
                _check((container.deadline, name) in live, f"{name} deadline not scheduled")

    # ------------------------------------------------------------------ internals

    def _tick(self, now: float, event: str) -> None:
        if not now >= self._now:  # also refuses NaN
            raise InvalidInput("now", f"{event}: time went backwards ({now!r} < {self._now!r})")
        self._now = now

    def _deadline(self, container: _Container) -> float | None:
        if not container.ready:
            return None
        first = next(iter(container.ready.values()))
        assert first.ready_at is not None
        config = self.config
        if container.ready_calls >= config.max_batch_size or (
            config.eager and not container.in_flight
        ):
            return first.ready_at
        return first.ready_at + config.window_s

    def _schedule(self, container: _Container) -> None:
        """Bring the container's deadline (and its heap entry) up to date; drop it when empty."""
        deadline = self._deadline(container)
        if deadline is None and not container.in_flight:
            del self._containers[container.name]
            return
        if deadline == container.deadline:
            return
        container.deadline = deadline
        if deadline is not None:
            self._seq += 1
            heapq.heappush(self._heap, (deadline, self._seq, container.name))
            if len(self._heap) > 64 + 4 * len(self._containers):
                self._compact()

    def _compact(self) -> None:
        self._heap[:] = [
            (c.deadline, i, c.name)
            for i, c in enumerate(self._containers.values())
            if c.deadline is not None
        ]
        heapq.heapify(self._heap)

    def _closing(self, container: _Container, now: float) -> BatchClose | None:
        config = self.config
        if container.ready_calls >= config.max_batch_size:
            return BatchClose.FULL
        if config.eager and not container.in_flight:
            return BatchClose.EAGER
        first = next(iter(container.ready.values()))
        assert first.ready_at is not None
        if first.ready_at + config.window_s <= now:
            return BatchClose.WINDOW
        return None

    def _send(self, container: _Container, now: float, reason: BatchClose) -> Batch:
        batch_id = self._next_batch
        self._next_batch += 1
        room = self.config.max_batch_size
        entries: list[_Pending] = []
        lines: list[_Line] = []
        ready = container.ready
        opened_at = next(iter(ready.values())).ready_at
        assert opened_at is not None
        while room and ready:
            _, line = ready.popitem(last=False)
            queue = line.queue
            take = min(room, len(queue))
            for _ in range(take):
                entry = queue.popleft()
                entry.batch = batch_id
                entries.append(entry)
            room -= take
            line.ready_at = None
            line.in_flight = batch_id
            lines.append(line)
            rest = len(queue)  # a full batch leaves the rest of the slot held
            container.ready_calls -= take + rest
            self._ready -= take + rest
            self._held += rest
        sent = len(entries)
        batch = Batch(
            id=batch_id,
            container=container.name,
            calls=tuple(entry.call for entry in entries),
            opened_at=opened_at,
            sent_at=now,
            reason=reason,
        )
        self._flights[batch_id] = _Flight(batch, entries, lines)
        container.in_flight += 1
        self._in_flight_calls += sent
        self._calls_sent += sent
        self._closed[reason] += 1
        return batch
