"""One slot's call queue: the order calls and resets run in, ``call_id`` repeats, retired epochs.

A slot server keeps one ``SlotCalls`` per slot. The queue decides; the server carries out its
decisions (runs a call in the slot's sandbox, resets the slot) and reports back. It holds no
clock and does no I/O; it is generic in the result type ``R`` (the server's ``ToolResult``).

Rules it keeps:

- One turn at a time. Calls and resets take turns in the order they were submitted
  (``submit``, ``reset``); ``next_turn`` hands out the oldest waiting item once the previous
  turn has been reported done (``finish`` for a call, ``reset_done`` for a reset).
- Every accepted call gets exactly one result, never lost: a ``RunCall`` turn is answered by the
  server's ``finish``; a ``RefuseCall`` turn names a typed ``Refusal`` that the server turns into
  the call's result and also reports with ``finish``; ``close`` hands back every call still
  waiting, to be answered by the server, and refuses everything submitted later.
- A call runs at most once per ``(epoch, call_id)``: a repeat of a call that is still waiting or
  running *joins* it (``Joined``: the same ticket, so the same result), a repeat of a finished
  one is *answered* with the first result (``Answered``). Finished results are remembered up to
  ``remember`` per slot, oldest forgotten first; a waiting or running call is never forgotten.
- ``reset(epoch)`` retires ``epoch`` and every earlier one at once: a call of a retired epoch is
  refused with ``StaleEpoch`` when submitted, and also when its turn comes (it was queued before
  the reset). Only a call already running when the reset arrives is left to the server to
  interrupt. When the reset is done, the results of retired epochs are forgotten: their calls
  are refused from then on, never run.
- A reset that could not prove the slot clean reports ``reset_done(problem=...)``: the slot is
  *broken* from then on and every later call is refused with ``SlotBroken``.
- A reset whose turn has not come may be withdrawn (``reset_done`` before its turn, e.g. when
  the server gave up waiting): it leaves the queue and the epochs stay retired.

Illegal moves (finishing a call whose turn it is not, a reset reported twice) raise
``StateError`` naming the event and the ticket.

Cost: every operation is O(1) amortised, but ``reset_done`` which is O(remembered results).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, TypeVar

import attrs

from trajcore.domain.errors import InvalidInput, StateError
from trajcore.domain.validators import positive_int

__all__ = [
    "Accepted",
    "Answered",
    "CallTicket",
    "Closing",
    "Joined",
    "Refusal",
    "RefuseCall",
    "Refused",
    "ResetTicket",
    "RunCall",
    "RunReset",
    "SlotBroken",
    "SlotCallStatistics",
    "SlotCalls",
    "StaleEpoch",
    "Submission",
    "Ticketed",
    "Turn",
]

R = TypeVar("R")


# ---------------------------------------------------------------------------- tickets


@attrs.frozen(kw_only=True)
class CallTicket:
    """An accepted call.

    Attributes:
        number: The queue's number for it, unique per queue, growing in submission order
            (shared with ``ResetTicket``).
        epoch: The lease epoch the call was made under.
        call_id: The caller's id for the call.
    """

    number: int
    epoch: int
    call_id: str


@attrs.frozen(kw_only=True)
class ResetTicket:
    """A queued reset.

    Attributes:
        number: The queue's number for it (shared with ``CallTicket``).
        epoch: The epoch it retires (with every earlier one).
    """

    number: int
    epoch: int


# ---------------------------------------------------------------------------- refusals


@attrs.frozen(kw_only=True)
class StaleEpoch:
    """The call's lease epoch was retired by a reset."""

    epoch: int
    retired: int

    @property
    def message(self) -> str:
        return (
            f"lease epoch {self.epoch} is stale: slot was reset through epoch {self.retired}"
            " @ $.epoch"
        )


@attrs.frozen(kw_only=True)
class SlotBroken:
    """A reset could not prove the slot clean; it runs nothing more."""

    problem: str

    @property
    def message(self) -> str:
        return f"slot is broken: {self.problem}"


@attrs.frozen(kw_only=True)
class Closing:
    """The queue was closed: the slot server is shutting down."""

    @property
    def message(self) -> str:
        return "the slot server is closing"


