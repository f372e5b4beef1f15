"""The agent loop of one trajectory, as a state machine that takes events and returns decisions.

The rollout layer does the I/O (asks the model, runs tools, reads the clock); this object decides
what comes next and keeps the counts. It never waits, never reads a clock (``now`` is passed in)
and never sees a server, so every branch is testable by feeding it events::

    loop = AgentLoop(config=AgentLoopConfig(max_turns=8))
    decision = loop.start(now)                       # CallModel
    decision = loop.assistant_turn(parsed, finish_reason=..., completion_tokens=...,
                                   context_tokens=..., now=now)   # RunTools or Finish
    decision = loop.tool_results(results, now=now)   # CallModel or Finish
    ...
    loop.stats()                                     # a frozen TrajectoryStats

States and the events each accepts (anything else raises ``StateError`` naming both)::

    ready           start -> awaiting_model          infra_failed -> finished
    awaiting_model  assistant_turn -> awaiting_tools | finished
                    model_failed, infra_failed, out_of_time, idle_limit -> finished
    awaiting_tools  tool_results -> awaiting_model | finished
                    infra_failed, out_of_time -> finished
    finished        nothing

``env_failed`` (the env's own code raised outside the loop, e.g. while preparing the slot) is
accepted wherever ``infra_failed`` is, as the same event with another stop reason: both are
failures from outside the loop, told apart only by who caused them.

Rules this module keeps:

- No more than ``max_turns`` assistant turns: once the last allowed turn's calls have run, the
  loop finishes with ``max_turns`` instead of asking the model again. The calls of that turn do
  run, so that what the model did counts when the env verifies the work. The token budgets (total
  completion tokens, context length) stop the loop the same way: they end the *next* model call,
  not the tools the current turn asked for; except a turn the server *cut* (``LENGTH``) at the
  context window (``max_context_tokens``, or the ``context_window`` its ``max_tokens`` was capped
  to fit): nothing can follow it, so it ends as ``token_budget`` at once, its calls not run.
- The time budget is strict: an event at or past ``time_budget_s`` since ``start`` finishes with
  ``time_budget`` at once; the calls of a turn that arrives late are not run. A model turn that
  outlasts the slot's idle lifetime (``idle_limit``, measured by the rollout) finishes with
  ``idle_limit``, a budget too.
- Every parse problem is counted in ``parse_errors``. When the loop goes on, each is answered by
  exactly one ``REJECTED`` ``ToolResult`` in ``RunTools.rejections`` carrying the problem's
  message for the model. A turn with problems and no well-formed call still gets ``RunTools``
  (with no calls), so the model reads its errors and tries again. When the turn ends the
  trajectory instead, its problems are counted but there is no one left to answer.
- A turn with ``finish_reason`` LENGTH and no complete call ends as ``max_tokens`` (or as
  ``token_budget`` when the completion budget is spent): a call cut off mid-way is not answered
  as a parse error, because the model did not choose to stop there. Complete calls of a LENGTH
  turn do run, and the cut tail's problem is answered like any other.
- ``CONTENT_FILTER`` ends as ``content_filter``, finished and scored: the server filtered what
  the policy wrote, the policy's outcome (not a server failure); its calls do not run.
- A turn with ``finish_reason`` ABORT ends as ``model_error``: the server gave up on it. A
  request the server refused as longer than the model's context (``model_failed`` with
  ``context_full``) ends as ``token_budget``: the conversation outgrew the context.
- Tool outcomes are counted per kind (tool_error, timeout, rejected, infra_error). An infra error
  is never the model's fault, and a trajectory that saw one is not a fair sample of the policy,
  so by default one infra error ends the trajectory as ``infra_error`` (which group assembly never
  scores); ``InfraErrorRule.EVERY_CALL`` ends it only when every call of a batch failed so.
- A result marked with a ``sandbox_budget`` (the slot ended the lease for its disk budget) ends
  the trajectory as ``sandbox_budget`` before any other rule: the policy's doing, a budget; its
  lease is gone, so ``needs_score`` is false and the rollout gives it the env's fixed score.
- ``finished`` accepts nothing. ``check_valid()`` checks the counters against each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import attrs

from trajcore.domain import converters, loop_checks, validators
from trajcore.domain.errors import InvalidInput, StateError
from trajcore.domain.groups import TrajectoryOutcome, TrajectoryStatus
from trajcore.domain.sampling import FinishReason
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.domain.turns import ParsedTurn, ParseProblem

__all__ = [
    "AgentLoop",
    "AgentLoopConfig",
    "CallModel",
    "Decision",
    "Finish",
    "InfraErrorRule",
    "LoopEvent",
    "LoopState",
    "RunTools",
    "StopReason",
    "ToolErrorCounts",
    "TrajectoryStats",
]


class LoopState(enum.Enum):
    """Where a trajectory's loop is."""

    READY = "ready"  # built, not started
    AWAITING_MODEL = "awaiting_model"  # the model is being asked for the next turn
    AWAITING_TOOLS = "awaiting_tools"  # the turn's calls are running
    FINISHED = "finished"  # terminal


