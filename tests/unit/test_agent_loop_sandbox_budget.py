"""A lease the slot server ended for its disk budget: the agent loop's ``sandbox_budget`` stop, its
status and score, and what group assembly makes of it (pure domain)."""

from __future__ import annotations

import pytest

from trajcore.domain.agent_loop import (
    AgentLoop,
    AgentLoopConfig,
    CallModel,
    Finish,
    InfraErrorRule,
    LoopState,
    StopReason,
    ToolErrorCounts,
)
from trajcore.domain.errors import InvalidInput
from trajcore.domain.groups import GroupRules, TrajectoryStatus
from trajcore.domain.sampling import FinishReason
from trajcore.domain.tools import SandboxBudget, ToolCall, ToolOutcome, ToolResult
from trajcore.domain.turns import ParsedTurn

OVER = (
    "disk budget of 4194304 bytes (disk_bytes) reached: the lease's writable area holds at "
    "least 8392704 bytes in 3 files; the lease was ended"
)


def _calls(n: int) -> list[ToolCall]:
    return [ToolCall(id=f"c{i}", name="bash", arguments={"command": "x"}) for i in range(n)]


def _over(call: ToolCall) -> ToolResult:
    """The slot server's answer to a call of a lease it ended for its disk budget."""
    return ToolResult(
        call_id=call.id,
        name=call.name,
        outcome=ToolOutcome.TOOL_ERROR,
        content=f"Error: {OVER}",
        error=OVER,
        sandbox_budget=SandboxBudget.DISK,
    )


def _awaiting_tools(
    calls: list[ToolCall], *, time_budget_s: float | None = None, max_turns: int = 5
) -> AgentLoop:
    loop = AgentLoop(AgentLoopConfig(max_turns=max_turns, time_budget_s=time_budget_s))
    loop.start(0.0)
    loop.assistant_turn(
        ParsedTurn(content="", calls=calls),
        finish_reason=FinishReason.STOP,
        completion_tokens=5,
        context_tokens=50,
        now=1.0,
    )
    return loop


def test_a_result_whose_lease_the_disk_budget_ended_ends_the_trajectory_as_a_budget() -> None:
    calls = _calls(2)
    loop = _awaiting_tools(calls)
    plain = ToolResult.failure(calls[0], ToolOutcome.TOOL_ERROR, "exit 1")
    decision = loop.tool_results([plain, _over(calls[1])], now=2.0)
    assert decision == Finish(
        reason=StopReason.SANDBOX_BUDGET, detail=f"lease ended for its disk budget: {OVER}"
    )
    stats = loop.stats()
    assert loop.state is LoopState.FINISHED
    assert stats.status is TrajectoryStatus.BUDGET_EXHAUSTED
    assert stats.status.healthy
    assert stats.tool_errors == ToolErrorCounts(tool_error=2)
    assert stats.tool_calls == 2
    assert not stats.needs_score  # the hook's check cannot run in the ended lease
    assert stats.produced_output
    outcome = stats.outcome(score=-1.0)  # the env's fixed score, not the hook's
    assert (outcome.status, outcome.score, outcome.detail) == (
        TrajectoryStatus.BUDGET_EXHAUSTED,
        -1.0,
        decision.detail,
    )
    loop.check_valid()


def test_the_budget_stop_comes_before_infra_errors_time_and_turns() -> None:
    calls = _calls(2)
    loop = _awaiting_tools(calls, time_budget_s=3.0, max_turns=1)
    infra = ToolResult.failure(calls[0], ToolOutcome.INFRA_ERROR, "the sandbox ended")
    decision = loop.tool_results([infra, _over(calls[1])], now=10.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.SANDBOX_BUDGET


def test_the_same_text_without_the_marker_is_an_ordinary_tool_error() -> None:
    """Only the marker ends it: a result that merely says "disk budget" (a command's own
    output, say) is a tool error the model reads, and the loop goes on."""
    calls = _calls(1)
    loop = _awaiting_tools(calls)
    text_only = ToolResult.failure(calls[0], ToolOutcome.TOOL_ERROR, OVER)
    assert loop.tool_results([text_only], now=2.0) == CallModel(turn=2)
    assert loop.stats().stop_reason is None


def test_every_call_rule_does_not_hide_the_budget_stop() -> None:
    calls = _calls(1)
    loop = AgentLoop(AgentLoopConfig(max_turns=5, infra_errors_end=InfraErrorRule.EVERY_CALL))
    loop.start(0.0)
    loop.assistant_turn(
        ParsedTurn(content="", calls=calls),
        finish_reason=FinishReason.STOP,
        completion_tokens=1,
        context_tokens=1,
        now=0.0,
    )
    decision = loop.tool_results([_over(calls[0])], now=0.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.SANDBOX_BUDGET


def test_other_healthy_stops_still_need_the_hook() -> None:
    calls = _calls(1)
    loop = _awaiting_tools(calls, max_turns=1)
    decision = loop.tool_results([ToolResult.success(calls[0], "ok")], now=2.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MAX_TURNS
    assert loop.stats().needs_score


def test_group_rules_count_the_budget_stop_as_usable() -> None:
    """It is scored: it counts toward min_healthy, and is kept, never failed."""
    calls = _calls(1)
    loop = _awaiting_tools(calls)
    loop.tool_results([_over(calls[0])], now=2.0)
    stopped = loop.stats().outcome(score=0.0)
    other = AgentLoop(AgentLoopConfig(max_turns=1))
    other.start(0.0)
    other.assistant_turn(
        ParsedTurn(content="done"),
        finish_reason=FinishReason.STOP,
        completion_tokens=1,
        context_tokens=1,
        now=0.0,
    )
    solved = other.stats().outcome(score=1.0)
    verdict = GroupRules(group_size=2, min_healthy=2).assess([stopped, solved])
    assert verdict.drop_reason is None
    assert verdict.kept == (0, 1)
    assert verdict.scores == (0.0, 1.0)
    assert verdict.failed == ()


def test_a_marked_result_is_never_ok() -> None:
    call = _calls(1)[0]
    with pytest.raises(InvalidInput) as caught:
        ToolResult(
            call_id=call.id,
            name=call.name,
            outcome=ToolOutcome.OK,
            sandbox_budget=SandboxBudget.DISK,
        )
    assert caught.value.field == "sandbox_budget"
    assert caught.value.reason == "a call whose lease was ended cannot be OK"
    assert _over(call).answering("other").sandbox_budget is SandboxBudget.DISK


def test_a_loop_that_never_started_has_spent_no_time() -> None:
    loop = AgentLoop(AgentLoopConfig(max_turns=1))
    assert loop.stats().elapsed_s == 0.0
    loop.start(5.0)
    assert loop.stats().elapsed_s == 0.0
