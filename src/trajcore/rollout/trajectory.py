"""Run one trajectory: lease a slot, prepare it, loop the agent, verify and score, release.

The decisions are the domain ``AgentLoop``'s; this module performs them. Its promises:

- **Always an outcome.** Whatever happens (the model server fails, the slot server dies, a hook
  raises, the deadline passes), the result says how the trajectory ended: finished, budget
  exhausted, model error, infrastructure error or env error, with a one-line detail. Failures
  carry no score, so group assembly never mistakes them for a zero. A policy that raises
  ``IdleLimitExceeded`` (a turn past the slot's idle lifetime) ends the loop on that budget.
- **Errors are told apart by who caused them.** A hook (prepare, score) that raises an
  ``InfrastructureError`` (a slot that could not run the hook's command, a dead server) fails the
  member as ``infra_error``; any other exception from a hook (a bug, a forgotten ``await``, an
  uncaught ``SlotFileError``), or an answer that is not a score or a JSON object, is the env's
  own doing and fails it as ``env_error``, with the exception and the traceback's last frame
  (``file:line in function``) in the detail.
- **Always released.** The slot is held by ``SandboxPool.lease``, an async context manager whose
  exit resets (or quarantines) the slot, shielded, also when this task is cancelled.
- **A task environment is the lease's.** ``environment`` (the group's image reference) is named
  in the lease; a lease that cannot run over it (``EnvironmentUnavailable``, an infrastructure
  error naming the image and the reason) fails the member as ``infra_error`` before any hook
  or model call, and its slot is released. With ``prepared`` (the group's preparation done
  once, ``rollout.preparation``), the lease starts from its snapshot where the pool can fork
  it: the prepare hook is then not run again and its metadata is the preparation's; elsewhere
  the member prepares itself.
- **One deadline, its last part kept for scoring.** ``deadline_s`` covers acquisition,
  preparing, the turns and scoring; the turns end at ``deadline_s`` less ``score_reserve``
  (a slot call's timeout is cut to end there too): the loop finishes as ``time_budget`` and
  the score hook runs in the lease with at least the reserve left, unless a model call was
  in flight that ``model_stalled`` calls the server's failure (every server unhealthy, or a
  request past its timeout being retried): that is ``model_error``, as it is when such a call
  meets the slot's idle limit (``IdleLimitExceeded``); a member that finished earlier has all
  the time left. At ``deadline_s`` a prepare or score hook fails the member as where it waited
  says, a score hook a reserve of 0 left no time as ``env_error`` naming ``score_reserve_s``
  (``rollout.hook_deadline``); a wait for a slot, as ``infra_error``.
- **The final render off the loop, with a deadline.** The training tokens (OpenAI mode's
  re-render of the whole conversation, managed mode's export) and managed mode's drift
  re-render are computed in a worker thread of ``RenderThreads`` (at most so many at once, in
  the order asked for), off the event loop, which goes on serving the env's other trajectories
  meanwhile (a conversation under ``render_inline_chars`` is rendered on the loop: the thread
  switch would cost it more). The render, its wait for a thread included, must be done by
  the deadline plus ``render_grace_s``, the same moment for every member of a group: so a
  trajectory, and its group, ends at most ``render_grace_s`` after its deadline, and a member
  loses its render to queueing only when its group's time is truly spent. A render that does
  not make it is dropped (never started if still queued; else its thread finishes it and the
  result is thrown away): the member keeps its outcome and score but has no tokens
  (``has_tokens`` false, so training rules leave it out, never as a zero), its detail says
  why (could not start, or did not finish) and a warning is logged.
- **Bounded tool results.** A result's text longer than ``max_tool_result_chars`` reaches the
  model, the transcript and the training tokens cut in the middle (its head and tail kept, and
  a line saying how many characters were cut and why), whatever its tool: a policy that reads a
  10 MiB file, or a tool server that answers one, costs the env a bounded render and tokenize.
- **A forgotten ``await`` is the env's error.** A hook that called a ``SlotTools`` method
  without ``await`` (``if tools.check(...)``: a coroutine, which is true) fails the member as
  ``env_error`` naming the call and its line, never with its score (``rollout.awaited``).
- **Scoring in the same slot.** The verify-and-score hook gets ``SlotTools`` bound to the slot
  the model worked in, and runs only when the loop says a score is needed (finished healthy, with
  some output); a lease ended for its disk budget (``sandbox_budget``, or ``SlotBudgetSpent``
  from the hook) gives ``sandbox_budget_score``: no check runs there.
- **Hooks carry what the seeds carried.** The prepare hook may return metadata (a JSON object);
  the score hook sees a ``Transcript`` (the messages, and the trajectory's id, stop reason,
  turns, tool calls with their results, and that metadata) and may return ``(score,
  metadata)``. Both metadata objects end up in the ``TrajectoryResult``; one that is not a JSON
  object fails the member as an infrastructure error, like a score that is not a number.

Cancellation from outside (the group or the env shutting down) is not swallowed: the slot is
released and the ``Cancelled`` exception propagates, as structured concurrency requires.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import overload

import anyio
import attrs

from trajcore.domain import validators
from trajcore.domain.agent_loop import (
    AgentLoop,
    AgentLoopConfig,
    CallModel,
    Finish,
    LoopEvent,
    RunTools,
    StopReason,
    TrajectoryStats,
)
from trajcore.domain.errors import (
    ConfigError,
    ContextFull,
    IdleLimitExceeded,
    InfrastructureError,
    InvalidInput,
    ModelServerRejected,
    SlotBudgetSpent,
)
from trajcore.domain.groups import TrajectoryOutcome, TrajectoryStatus
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.token_ledger.drift import Drift
from trajcore.domain.token_ledger.ledger import TrainingTokens, Truncation
from trajcore.domain.tools import ToolCall, ToolResult, ToolSpec
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.hook_deadline import unfinished_hook, unscored
from trajcore.rollout.hook_failures import (
    env_failure,
    first_failure,
    forgotten_await,
    infrastructure_failure,
    metadata_problem,
)
from trajcore.rollout.policy import (
    ModelStallCheck,
    Policy,
    PolicySession,
    context_window,
    turn_cap,
)
from trajcore.rollout.preparation import Prepared, member_lease, unstarted_lease
from trajcore.rollout.render_threads import RenderThreads, render_member, shared_render_threads
from trajcore.rollout.tools import SlotTools, ToolRouter, capped

__all__ = [
    "RolloutConfig",
    "ToolExchange",
    "TrajectoryHooks",
    "TrajectoryResult",
    "Transcript",
    "run_trajectory",
]

_RESERVE_S = 60.0  # the most a trajectory keeps for scoring by default
_reserve_seconds = validators.finite_number(None, at_least=0.0, unit="seconds")


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """How trajectories run.

    Attributes:
        agent: Turn, token and time limits of the agent loop.
        sampling: Sampling parameters for every turn (``max_tokens`` is capped by the loop's
            remaining completion budget).
        tool_timeout_s: Limit of one slot tool call (the env's, never the model's).
        deadline_s: The single deadline of a trajectory: acquire, prepare, model, tools and
            scoring.
        score_reserve_s: The last part of ``deadline_s`` kept for scoring: the agent's turns
            end at ``deadline_s`` less this, so the score hook of a member whose time ran out
            still has it (``score_reserve``). ``None``: a tenth of ``deadline_s``, at most
            60 s. At least 0 and below ``deadline_s``.
        acquire_timeout_s: Longest wait for a slot (also bounded by ``deadline_s``).
        tool_delay_s: Pause before each batch of tool calls (rate-limits real tools).
        max_token_length: Truncation of exported training tokens.
        max_tool_result_chars: Longest text of one tool result the model sees; a longer one is
            cut in the middle (``None``: no cap).
        render_grace_s: How long past ``deadline_s`` the final render (training tokens,
            drift) may go on, in a worker thread, its wait for one included: it must be done
            by the deadline plus this (``rollout.render_threads``).
        render_inline_chars: A conversation whose messages hold fewer characters than this
            is rendered on the loop: its render is shorter than the switch to a worker thread
            and back costs (``0``: every render in a worker thread).
        sandbox_budget_score: The score of a member whose lease the slot server ended for its
            disk budget (``sandbox_budget``): the score hook is not called for it (its check
            cannot run in the ended lease). ``None``: left out, as an ``infra_error``.
    """

    agent: AgentLoopConfig
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    tool_timeout_s: float = 60.0
    deadline_s: float = 1800.0
    acquire_timeout_s: float = 600.0
    tool_delay_s: float = 0.0
    max_token_length: int | None = None
    max_tool_result_chars: int | None = attrs.field(default=100_000)
    render_grace_s: float = attrs.field(default=120.0)
    render_inline_chars: int = attrs.field(default=8192)
    sandbox_budget_score: float | None = attrs.field(
        default=0.0, validator=validators.finite_number(None, optional=True)
    )
    score_reserve_s: float | None = attrs.field(default=None)

    @score_reserve_s.validator
    def _check_reserve(self, attribute: attrs.Attribute[float | None], value: float | None) -> None:
        if value is None:
            return
        _reserve_seconds(self, attribute, value)
        if not value < self.deadline_s:
            raise ConfigError(
                attribute.name,
                f"must be below deadline_s={self.deadline_s:g}, which it is a part of (the "
                f"turns would have no time), got {value!r}",
            )

    @property
    def score_reserve(self) -> float:
        """The seconds of ``deadline_s`` kept for scoring (``score_reserve_s``'s default)."""
        reserve = self.score_reserve_s
        return min(_RESERVE_S, self.deadline_s / 10) if reserve is None else reserve

    @render_inline_chars.validator
    def _check_inline(self, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(attribute.name, f"must be a whole number >= 0, got {value!r}")

    @render_grace_s.validator
    def _check_grace(self, attribute: attrs.Attribute[float], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(attribute.name, f"must be a number of seconds above 0, got {value!r}")

    @max_tool_result_chars.validator
    def _check_cap(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or value < 200):
            raise ConfigError(attribute.name, f"must be at least 200 characters, got {value!r}")


@attrs.frozen(kw_only=True)
class ToolExchange:
    """One tool call and its result, for logs and rollout tables."""

    turn: int
    call: ToolCall
    result: ToolResult


@attrs.frozen(kw_only=True)
class TrajectoryResult:
    """Everything one trajectory produced.

    Attributes:
        trajectory_id: Its id (also the lease holder).
        messages: The conversation, system prompt to last message.
        stats: The agent loop's final counters and stop reason.
        outcome: What group assembly takes (status, score, whether there was output).
        tokens: Training tokens, or ``None`` (OpenAI mode without a tokenizer, or no model call).
        drift: Managed mode's ledger-versus-re-render metric, when measured.
        exchanges: Every tool call with its result, in order.
        duration_s: Wall time from start to release.
        slot: The slot it ran in (``container/index``), or ``None`` if none was acquired.
    """

    trajectory_id: str
    messages: tuple[Message, ...]
    stats: TrajectoryStats
    outcome: TrajectoryOutcome
    tokens: TrainingTokens | None
    drift: Drift | None
    exchanges: tuple[ToolExchange, ...]
    duration_s: float
    slot: str | None
    prepare_metadata: JSONObject | None = None
    score_metadata: JSONObject | None = None

    @property
    def truncation(self) -> Truncation | None:
        """What the export cut to fit ``max_token_length``, or ``None`` (nothing cut, or no
        training tokens)."""
        return None if self.tokens is None else self.tokens.truncation


@attrs.frozen(kw_only=True)
class Transcript(Sequence[Message]):
    """What the score hook sees: the conversation (it *is* the sequence of messages) and the
    trajectory's story so far.

    Attributes:
        trajectory_id: The trajectory's id.
        messages: The conversation, system prompt to last message.
        stats: The agent loop's counters and stop reason (the loop has finished).
        exchanges: Every tool call with its result, in order.
        prepare_metadata: What the prepare hook returned, or ``None``.
    """

    trajectory_id: str
    messages: tuple[Message, ...]
    stats: TrajectoryStats
    exchanges: tuple[ToolExchange, ...]
    prepare_metadata: JSONObject | None = None

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self.messages[index]

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    @property
    def final_response(self) -> str:
        """The text of the last assistant message ("" when there is none)."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content
        return ""

    @property
    def reasoning(self) -> tuple[str | None, ...]:
        """Each assistant turn's reasoning (``None`` where it had none), in order."""
        return tuple(m.reasoning for m in self.messages if m.role == "assistant")

    @property
    def tool_errors(self) -> tuple[ToolExchange, ...]:
        """The exchanges whose result was not ``OK``, in order."""
        return tuple(e for e in self.exchanges if not e.result.ok)


ScoreAnswer = float | tuple[float, JSONObject]
"""A score hook's answer: a score, or ``(score, metadata)``."""


@attrs.frozen(kw_only=True)
class TrajectoryHooks:
    """The env's part of a trajectory.

    Attributes:
        prepare: Set up the workspace before the first turn (files, repositories); may return
            metadata (a JSON object) that the score hook and the result carry.
        score: Verify the work in the slot and return a score, or ``(score, metadata)``; runs
            only when a score is needed. Its ``Transcript`` is a ``Sequence[Message]``, so a
            hook that only reads the messages may take ``Sequence[Message]``.
    """

    prepare: Callable[[SlotTools], Awaitable[JSONObject | None]]
    score: Callable[[SlotTools, Transcript], Awaitable[ScoreAnswer]]


@attrs.define
class _Run:
    trajectory_id: str
    config: RolloutConfig
    loop: AgentLoop
    messages: list[Message]
    clock: Callable[[], float]  # the dispatcher's: anyio's time, the backend looked up once
    turns_end: float = math.inf  # the turns' deadline, by ``clock``: scoring keeps the rest
    turns_scope: anyio.CancelScope | None = None  # what ends the turns there (``_turns``)
    sampling_since: float | None = None  # when the model call in flight was sent
    exchanges: list[ToolExchange] = attrs.field(factory=list)
    cut: tuple[RunTools, int, ToolRouter] | None = None  # a turn's calls running (``_tools``)
    session: PolicySession | None = None
    slot: str | None = None
    score: float | None = None
    score_failure: str | None = None
    score_failure_status: TrajectoryStatus = TrajectoryStatus.ENV_ERROR
    budget_spent: str | None = None  # the score hook met its lease ended for the model's budget
    unprepared: tuple[str, TrajectoryStatus] | None = None  # the deadline ended the prepare hook
    prepare_metadata: JSONObject | None = None
    score_metadata: JSONObject | None = None

    def now(self) -> float:
        return self.clock()


async def run_trajectory(
    *,
    trajectory_id: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    hooks: TrajectoryHooks,
    policy: Policy,
    pool: SandboxPool,
    dispatcher: ToolDispatcher,
    tool_server: ToolServer | None,
    config: RolloutConfig,
    environment: str | None = None,
    prepared: Prepared | None = None,
    render_threads: RenderThreads | None = None,
    model_stalled: ModelStallCheck | None = None,
) -> TrajectoryResult:
    """Run one trajectory to its end, its lease over ``environment`` (an image reference) when
    given, from the group's ``prepared`` snapshot where it can, its final render in
    ``render_threads`` (the process's shared ones by default), a model call in flight at the
    turns' deadline judged by ``model_stalled``; see the module docstring for its promises."""
    run = _Run(trajectory_id, config, AgentLoop(config.agent), list(messages), dispatcher.clock)
    started = run.now()
    run.turns_end = started + config.deadline_s - config.score_reserve
    env = _Env(
        tools, hooks, policy, pool, dispatcher, tool_server, environment, prepared, model_stalled
    )
    with anyio.move_on_after(config.deadline_s) as deadline:
        await _leased(run, env)
    if deadline.cancelled_caught:  # with no score reserve, the turns end here too
        _stalled_model(run, env, "at the trajectory's deadline")
        _answer_cut(run, "not finished: the trajectory's deadline passed while it ran")
    if deadline.cancelled_caught and not run.loop.finished:
        if LoopEvent.OUT_OF_TIME in run.loop.allowed_events():
            detail = f"the trajectory's deadline of {config.deadline_s:g} s passed"
            run.loop.out_of_time(now=run.now(), detail=detail)
        elif run.slot is None:  # no slot, or (over an environment) its server still opening it
            why = unstarted_lease(env.environment, config.deadline_s)
            run.loop.infra_failed(now=run.now(), detail=why)
        elif run.unprepared is None:
            run.loop.infra_failed(now=run.now(), detail="the deadline passed while preparing")
        elif run.unprepared[1] is TrajectoryStatus.ENV_ERROR:  # where the prepare hook waited
            run.loop.env_failed(now=run.now(), detail=run.unprepared[0])
        else:
            run.loop.infra_failed(now=run.now(), detail=run.unprepared[0])
    threads = shared_render_threads() if render_threads is None else render_threads
    return await _result(run, policy, started, threads)


@attrs.frozen
class _Env:
    tools: Sequence[ToolSpec]
    hooks: TrajectoryHooks
    policy: Policy
    pool: SandboxPool
    dispatcher: ToolDispatcher
    tool_server: ToolServer | None
    environment: str | None = None
    prepared: Prepared | None = None
    model_stalled: ModelStallCheck | None = None


async def _leased(run: _Run, env: _Env) -> None:
    config = run.config
    try:
        leasing = member_lease(
            env.pool, run.trajectory_id, timeout_s=config.acquire_timeout_s,
            environment=env.environment, prepared=env.prepared,
        )  # fmt: skip
        async with leasing as (lease, forked):
            run.slot = str(lease.slot)
            router = ToolRouter(
                lease=lease,
                dispatcher=env.dispatcher,
                tool_server=env.tool_server,
                offered=frozenset(spec.name for spec in env.tools),
                tool_timeout_s=config.tool_timeout_s,
                trajectory_id=run.trajectory_id,
            )
            slot_tools = SlotTools(router, pool=env.pool, environment=env.environment)
            try:
                metadata: object = (
                    env.prepared.metadata
                    if forked and env.prepared is not None
                    else await env.hooks.prepare(slot_tools)
                )
            except anyio.get_cancelled_exc_class() as cancelled:  # the deadline, or the run's end
                cut = slot_tools.router.calls_cut_since(run.turns_end + config.score_reserve)
                run.unprepared = unfinished_hook("prepare hook", cancelled, cut)
                raise
            except Exception as exc:  # noqa: BLE001 - the env's own code, or the slot's failure
                forgotten = forgotten_await(slot_tools, "prepare hook")
                if infrastructure_failure(exc):
                    detail = f"prepare hook failed: {first_failure(exc)}"
                    run.loop.infra_failed(now=run.now(), detail=detail)
                else:  # a coroutine used as its answer raises: the forgotten await is the cause
                    detail = forgotten or env_failure("prepare hook", exc)
                    run.loop.env_failed(now=run.now(), detail=detail)
                return
            forgotten = forgotten_await(slot_tools, "prepare hook")
            if forgotten is not None:
                run.loop.env_failed(now=run.now(), detail=forgotten)
                return
            problem = metadata_problem(metadata)
            if problem is not None:
                run.loop.env_failed(now=run.now(), detail=f"prepare hook returned {problem}")
                return
            run.prepare_metadata = metadata  # type: ignore[assignment]  # checked just above
            await _turns(run, env, router)
            if run.loop.stats().needs_score:
                await _score(run, env.hooks, slot_tools)
    except InfrastructureError as exc:  # the lease: AcquireTimeout, EnvironmentUnavailable, ...
        if not run.loop.finished:
            run.loop.infra_failed(now=run.now(), detail=f"{type(exc).__name__}: {exc}")


async def _turns(run: _Run, env: _Env, router: ToolRouter) -> None:
    """The agent loop, ended at the turns' deadline as ``time_budget`` (the loop's
    ``out_of_time``), the score reserve left for scoring."""
    left = run.turns_end - run.now()  # by the dispatcher's clock; the scope's is anyio's
    with anyio.CancelScope(deadline=anyio.current_time() + left) as turns:
        run.turns_scope = turns
        await _agent(run, env, router)
    if turns.cancelled_caught and LoopEvent.OUT_OF_TIME in run.loop.allowed_events():
        if _stalled_model(run, env, "at the turns' deadline"):
            return
        _answer_cut(run, "not finished: the turns' deadline passed while it ran")
        config = run.config
        detail = (
            f"the turns' deadline passed (deadline_s={config.deadline_s:g} s less "
            f"score_reserve_s={config.score_reserve:g} s, kept for scoring)"
        )
        if LoopEvent.OUT_OF_TIME in run.loop.allowed_events():  # not ended by those answers
            run.loop.out_of_time(now=run.now(), detail=detail)


def _stalled_model(run: _Run, env: _Env, when: str) -> bool:
    """Whether the model call in flight (``when`` its time ran out) is the model server's
    failure by the run's ``model_stalled``: if so, the loop has ended as ``model_error``."""
    since, check = run.sampling_since, env.model_stalled
    why = None if since is None or check is None else check(run.now() - since)
    if why is not None and LoopEvent.MODEL_FAILED in run.loop.allowed_events():
        run.loop.model_failed(now=run.now(), detail=f"{when}: {why}")
        return True
    return False


async def _agent(run: _Run, env: _Env, router: ToolRouter) -> None:
    loop = run.loop
    decision: CallModel | RunTools | Finish = loop.start(run.now())
    run.session = session = env.policy.start(run.messages, tools=env.tools)
    while isinstance(decision, CallModel):
        turn_number = decision.turn
        config = run.config
        sampling = config.sampling
        window = context_window(session, config.agent.max_context_tokens, config.max_token_length)
        prompt = session.prompt_tokens()
        if window is not None and prompt is not None and prompt >= window and turn_number > 1:
            # the last tool results filled the context: no turn fits, a budget (the work so
            # far is scored), not one more request for a single token
            loop.model_failed(
                now=run.now(),
                detail=f"the conversation ({prompt} tokens) fills the context ({window} tokens)",
                context_full=True,
            )
            return
        cap = turn_cap(session, decision.completion_tokens_left, window)
        if cap is not None and cap < sampling.max_tokens:
            sampling = attrs.evolve(sampling, max_tokens=max(1, cap))
        run.sampling_since = run.now()
        try:
            turn = await session.sample(run.messages, sampling=sampling)
        except IdleLimitExceeded as exc:
            if not _stalled_model(run, env, "at the slot's idle limit"):
                loop.idle_limit(now=run.now(), detail=str(exc))
            return
        except (InfrastructureError, ModelServerRejected, InvalidInput) as exc:
            loop.model_failed(
                now=run.now(),
                detail=f"{type(exc).__name__}: {exc}",
                context_full=isinstance(exc, ContextFull),  # a budget: the work so far is scored
            )
            return
        run.sampling_since = None
        run.messages.append(turn.parsed.to_message())
        decision = loop.assistant_turn(
            turn.parsed,
            finish_reason=turn.finish_reason,
            completion_tokens=turn.completion_tokens,
            context_tokens=turn.context_tokens,
            now=run.now(),
            context_window=window,  # a turn cut there ends the trajectory as token_budget
        )
        if isinstance(decision, RunTools):
            decision = await _tools(run, decision, router, session, turn_number)


async def _tools(
    run: _Run, decision: RunTools, router: ToolRouter, session: PolicySession, turn: int
) -> CallModel | Finish:
    """Run the calls of the model's turn number ``turn`` and hand the loop their results;
    the deadline passing first, ``_answer_cut`` answers them."""
    run.cut = (decision, turn, router)
    if run.config.tool_delay_s > 0:
        await anyio.sleep(run.config.tool_delay_s)
    left = run.turns_end - run.now()  # for the turn's calls, all together
    wait_s = min(1.0, run.config.score_reserve / 2)  # for their results past it, at most
    results = await router.run_turn(decision.calls, left, run.turns_scope, wait_s)
    run.cut = None
    next_step = _take(run, decision, results, session, turn)
    if isinstance(next_step, CallModel) and run.now() >= run.turns_end:  # results past the
        await anyio.lowlevel.checkpoint()  # turns' deadline: its scope, put back, ends them
    return next_step


def _answer_cut(run: _Run, why: str) -> None:
    """Answer the calls of the turn the deadline cut in ``_tools``, if any, each ``TIMEOUT``
    saying ``why`` and counted as the loop's tool calls: every call of the model has its
    answer in the messages (and the training tokens), whatever ended the turns."""
    if run.cut is not None and run.session is not None:
        (decision, turn, router), run.cut = run.cut, None
        _take(run, decision, router.unanswered(decision.calls, why), run.session, turn)


def _take(
    run: _Run, decision: RunTools, results: list[ToolResult], session: PolicySession, turn: int
) -> CallModel | Finish:
    """Record the results and rejections of the model's turn ``turn``; give the loop those."""
    cap = run.config.max_tool_result_chars
    if cap is not None:
        results = [capped(result, cap) for result in results]
    by_id = {result.call_id: result for result in results}
    answered = [*results, *decision.rejections]
    run.exchanges.extend(
        ToolExchange(turn=turn, call=call, result=by_id[call.id]) for call in decision.calls
    )
    tool_messages = [Message.tool(result) for result in answered]
    run.messages.extend(tool_messages)
    next_step = run.loop.tool_results(results, now=run.now())
    if isinstance(next_step, CallModel):
        try:
            session.add_environment(tool_messages)
        except ConfigError as exc:  # the env's chat template: an env_error, never infra's
            return run.loop.env_failed(
                now=run.now(), detail=f"the tool results cannot be appended: {exc}"
            )
    return next_step


def _transcript(run: _Run) -> Transcript:
    return Transcript(
        trajectory_id=run.trajectory_id,
        messages=tuple(run.messages),
        stats=run.loop.stats(),
        exchanges=tuple(run.exchanges),
        prepare_metadata=run.prepare_metadata,
    )


async def _score(run: _Run, hooks: TrajectoryHooks, slot_tools: SlotTools) -> None:
    try:
        score: object = await hooks.score(slot_tools, _transcript(run))
    except anyio.get_cancelled_exc_class() as cancelled:  # the deadline, or the run's end
        cut = slot_tools.router.calls_cut_since(run.turns_end + run.config.score_reserve)
        hook, turns = unfinished_hook("score hook", cancelled, cut), run.turns_scope
        stop = run.loop.stats().stop_reason if turns and turns.cancelled_caught else None
        run.score_failure, run.score_failure_status = unscored(run.config, stop, hook)
        raise
    except Exception as exc:  # noqa: BLE001 - the env's own code, or the slot's failure
        forgotten = forgotten_await(slot_tools, "score hook")
        if isinstance(first_failure(exc), SlotBudgetSpent):
            run.budget_spent = f"score hook: {first_failure(exc)}"
        elif infrastructure_failure(exc):
            run.score_failure = f"score hook failed: {first_failure(exc)}"
            run.score_failure_status = TrajectoryStatus.INFRA_ERROR
        else:  # a coroutine used as its answer raises: the forgotten await is the cause
            run.score_failure = forgotten or env_failure("score hook", exc)
        return
    if (forgotten := forgotten_await(slot_tools, "score hook")) is not None:
        run.score_failure = forgotten
        return
    if isinstance(score, tuple) and len(score) == 2:
        score, metadata = score
        problem = metadata_problem(metadata)
        if problem is not None:
            run.score_failure = f"score hook returned {problem}"
            return
        run.score_metadata = metadata
    if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score):
        run.score_failure = f"score hook returned {score!r}, not a finite number"
        return
    run.score = float(score)


async def _result(
    run: _Run, policy: Policy, started: float, threads: RenderThreads
) -> TrajectoryResult:
    stats = run.loop.stats()
    detail, spent = stats.detail, run.budget_spent
    if stats.stop_reason is StopReason.SANDBOX_BUDGET or spent:  # no hook could run or finish
        run.score = run.config.sandbox_budget_score
        given = "left out" if run.score is None else f"scored sandbox_budget_score={run.score!r}"
        detail = f"{spent}; {given}" if spent else f"{detail}; the score hook was not run: {given}"
        if run.score is None:
            run.score_failure, run.score_failure_status = detail, TrajectoryStatus.INFRA_ERROR
    if stats.needs_score and run.score is None and run.score_failure is None:  # never started
        run.score_failure, run.score_failure_status = unscored(run.config, stats.stop_reason, None)
    config = run.config
    (tokens, drift), unrendered = await render_member(
        run.trajectory_id, run.session, tuple(run.messages), turns=stats.turns,
        drift=policy.token_exact and stats.stop_reason is not StopReason.MODEL_ERROR,
        max_token_length=config.max_token_length, inline_chars=config.render_inline_chars,
        threads=threads,  # by the deadline plus the grace, the group's too
        timeout_s=started + config.deadline_s + config.render_grace_s - run.now(),
    )  # fmt: skip
    # training data only where a sampled token is left to train on: a member cut to
    # max_token_length before its first completion token is left out as having no tokens
    trainable = tokens is not None and tokens.completion_tokens > 0
    if run.score_failure is not None:
        outcome = TrajectoryOutcome(
            status=run.score_failure_status, produced_output=stats.produced_output,
            detail=run.score_failure, has_tokens=trainable,
        )  # fmt: skip
    else:
        outcome = attrs.evolve(stats.outcome(score=run.score), has_tokens=trainable, detail=detail)
    if unrendered is not None:
        detail = unrendered if outcome.detail is None else f"{outcome.detail}; {unrendered}"
        outcome = attrs.evolve(outcome, detail=detail)
    return TrajectoryResult(
        trajectory_id=run.trajectory_id,
        messages=tuple(run.messages),
        stats=stats,
        outcome=outcome,
        tokens=tokens,
        drift=drift,
        exchanges=tuple(run.exchanges),
        duration_s=run.now() - started,
        slot=run.slot,
        prepare_metadata=run.prepare_metadata,
        score_metadata=run.score_metadata,
    )