class LoopEvent(enum.Enum):
    """What the rollout can tell the loop."""

    START = "start"
    ASSISTANT_TURN = "assistant_turn"
    TOOL_RESULTS = "tool_results"
    MODEL_FAILED = "model_failed"
    INFRA_FAILED = "infra_failed"
    OUT_OF_TIME = "out_of_time"
    IDLE_LIMIT = "idle_limit"


_S = LoopState
_E = LoopEvent
_TRANSITIONS: Mapping[LoopState, Mapping[LoopEvent, frozenset[LoopState]]] = {
    _S.READY: {
        _E.START: frozenset({_S.AWAITING_MODEL}),
        _E.INFRA_FAILED: frozenset({_S.FINISHED}),
    },
    _S.AWAITING_MODEL: {
        _E.ASSISTANT_TURN: frozenset({_S.AWAITING_TOOLS, _S.FINISHED}),
        _E.MODEL_FAILED: frozenset({_S.FINISHED}),
        _E.INFRA_FAILED: frozenset({_S.FINISHED}),
        _E.OUT_OF_TIME: frozenset({_S.FINISHED}),
        _E.IDLE_LIMIT: frozenset({_S.FINISHED}),
    },
    _S.AWAITING_TOOLS: {
        _E.TOOL_RESULTS: frozenset({_S.AWAITING_MODEL, _S.FINISHED}),
        _E.INFRA_FAILED: frozenset({_S.FINISHED}),
        _E.OUT_OF_TIME: frozenset({_S.FINISHED}),
    },
    _S.FINISHED: {},
}


class StopReason(enum.Enum):
    """Why a trajectory's loop finished."""

    NATURAL = "natural"  # the model answered without calling a tool
    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"  # noqa: S105 - a stop reason, not a secret
    TIME_BUDGET = "time_budget"
    IDLE_LIMIT = "idle_limit"  # one model turn kept the slot idle past its lifetime
    SANDBOX_BUDGET = "sandbox_budget"  # the slot ended the lease for its disk budget
    MAX_TOKENS = "max_tokens"  # a turn cut by max_tokens with no complete call
    CONTENT_FILTER = "content_filter"  # the server's content filter stopped the model's turn
    MODEL_ERROR = "model_error"  # the LLM server failed or aborted
    INFRA_ERROR = "infra_error"  # sandbox, slot server or tool server failed
    ENV_ERROR = "env_error"  # the env's own code (a hook) failed

    @property
    def status(self) -> TrajectoryStatus:
        """The trajectory status group assembly sees for this reason."""
        return _STATUS_OF[self]


_STATUS_OF: Mapping[StopReason, TrajectoryStatus] = {
    StopReason.NATURAL: TrajectoryStatus.FINISHED,
    StopReason.MAX_TOKENS: TrajectoryStatus.FINISHED,
    StopReason.CONTENT_FILTER: TrajectoryStatus.FINISHED,
    StopReason.MAX_TURNS: TrajectoryStatus.BUDGET_EXHAUSTED,
    StopReason.TOKEN_BUDGET: TrajectoryStatus.BUDGET_EXHAUSTED,
    StopReason.TIME_BUDGET: TrajectoryStatus.BUDGET_EXHAUSTED,
    StopReason.IDLE_LIMIT: TrajectoryStatus.BUDGET_EXHAUSTED,
    StopReason.SANDBOX_BUDGET: TrajectoryStatus.BUDGET_EXHAUSTED,
    StopReason.MODEL_ERROR: TrajectoryStatus.MODEL_ERROR,
    StopReason.INFRA_ERROR: TrajectoryStatus.INFRA_ERROR,
    StopReason.ENV_ERROR: TrajectoryStatus.ENV_ERROR,
}


