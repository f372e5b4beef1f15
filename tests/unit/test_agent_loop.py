"""The agent loop: decisions per event, budgets, parse-error replies, counters, illegal events."""

from __future__ import annotations

import math

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trajcore.domain.agent_loop import (
    AgentLoop,
    AgentLoopConfig,
    CallModel,
    Decision,
    Finish,
    InfraErrorRule,
    LoopEvent,
    LoopState,
    RunTools,
    StopReason,
    ToolErrorCounts,
    TrajectoryStats,
)
from trajcore.domain.errors import ConfigError, InvalidInput, StateError
from trajcore.domain.groups import TrajectoryOutcome, TrajectoryStatus
from trajcore.domain.sampling import FinishReason
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.domain.turns import ParsedTurn, ParseProblem

STOP = FinishReason.STOP
LENGTH = FinishReason.LENGTH


def turn(calls: int = 0, problems: int = 0, *, tag: str = "t", content: str = "") -> ParsedTurn:
    return ParsedTurn(
        content=content,
        calls=[
            ToolCall(id=f"{tag}-{i}", name="bash", arguments={"cmd": "true"}) for i in range(calls)
        ],
        errors=[
            ParseProblem(
                index=calls + i,
                raw='{"name": "bash", "arguments": {',
                reason="truncated JSON @ arguments",
                name="bash" if i % 2 else None,
                call_id=f"{tag}-bad-{i}" if i % 2 else None,
            )
            for i in range(problems)
        ],
    )


def ok(call: ToolCall, outcome: ToolOutcome = ToolOutcome.OK) -> ToolResult:
    if outcome is ToolOutcome.OK:
        return ToolResult(call_id=call.id, name=call.name, outcome=outcome, content="done")
    return ToolResult.failure(call, outcome, f"{outcome.value} @ slot")


def say(
    loop: AgentLoop,
    parsed: ParsedTurn,
    *,
    finish: FinishReason = STOP,
    tokens: int = 10,
    context: int = 100,
    now: float = 1.0,
) -> RunTools | Finish:
    return loop.assistant_turn(
        parsed, finish_reason=finish, completion_tokens=tokens, context_tokens=context, now=now
    )


def started(
    max_turns: int,
    *,
    max_completion_tokens: int | None = None,
    max_context_tokens: int | None = None,
    time_budget_s: float | None = None,
    infra_errors_end: InfraErrorRule = InfraErrorRule.ANY_CALL,
) -> AgentLoop:
    config = AgentLoopConfig(
        max_turns=max_turns,
        max_completion_tokens=max_completion_tokens,
        max_context_tokens=max_context_tokens,
        time_budget_s=time_budget_s,
        infra_errors_end=infra_errors_end,
    )
    loop = AgentLoop(config=config)
    assert loop.start(0.0) == CallModel(turn=1, completion_tokens_left=max_completion_tokens)
    return loop


# ------------------------------------------------------------------------------------ config


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"@ agent\.max_turns"):
        AgentLoopConfig(max_turns=0)
    with pytest.raises(ConfigError, match=r"@ agent\.max_completion_tokens"):
        AgentLoopConfig(max_turns=3, max_completion_tokens=0)
    with pytest.raises(ConfigError, match=r"@ agent\.max_context_tokens"):
        AgentLoopConfig(max_turns=3, max_context_tokens=True)
    with pytest.raises(ConfigError, match=r"@ agent\.time_budget_s"):
        AgentLoopConfig(max_turns=3, time_budget_s=math.inf)
    with pytest.raises(ConfigError, match=r"@ agent\.time_budget_s"):
        AgentLoopConfig(max_turns=3, time_budget_s=0)


# ------------------------------------------------------------------------------ decisions


def test_natural_finish_without_calls() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(content="The answer is 4."))
    assert decision == Finish(
        reason=StopReason.NATURAL, detail="the model answered without calling a tool"
    )
    stats = loop.stats()
    assert stats.status is TrajectoryStatus.FINISHED
    assert stats.produced_output
    assert stats.turns == 1


def test_calls_then_results_then_next_turn() -> None:
    loop = started(max_turns=5)
    parsed = turn(calls=2)
    decision = say(loop, parsed)
    assert decision == RunTools(calls=parsed.calls)
    assert loop.pending_calls == parsed.calls
    results = [ok(parsed.calls[1], ToolOutcome.TIMEOUT), ok(parsed.calls[0])]
    assert loop.tool_results(results, now=2.0) == CallModel(turn=2)
    stats = loop.stats()
    assert stats.tool_calls == 2
    assert stats.tool_errors == ToolErrorCounts(timeout=1)
    assert stats.elapsed_s == 2.0


