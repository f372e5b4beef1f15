"""The tool dispatcher: many trajectories' tool calls, one request per container per window.

Trajectories call ``await dispatcher.run(calls)`` from their own tasks; the dispatcher offers the
calls to the domain ``BatchPlanner``, sends each batch the planner says is due as one
``SandboxPool.execute`` request, and hands every caller its own results. The I/O lives here; every
decision (which calls share a request, when a batch closes, the order of one slot's calls) is the
planner's.

Rules it keeps:

- Each batch runs in a task of its own, so a slow or dead container never delays another; the
  loop itself only asks the planner what is due and sleeps until ``next_deadline()`` or until an
  offer or a completed batch makes something due before that. A caller whose calls are the only
  ones outstanding, and whose offer makes a batch due at once while the loop sleeps, hands it out
  itself, as the loop would (the loop's turn was one event-loop iteration on the path of every
  call made alone); with other calls outstanding the loop's turn gathers the offers that their
  results bring in the same iteration into one batch.
- It never leases slots: callers arrive holding their leases (the upstream deadlock came from
  acquiring slots inside the dispatch loop).
- Nothing hangs: every batch runs under a deadline of its slowest slot's call timeouts added
  up (a slot server runs one slot's calls one after another) plus ``grace_s``; a batch that
  overruns, raises, or answers with the wrong number of results gives each of its calls an
  ``INFRA_ERROR`` result naming what happened. The deadline counts time the event loop ran
  (one task watches every batch's): a stretch in which it did not (a long synchronous step, a
  CPU starved by load) is added, as the slot server's client adds it. The deadline is a
  backstop: a pool bounds its own batches (a slot server's client gives the server up at the
  same sum plus its own grace, and the pool loses that server), so ``DISPATCH_GRACE_S`` is
  longer than that grace.
- A call's turn's time left (``SlotCall.time_left_s``) counts from its offer: a call that waited
  here (behind its slot's earlier batch) goes out with that much less, and one whose time ran out
  while it waited is answered ``TIMEOUT`` without going out (``slots.time_left_spent``).
- A cancelled caller withdraws its calls that are still queued; calls already in flight finish and
  their results are dropped. No one else loses a result, and nothing is released twice (the
  dispatcher holds no lease).

Every call passes through here, so the hot path looks the event loop up once, when the
dispatcher starts (``_Backend``): ``anyio.current_time()`` and ``anyio.Event()`` each find the
running backend anew on every use (a context lookup and the current task), which was a tenth of
the env process's CPU per call at 64 trajectories (docs/benchmarks.md). Given ``loop_hooks``
(``trajcore.ports.event_loop``), it takes the clock and the result waiters from the running
loop's adapter instead (on asyncio, ``trajcore.adapters.event_loops.asyncio_hooks``: the loop's
clock, one future per call), with the same cancellation points. For the same reason a task that
has sent its batch waits for the next one (``_Courier``, at most ``_IDLE_COURIERS`` waiting)
instead of ending, so a batch starts a task only when every earlier one is still busy, and the
loop is woken only when a batch became due before it would look anyway.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence

import anyio
import anyio.abc
import attrs

from trajcore.domain.batch_planner import Batch, BatchConfig, BatchPlanner
from trajcore.domain.errors import PoolClosed
from trajcore.domain.slots import SlotCall, time_left_spent
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.ports.event_loop import LoopHooks, ResultWaiter
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = ["DISPATCH_GRACE_S", "DispatcherStatistics", "ToolDispatcher"]

DISPATCH_GRACE_S = 30.0
"""The default slack past a batch's limit before the dispatcher abandons it: longer than a slot
server client's own (15 s), so that a hung server fails its batch at the client first, which
loses it, and the dispatcher's deadline only catches a pool that does not bound itself."""

