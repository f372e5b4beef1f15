"""``RenderThreads``: the bound on renders off the loop, and the deadline of a finished
trajectory's render (what a member whose render is too slow comes to, and a group whose renders
queue for one thread: they share the group's deadline plus the grace)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import anyio
import attrs
import pytest

from tests.unit.test_trajectory_render_threads import (
    CONFIG,
    WAIT_S,
    _run,
    _WatchedPolicy,
    anyio_backend,
    llama3,
)
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.render_pool import DaemonRenderPool
from trajcore.adapters.tokenizers import TransformersTokenizer
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.token_ledger.ledger import TrainingTokens
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tools import ToolSpec
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy, ModelTurn, PolicySession, SessionWrapper
from trajcore.rollout.render_threads import RenderLate, RenderThreads, default_render_threads
from trajcore.rollout.trajectory import RolloutConfig, TrajectoryResult

pytestmark = pytest.mark.anyio
__all__ = ["anyio_backend", "llama3"]  # fixtures shared with the trajectory tests


@pytest.fixture(params=["executor", "daemon"])
def render_threads_of(request: pytest.FixtureRequest) -> Callable[[int], RenderThreads]:
    """``RenderThreads`` of so many threads over the default pool, and over the entry points'."""
    if request.param == "daemon":
        return lambda threads: RenderThreads(threads, make_pool=DaemonRenderPool)
    return RenderThreads


async def test_a_render_past_its_deadline_leaves_the_member_scored_without_tokens(
    llama3: TransformersTokenizer,
) -> None:
    rendering, go = threading.Event(), threading.Event()  # go is set only after the run
    template = ChatTemplate.learn(llama3)
    policy = _WatchedPolicy(
        ChatPolicy(FakeChatServer(script=[Message.assistant("done")]), template),
        rendering=rendering,
        go=go,
    )
    config = attrs.evolve(CONFIG, deadline_s=2.0, render_grace_s=0.2)
    render_threads = RenderThreads(threads=1)
    try:
        async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
            with anyio.fail_after(WAIT_S / 2):  # bounded: by the deadline, or at most the grace
                result = await _run(
                    policy, pool, dispatcher, config=config, render_threads=render_threads
                )
    finally:
        go.set()
        render_threads.close()
    assert rendering.is_set()
    assert result.tokens is None
    assert result.drift is None
    assert not result.outcome.has_tokens  # training rules leave it out; never a zero
    assert result.outcome.score == 1.0  # the score stays: evaluation still counts it
    assert result.outcome.status is TrajectoryStatus.FINISHED
    assert "no training tokens: their render did not finish by" in (result.outcome.detail or "")


async def test_a_render_given_up_keeps_its_thread_and_one_not_started_never_starts(
    render_threads_of: Callable[[int], RenderThreads],
) -> None:
    render_threads = render_threads_of(1)
    release, running = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        running.set()
        release.wait(WAIT_S)
        ran.append("slow")
        return "slow"

    def quick() -> str:
        ran.append("quick")
        return "quick"

    try:
        with pytest.raises(RenderLate) as late:
            await render_threads.run(slow, timeout_s=0.2)
        assert late.value.started
        assert running.is_set()
        # the given-up render still holds the only thread: the next one waits, and is dropped
        with pytest.raises(TimeoutError) as timeout:  # a RenderLate is a TimeoutError
            await render_threads.run(quick, timeout_s=0.2)
        assert isinstance(timeout.value, RenderLate)
        assert not timeout.value.started
        release.set()
        assert await render_threads.run(quick, timeout_s=WAIT_S) == "quick"
    finally:
        release.set()
        render_threads.close()
    assert ran == ["slow", "quick"]  # the dropped one never ran


async def test_a_cancelled_callers_queued_render_never_starts(
    render_threads_of: Callable[[int], RenderThreads],
) -> None:
    render_threads = render_threads_of(1)
    release, running = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        running.set()
        release.wait(WAIT_S)
        ran.append("slow")
        return "slow"

    def queued() -> str:
        ran.append("queued")
        return "queued"

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: render_threads.run(slow, timeout_s=WAIT_S))
            await anyio.to_thread.run_sync(running.wait, WAIT_S)
            with anyio.CancelScope() as scope:
                scope.cancel()  # the caller is cancelled while its render waits for the thread
                await render_threads.run(queued, timeout_s=WAIT_S)
            release.set()
        assert await render_threads.run(lambda: "after", timeout_s=WAIT_S) == "after"
    finally:
        release.set()
        render_threads.close()
    assert ran == ["slow"]