def test_parse_problems_answered_once_each() -> None:
    loop = started(max_turns=5)
    parsed = turn(calls=1, problems=3)
    decision = say(loop, parsed)
    assert isinstance(decision, RunTools)
    assert decision.problems == parsed.errors
    assert [r.content for r in decision.rejections] == [
        p.message_for_model() for p in parsed.errors
    ]
    assert all(r.outcome is ToolOutcome.REJECTED for r in decision.rejections)
    assert [r.call_id for r in decision.rejections] == ["invalid-1-1", "t-bad-1", "invalid-1-3"]
    assert loop.stats().parse_errors == 3


def test_only_malformed_calls_still_answered() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(problems=1))
    assert isinstance(decision, RunTools)
    assert decision.calls == ()
    assert len(decision.rejections) == 1
    assert loop.tool_results([], now=1.0) == CallModel(turn=2)


def test_max_turns_runs_last_calls_then_finishes() -> None:
    loop = started(max_turns=2)
    first = turn(calls=1, tag="a")
    say(loop, first)
    assert isinstance(loop.tool_results([ok(first.calls[0])], now=1.0), CallModel)
    last = turn(calls=1, tag="b")
    assert isinstance(say(loop, last), RunTools)
    decision = loop.tool_results([ok(last.calls[0])], now=2.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MAX_TURNS
    assert loop.stats().status is TrajectoryStatus.BUDGET_EXHAUSTED


def test_max_turns_with_only_problems_finishes_at_once() -> None:
    loop = started(max_turns=1)
    decision = say(loop, turn(problems=2))
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MAX_TURNS
    assert loop.stats().parse_errors == 2


def test_truncated_without_complete_call() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(problems=1), finish=LENGTH)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MAX_TOKENS
    assert loop.stats().status is TrajectoryStatus.FINISHED


def test_length_with_complete_calls_runs_them() -> None:
    loop = started(max_turns=5)
    parsed = turn(calls=1, problems=1)
    decision = say(loop, parsed, finish=LENGTH)
    assert isinstance(decision, RunTools)
    assert decision.calls == parsed.calls
    assert len(decision.rejections) == 1


def test_length_at_completion_budget_is_token_budget() -> None:
    loop = started(max_turns=5, max_completion_tokens=50)
    decision = say(loop, turn(content="and so on and"), finish=LENGTH, tokens=50)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.TOKEN_BUDGET


