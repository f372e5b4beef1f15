"""A slot server's calls carried out in their slots' turns: the execute half of ``SlotRuntime``.

Each call is taken in by its slot's ``SlotCalls`` (``domain/slot_calls``) as it arrives, and the
queue's turns are carried out here: a command for a lease whose agent is idle is sent to it at
once (``tool_calls.start_call``) and answered from the channel's read callback; anything else
runs in a task of its own (``tool_calls.run_call``). A call's future is shared by every repeat of
its ``call_id``. A call that carries its turn's time left (``time_left_s``) has it counted from
the request's arrival: it runs under what remains when it starts, and one left none is answered
``TIMEOUT`` without running (``slots.time_left_spent``), for the calls before it in the slot
spent its turn's time.

``execute_now`` is the path a request takes: the batch is submitted, and its agents written to,
before it returns, and the batch's results go to a plain callback from the last call's answer,
so between the request read and the agent's request, and between the agent's reply and the
response, the event loop runs no iteration of its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from trajcore.adapters.slot_server.channel import AgentLost
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.tool_calls import (
    failure,
    lease_refusal,
    lost_result,
    refused,
    run_call,
    start_call,
)
from trajcore.domain.slot_calls import (
    Accepted,
    Answered,
    CallTicket,
    Closing,
    Joined,
    RefuseCall,
    Refused,
    RunReset,
)
from trajcore.domain.slot_protocol import Capabilities, ExecuteCall
from trajcore.domain.slots import time_left_spent
from trajcore.domain.tools import ToolOutcome, ToolResult

__all__ = ["CallTurns", "setter"]


def setter(future: asyncio.Future[list[ToolResult]]) -> Callable[[list[ToolResult]], None]:
    """A ``done`` for ``execute_now`` that sets ``future`` (unless it was cancelled)."""

    def done(results: list[ToolResult]) -> None:
        if not future.done():
            future.set_result(results)

    return done


class CallTurns:
    """The execute half of ``SlotRuntime`` (which holds these attributes)."""

    capabilities: Capabilities
    _sandboxes: Sandboxes
    _slots: list[Slot]
    _tasks: set[asyncio.Task[None]]
    _closed: bool
    _listeners: dict[asyncio.Future[ToolResult], list[Callable[[], None]]]

    async def execute(self, calls: Sequence[ExecuteCall]) -> list[ToolResult]:
        """Run a batch; one result per call, in order. Never raises for a call's failure.

        A cancelled request stops waiting and nothing else: its calls go on (their futures
        are shared with any repeat of the same ``call_id``)."""
        waiter: asyncio.Future[list[ToolResult]] = asyncio.get_running_loop().create_future()
        results = self.execute_now(calls, setter(waiter))
        return results if results is not None else await waiter

    def execute_now(
        self, calls: Sequence[ExecuteCall], done: Callable[[list[ToolResult]], None]
    ) -> list[ToolResult] | None:
        """Submit a batch now: every call whose turn has come is sent to its lease's agent
        before this returns. The results, one per call in order, when all are answered at once;
        else ``None``, and ``done`` gets them once, called from the last call's answer (no
        task, no loop iteration between). ``done`` must not raise."""
        loop = asyncio.get_running_loop()
        create, now = loop.create_future, loop.time()
        futures = [self._submit(call, create(), now) for call in calls]
        pending = [future for future in futures if not future.done()]
        if not pending:
            return [future.result() for future in futures]
        left = len(pending)

        def one_answered() -> None:
            nonlocal left
            left -= 1
            if not left:
                done([future.result() for future in futures])

        listeners = self._listeners
        for future in pending:  # a call twice in the batch is one future, counted twice
            waiting = listeners.get(future)
            if waiting is None:
                listeners[future] = [one_answered]
            else:
                waiting.append(one_answered)
        return None

    def _submit(
        self, call: ExecuteCall, done: asyncio.Future[ToolResult], now: float
    ) -> asyncio.Future[ToolResult]:
        """The future of ``call``'s result (``done``, a new future, unless the call joins one
        already under way), after the slot's queue has taken it in (``now``: the request's
        arrival, by the loop's clock)."""
        if self._closed:
            done.set_result(refused(call, Closing()))
            return done
        if not 0 <= call.slot < len(self._slots):
            reason = f"slot {call.slot} does not exist @ $.slot"
            done.set_result(lease_refusal(call, reason))
            return done
        slot = self._slots[call.slot]
        submission = slot.calls.submit(call.epoch, call.call_id)
        if isinstance(submission, Accepted):  # the common case first
            slot.answers[submission.ticket.number] = (call, done)
            if call.time_left_s is not None:
                slot.time_ends[submission.ticket.number] = now + call.time_left_s
            self._take_turns(slot)
        elif isinstance(submission, Joined):
            return slot.answers[submission.ticket.number][1]
        elif isinstance(submission, Answered):
            done.set_result(submission.result)
        else:
            assert isinstance(submission, Refused)
            done.set_result(refused(call, submission.reason))
        return done

    def _take_turns(self, slot: Slot) -> None:
        """Carry out the slot's next turns: answer refused calls, start the next call's task or
        let the waiting reset go on. Returns once a turn is under way or none is left."""
        while (turn := slot.calls.next_turn()) is not None:
            if isinstance(turn, RunReset):
                waiter = slot.reset_turns.pop(turn.ticket.number)
                if not waiter.done():
                    waiter.set_result(None)
                return
            call = slot.answers[turn.ticket.number][0]
            ends = None
            if call.time_left_s is not None:
                ends = slot.time_ends.pop(turn.ticket.number, None)
            if isinstance(turn, RefuseCall):
                self._answer(slot, turn.ticket, refused(call, turn.reason))
                continue
            left = None if ends is None else ends - asyncio.get_running_loop().time()
            if left is not None and left <= 0:
                self._answer(slot, turn.ticket, _unstarted(call))
                continue
            if not call.hook:
                slot.model_ran = call.epoch
            elif self._measures_hooks() and slot.model_ran == call.epoch:
                # measured first, off the fast path
                self._run_task(slot, turn.ticket, call, ends=ends)
                return
            try:
                started = start_call(
                    self._sandboxes, slot, call, unsandboxed_why=self.capabilities.detail,
                    done=functools.partial(self._sent_call_done, slot, turn.ticket, call),
                    time_left_s=left,
                )  # fmt: skip
            except Exception as error:  # noqa: BLE001 - one call's fault, never the batch's
                reason = f"slot server fault: {type(error).__name__}: {error}"
                started = failure(call, ToolOutcome.INFRA_ERROR, reason)
            if isinstance(started, ToolResult):
                self._answer(slot, turn.ticket, started)
                continue
            if started:
                return
            self._run_task(slot, turn.ticket, call, ends=ends)
            return

    def _settle(
        self, slot: Slot, ticket: CallTicket, call: ExecuteCall, task: asyncio.Task[None]
    ) -> None:
        """A call's task ended: forget it, and if it never answered (cancelled before it
        began), answer it as closing and let the slot's next turn go on, so no call and no
        reset waits for it."""
        self._tasks.discard(task)
        if ticket.number in slot.answers:
            self._answer(slot, ticket, refused(call, Closing()))
            self._take_turns(slot)

    def _sent_call_done(
        self, slot: Slot, ticket: CallTicket, call: ExecuteCall, outcome: ToolResult | AgentLost
    ) -> None:
        """A call ``start_call`` sent has its reply (answer it, go on with the slot's turns), or
        its lease was lost (stop the agent first, then answer, as ``run_call`` does)."""
        if isinstance(outcome, ToolResult):
            self._answer(slot, ticket, outcome)
            self._take_turns(slot)
            return
        if self._closed:  # aclose ends the agent itself
            self._answer(slot, ticket, refused(call, Closing()))
            return
        self._run_task(slot, ticket, call, outcome)

    def _run_task(
        self, slot: Slot, ticket: CallTicket, call: ExecuteCall, lost: AgentLost | None = None,
        *, ends: float | None = None,
    ) -> None:  # fmt: skip
        run = self._run_turn(slot, ticket, call, lost, ends)
        task = asyncio.get_running_loop().create_task(run)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._settle, slot, ticket, call))

    async def _run_turn(
        self, slot: Slot, ticket: CallTicket, call: ExecuteCall, lost: AgentLost | None,
        ends: float | None,
    ) -> None:  # fmt: skip
        """Run the call (or, when a call ``start_call`` sent ``lost`` its lease, stop the agent
        first and then answer it, as ``run_call`` does), by ``ends`` (the loop's time its
        turn's time runs out, if it has one), answer it, go on with the turns."""
        result: ToolResult
        try:
            if call.hook and lost is None:
                await self._before_hook(slot, call)
            left = None if ends is None else ends - asyncio.get_running_loop().time()
            if left is not None and left <= 0:  # the hook's measure took the rest
                result = _unstarted(call)
            elif lost is None:
                result = await run_call(
                    self._sandboxes,
                    slot,
                    call,
                    unsandboxed_why=self.capabilities.detail,
                    time_left_s=left,
                )
            else:
                await self._sandboxes.stop_agent(slot)
                result = lost_result(slot, call, lost)
        except asyncio.CancelledError:
            result = refused(call, Closing())
        except Exception as error:  # noqa: BLE001 - every call gets a result, whatever failed
            reason = f"slot server fault: {type(error).__name__}: {error}"
            result = failure(call, ToolOutcome.INFRA_ERROR, reason)
        self._answer(slot, ticket, result)
        self._take_turns(slot)

    def _measures_hooks(self) -> bool:
        """Whether a hook's call waits for ``_before_hook`` (the runtime's disk budget)."""
        return False

    async def _before_hook(self, slot: Slot, call: ExecuteCall) -> None:
        """What runs before a hook's call (the runtime measures the lease's disk)."""

    def _answer(self, slot: Slot, ticket: CallTicket, result: ToolResult) -> None:
        if slot.time_ends:  # a call answered before its turn came (a closing server)
            slot.time_ends.pop(ticket.number, None)
        slot.calls.finish(ticket, result)
        self._resolve(slot.answers.pop(ticket.number)[1], result)

    def _resolve(self, answer: asyncio.Future[ToolResult], result: ToolResult) -> None:
        """Answer a call's future, and at once whoever ``execute_now`` waits on it for."""
        if not answer.done():
            answer.set_result(result)
        for listener in self._listeners.pop(answer, ()):
            listener()


def _unstarted(call: ExecuteCall) -> ToolResult:
    """The answer to ``call`` when its turn came with its turn's time spent: ``TIMEOUT``, not
    run (the policy's time, never the infrastructure's failure)."""
    assert call.time_left_s is not None  # only such a call has a turn's time
    return failure(call, ToolOutcome.TIMEOUT, time_left_spent(call.time_left_s))