Refusal = StaleEpoch | SlotBroken | Closing


# ---------------------------------------------------------------------------- submissions


@attrs.frozen(kw_only=True)
class Ticketed:
    """A submission or a turn about one call, named by the call's ticket."""

    ticket: CallTicket


class Accepted(Ticketed):
    """A new call: it gets its turn from ``next_turn``."""


class Joined(Ticketed):
    """A repeat of a call that has not finished: its result is ``ticket``'s."""


@attrs.frozen(kw_only=True)
class Answered(Generic[R]):
    """A repeat of a finished call: ``result`` is the first call's result."""

    result: R


@attrs.frozen(kw_only=True)
class Refused:
    """A call that will not run and is not remembered."""

    reason: Refusal


Submission = Accepted | Joined | Answered[R] | Refused


# ---------------------------------------------------------------------------- turns


class RunCall(Ticketed):
    """Run the call now, then report ``finish(ticket, result)``."""


@attrs.frozen(kw_only=True)
class RefuseCall(Ticketed):
    """Answer the call with ``reason`` (it must not run), then report ``finish``."""

    reason: Refusal


@attrs.frozen(kw_only=True)
class RunReset:
    """Reset the slot now, then report ``reset_done(ticket, problem)``."""

    ticket: ResetTicket


Turn = RunCall | RefuseCall | RunReset


# ---------------------------------------------------------------------------- the queue


@attrs.frozen(kw_only=True)
class SlotCallStatistics:
    """What ``SlotCalls.statistics`` reports.

    Attributes:
        retired_epoch: The highest epoch a reset has retired (0 before the first reset).
        broken: Why the slot is broken, or ``None``.
        busy: Whether a call is running (a ``RunCall`` turn not yet finished).
        calls_run: How many ``RunCall`` turns were handed out.
        waiting: How many calls and resets wait for their turn.
        closed: Whether ``close`` was called.
    """

    retired_epoch: int
    broken: str | None
    busy: bool
    calls_run: int
    waiting: int
    closed: bool