class InfraErrorRule(enum.Enum):
    """When infra errors in tool results end the trajectory as ``infra_error``."""

    ANY_CALL = "any_call"  # one infra error is enough (the default)
    EVERY_CALL = "every_call"  # only when every call of a batch failed for infra reasons


_positive_int = validators.whole_number(1, prefix="agent.")
_positive_int_or_none = validators.whole_number(1, optional=True, prefix="agent.")
_positive_seconds_or_none = validators.finite_number(
    0.0, unit="seconds", optional=True, prefix="agent."
)


@attrs.frozen(kw_only=True)
class AgentLoopConfig:
    """The limits of one trajectory.

    Attributes:
        max_turns: Most assistant turns.
        max_completion_tokens: Most completion tokens over all turns, or ``None``.
        max_context_tokens: Longest context (prompt plus completion of a turn), or ``None``.
        time_budget_s: Seconds from ``start`` after which the loop finishes, or ``None``.
        infra_errors_end: When infra errors in tool results end the trajectory.

    Raises (when built):
        ConfigError: a limit that is not a positive number, at ``agent.<field>``.
    """

    max_turns: int = attrs.field(validator=_positive_int)
    max_completion_tokens: int | None = attrs.field(default=None, validator=_positive_int_or_none)
    max_context_tokens: int | None = attrs.field(default=None, validator=_positive_int_or_none)
    time_budget_s: float | None = attrs.field(default=None, validator=_positive_seconds_or_none)
    infra_errors_end: InfraErrorRule = InfraErrorRule.ANY_CALL


# ---------------------------------------------------------------------------------- decisions


@attrs.frozen(kw_only=True)
class CallModel:
    """Ask the model for the next turn.

    Attributes:
        turn: The number of the turn to ask for, from 1.
        completion_tokens_left: What remains of the completion budget (cap ``max_tokens`` with
            it), or ``None`` when there is no such budget.
    """

    turn: int
    completion_tokens_left: int | None = None


@attrs.frozen(kw_only=True)
class RunTools:
    """Run these calls, answer these parse problems, then report with ``tool_results``.

    Attributes:
        calls: The well-formed calls, in the model's order; may be empty when the turn only had
            malformed calls (then report ``tool_results(())``).
        rejections: One ``REJECTED`` result per parse problem, in order, for the conversation;
            their ``call_id`` is the problem's, or ``invalid-<turn>-<index>`` when it had none.
        problems: The parse problems answered, aligned with ``rejections``.
    """

    calls: tuple[ToolCall, ...] = attrs.field(converter=converters.tool_calls)
    rejections: tuple[ToolResult, ...] = attrs.field(default=(), converter=converters.tool_results)
    problems: tuple[ParseProblem, ...] = attrs.field(
        default=(), converter=converters.parse_problems
    )


@attrs.frozen(kw_only=True)
class Finish:
    """The trajectory is over.

    Attributes:
        reason: Why it ended; ``reason.status`` is what group assembly sees.
        detail: One line for logs (the failure's message, the budget that ran out).
    """

    reason: StopReason
    detail: str | None = None


Decision: TypeAlias = CallModel | RunTools | Finish


# -------------------------------------------------------------------------------- statistics


@attrs.frozen(kw_only=True)
class ToolErrorCounts:
    """Tool calls that did not end ``OK``, per outcome."""

    tool_error: int = 0
    timeout: int = 0
    rejected: int = 0
    infra_error: int = 0

    @property
    def total(self) -> int:
        return self.tool_error + self.timeout + self.rejected + self.infra_error

    def of(self, outcome: ToolOutcome) -> int:
        """The count for one outcome (0 for ``OK``, which is not an error)."""
        return 0 if outcome is ToolOutcome.OK else int(getattr(self, outcome.value))

    def plus(self, outcome: ToolOutcome) -> ToolErrorCounts:
        """These counts with one more ``outcome`` (unchanged for ``OK``)."""
        if outcome is ToolOutcome.OK:
            return self
        return attrs.evolve(self, **{outcome.value: self.of(outcome) + 1})


