"""Models that outlast the turns' deadline, and what a trajectory of one must show, for the
score-reserve tests against the fakes and against a real slot server alike.

- ``sleeping_after``: a scripted model that makes its answer call, then ``sleep 60`` calls in
  the slot, turn after turn, never done.
- ``check_long_calls_ended_at_the_turns_deadline``: a turn of several ``sleep 60`` calls ended
  at the turns' deadline: the first killed there, the others answered ``TIMEOUT`` unrun, every
  result in the transcript, the member scored ``time_budget``.
"""

from __future__ import annotations

from collections.abc import Sequence

from trajcore.domain.agent_loop import StopReason
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.rollout.scripted import ModelScript, ScriptStep, tool_call
from trajcore.rollout.trajectory import TrajectoryResult

__all__ = ["SLEEP", "check_long_calls_ended_at_the_turns_deadline", "sleeping_after"]

SLEEP = "sleep 60"
"""A command that outlasts every deadline of these tests."""


def sleeping_after(answer: ToolCall, *, calls: int = 1) -> ModelScript:
    """The model: makes the ``answer`` call, then ``calls`` ``sleep 60`` in one turn (one call
    alone where ``calls`` is 1), turn after turn, never done."""

    def script(messages: Sequence[Message]) -> ScriptStep:
        if not any(message.role == "tool" for message in messages):
            return answer
        if calls == 1:
            return tool_call("bash", command=SLEEP)
        return [tool_call("bash", command=SLEEP) for _ in range(calls)]

    return script


def check_long_calls_ended_at_the_turns_deadline(result: TrajectoryResult, *, calls: int) -> None:
    """``result`` is of ``sleeping_after(..., calls=calls)``: its turns ended at their deadline
    in a turn of ``calls`` sleeps (the first killed there, the others ``TIMEOUT`` unrun), all of
    whose results reach the transcript, none an infrastructure error; the member is scored 1.0
    as ``time_budget``."""
    assert result.stats.stop_reason is StopReason.TIME_BUDGET, result.outcome
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.BUDGET_EXHAUSTED, 1.0)
    sleeps = [e for e in result.exchanges if e.call.arguments.get("command") == SLEEP]
    assert [e.result.outcome for e in sleeps] == [ToolOutcome.TIMEOUT] * calls, sleeps
    ran, *unrun = sleeps
    assert ran.result.exec is not None
    assert ran.result.exec.timed_out
    assert all("turn's time ran out before it could start" in (e.result.error or "") for e in unrun)
    assert [m.tool_call_id for m in result.messages[-calls:]] == [e.call.id for e in sleeps]
    assert all(e.result.outcome is not ToolOutcome.INFRA_ERROR for e in result.exchanges)