def test_completion_budget_stops_the_next_call_and_caps_it() -> None:
    loop = started(max_turns=5, max_completion_tokens=100)
    parsed = turn(calls=1, tag="a")
    say(loop, parsed, tokens=60)
    assert loop.tool_results([ok(parsed.calls[0])], now=1.0) == CallModel(
        turn=2, completion_tokens_left=40
    )
    parsed = turn(calls=1, tag="b")
    assert isinstance(say(loop, parsed, tokens=40), RunTools)
    decision = loop.tool_results([ok(parsed.calls[0])], now=1.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.TOKEN_BUDGET


def test_context_budget() -> None:
    loop = started(max_turns=5, max_context_tokens=1000)
    parsed = turn(calls=1)
    say(loop, parsed, context=1000)
    decision = loop.tool_results([ok(parsed.calls[0])], now=1.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.TOKEN_BUDGET
    assert decision.detail == "context reached 1000 tokens"


def test_time_budget_is_strict() -> None:
    loop = started(max_turns=5, time_budget_s=30.0)
    assert loop.remaining_seconds(10.0) == 20.0
    decision = say(loop, turn(calls=2), now=30.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.TIME_BUDGET
    assert loop.pending_calls == ()
    assert loop.remaining_seconds(40.0) == 0.0


def test_time_budget_after_tools() -> None:
    loop = started(max_turns=5, time_budget_s=30.0)
    parsed = turn(calls=1)
    say(loop, parsed, now=29.0)
    decision = loop.tool_results([ok(parsed.calls[0])], now=31.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.TIME_BUDGET


def test_abort_is_a_model_error() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(calls=1), finish=FinishReason.ABORT)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MODEL_ERROR


def test_any_infra_error_ends_by_default() -> None:
    loop = started(max_turns=5)
    parsed = turn(calls=2)
    say(loop, parsed)
    decision = loop.tool_results(
        [ok(parsed.calls[0]), ok(parsed.calls[1], ToolOutcome.INFRA_ERROR)], now=1.0
    )
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.INFRA_ERROR
    assert decision.detail == "1 of 2 tool calls failed: infra_error @ slot"
    assert loop.stats().status is TrajectoryStatus.INFRA_ERROR
    assert loop.stats().tool_errors.infra_error == 1


def test_every_call_rule_continues_on_partial_infra_errors() -> None:
    loop = started(max_turns=5, infra_errors_end=InfraErrorRule.EVERY_CALL)
    parsed = turn(calls=2, tag="a")
    say(loop, parsed)
    partial = [ok(parsed.calls[0]), ok(parsed.calls[1], ToolOutcome.INFRA_ERROR)]
    assert isinstance(loop.tool_results(partial, now=1.0), CallModel)
    parsed = turn(calls=2, tag="b")
    say(loop, parsed)
    every = [ok(c, ToolOutcome.INFRA_ERROR) for c in parsed.calls]
    decision = loop.tool_results(every, now=1.0)
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.INFRA_ERROR


def test_a_request_past_the_models_context_ends_on_the_token_budget() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(calls=1))
    assert isinstance(decision, RunTools)
    loop.tool_results([ok(c) for c in decision.calls], now=1.0)
    assert loop.model_failed(now=1.0, detail="HTTP 400: context length", context_full=True) == (
        Finish(reason=StopReason.TOKEN_BUDGET, detail="HTTP 400: context length")
    )
    assert loop.stats().stop_reason is StopReason.TOKEN_BUDGET


def test_a_first_request_past_the_models_context_is_the_model_servers_refusal() -> None:
    # nothing the model did filled the context: the task and max_tokens are too long for it
    loop = started(max_turns=5)
    assert loop.model_failed(now=1.0, detail="HTTP 400: context length", context_full=True) == (
        Finish(reason=StopReason.MODEL_ERROR, detail="HTTP 400: context length")
    )


def test_model_and_infra_failures() -> None:
    loop = started(max_turns=5)
    assert loop.model_failed(now=1.0, detail="503 after 3 retries") == Finish(
        reason=StopReason.MODEL_ERROR, detail="503 after 3 retries"
    )
    assert loop.stats().status is TrajectoryStatus.MODEL_ERROR
    assert not loop.stats().produced_output

    unstarted = AgentLoop(config=AgentLoopConfig(max_turns=5))
    decision = unstarted.infra_failed(now=5.0, detail="no slot before the lease deadline")
    assert decision.reason is StopReason.INFRA_ERROR
    assert unstarted.finished
    unstarted.check_valid()


def test_out_of_time_while_tools_run() -> None:
    loop = started(max_turns=5, time_budget_s=10.0)
    say(loop, turn(calls=1))
    assert loop.out_of_time(now=10.0).reason is StopReason.TIME_BUDGET
    other = started(max_turns=5)
    say(other, turn(calls=1))
    assert other.out_of_time(now=10.0, detail="the caller's deadline passed") == Finish(
        reason=StopReason.TIME_BUDGET, detail="the caller's deadline passed"
    )
    assert loop.pending_calls == ()


def test_a_turn_past_the_idle_limit_is_a_budget_not_a_model_error() -> None:
    loop = started(max_turns=5)
    decision = say(loop, turn(calls=1))
    assert isinstance(decision, RunTools)
    with pytest.raises(StateError, match="'idle_limit' in state 'awaiting_tools'"):
        loop.idle_limit(now=2.0, detail="slot idle past 0.3 s")
    assert isinstance(loop.tool_results([ok(c) for c in decision.calls], now=2.0), CallModel)
    finish = loop.idle_limit(now=3.0, detail="slot idle past 0.3 s")
    assert (finish.reason, finish.detail) == (StopReason.IDLE_LIMIT, "slot idle past 0.3 s")
    stats = loop.stats()
    assert stats.status is TrajectoryStatus.BUDGET_EXHAUSTED
    assert stats.needs_score  # a budget: the work done so far is verified
    loop.check_valid()


def test_a_failure_before_the_loop_ran_has_stats_without_a_loop() -> None:
    stats = TrajectoryStats.failed_unstarted(StopReason.INFRA_ERROR, "RuntimeError: boom")
    loop = AgentLoop(config=AgentLoopConfig(max_turns=1))
    loop.infra_failed(now=0.0, detail="RuntimeError: boom")
    assert stats == loop.stats()
    assert stats.outcome() == TrajectoryOutcome(
        status=TrajectoryStatus.INFRA_ERROR, produced_output=False, detail="RuntimeError: boom"
    )
    with pytest.raises(InvalidInput, match="must be a failure, got 'time_budget' @ reason"):
        TrajectoryStats.failed_unstarted(StopReason.TIME_BUDGET, "x")


def test_blank_turn_produced_nothing() -> None:
    loop = started(max_turns=5)
    say(loop, ParsedTurn(content="  \n", reasoning=""))
    stats = loop.stats()
    assert not stats.produced_output
    assert not stats.needs_score
    assert stats.outcome() == TrajectoryOutcome(
        status=TrajectoryStatus.FINISHED,
        produced_output=False,
        detail="the model answered without calling a tool",
    )


def test_outcome_from_stats() -> None:
    loop = started(max_turns=5)
    with pytest.raises(StateError, match="'awaiting_model'"):
        loop.stats().outcome()
    say(loop, turn(content="done"))
    stats = loop.stats()
    assert stats.needs_score
    assert stats.outcome(1.0).score == 1.0
    with pytest.raises(InvalidInput, match="needs a score @ score"):
        stats.outcome()
    failed = started(max_turns=5)
    failed.model_failed(now=1.0, detail="503")
    assert not failed.stats().needs_score
    assert failed.stats().outcome().status is TrajectoryStatus.MODEL_ERROR


# --------------------------------------------------------------------------------- bad input


def test_results_must_match_pending_calls_and_leave_loop_unchanged() -> None:
    loop = started(max_turns=5)
    parsed = turn(calls=2)
    say(loop, parsed)
    a, b = parsed.calls
    stranger = ToolCall(id="zz", name="bash")
    with pytest.raises(InvalidInput, match=r"'zz' is not pending @ results\[1\]\.call_id"):
        loop.tool_results([ok(a), ok(stranger)], now=2.0)
    with pytest.raises(InvalidInput, match=r"answered twice @ results\[1\]\.call_id"):
        loop.tool_results([ok(a), ok(a)], now=2.0)
    with pytest.raises(InvalidInput, match=r"no result for pending calls \['t-1'\] @ results"):
        loop.tool_results([ok(a)], now=2.0)
    assert loop.state is LoopState.AWAITING_TOOLS
    assert loop.stats().tool_calls == 0
    assert isinstance(loop.tool_results([ok(b), ok(a)], now=2.0), CallModel)


def test_turn_input_validation() -> None:
    loop = started(max_turns=5)
    with pytest.raises(InvalidInput, match=r"@ completion_tokens"):
        say(loop, turn(), tokens=-1)
    with pytest.raises(InvalidInput, match=r"went backwards.* @ now"):
        say(loop, turn(), now=-1.0)
    with pytest.raises(InvalidInput, match=r"@ now"):
        say(loop, turn(), now=math.nan)
    duplicate = ParsedTurn(calls=[ToolCall(id="x", name="a"), ToolCall(id="x", name="b")])
    with pytest.raises(InvalidInput, match=r"duplicate call id 'x' @ turn\.calls\[1\]\.id"):
        say(loop, duplicate)
    assert loop.stats().turns == 0
    loop.check_valid()


def test_illegal_event_names_event_and_state() -> None:
    loop = AgentLoop(config=AgentLoopConfig(max_turns=5))
    with pytest.raises(StateError, match=r"'tool_results' in state 'ready'.*accepts infra_failed"):
        loop.tool_results([], now=0.0)
    loop.start(0.0)
    with pytest.raises(StateError, match=r"'start' in state 'awaiting_model'"):
        loop.start(1.0)
    say(loop, turn())
    with pytest.raises(StateError, match=r"'assistant_turn' in state 'finished'.*accepts nothing"):
        say(loop, turn())


def test_tool_error_counts() -> None:
    counts = ToolErrorCounts().plus(ToolOutcome.OK).plus(ToolOutcome.REJECTED)
    counts = counts.plus(ToolOutcome.REJECTED).plus(ToolOutcome.TOOL_ERROR)
    assert counts == ToolErrorCounts(rejected=2, tool_error=1)
    assert counts.total == 3
    assert counts.of(ToolOutcome.OK) == 0


# ----------------------------------------------------------------------------- state machine


def fire(loop: AgentLoop, event: LoopEvent, now: float) -> Decision:
    """Send ``event`` with harmless arguments."""
    if event is LoopEvent.START:
        return loop.start(now)
    if event is LoopEvent.ASSISTANT_TURN:
        return say(loop, turn(), now=now)
    if event is LoopEvent.TOOL_RESULTS:
        return loop.tool_results([], now=now)
    if event is LoopEvent.MODEL_FAILED:
        return loop.model_failed(now=now, detail="x")
    if event is LoopEvent.INFRA_FAILED:
        return loop.infra_failed(now=now, detail="x")
    if event is LoopEvent.IDLE_LIMIT:
        return loop.idle_limit(now=now, detail="x")
    return loop.out_of_time(now=now)


class AgentLoopMachine(RuleBasedStateMachine):
    """Drive the loop with random events and keep an independent tally to check it against."""

    loop: AgentLoop

    @initialize(
        max_turns=st.integers(min_value=1, max_value=6),
        max_completion=st.none() | st.integers(min_value=1, max_value=400),
        max_context=st.none() | st.integers(min_value=1, max_value=2000),
        time_budget=st.none() | st.floats(min_value=1.0, max_value=100.0),
        infra_rule=st.sampled_from(InfraErrorRule),
    )
    def setup(
        self,
        *,
        max_turns: int,
        max_completion: int | None,
        max_context: int | None,
        time_budget: float | None,
        infra_rule: InfraErrorRule,
    ) -> None:
        self.config = AgentLoopConfig(
            max_turns=max_turns,
            max_completion_tokens=max_completion,
            max_context_tokens=max_context,
            time_budget_s=time_budget,
            infra_errors_end=infra_rule,
        )
        self.fresh_loop()

    def fresh_loop(self) -> None:
        self.loop = AgentLoop(config=self.config)
        self.now = 0.0
        self.turns = 0
        self.tool_calls = 0
        self.errors: dict[ToolOutcome, int] = dict.fromkeys(ToolOutcome, 0)
        self.parse_errors = 0
        self.replies = 0
        self.unanswered = 0
        self.completion = 0
        self.serial = 0

    @precondition(lambda self: self.loop.finished)
    @rule()
    def next_trajectory(self) -> None:
        """A finished loop accepts nothing more; go on with a fresh one to explore further."""
        self.fresh_loop()

    def tick(self, dt: float) -> float:
        self.now += dt
        return self.now

    @precondition(lambda self: self.loop.state is LoopState.READY)
    @rule(dt=st.floats(min_value=0.0, max_value=5.0))
    def start(self, dt: float) -> None:
        decision = self.loop.start(self.tick(dt))
        assert decision.turn == 1

    @precondition(lambda self: self.loop.state is LoopState.AWAITING_MODEL)
    @rule(
        calls=st.integers(min_value=0, max_value=3),
        problems=st.integers(min_value=0, max_value=2),
        content=st.sampled_from(["", "ok", "  "]),
        finish=st.sampled_from(FinishReason),
        tokens=st.integers(min_value=0, max_value=150),
        context=st.integers(min_value=0, max_value=1500),
        dt=st.floats(min_value=0.0, max_value=20.0),
    )
    def assistant_turn(
        self,
        *,
        calls: int,
        problems: int,
        content: str,
        finish: FinishReason,
        tokens: int,
        context: int,
        dt: float,
    ) -> None:
        self.serial += 1
        parsed = turn(calls, problems, tag=f"s{self.serial}", content=content)
        decision = say(
            self.loop, parsed, finish=finish, tokens=tokens, context=context, now=self.tick(dt)
        )
        self.turns += 1
        self.completion += tokens
        self.parse_errors += problems
        if isinstance(decision, RunTools):
            assert decision.calls == parsed.calls
            assert decision.problems == parsed.errors
            assert len(decision.rejections) == problems
            for problem, reply in zip(parsed.errors, decision.rejections, strict=True):
                assert reply.outcome is ToolOutcome.REJECTED
                assert reply.content == problem.message_for_model()
            self.replies += problems
            assert finish not in (FinishReason.ABORT, FinishReason.CONTENT_FILTER)
            assert calls or (problems and finish is not FinishReason.LENGTH)
        else:
            self.unanswered += problems
            if finish is FinishReason.ABORT:
                assert decision.reason is StopReason.MODEL_ERROR
            elif finish is FinishReason.CONTENT_FILTER:
                assert decision.reason in (StopReason.CONTENT_FILTER, StopReason.TIME_BUDGET)
            elif decision.reason is not StopReason.TIME_BUDGET:
                window = self.config.max_context_tokens
                cut = finish is FinishReason.LENGTH and window is not None and context >= window
                assert not calls or cut
                if finish is FinishReason.LENGTH:
                    assert decision.reason in (StopReason.MAX_TOKENS, StopReason.TOKEN_BUDGET)
                elif not problems:
                    assert decision.reason is StopReason.NATURAL

    @precondition(lambda self: self.loop.state is LoopState.AWAITING_TOOLS)
    @rule(data=st.data(), dt=st.floats(min_value=0.0, max_value=20.0))
    def tool_results(self, data: st.DataObject, dt: float) -> None:
        pending = self.loop.pending_calls
        outcomes = data.draw(
            st.lists(st.sampled_from(ToolOutcome), min_size=len(pending), max_size=len(pending))
        )
        results = data.draw(
            st.permutations([ok(c, o) for c, o in zip(pending, outcomes, strict=True)])
        )
        decision = self.loop.tool_results(results, now=self.tick(dt))
        self.tool_calls += len(results)
        for outcome in outcomes:
            self.errors[outcome] += 1
        infra = outcomes.count(ToolOutcome.INFRA_ERROR)
        ends = infra > 0 and (
            self.config.infra_errors_end is InfraErrorRule.ANY_CALL or infra == len(outcomes)
        )
        if ends:
            assert isinstance(decision, Finish)
            assert decision.reason is StopReason.INFRA_ERROR
        elif isinstance(decision, CallModel):
            assert not self.loop.finished
            assert decision.turn == self.turns + 1
            assert self.turns < self.config.max_turns
        else:
            assert decision.reason in (  # never infra_error when the rule does not say so
                StopReason.MAX_TURNS,
                StopReason.TOKEN_BUDGET,
                StopReason.TIME_BUDGET,
            )

    @rule(
        event=st.sampled_from(
            [
                LoopEvent.MODEL_FAILED,
                LoopEvent.INFRA_FAILED,
                LoopEvent.OUT_OF_TIME,
                LoopEvent.IDLE_LIMIT,
            ]
        ),
        dt=st.floats(min_value=0.0, max_value=5.0),
    )
    def interruption(self, event: LoopEvent, dt: float) -> None:
        """A failure or the deadline, in whatever state the loop is (illegal ones must raise)."""
        if event not in self.loop.allowed_events():
            with pytest.raises(StateError):
                fire(self.loop, event, self.tick(dt))
            return
        decision = fire(self.loop, event, self.tick(dt))
        assert isinstance(decision, Finish)
        expected = {
            LoopEvent.MODEL_FAILED: StopReason.MODEL_ERROR,
            LoopEvent.INFRA_FAILED: StopReason.INFRA_ERROR,
            LoopEvent.OUT_OF_TIME: StopReason.TIME_BUDGET,
            LoopEvent.IDLE_LIMIT: StopReason.IDLE_LIMIT,
        }
        assert decision.reason is expected[event]
        assert self.loop.pending_calls == ()

    @rule(event=st.sampled_from(LoopEvent))
    def illegal_event(self, event: LoopEvent) -> None:
        if event in self.loop.allowed_events():
            return
        before = self.loop.stats()
        with pytest.raises(StateError, match=f"'{event.value}' in state '{before.state.value}'"):
            fire(self.loop, event, self.now)
        assert self.loop.stats() == before

    @invariant()
    def valid(self) -> None:
        self.loop.check_valid()

    @invariant()
    def counters_add_up(self) -> None:
        stats = self.loop.stats()
        assert stats.turns == self.turns <= self.config.max_turns
        assert stats.tool_calls == self.tool_calls
        assert stats.parse_errors == self.parse_errors == self.replies + self.unanswered
        assert stats.completion_tokens == self.completion
        for outcome in ToolOutcome:
            if outcome is not ToolOutcome.OK:
                assert stats.tool_errors.of(outcome) == self.errors[outcome]
        assert stats.tool_errors.total == self.tool_calls - self.errors[ToolOutcome.OK]
        assert (stats.status is None) == (stats.state is not LoopState.FINISHED)

    @invariant()
    def terminal_accepts_nothing(self) -> None:
        if self.loop.finished:
            assert self.loop.allowed_events() == frozenset()
            for event in LoopEvent:
                with pytest.raises(StateError):
                    fire(self.loop, event, self.now)


TestAgentLoopMachine = AgentLoopMachine.TestCase
