"""A finished trajectory's render (training tokens, drift) runs in a worker thread, not on the
event loop, so the env's other trajectories go on meanwhile (through the real trajectory runner,
with the shipped fakes and a small real tokenizer). Its deadline and its bound are in
``test_render_threads``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest

from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import TransformersTokenizer
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.token_ledger.drift import Drift
from trajcore.domain.token_ledger.ledger import TrainingTokens
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import (
    ChatPolicy,
    ModelTurn,
    Policy,
    PolicySession,
    SessionWrapper,
    TokenPolicy,
)
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    run_trajectory,
)
from trajcore.testing.tokenizers import write_llama3_shaped_tokenizer

pytestmark = pytest.mark.anyio

TASK = [Message.system("You fix things."), Message.user("Create done.txt containing ok.")]
CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    sampling=SamplingParams(max_tokens=256),
    tool_timeout_s=5.0,
    deadline_s=30.0,
    acquire_timeout_s=5.0,
    render_inline_chars=0,  # every render in a worker thread, however small
)
WAIT_S = 10.0  # how long a blocked render waits for the other trajectory before it gives up


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> TransformersTokenizer:
    return TransformersTokenizer.from_path(
        write_llama3_shaped_tokenizer(tmp_path_factory.mktemp("llama3"))
    )


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 1.0


HOOKS = TrajectoryHooks(prepare=_prepare, score=_score)


@attrs.define
class _Recorder:
    """The ``Tokenizer`` port over ``inner``, noting the thread of every render."""

    inner: TransformersTokenizer
    render_threads: list[int] = attrs.field(factory=list)

    @property
    def eos_token_id(self) -> int | None:
        return self.inner.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        self.render_threads.append(threading.get_ident())
        return self.inner.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)


@attrs.frozen
class _Watched(SessionWrapper):
    """A session that notes the thread its final render (tokens, drift) runs in, and can make
    that render wait for ``go`` (set by another trajectory's work)."""

    inner: PolicySession
    seen: list[tuple[str, int]]
    rendering: threading.Event | None = None
    go: threading.Event | None = None

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        return await self.inner.sample(messages, sampling=sampling)

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        self.seen.append(("training_tokens", threading.get_ident()))
        if self.rendering is not None and self.go is not None:
            self.rendering.set()
            if not self.go.wait(WAIT_S):
                raise AssertionError("the other trajectory never ran while this one rendered")
        return self.inner.training_tokens(messages, max_token_length=max_token_length)

    def drift(self, messages: Sequence[Message]) -> Drift | None:
        self.seen.append(("drift", threading.get_ident()))
        return self.inner.drift(messages)


@attrs.frozen
class _WatchedPolicy:
    inner: Policy
    seen: list[tuple[str, int]] = attrs.field(factory=list)
    rendering: threading.Event | None = None
    go: threading.Event | None = None

    @property
    def token_exact(self) -> bool:
        return self.inner.token_exact

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        session = self.inner.start(messages, tools=tools)
        return _Watched(session, self.seen, self.rendering, self.go)


async def _run(
    policy: Policy,
    pool: FakeSandboxPool,
    dispatcher: ToolDispatcher,
    *,
    tid: str = "t0",
    config: RolloutConfig = CONFIG,
    **more: Any,
) -> TrajectoryResult:
    return await run_trajectory(
        trajectory_id=tid,
        messages=TASK,
        tools=SLOT_TOOL_SPECS,
        hooks=HOOKS,
        policy=policy,
        pool=pool,
        dispatcher=dispatcher,
        tool_server=None,
        config=config,
        **more,
    )


def _writing_chat() -> FakeChatServer:
    call = ToolCall(id="c1", name="write_file", arguments={"path": "done.txt", "content": "ok"})
    return FakeChatServer(
        script=[Message.assistant("writing", tool_calls=[call]), Message.assistant("done")]
    )


async def test_openai_mode_renders_the_training_tokens_off_the_event_loop(
    llama3: TransformersTokenizer,
) -> None:
    recorder = _Recorder(llama3)
    template = ChatTemplate.learn(recorder)
    recorder.render_threads.clear()
    policy = _WatchedPolicy(ChatPolicy(_writing_chat(), template))
    loop_thread = threading.get_ident()
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        result = await _run(policy, pool, dispatcher)
    assert result.outcome.score == 1.0
    assert result.tokens is not None
    assert result.outcome.has_tokens
    assert [what for what, _ in policy.seen] == ["training_tokens"]
    assert loop_thread not in [thread for _, thread in policy.seen]
    assert recorder.render_threads  # the re-render (one per assistant turn, and the whole)
    assert loop_thread not in recorder.render_threads


async def test_managed_mode_exports_and_measures_drift_off_the_event_loop(
    llama3: TransformersTokenizer,
) -> None:
    recorder = _Recorder(llama3)
    template = ChatTemplate.learn(recorder)
    eot = llama3.encode("<|eot_id|>")

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        ids = [*llama3.encode("All done."), *eot]
        return TokenCompletion.of(ids, [-0.25] * len(ids), FinishReason.STOP)

    policy = _WatchedPolicy(
        TokenPolicy(
            server=FakeTokenServer(policy=respond),
            tokenizer=recorder,
            template=template,
            parser=get_parser("llama3_json"),
        )
    )
    loop_thread = threading.get_ident()
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        recorder.render_threads.clear()
        result = await _run(policy, pool, dispatcher)
    assert result.tokens is not None
    assert result.drift is not None
    assert [what for what, _ in policy.seen] == ["training_tokens", "drift"]
    assert loop_thread not in [thread for _, thread in policy.seen]
    # the prompt is rendered on the loop when the trajectory starts; the drift's full
    # re-render, the last one, in the worker thread
    assert recorder.render_threads[0] == loop_thread
    assert recorder.render_threads[-1] != loop_thread


async def test_a_small_conversation_renders_on_the_loop_and_a_large_one_off_it(
    llama3: TransformersTokenizer,
) -> None:
    """Under ``render_inline_chars`` the render is cheaper than the switch to a thread and back:
    it runs on the loop; at or above it, in a worker thread."""
    loop_thread = threading.get_ident()
    threads = {}
    for name, limit in (("small", 100_000), ("large", 10)):  # the conversation: about 200
        policy = _WatchedPolicy(ChatPolicy(_writing_chat(), ChatTemplate.learn(llama3)))
        config = attrs.evolve(CONFIG, render_inline_chars=limit)
        async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
            result = await _run(policy, pool, dispatcher, config=config)
        assert result.outcome.has_tokens
        threads[name] = [thread for _, thread in policy.seen]
    assert threads["small"] == [loop_thread]
    assert loop_thread not in threads["large"]


@attrs.frozen
class _AfterRender(SessionWrapper):
    """A session whose first model call waits until the other trajectory is rendering, then
    lets that render go on: it can only happen while that render runs."""

    inner: PolicySession
    rendering: threading.Event
    go: threading.Event

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        await anyio.to_thread.run_sync(self.rendering.wait, WAIT_S)
        assert self.rendering.is_set()
        self.go.set()
        return await self.inner.sample(messages, sampling=sampling)


@attrs.frozen
class _AfterRenderPolicy:
    inner: Policy
    rendering: threading.Event
    go: threading.Event

    @property
    def token_exact(self) -> bool:
        return False

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        return _AfterRender(self.inner.start(messages, tools=tools), self.rendering, self.go)


async def test_another_trajectory_runs_while_one_renders(llama3: TransformersTokenizer) -> None:
    rendering, go = threading.Event(), threading.Event()
    template = ChatTemplate.learn(llama3)
    first = _WatchedPolicy(
        ChatPolicy(FakeChatServer(script=[Message.assistant("done")]), template),
        rendering=rendering,
        go=go,
    )
    second = _AfterRenderPolicy(
        ChatPolicy(FakeChatServer(script=[Message.assistant("done too")])), rendering, go
    )
    results: dict[str, TrajectoryResult] = {}
    async with (
        FakeSandboxPool(slots_per_container=2) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):

        async def run(policy: Policy, tid: str) -> None:
            results[tid] = await _run(policy, pool, dispatcher, tid=tid)

        try:
            # The render blocks until the second trajectory's model call: on the loop, that
            # call could never come (the render then gives up after WAIT_S, failing it).
            with anyio.fail_after(WAIT_S / 2):
                async with anyio.create_task_group() as group:
                    group.start_soon(run, first, "first")
                    group.start_soon(run, second, "second")
        finally:
            go.set()  # never leave a worker thread waiting
    assert results["first"].outcome.score == 1.0
    assert results["first"].tokens is not None
    assert results["second"].outcome.score == 1.0


async def test_a_conversation_large_in_its_tool_call_arguments_renders_off_the_loop(
    llama3: TransformersTokenizer,
) -> None:
    """The size that keeps a render on the loop counts the tool calls' arguments too: a model
    that writes a whole file in one ``write_file`` call (its message's text empty) is rendered
    in a worker thread, else its tokenizing would hold the loop (every other trajectory, the
    deadlines and Ctrl-C) for as long as it takes."""
    big = ToolCall(id="c1", name="write_file", arguments={"path": "big.txt", "content": "y" * 500})
    chat = FakeChatServer(script=[Message.assistant("", tool_calls=[big]), Message.assistant("")])
    policy = _WatchedPolicy(ChatPolicy(chat, ChatTemplate.learn(llama3)))
    config = attrs.evolve(CONFIG, render_inline_chars=400)  # the texts alone: about 40
    loop_thread = threading.get_ident()
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        result = await _run(policy, pool, dispatcher, config=config)
    assert result.outcome.has_tokens
    assert [what for what, _ in policy.seen] == ["training_tokens"]
    assert loop_thread not in [thread for _, thread in policy.seen]