_LOOK_S = 1.0
"""Longest the watch of batch deadlines waits between looks while batches are in flight."""
_STALL_ROOM_S = 30.0
"""What stalls of the event loop may add to one batch's deadline in all, at the least (its
limit when longer): a loop that is always held up still abandons an overrun batch."""
_STALL_S = 0.5
"""A look this much later than due means the event loop did not run meanwhile (``_watch``)."""

_IDLE_COURIERS = 64
"""Most tasks kept waiting for a next batch; a task that finds this many waiting ends."""


@attrs.frozen(kw_only=True)
class DispatcherStatistics:
    """Counts since the dispatcher started.

    Attributes:
        batches: Requests sent to containers.
        calls: Calls delivered in those requests.
        failed_batches: Batches that raised, overran or answered wrongly (their calls got
            ``INFRA_ERROR`` results).
        withdrawn: Calls withdrawn by cancelled callers before they went out.
        largest_batch: The most calls one request carried.
    """

    batches: int = 0
    calls: int = 0
    failed_batches: int = 0
    withdrawn: int = 0
    largest_batch: int = 0


class _Waiter:
    """Where one call's result waits for its caller, on any backend (an anyio event)."""

    __slots__ = ("_done", "_result")

    def __init__(self, done: anyio.Event) -> None:
        self._done = done
        self._result: ToolResult | None = None

    def deliver(self, result: ToolResult | None) -> None:
        """Hand the caller ``result`` (``None``: the dispatcher stopped); the first one counts."""
        if not self._done.is_set():
            self._result = result
            self._done.set()

    def delivered(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> ToolResult | None:
        await self._done.wait()
        return self._result


class _Courier:
    """A task that sent a batch, waiting for the next one: the loop sets ``batch``, then
    ``ready``."""

    __slots__ = ("batch", "ready")

    def __init__(self, ready: anyio.Event) -> None:
        self.ready = ready
        self.batch: Batch | None = None


@attrs.frozen
class _Backend:
    """The running backend's clock, event and cancel scope classes and waiters, looked up once
    (see the module's notes).

    ``clock()`` reads what ``anyio.current_time()`` reads, ``event()`` makes what
    ``anyio.Event()`` makes and ``scope(deadline=...)`` what ``anyio.CancelScope(deadline=...)``
    makes, in the event loop that was running when ``running()`` was called.
    """

    clock: Callable[[], float]
    event: Callable[[], anyio.Event]
    waiter: Callable[[], ResultWaiter]
    scope: Callable[..., anyio.CancelScope] = anyio.CancelScope

    @classmethod
    def running(cls, hooks: LoopHooks | None = None) -> _Backend:
        """The running backend's, or ``hooks``' clock and waiters where given."""
        event = type(anyio.Event())  # the backend's own class; calling it skips the lookup
        try:
            scope: Callable[..., anyio.CancelScope] = type(anyio.CancelScope())  # likewise
        except RuntimeError:  # no loop is running (anyio's NoEventLoopError): the portable one
            scope = anyio.CancelScope
        if hooks is None:
            return cls(
                clock=anyio.current_time, event=event, waiter=lambda: _Waiter(event()), scope=scope
            )
        return cls(clock=hooks.clock, event=event, waiter=hooks.waiter, scope=scope)


class ToolDispatcher:
    """Batches tool calls per container; use as ``async with ToolDispatcher(pool, config) as d``.

    Args:
        pool: Where batches run.
        config: The batching window (``window_ms``, ``max_batch_size``, ``eager``).
        grace_s: Slack added to a batch's limit (its slowest slot's call timeouts, one after
            another, as the slot server runs them) before the batch is abandoned: a backstop
            past the pool's own limit (``DISPATCH_GRACE_S``).
        loop_hooks: Called when the dispatcher starts, in its loop: that loop's clock and
            result waiters (``trajcore.adapters.event_loops.asyncio_hooks``), or ``None`` for
            anyio's portable ones (also the default).
    """

    def __init__(
        self,
        pool: SandboxPool,
        config: BatchConfig,
        *,
        grace_s: float = DISPATCH_GRACE_S,
        loop_hooks: Callable[[], LoopHooks | None] | None = None,
    ) -> None:
        self._pool = pool
        self._loop_hooks = loop_hooks
        self._planner = BatchPlanner(config)
        self._grace_s = grace_s
        # Each call's waiter, by the identity of the SlotCall the planner hands back in its
        # batch (the planner refuses a second pending call under the same lease and id).
        self._waiters: dict[int, ResultWaiter] = {}
        self._offered: dict[int, float] = {}  # when each call with a turn's time was offered
        self._wake = anyio.Event()
        self._until = -math.inf  # when the loop next looks at the planner unless woken
        self._backend = _Backend(
            clock=anyio.current_time, event=anyio.Event, waiter=lambda: _Waiter(anyio.Event())
        )
        self.clock: Callable[[], float] = anyio.current_time
        """The running loop's time, as ``anyio.current_time()`` reads it, without looking the
        backend up again once the dispatcher has started (see the module's notes): the clock of
        every trajectory that sends its calls here. The backend's own function (on asyncio the
        loop's ``time``), so that a trajectory's reading of it is one call."""
        self._group: anyio.abc.TaskGroup | None = None
        # The context couriers start in: the dispatcher's own, not that of the caller whose
        # offer happens to start one (a courier serves every trajectory's batches after it).
        self._context = contextvars.copy_context()
        self._idle: list[_Courier] = []
        self._closed = False
        # the batches in flight: each one's cancel scope and deadline (``_watch``)
        self._deadlines: dict[anyio.CancelScope, float] = {}
        self._room: dict[anyio.CancelScope, float] = {}  # what stalls may still add to each
        self._watch_wake = anyio.Event()
        self._watch_until = math.inf  # when the watch next looks unless woken
        # batches, calls, failed batches, withdrawn calls, largest batch
        self._counts = [0, 0, 0, 0, 0]

    async def __aenter__(self) -> ToolDispatcher:
        self._backend = _Backend.running(None if self._loop_hooks is None else self._loop_hooks())
        self.clock = self._backend.clock
        self._context = contextvars.copy_context()
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._watch_wake = self._backend.event()
        self._group.start_soon(self._loop, self._group)
        self._group.start_soon(self._watch)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closed = True
        group, self._group = self._group, None
        if group is not None:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
        for waiter in self._waiters.values():
            waiter.deliver(None)  # their callers see no result and raise PoolClosed

    def statistics(self) -> DispatcherStatistics:
        """A snapshot of the counts so far."""
        batches, calls, failed, withdrawn, largest = self._counts
        return DispatcherStatistics(
            batches=batches, calls=calls, failed_batches=failed, withdrawn=withdrawn,
            largest_batch=largest,
        )  # fmt: skip

    async def run(self, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """Run ``calls`` (offered together, so they may share a batch); results in their order.

        Failures are results, not exceptions (see ``SandboxPool.execute``).

        Raises:
            PoolClosed: the dispatcher is not running or stopped before the results came.
            InvalidInput / StateError: a call is already pending under the same key.
        """
        if self._group is None or self._closed:
            raise PoolClosed("the tool dispatcher is not running")
        backend = self._backend
        now = backend.clock()
        planner, registered, offered = self._planner, self._waiters, self._offered
        waiters: list[tuple[SlotCall, ResultWaiter]] = []
        results: list[ToolResult] = []
        try:
            for call in calls:
                waiter = backend.waiter()
                planner.offer(call, now)
                registered[id(call)] = waiter
                waiters.append((call, waiter))
                if call.time_left_s is not None:
                    offered[id(call)] = now
            if len(registered) == len(waiters):  # no other caller's call is outstanding
                self._offered_alone(now)
            else:
                self._nudge()
            for _call, waiter in waiters:
                result = await waiter.wait()
                if result is None:
                    raise PoolClosed("the tool dispatcher stopped before the call returned")
                results.append(result)
            return results
        finally:
            withdrawn = 0
            every = len(results) == len(waiters)  # each waiter delivered: nothing to withdraw
            for call, waiter in waiters:
                registered.pop(id(call), None)
                if offered:
                    offered.pop(id(call), None)
                if every or waiter.delivered() or self._closed:
                    continue
                if planner.withdraw(call):  # still queued: it never goes out
                    withdrawn += 1
            if withdrawn:
                self._counts[3] += withdrawn
                self._wake.set()

    def _offered_alone(self, now: float) -> None:
        """After the offer of a caller whose calls are the only ones outstanding: send what is
        due at once from here, or wake the loop.

        When the loop sleeps (nothing woke it since it last looked) and the offer made a batch
        due now (eager mode and an idle container, or a full batch), the batch is handed to a
        courier here, as the loop would hand it, without a turn of the loop first: that turn was
        one event-loop iteration on the path of every call made alone. Where other calls are
        outstanding, their callers may offer in the same iteration when their results come, and
        the loop's turn gathers those offers into one batch, so they go through ``_nudge``.
        """
        if self._until == -math.inf:
            return  # it is looking now, or woken already
        deadline = self._planner.next_deadline()
        if deadline is not None and deadline <= now and self._group is not None:
            self._hand_out(self._group, now)
        self._nudge()

    def _nudge(self) -> None:
        """Wake the loop when the planner now has a batch due before the loop would look."""
        if self._until == -math.inf:
            return  # it is looking now, or woken already
        deadline = self._planner.next_deadline()
        if deadline is not None and deadline < self._until:
            self._until = -math.inf
            self._wake.set()

    def _hand_out(self, group: anyio.abc.TaskGroup, now: float) -> None:
        """Give each batch due at ``now`` to a waiting courier, or to a new one."""
        for batch in self._planner.due(now):
            if self._idle:
                courier = self._idle.pop()
                courier.batch = batch
                courier.ready.set()
            else:
                self._context.run(group.start_soon, self._courier, batch)

    async def _loop(self, group: anyio.abc.TaskGroup) -> None:
        clock, event, scope = self._backend.clock, self._backend.event, self._backend.scope
        while True:
            self._hand_out(group, clock())
            deadline = self._planner.next_deadline()
            if deadline is None:
                self._until = math.inf
                await self._wake.wait()
            else:
                self._until = deadline
                with scope(deadline=deadline):  # anyio.move_on_after, until the deadline
                    await self._wake.wait()
            self._until = -math.inf  # looking now: no one need wake it
            self._wake = event()

    async def _watch(self) -> None:
        """Cancel each batch past its deadline, counted in time the event loop ran: a look that
        comes more than ``_STALL_S`` after it was due (the loop was held up by a long synchronous
        step or starved of CPU, while the batch's answer may have come) moves every deadline by
        that much and ``_LOOK_S`` more, for the loop to read what came meanwhile, up to
        ``_STALL_ROOM_S`` (or the batch's limit) in all (a loop always held up still gives up
        on a batch). It
        looks at least every ``_LOOK_S`` while batches are in flight."""
        clock, event, scope, deadlines = (
            self._backend.clock, self._backend.event, self._backend.scope, self._deadlines
        )  # fmt: skip
        while True:
            now = clock()
            due = min(*deadlines.values(), now + _LOOK_S) if deadlines else math.inf
            self._watch_until = due
            if due > now:
                with scope(deadline=due):
                    await self._watch_wake.wait()
            self._watch_wake = event()
            self._watch_until = -math.inf  # looking now
            looked = clock()
            late = looked - due
            if late > _STALL_S:  # and a look's time to read what came meanwhile
                for batch in deadlines:  # at most the limit once more in all
                    extra = min(late + _LOOK_S, self._room.get(batch, 0.0))
                    deadlines[batch] += extra
                    self._room[batch] = self._room.get(batch, 0.0) - extra
            for batch, deadline in list(deadlines.items()):
                if deadline <= looked:
                    del deadlines[batch]
                    self._room.pop(batch, None)
                    batch.cancel()

    async def _courier(self, batch: Batch) -> None:
        """Send ``batch``, then each batch the loop hands over while this task waits."""
        event, idle = self._backend.event, self._idle
        while True:
            await self._send(batch)
            if len(idle) >= _IDLE_COURIERS:
                return
            courier = _Courier(event())
            idle.append(courier)
            await courier.ready.wait()  # cancelled with the dispatcher's task group
            assert courier.batch is not None
            batch = courier.batch

    def _on_time(self, calls: list[SlotCall]) -> tuple[list[SlotCall], list[SlotCall]]:
        """The calls of a batch still to send, and the same as they go out: a turn's time left
        less what they waited here. Those whose turn's time ran out while they waited are
        answered now, ``TIMEOUT`` without going out, as the slot would answer them."""
        now, offered = self._backend.clock(), self._offered
        kept: list[SlotCall] = []
        sent: list[SlotCall] = []
        for call in calls:
            since, given = offered.get(id(call)), call.time_left_s
            if since is None or given is None or now <= since:
                kept.append(call)
                sent.append(call)
            elif given > now - since:
                kept.append(call)
                sent.append(attrs.evolve(call, time_left_s=given - (now - since)))
            elif (waiter := self._waiters.get(id(call))) is not None:
                reason = time_left_spent(given)
                waiter.deliver(ToolResult.failure(call.call, ToolOutcome.TIMEOUT, reason))
        return kept, sent

    async def _send(self, batch: Batch) -> None:
        calls = sent = list(batch.calls)
        if self._offered:
            calls, sent = self._on_time(calls)
            if not calls:  # every one was answered: its turn's time ran out here
                self._planner.complete(batch.id, self._backend.clock())
                self._nudge()
                return
        if len(calls) == 1:
            limit = calls[0].timeout_s + self._grace_s
        else:  # a slot runs its calls one after another: its timeouts add up
            # by index: the batch is one container's, and an int hashes without a call of ours
            per_slot: dict[int, float] = {}
            for call in calls:
                slot = call.lease.slot.index
                per_slot[slot] = per_slot.get(slot, 0.0) + call.timeout_s
            limit = max(per_slot.values()) + self._grace_s
        failure: str | None = None
        results: list[ToolResult] = []
        backend = self._backend
        scope = backend.scope()
        deadline = self._deadlines[scope] = backend.clock() + limit
        self._room[scope] = max(limit, _STALL_ROOM_S)
        if deadline < self._watch_until:
            self._watch_wake.set()
        with scope:
            try:
                results = await self._pool.execute(batch.container, sent)
            except PoolClosed:
                failure = "the sandbox pool is closed"
            except Exception as exc:  # noqa: BLE001 - any adapter failure becomes per-call results
                failure = f"batch to {batch.container} failed: {type(exc).__name__}: {exc}"
        self._deadlines.pop(scope, None)
        self._room.pop(scope, None)
        if scope.cancelled_caught:
            failure = f"batch to container {batch.container} overran its {limit:.1f}s deadline"
        elif failure is None and len(results) != len(calls):
            failure = f"{batch.container} answered {len(results)} results for {len(calls)} calls"
        if failure is not None:
            results = ToolResult.infra_errors((call.call for call in calls), failure)
        registered = self._waiters
        for call, result in zip(calls, results, strict=True):
            waiter = registered.get(id(call))
            if waiter is not None:
                waiter.deliver(result)
        self._planner.complete(batch.id, self._backend.clock())
        counts = self._counts
        counts[0] += 1
        counts[1] += len(calls)
        counts[2] += failure is not None
        counts[4] = max(counts[4], len(calls))
        self._nudge()
