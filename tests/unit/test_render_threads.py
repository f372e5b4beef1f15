"""``RenderThreads``: the bound on renders off the loop, and the deadline of a finished
trajectory's render (what a member whose render is too slow comes to)."""

from __future__ import annotations

import threading

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
from trajcore.adapters.tokenizers import TransformersTokenizer
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.render_threads import RenderThreads, default_render_threads

pytestmark = pytest.mark.anyio
__all__ = ["anyio_backend", "llama3"]  # fixtures shared with the trajectory tests


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
    assert "no training tokens: their render took longer than" in (result.outcome.detail or "")


async def test_a_render_given_up_keeps_its_thread_and_one_not_started_never_starts() -> None:
    render_threads = RenderThreads(threads=1)
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
        with pytest.raises(TimeoutError):
            await render_threads.run(slow, timeout_s=0.2)
        assert running.is_set()
        # the given-up render still holds the only thread: the next one waits, and is dropped
        with pytest.raises(TimeoutError):
            await render_threads.run(quick, timeout_s=0.2)
        release.set()
        assert await render_threads.run(quick, timeout_s=WAIT_S) == "quick"
    finally:
        release.set()
        render_threads.close()
    assert ran == ["slow", "quick"]  # the dropped one never ran


async def test_a_render_that_raises_raises_in_the_caller() -> None:
    render_threads = RenderThreads(threads=2)

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
