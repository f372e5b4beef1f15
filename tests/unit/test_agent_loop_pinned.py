"""The agent loop: decisions its examples and state machine (``test_agent_loop``) left open,
found by mutation testing (docs/testing.md)."""

from __future__ import annotations

import math

import pytest

from tests.unit.test_agent_loop import LENGTH, ok, say, started, turn
from trajcore.domain.agent_loop import (
    AgentLoop,
    AgentLoopConfig,
    CallModel,
    Finish,
    RunTools,
    StopReason,
)
from trajcore.domain.errors import InvalidInput, StateError
from trajcore.domain.sampling import FinishReason
from trajcore.domain.tools import ToolOutcome


def test_the_counters_add_up_over_the_turns() -> None:
    loop = started(max_turns=5)
    first = turn(calls=1, problems=2, tag="a")
    say(loop, first, tokens=10, context=100, now=1.0)
    loop.tool_results([ok(first.calls[0])], now=2.0)
    second = turn(calls=2, problems=1, tag="b")
    say(loop, second, tokens=5, context=180, now=3.0)
    loop.tool_results([ok(c) for c in second.calls], now=4.5)
    stats = loop.stats()
    assert (stats.turns, stats.tool_calls, stats.parse_errors) == (2, 3, 3)
    assert (stats.completion_tokens, stats.context_tokens, stats.elapsed_s) == (15, 180, 4.5)


def test_a_loop_started_late_counts_its_time_from_its_start() -> None:
    loop = AgentLoop(config=AgentLoopConfig(max_turns=5, time_budget_s=5.0))
    loop.start(10.0)
    assert loop.remaining_seconds(12.0) == 3.0
    assert isinstance(say(loop, turn(calls=1), now=12.0), RunTools)
    assert loop.stats().elapsed_s == 2.0
    assert started(max_turns=5).remaining_seconds(3.0) is None


@pytest.mark.parametrize(
    ("finish", "budget", "reason", "detail"),
    [
        (FinishReason.ABORT, None, StopReason.MODEL_ERROR, "the server aborted the generation"),
        (LENGTH, 10, StopReason.TOKEN_BUDGET, "completion token budget spent"),
        (LENGTH, None, StopReason.MAX_TOKENS, "cut off by max_tokens with no complete call"),
    ],
)
def test_each_way_a_turn_ends_the_loop_says_why(
    finish: FinishReason, budget: int | None, reason: StopReason, detail: str
) -> None:
    loop = started(max_turns=5, max_completion_tokens=budget)
    assert say(loop, turn(content="half an ans"), finish=finish, tokens=10) == Finish(
        reason=reason, detail=detail
    )
    assert loop.stats().detail == detail


def test_a_malformed_call_is_rejected_under_its_name_with_its_reason() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(problems=2))
    assert isinstance(decision, RunTools)
    assert [(r.name, r.error, r.outcome) for r in decision.rejections] == [
        ("", "truncated JSON @ arguments", ToolOutcome.REJECTED),
        ("bash", "truncated JSON @ arguments", ToolOutcome.REJECTED),
    ]
    assert loop.tool_results([], now=2.0) == CallModel(turn=2)


def test_an_env_error_ends_the_loop_as_the_envs_fault_even_before_it_started() -> None:
    loop = AgentLoop(config=AgentLoopConfig(max_turns=3))
    assert loop.env_failed(now=4.0, detail="verify() raised KeyError") == Finish(
        reason=StopReason.ENV_ERROR, detail="verify() raised KeyError"
    )
    stats = loop.stats()
    assert (stats.stop_reason, stats.elapsed_s) == (StopReason.ENV_ERROR, 0.0)
    with pytest.raises(StateError):
        loop.env_failed(now=5.0, detail="again")
    running = started(max_turns=3)
    say(running, turn(calls=1), now=1.0)
    assert running.env_failed(now=2.0, detail="hook").reason is StopReason.ENV_ERROR
    assert running.pending_calls == ()