@attrs.define(kw_only=True, on_setattr=attrs.setters.NO_OP)
class SlotCalls(Generic[R]):
    """One slot's calls and resets, in order. See the module docstring for the rules.

    Attributes:
        remember: How many finished results are kept for ``call_id`` repeats; checked when
            built (the queue's own state changes several times a call, so no attribute is
            checked on assignment).
    """

    remember: int = attrs.field(default=4096, validator=positive_int)
    _numbers: int = attrs.field(init=False, default=0)
    _queue: deque[CallTicket | ResetTicket] = attrs.field(init=False, factory=deque)
    _turn: CallTicket | ResetTicket | None = attrs.field(init=False, default=None)
    _turn_runs: bool = attrs.field(init=False, default=False)
    _pending: dict[tuple[int, str], CallTicket] = attrs.field(init=False, factory=dict)
    _done: OrderedDict[tuple[int, str], R] = attrs.field(init=False, factory=OrderedDict)
    _retired: int = attrs.field(init=False, default=0)
    _broken: str | None = attrs.field(init=False, default=None)
    _closed: bool = attrs.field(init=False, default=False)
    _calls_run: int = attrs.field(init=False, default=0)

    # ------------------------------------------------------------------ what it holds

    @property
    def retired_epoch(self) -> int:
        """The highest epoch a reset has retired (0 before the first reset)."""
        return self._retired

    def statistics(self) -> SlotCallStatistics:
        """A snapshot of the queue's state."""
        return SlotCallStatistics(
            retired_epoch=self._retired,
            broken=self._broken,
            busy=self._turn_runs,
            calls_run=self._calls_run,
            waiting=len(self._queue),
            closed=self._closed,
        )

    # ------------------------------------------------------------------ events

    def submit(self, epoch: int, call_id: str) -> Submission[R]:
        """A call arrives. See ``Submission``'s kinds for what the caller does next."""
        key = (epoch, call_id)
        joined = self._pending.get(key)
        if joined is not None:
            return Joined(ticket=joined)
        if key in self._done:
            return Answered(result=self._done[key])
        if self._closed:
            return Refused(reason=Closing())
        if epoch <= self._retired:
            return Refused(reason=StaleEpoch(epoch=epoch, retired=self._retired))
        ticket = CallTicket(number=self._next_number(), epoch=epoch, call_id=call_id)
        self._pending[key] = ticket
        self._queue.append(ticket)
        return Accepted(ticket=ticket)

    def reset(self, epoch: int) -> ResetTicket:
        """Retire ``epoch`` (and every earlier one) now, and queue the slot's reset."""
        if epoch < 0:
            raise InvalidInput("epoch", f"must be at least 0, got {epoch}")
        self._retired = max(self._retired, epoch)
        ticket = ResetTicket(number=self._next_number(), epoch=epoch)
        self._queue.append(ticket)
        return ticket

    def next_turn(self) -> Turn | None:
        """The next thing to do, or ``None`` while a turn is under way or nothing waits."""
        if self._turn is not None or not self._queue:
            return None
        item = self._queue.popleft()
        self._turn = item
        if isinstance(item, ResetTicket):
            return RunReset(ticket=item)
        reason = self._refusal(item.epoch)
        if reason is not None:
            return RefuseCall(ticket=item, reason=reason)
        self._turn_runs = True
        self._calls_run += 1
        return RunCall(ticket=item)

    def finish(self, ticket: CallTicket, result: R) -> None:
        """The call whose turn it was has its result. Raises ``StateError`` for another."""
        if self._turn != ticket:
            raise StateError(f"finish: call {ticket.number} ({ticket.call_id!r}) has no turn")
        self._turn = None
        self._turn_runs = False
        self._remember(ticket, result)

    def reset_done(self, ticket: ResetTicket, problem: str | None = None) -> None:
        """The reset is over (``problem``: why the slot could not be proven clean), or it is
        withdrawn before its turn came. Forgets the results of retired epochs."""
        if self._turn == ticket:
            self._turn = None
        elif ticket in self._queue:
            self._queue.remove(ticket)
        else:
            raise StateError(f"reset_done: reset {ticket.number} is not queued nor under way")
        if problem is not None:
            self._broken = problem
        for key in [key for key in self._done if key[0] <= self._retired]:
            del self._done[key]

    def close(self) -> list[CallTicket]:
        """Refuse everything from now on; return the calls that wait for their turn (the
        caller answers each of them). A call under way is still reported with ``finish``."""
        self._closed = True
        waiting = [item for item in self._queue if isinstance(item, CallTicket)]
        self._queue = deque(item for item in self._queue if isinstance(item, ResetTicket))
        for ticket in waiting:
            del self._pending[(ticket.epoch, ticket.call_id)]
        return waiting

    def check_valid(self) -> None:
        """The queue's invariants. Raises ``AssertionError`` naming the first broken."""
        queued = [item for item in self._queue if isinstance(item, CallTicket)]
        running = [self._turn] if isinstance(self._turn, CallTicket) else []
        if set(self._pending.values()) != set(queued + running):
            raise AssertionError("check_valid: pending calls are not the queued and running")
        numbers = [item.number for item in self._queue]
        if numbers != sorted(numbers):
            raise AssertionError("check_valid: the queue is out of submission order")
        if len(self._done) > self.remember:
            raise AssertionError("check_valid: more results remembered than allowed")
        if self._turn_runs and not running:
            raise AssertionError("check_valid: busy without a running call")

    # ------------------------------------------------------------------ inside

    def _next_number(self) -> int:
        self._numbers += 1
        return self._numbers

    def _refusal(self, epoch: int) -> Refusal | None:
        if self._closed:
            return Closing()
        if epoch <= self._retired:
            return StaleEpoch(epoch=epoch, retired=self._retired)
        if self._broken is not None:
            return SlotBroken(problem=self._broken)
        return None

    def _remember(self, ticket: CallTicket, result: R) -> None:
        key = (ticket.epoch, ticket.call_id)
        del self._pending[key]
        self._done[key] = result
        while len(self._done) > self.remember:
            self._done.popitem(last=False)