async def test_a_render_that_raises_raises_in_the_caller(
    render_threads_of: Callable[[int], RenderThreads],
) -> None:
    render_threads = render_threads_of(2)

    def broken() -> None:
        raise ConfigError("messages", "the chat template refused them")

    try:
        with pytest.raises(ConfigError, match="refused"):
            await render_threads.run(broken, timeout_s=WAIT_S)
    finally:
        render_threads.close()


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="threads"):
        RenderThreads(threads=0)
    with pytest.raises(ConfigError, match="render_grace_s"):
        attrs.evolve(CONFIG, render_grace_s=0)
    assert 1 <= default_render_threads() <= 8


RENDER_S = 0.2  # how long each member's final render takes (it sleeps)


@attrs.frozen
class _SlowRender(SessionWrapper):
    """A session whose final render takes ``RENDER_S``, noting its trajectory when it starts."""

    inner: PolicySession
    tid: str
    started: list[str]

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        return await self.inner.sample(messages, sampling=sampling)

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        self.started.append(self.tid)
        time.sleep(RENDER_S)
        return self.inner.training_tokens(messages, max_token_length=max_token_length)


@attrs.frozen
class _SlowRenderPolicy:
    inner: ChatPolicy
    tid: str
    started: list[str]

    @property
    def token_exact(self) -> bool:
        return False

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        return _SlowRender(self.inner.start(messages, tools=tools), self.tid, self.started)


async def _group(
    llama3: TransformersTokenizer, members: int, config: RolloutConfig
) -> tuple[dict[str, TrajectoryResult], list[str]]:
    """A group of ``members`` that all end at once, their renders queued for one thread: the
    results by member, and the members in the order their renders started."""
    template = ChatTemplate.learn(llama3)
    started: list[str] = []
    results: dict[str, TrajectoryResult] = {}
    render_threads = RenderThreads(threads=1)
    try:
        async with (
            FakeSandboxPool(slots_per_container=members) as pool,
            ToolDispatcher(pool, BatchConfig()) as dispatcher,
        ):

            async def member(tid: str) -> None:
                chat = ChatPolicy(FakeChatServer(script=[Message.assistant("done")]), template)
                policy = _SlowRenderPolicy(chat, tid, started)
                results[tid] = await _run(
                    policy, pool, dispatcher, tid=tid, config=config, render_threads=render_threads
                )

            with anyio.fail_after(WAIT_S * 2):  # bounded: by the deadline plus the grace
                async with anyio.create_task_group() as group:
                    for index in range(members):
                        group.start_soon(member, f"m{index}")
    finally:
        render_threads.close()
    return results, started


async def test_a_groups_renders_queued_for_one_thread_all_finish_when_its_time_allows(
    llama3: TransformersTokenizer,
) -> None:
    """15 renders of 0.2 s, one after another: 3 s, more than the grace counted from each
    member's end (2 s) but well within the group's deadline plus the grace (4 s)."""
    config = attrs.evolve(CONFIG, deadline_s=2.0, render_grace_s=2.0)
    results, started = await _group(llama3, 15, config)
    assert sorted(started) == sorted(results)  # each member's render ran, once
    for result in results.values():
        assert "no training tokens" not in (result.outcome.detail or "")
        assert result.tokens is not None
        assert result.outcome.has_tokens
        assert result.outcome.score == 1.0


async def test_a_groups_renders_that_cannot_make_its_deadline_are_dropped_saying_why(
    llama3: TransformersTokenizer,
) -> None:
    """12 renders of 0.2 s, one after another, from a group that must end 1.6 s after it
    started (its deadline plus the grace): at most 7 can finish, the 8th may be running when
    the time is up, the others cannot start before it."""
    config = attrs.evolve(CONFIG, deadline_s=1.0, render_grace_s=0.6)
    results, started = await _group(llama3, 12, config)
    kept = [tid for tid in started if results[tid].outcome.has_tokens]
    assert kept == started[: len(kept)]  # the renders started in order; the first ones made it
    assert 1 <= len(kept) <= 7
    unfinished = [
        tid
        for tid, result in results.items()
        if "did not finish by" in (result.outcome.detail or "")
    ]
    assert unfinished == started[len(kept) :]  # one thread: at most the one running at the end
    assert len(unfinished) <= 1
    not_started = [tid for tid in results if tid not in started]
    assert len(not_started) >= 4
    for tid, result in results.items():
        assert result.outcome.status is TrajectoryStatus.FINISHED
        assert result.outcome.score == 1.0  # the score stays: evaluation still counts it
        if tid in kept:
            assert result.tokens is not None
            continue
        assert result.tokens is None
        assert not result.outcome.has_tokens
        if tid in not_started:
            assert "no training tokens: their render could not start" in (
                result.outcome.detail or ""
            )