@pytest.mark.parametrize(
    ("context", "now", "message"),
    [
        (-1, 1.0, "must be an integer >= 0, got -1 @ context_tokens"),
        (True, 1.0, "must be an integer >= 0, got True @ context_tokens"),
        (100, math.inf, "must be a finite number, got inf @ now"),
        (100, True, "must be a finite number, got True @ now"),
    ],
)
def test_bad_turn_reports_are_refused_with_the_field_and_reason(
    context: int, now: float, message: str
) -> None:
    loop = started(max_turns=3)
    with pytest.raises(InvalidInput) as caught:
        say(loop, turn(), context=context, now=now)
    assert str(caught.value) == message


def test_a_turn_cut_exactly_at_the_context_window_ends_there_saying_so() -> None:
    """A cut turn (finish length) whose context reached the window, to the token, or a
    ``max_context_tokens`` alone: ``token_budget`` naming both figures; one token short of it,
    its calls run."""
    at_window = started(max_turns=5).assistant_turn(
        turn(calls=1), finish_reason=LENGTH, completion_tokens=10, context_tokens=100,
        now=1.0, context_window=100,
    )  # fmt: skip
    assert at_window == Finish(
        reason=StopReason.TOKEN_BUDGET, detail="turn cut at the context window (100 of 100)"
    )
    by_config = say(started(max_turns=5, max_context_tokens=100), turn(calls=1), finish=LENGTH)
    assert by_config == Finish(
        reason=StopReason.TOKEN_BUDGET, detail="turn cut at the context window (100 of 100)"
    )
    short = started(max_turns=5).assistant_turn(
        turn(calls=1), finish_reason=LENGTH, completion_tokens=10, context_tokens=99,
        now=1.0, context_window=100,
    )  # fmt: skip
    assert isinstance(short, RunTools)


@pytest.mark.parametrize("window", [-1, 1.5, True, "100"])
def test_a_context_window_that_is_no_count_is_refused_by_name(window: object) -> None:
    loop = started(max_turns=5)
    with pytest.raises(InvalidInput) as refused:
        loop.assistant_turn(
            turn(calls=1), finish_reason=LENGTH, completion_tokens=10, context_tokens=99,
            now=1.0, context_window=window,  # type: ignore[arg-type]
        )  # fmt: skip
    assert refused.value.field == "context_window"
    assert isinstance(say(loop, turn(calls=1)), RunTools)  # the refusal changed nothing


def test_a_filtered_turn_says_so_and_an_overspent_budget_leaves_nothing() -> None:
    filtered = say(started(max_turns=5), turn(calls=1), finish=FinishReason.CONTENT_FILTER)
    assert filtered == Finish(
        reason=StopReason.CONTENT_FILTER,
        detail="finish_reason content_filter: the turn was filtered",
    )
    loop = started(max_turns=5, max_completion_tokens=10)
    say(loop, turn(calls=1), tokens=25)  # a server that sampled past the cap it was given
    assert loop.completion_tokens_left() == 0


def test_the_budgets_that_end_a_loop_after_its_tools_say_which() -> None:
    spent = started(max_turns=5, max_completion_tokens=10)
    first = turn(calls=1)
    say(spent, first, tokens=10)
    assert spent.tool_results([ok(first.calls[0])], now=2.0) == Finish(
        reason=StopReason.TOKEN_BUDGET, detail="completion token budget spent"
    )
    late = started(max_turns=5, time_budget_s=5.0)
    second = turn(calls=1)
    say(late, second, now=1.0)
    assert late.tool_results([ok(second.calls[0])], now=9.0) == Finish(
        reason=StopReason.TIME_BUDGET, detail="time budget of 5.0s spent"
    )
    assert say(started(max_turns=5, time_budget_s=5.0), turn(calls=1), now=9.0) == Finish(
        reason=StopReason.TIME_BUDGET, detail="time budget of 5.0s spent"
    )


def test_a_model_failure_after_a_turn_is_a_model_error_unless_the_context_was_full() -> None:
    loop = started(max_turns=5)
    first = turn(calls=1)
    say(loop, first)
    loop.tool_results([ok(first.calls[0])], now=2.0)
    assert loop.model_failed(now=3.0, detail="HTTP 500").reason is StopReason.MODEL_ERROR