@attrs.frozen(kw_only=True)
class TrajectoryStats:
    """A snapshot of one trajectory's loop (the counts default to 0).

    Attributes:
        state: The loop's state when the snapshot was taken.
        stop_reason: Why it finished, or ``None`` while it runs.
        detail: The finish's detail line.
        turns: Assistant turns received.
        tool_calls: Tool calls answered, one cut by a deadline too (parse problems are not calls).
        tool_errors: Those of them that did not end ``OK``, per outcome.
        parse_errors: Malformed calls the model wrote.
        completion_tokens: Completion tokens over all turns.
        context_tokens: Context length reported with the last turn.
        elapsed_s: Seconds from ``start`` to the last event.
        produced_output: Whether any turn had text, reasoning, a call or a malformed call.
    """

    state: LoopState
    stop_reason: StopReason | None
    detail: str | None
    turns: int = 0
    tool_calls: int = 0
    tool_errors: ToolErrorCounts = ToolErrorCounts()
    parse_errors: int = 0
    completion_tokens: int = 0
    context_tokens: int = 0
    elapsed_s: float = 0.0
    produced_output: bool = False

    @classmethod
    def failed_unstarted(cls, reason: StopReason, detail: str) -> TrajectoryStats:
        """The stats of a trajectory that failed before its loop counted anything (a member
        that crashed outside the loop): finished with ``reason`` and ``detail``, every count 0.

        Raises:
            InvalidInput: ``reason`` is not a failure (field ``reason``).
        """
        if reason.status.healthy:
            raise InvalidInput("reason", f"must be a failure, got {reason.value!r}")
        return cls(state=LoopState.FINISHED, stop_reason=reason, detail=detail)

    @property
    def status(self) -> TrajectoryStatus | None:
        """The trajectory status for group assembly, or ``None`` while the loop runs."""
        return None if self.stop_reason is None else self.stop_reason.status

    @property
    def needs_score(self) -> bool:
        """Whether the env's verify-and-score hook should run: finished healthy, with output,
        in a lease that still stands (not ``sandbox_budget``: its score is the env's fixed one)."""
        status, ended = self.status, self.stop_reason is StopReason.SANDBOX_BUDGET
        return status is not None and status.healthy and self.produced_output and not ended

    def outcome(self, score: float | None = None) -> TrajectoryOutcome:
        """The outcome group assembly takes; pass the score exactly when it is healthy with
        output (the hook's when ``needs_score``, else a ``sandbox_budget`` stop's fixed one).

        Raises:
            StateError: the loop has not finished.
            InvalidInput: a score given or missing against ``needs_score`` (field ``score``).
        """
        if self.stop_reason is None:
            raise StateError(f"cannot make an outcome in state {self.state.value!r}")
        return TrajectoryOutcome(
            status=self.stop_reason.status,
            score=score,
            produced_output=self.produced_output,
            detail=self.detail,
        )


# ---------------------------------------------------------------------------------- the loop


@attrs.define
class AgentLoop:
    """One trajectory's agent loop. Feed it events; do what the returned decision says.

    Attributes:
        config: The trajectory's limits.
    """

    config: AgentLoopConfig
    _state: LoopState = attrs.field(default=LoopState.READY, init=False)
    _stop: Finish | None = attrs.field(default=None, init=False)
    _started_at: float | None = attrs.field(default=None, init=False)
    _last_now: float | None = attrs.field(default=None, init=False)
    _pending: tuple[ToolCall, ...] = attrs.field(default=(), init=False)
    _turns: int = attrs.field(default=0, init=False)
    _tool_calls: int = attrs.field(default=0, init=False)
    _tool_errors: ToolErrorCounts = attrs.field(factory=ToolErrorCounts, init=False)
    _parse_errors: int = attrs.field(default=0, init=False)
    _answered: int = attrs.field(default=0, init=False)  # parse problems given a rejection
    _unanswered: int = attrs.field(default=0, init=False)  # problems of a turn that finished
    _completion_tokens: int = attrs.field(default=0, init=False)
    _context_tokens: int = attrs.field(default=0, init=False)
    _produced_output: bool = attrs.field(default=False, init=False)

    # ------------------------------------------------------------------------------ queries

    @property
    def state(self) -> LoopState:
        return self._state

    @property
    def finished(self) -> bool:
        return self._state is LoopState.FINISHED

    @property
    def pending_calls(self) -> tuple[ToolCall, ...]:
        """The calls whose results the loop waits for (empty unless ``awaiting_tools``)."""
        return self._pending

    def allowed_events(self) -> frozenset[LoopEvent]:
        """The events the current state accepts."""
        return frozenset(_TRANSITIONS[self._state])

    def remaining_seconds(self, now: float) -> float | None:
        """Seconds left of the time budget at ``now`` (at least 0), or ``None`` without one."""
        if self.config.time_budget_s is None or self._started_at is None:
            return self.config.time_budget_s
        return max(0.0, self._started_at + self.config.time_budget_s - now)

    def completion_tokens_left(self) -> int | None:
        """What remains of the completion budget (at least 0), or ``None`` without one."""
        budget = self.config.max_completion_tokens
        return None if budget is None else max(0, budget - self._completion_tokens)

    def stats(self) -> TrajectoryStats:
        """A frozen snapshot of the counters; allowed in every state."""
        started, last = self._started_at, self._last_now
        elapsed = 0.0 if started is None or last is None else last - started
        return TrajectoryStats(
            state=self._state,
            stop_reason=None if self._stop is None else self._stop.reason,
            detail=None if self._stop is None else self._stop.detail,
            turns=self._turns,
            tool_calls=self._tool_calls,
            tool_errors=self._tool_errors,
            parse_errors=self._parse_errors,
            completion_tokens=self._completion_tokens,
            context_tokens=self._context_tokens,
            elapsed_s=elapsed,
            produced_output=self._produced_output,
        )

    def check_valid(self) -> None:
        """Assert that the counters and the state agree (for tests and debugging)."""
        assert self._state in _TRANSITIONS
        assert (self._state is LoopState.FINISHED) == (self._stop is not None)
        assert (self._state is LoopState.READY) == (self._started_at is None)
        assert not self._pending or self._state is LoopState.AWAITING_TOOLS
        assert 0 <= self._turns <= self.config.max_turns
        assert 0 <= self._tool_errors.total <= self._tool_calls
        assert all(self._tool_errors.of(outcome) >= 0 for outcome in ToolOutcome)
        assert self._answered + self._unanswered == self._parse_errors
        assert self._completion_tokens >= 0
        assert self._context_tokens >= 0
        assert self._turns > 0 or not self._produced_output
        if self._started_at is not None:
            assert self._last_now is not None
            assert self._last_now >= self._started_at

    # ------------------------------------------------------------------------------- events

    def start(self, now: float) -> CallModel:
        """Begin the trajectory at ``now``.

        Returns ``CallModel`` for turn 1.

        Raises:
            StateError: the loop was already started.
            InvalidInput: ``now`` is not a finite number (field ``now``).
        """
        self._expect(LoopEvent.START)
        self._observe(now)
        self._started_at = now
        self._move(LoopEvent.START, LoopState.AWAITING_MODEL)
        return self._call_model()

    def assistant_turn(
        self,
        turn: ParsedTurn,
        *,
        finish_reason: FinishReason,
        completion_tokens: int,
        context_tokens: int,
        now: float,
        context_window: int | None = None,
    ) -> RunTools | Finish:
        """Take the model's turn and decide what follows.

        Args:
            turn: The parsed turn.
            finish_reason: Why sampling stopped.
            completion_tokens: Tokens the model generated in this turn.
            context_tokens: Length of the context after this turn (prompt plus completion).
            now: The time the turn arrived.
            context_window: The context this turn's ``max_tokens`` was capped to fit (managed
                mode: the trainer's length), or ``None``; ``max_context_tokens`` counts too.

        Returns ``RunTools`` (calls to run and parse problems to answer) or ``Finish``.

        Raises:
            StateError: the loop is not waiting for the model.
            InvalidInput: a negative or non-integer count, a ``now`` before the last event, or
                two calls with the same id; the field is named and the loop is left unchanged.
        """
        self._expect(LoopEvent.ASSISTANT_TURN)
        completion = loop_checks.checked_count("completion_tokens", completion_tokens)
        context = loop_checks.checked_count("context_tokens", context_tokens)
        if context_window is not None:
            loop_checks.checked_count("context_window", context_window)
        loop_checks.check_distinct_call_ids(turn)
        self._observe(now)

        self._turns += 1
        self._completion_tokens += completion
        self._context_tokens = context
        self._parse_errors += len(turn.errors)
        if turn.content.strip() or (turn.reasoning or "").strip() or turn.calls or turn.errors:
            self._produced_output = True

        def finish(reason: StopReason, detail: str) -> Finish:
            self._unanswered += len(turn.errors)
            return self._finish(LoopEvent.ASSISTANT_TURN, reason, detail)

        if finish_reason is FinishReason.ABORT:
            return finish(StopReason.MODEL_ERROR, "the server aborted the generation")
        if self._time_is_up(now):
            return finish(StopReason.TIME_BUDGET, self._time_detail())
        cut = self._cut_turn_stop(turn, finish_reason, context_window)
        if cut is not None:
            return finish(*cut)
        if not turn.calls:
            if not turn.errors:
                return finish(StopReason.NATURAL, "the model answered without calling a tool")
            budget = self._budget_stop()
            if budget is not None:
                return finish(*budget)
        rejections = tuple(problem.rejection(self._turns) for problem in turn.errors)
        self._answered += len(rejections)
        self._pending = turn.calls
        self._move(LoopEvent.ASSISTANT_TURN, LoopState.AWAITING_TOOLS)
        return RunTools(calls=turn.calls, rejections=rejections, problems=turn.errors)

    def tool_results(self, results: Sequence[ToolResult], *, now: float) -> CallModel | Finish:
        """Take the results of the pending calls (one each, any order) and decide what follows.

        Returns ``CallModel`` for the next turn, or ``Finish`` (a lease a sandbox budget ended,
        infra errors per ``infra_errors_end``, the time budget, ``max_turns``, the token budgets).

        Raises:
            StateError: the loop is not waiting for tool results.
            InvalidInput: a result that answers no pending call or answers one twice
                (``results[i].call_id``), a pending call without a result (``results``), or a
                ``now`` before the last event; the loop is left unchanged.
        """
        self._expect(LoopEvent.TOOL_RESULTS)
        loop_checks.check_results(self._pending, results)
        self._observe(now)

        self._pending = ()
        self._tool_calls += len(results)
        for result in results:
            self._tool_errors = self._tool_errors.plus(result.outcome)
        for ended in results:
            if ended.sandbox_budget is not None:
                detail = f"lease ended for its {ended.sandbox_budget.value} budget: {ended.error}"
                return self._finish(LoopEvent.TOOL_RESULTS, StopReason.SANDBOX_BUDGET, detail)
        infra = [r for r in results if r.outcome is ToolOutcome.INFRA_ERROR]
        rule = self.config.infra_errors_end
        if infra and (rule is InfraErrorRule.ANY_CALL or len(infra) == len(results)):
            first = infra[0]
            detail = f"{len(infra)} of {len(results)} tool calls failed: {first.error or ''}"
            return self._finish(LoopEvent.TOOL_RESULTS, StopReason.INFRA_ERROR, detail.strip())
        if self._time_is_up(now):
            return self._finish(LoopEvent.TOOL_RESULTS, StopReason.TIME_BUDGET, self._time_detail())
        budget = self._budget_stop()
        if budget is not None:
            return self._finish(LoopEvent.TOOL_RESULTS, *budget)
        self._move(LoopEvent.TOOL_RESULTS, LoopState.AWAITING_MODEL)
        return self._call_model()

    def model_failed(self, *, now: float, detail: str, context_full: bool = False) -> Finish:
        """The LLM server failed for this turn (after its retries): finish with ``model_error``;
        with ``context_full`` (it refused the request as longer than the model's context) after
        a first turn, with ``token_budget`` instead: the conversation outgrew the context, a
        budget, as when ``max_context_tokens`` ends the loop. Refused so on the first turn, the
        task and the sampling settings are too long for the model: ``model_error``.

        Raises:
            StateError: the loop is not waiting for the model.
        """
        self._expect(LoopEvent.MODEL_FAILED)
        self._observe(now)
        outgrew = context_full and self._turns > 0  # not the task and max_tokens alone
        reason = StopReason.TOKEN_BUDGET if outgrew else StopReason.MODEL_ERROR
        return self._finish(LoopEvent.MODEL_FAILED, reason, detail)

    def infra_failed(self, *, now: float, detail: str) -> Finish:
        """The sandbox or a server failed outside a tool result: finish with ``infra_error``.

        Allowed before ``start`` too (the slot could not be leased).

        Raises:
            StateError: the loop already finished.
        """
        return self._failed_from_outside(StopReason.INFRA_ERROR, now, detail)

    def env_failed(self, *, now: float, detail: str) -> Finish:
        """The env's own code failed outside a turn (a hook raised): finish with ``env_error``.

        Accepted wherever ``infra_failed`` is (it is the same event, told apart by its cause).

        Raises:
            StateError: the loop already finished.
        """
        return self._failed_from_outside(StopReason.ENV_ERROR, now, detail)

    def out_of_time(self, *, now: float, detail: str | None = None) -> Finish:
        """The time budget ran out while the model or the tools were busy; ``detail`` says whose
        (the caller's deadline), else the loop's own ``time_budget_s``. Raises ``StateError``
        unless the loop is running."""
        self._expect(LoopEvent.OUT_OF_TIME)
        self._observe(now)
        self._pending = ()
        reason = self._time_detail() if detail is None else detail
        return self._finish(LoopEvent.OUT_OF_TIME, StopReason.TIME_BUDGET, reason)

    def idle_limit(self, *, now: float, detail: str) -> Finish:
        """The model's turn kept the slot idle past its lifetime: finish with ``idle_limit``
        (a budget: the work done so far is scored). Raises ``StateError`` unless awaiting it."""
        self._expect(LoopEvent.IDLE_LIMIT)
        self._observe(now)
        return self._finish(LoopEvent.IDLE_LIMIT, StopReason.IDLE_LIMIT, detail)

    # ----------------------------------------------------------------------------- internals

    def _failed_from_outside(self, reason: StopReason, now: float, detail: str) -> Finish:
        """The ``infra_failed`` event, whoever caused it (``reason``); allowed before start."""
        self._expect(LoopEvent.INFRA_FAILED)
        self._observe(now)
        if self._started_at is None:
            self._started_at = now
        self._pending = ()
        return self._finish(LoopEvent.INFRA_FAILED, reason, detail)

    def _expect(self, event: LoopEvent) -> None:
        if event not in _TRANSITIONS[self._state]:
            allowed = sorted(e.value for e in _TRANSITIONS[self._state]) or ["nothing"]
            raise StateError(
                f"cannot handle event {event.value!r} in state {self._state.value!r}; "
                f"this state accepts {', '.join(allowed)}"
            )

    def _move(self, event: LoopEvent, to: LoopState) -> None:
        assert to in _TRANSITIONS[self._state][event], (self._state, event, to)
        self._state = to

    def _observe(self, now: object) -> None:
        self._last_now = loop_checks.checked_now(now, after=self._last_now)

    def _finish(self, event: LoopEvent, reason: StopReason, detail: str) -> Finish:
        self._move(event, LoopState.FINISHED)
        self._stop = Finish(reason=reason, detail=detail)
        return self._stop

    def _call_model(self) -> CallModel:
        return CallModel(turn=self._turns + 1, completion_tokens_left=self.completion_tokens_left())

    def _time_is_up(self, now: float) -> bool:
        budget, started = self.config.time_budget_s, self._started_at
        return budget is not None and started is not None and now - started >= budget

    def _time_detail(self) -> str:
        return f"time budget of {self.config.time_budget_s}s spent"

    def _completion_budget_spent(self) -> bool:
        budget = self.config.max_completion_tokens
        return budget is not None and self._completion_tokens >= budget

    def _cut_turn_stop(
        self, turn: ParsedTurn, finish_reason: FinishReason, context_window: int | None
    ) -> tuple[StopReason, str] | None:
        """How a turn the server cut ends the trajectory, or ``None`` when it goes on."""
        if finish_reason is FinishReason.CONTENT_FILTER:
            return StopReason.CONTENT_FILTER, "finish_reason content_filter: the turn was filtered"
        if finish_reason is not FinishReason.LENGTH:
            return None
        windows = [n for n in (context_window, self.config.max_context_tokens) if n is not None]
        if windows and self._context_tokens >= min(windows):
            detail = f"turn cut at the context window ({self._context_tokens} of {min(windows)})"
            return StopReason.TOKEN_BUDGET, detail
        if turn.calls:
            return None
        if self._completion_budget_spent():
            return StopReason.TOKEN_BUDGET, "completion token budget spent"
        return StopReason.MAX_TOKENS, "cut off by max_tokens with no complete call"

    def _budget_stop(self) -> tuple[StopReason, str] | None:
        if self._turns >= self.config.max_turns:
            return StopReason.MAX_TURNS, f"max_turns={self.config.max_turns} reached"
        if self._completion_budget_spent():
            return StopReason.TOKEN_BUDGET, "completion token budget spent"
        context_budget = self.config.max_context_tokens
        if context_budget is not None and self._context_tokens >= context_budget:
            return StopReason.TOKEN_BUDGET, f"context reached {self._context_tokens} tokens"
        return None
