"""The trajectory runner and group collection, against the shipped fakes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs
import pytest

from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.environment_leases import Snapshot
from trajcore.domain.errors import ConfigError, SlotFileError
from trajcore.domain.groups import GroupRules, GroupStatus, TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.slots import Lease
from trajcore.domain.token_ledger.ledger import MASKED_LABEL
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolSpec
from trajcore.entrypoints.idle_slots import IdleLimitedPolicy
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.group import collect_group
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

pytestmark = pytest.mark.anyio

TASK = [Message.system("You fix things."), Message.user("Create done.txt containing ok.")]
CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    sampling=SamplingParams(max_tokens=256),
    tool_timeout_s=5.0,
    deadline_s=30.0,
    acquire_timeout_s=5.0,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _write_call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="write_file", arguments={"path": "done.txt", "content": "ok"})


async def _prepare(tools: SlotTools) -> None:
    await tools.write_file("README", "task files")


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    try:
        return 1.0 if (await tools.read_file("done.txt")) == "ok" else 0.0
    except SlotFileError:  # the file is missing
        return 0.0


HOOKS = TrajectoryHooks(prepare=_prepare, score=_score)


async def _run(
    policy: Policy,
    pool: FakeSandboxPool,
    config: RolloutConfig = CONFIG,
    tid: str = "t0",
    hooks: TrajectoryHooks = HOOKS,
) -> TrajectoryResult:
    async with ToolDispatcher(pool, BatchConfig()) as dispatcher:
        return await run_trajectory(
            trajectory_id=tid,
            messages=TASK,
            tools=SLOT_TOOL_SPECS,
            hooks=hooks,
            policy=policy,
            pool=pool,
            dispatcher=dispatcher,
            tool_server=None,
            config=config,
        )


def _solving_chat() -> FakeChatServer:
    return FakeChatServer(
        script=[
            Message.assistant("writing", tool_calls=[_write_call("c1")]),
            Message.assistant("done"),
        ]
    )


async def test_openai_mode_solves_scores_and_releases() -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        result = await _run(ChatPolicy(_solving_chat()), pool)
        stats = pool.statistics()
    assert result.outcome.status is TrajectoryStatus.FINISHED
    assert result.outcome.score == 1.0
    assert result.stats.stop_reason is StopReason.NATURAL
    assert [e.result.outcome for e in result.exchanges] == [ToolOutcome.OK]
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert result.tokens is None  # OpenAI mode without a tokenizer: messages only
    assert not result.outcome.has_tokens  # so a training group's verdict leaves it out
    assert stats.free == 2
    assert stats.leased == 0


async def test_a_model_that_never_solves_scores_zero_not_infra() -> None:
    chat = FakeChatServer(script=[Message.assistant("I give up")])
    async with FakeSandboxPool() as pool:
        result = await _run(ChatPolicy(chat), pool)
    assert result.outcome.status is TrajectoryStatus.FINISHED
    assert result.outcome.score == 0.0


async def test_a_dead_model_server_is_a_model_error_without_score() -> None:
    chat = FakeChatServer(script=[Message.assistant("x")])
    chat.inject(*[LLMFault.server_error(503)] * 5)
    async with FakeSandboxPool() as pool:
        result = await _run(ChatPolicy(chat), pool)
        assert pool.statistics().free == pool.statistics().total
    assert result.outcome.status is TrajectoryStatus.MODEL_ERROR
    assert result.outcome.score is None
    assert "ModelServerError" in (result.stats.detail or "")


async def test_garbled_calls_are_answered_to_the_model_and_counted() -> None:
    chat = FakeChatServer(script=[Message.assistant("fixed")])
    chat.inject(LLMFault.garbled_tool_call('{"command": "ls', finish_reason=FinishReason.STOP))
    async with FakeSandboxPool() as pool:
        result = await _run(ChatPolicy(chat), pool)
    assert result.stats.parse_errors == 1
    tool_messages = [m for m in result.messages if m.role == "tool"]
    assert len(tool_messages) == 1
    assert tool_messages[0].content.startswith("Error:")


async def test_the_deadline_ends_a_hanging_model_as_time_budget() -> None:
    chat = FakeChatServer(script=[Message.assistant("late")])
    chat.inject(LLMFault.delay(60.0))
    config = attrs.evolve(CONFIG, deadline_s=0.3)
    async with FakeSandboxPool() as pool:
        with anyio.fail_after(10):
            result = await _run(ChatPolicy(chat), pool, config)
        assert pool.statistics().leased == 0
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.stats.detail == (
        "the turns' deadline passed (deadline_s=0.3 s less score_reserve_s=0.03 s, kept for "
        "scoring)"
    )
    assert result.outcome.score is None or result.outcome.score == 0.0


async def test_a_turn_past_the_idle_limit_ends_on_that_budget_and_the_work_is_scored() -> None:
    """The idle lifetime is a loop budget: the second turn never comes in time, so the loop
    ends as ``idle_limit`` (budget exhausted, not a model error) and the file the first turn
    wrote is scored."""
    chat = _solving_chat()
    chat.inject(LLMFault.delay(0.0), LLMFault.delay(60.0))
    async with FakeSandboxPool() as pool:
        with anyio.fail_after(10):
            result = await _run(IdleLimitedPolicy(ChatPolicy(chat), 0.3), pool)
        assert pool.statistics().leased == 0
    assert result.stats.stop_reason is StopReason.IDLE_LIMIT
    assert result.outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED
    assert "slot_idle_timeout_s=0.3" in (result.stats.detail or "")
    assert result.outcome.score == 1.0


async def test_a_member_that_crashes_outside_the_runner_is_an_unscored_infra_error() -> None:
    async def run_member(trajectory_id: str) -> TrajectoryResult:
        if trajectory_id.endswith("/1"):
            raise RuntimeError("adapter bug")
        async with FakeSandboxPool() as pool:
            return await _run(ChatPolicy(_solving_chat()), pool, tid=trajectory_id)

    group = await collect_group(
        group_id="g", rules=GroupRules(group_size=2, min_healthy=1), run_member=run_member
    )
    crashed = group.members[1]
    assert crashed.trajectory_id == "g/1"
    assert crashed.outcome.status is TrajectoryStatus.INFRA_ERROR
    assert crashed.outcome.score is None
    assert crashed.stats.stop_reason is StopReason.INFRA_ERROR
    assert crashed.stats.detail == "RuntimeError: adapter bug"
    assert (crashed.stats.turns, crashed.messages, crashed.slot) == (0, (), None)
    assert group.members[0].outcome.status is TrajectoryStatus.FINISHED


@attrs.frozen
class _UnbridgeableSession(SessionWrapper):
    """A session whose chat template cannot append tool results (what ``ChatTemplate`` raises
    for a template that re-renders the history after an assistant turn)."""

    inner: PolicySession

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        return await self.inner.sample(messages, sampling=sampling)

    def add_environment(self, messages: Sequence[Message]) -> None:
        raise ConfigError("chat_template", "rendering messages after an assistant turn changes")


@attrs.frozen
class _UnbridgeablePolicy:
    inner: Policy

    @property
    def token_exact(self) -> bool:
        return True

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        return _UnbridgeableSession(self.inner.start(messages, tools=tools))


async def test_a_chat_template_that_cannot_append_tool_results_is_an_env_error() -> None:
    async with FakeSandboxPool() as pool:
        result = await _run(_UnbridgeablePolicy(ChatPolicy(_solving_chat())), pool)
        assert pool.statistics().leased == 0
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert result.outcome.score is None
    assert result.stats.stop_reason is StopReason.ENV_ERROR
    assert "the tool results cannot be appended" in (result.stats.detail or "")
    assert "chat_template" in (result.stats.detail or "")
    assert result.stats.turns == 1
    assert len(result.messages) == 4  # the task, the model's turn and its tool result are kept


async def test_a_huge_tool_result_reaches_the_model_cut_in_the_middle() -> None:
    # A policy that reads a large file must cost the env a bounded render, not a 10 MiB one.
    big = "".join(f"{i:07d}\n" for i in range(50_000))  # 400,000 characters
    chat = FakeChatServer(
        script=[
            Message.assistant(
                "",
                tool_calls=[
                    ToolCall(id="w", name="write_file", arguments={"path": "big", "content": big})
                ],
            ),
            Message.assistant(
                "", tool_calls=[ToolCall(id="r", name="read_file", arguments={"path": "big"})]
            ),
            Message.assistant("done"),
        ]
    )
    config = attrs.evolve(CONFIG, max_tool_result_chars=10_000)
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        result = await _run(ChatPolicy(chat), pool, config)
    read = result.messages[5]
    assert read.role == "tool"
    assert read.tool_call_id == "r"
    assert len(read.content) <= 10_000
    assert read.content.startswith("0000000\n0000001\n")
    assert read.content.endswith("0049999\n")
    assert "cut here: a tool result is capped at 10000 characters" in read.content
    assert result.exchanges[1].result.content == read.content
    # what the model was sent on its next turn is the cut text too
    assert chat.requests[-1].messages[5].content == read.content
    assert result.outcome.status is TrajectoryStatus.FINISHED


def test_a_tool_result_cap_below_200_characters_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_tool_result_chars"):
        attrs.evolve(CONFIG, max_tool_result_chars=10)


async def _score_without_await(tools: SlotTools, messages: Sequence[Message]) -> float:
    # the README's check with its await forgotten: a coroutine, which is true
    return 1.0 if tools.check("test -f done.txt") else 0.0  # type: ignore[truthy-bool]


async def _prepare_without_await(tools: SlotTools) -> None:
    tools.write_file("README", "task files")  # type: ignore[unused-coroutine]


async def test_a_score_hook_that_forgets_an_await_is_an_env_error_not_a_score() -> None:
    hooks = TrajectoryHooks(prepare=_prepare, score=_score_without_await)
    never = FakeChatServer(script=[Message.assistant("done")])  # writes nothing
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        result = await _run(ChatPolicy(never), pool, hooks=hooks)
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert result.outcome.score is None
    detail = result.outcome.detail or ""
    assert "score hook called tools.check() at test_trajectory.py:" in detail
    assert "without await" in detail


async def _score_reads_a_coroutine(tools: SlotTools, messages: Sequence[Message]) -> float:
    report = tools.run("cat done.txt")  # no await: a coroutine, which has no stdout
    return 1.0 if report.stdout == "ok" else 0.0  # type: ignore[attr-defined]


async def test_a_score_hook_that_raises_on_a_forgotten_await_is_named_for_it() -> None:
    hooks = TrajectoryHooks(prepare=_prepare, score=_score_reads_a_coroutine)
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        result = await _run(ChatPolicy(_solving_chat()), pool, hooks=hooks)
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert "score hook called tools.run() at test_trajectory.py:" in str(result.outcome.detail)


async def test_a_prepare_hook_that_forgets_an_await_is_an_env_error() -> None:
    hooks = TrajectoryHooks(prepare=_prepare_without_await, score=_score)
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        result = await _run(ChatPolicy(_solving_chat()), pool, hooks=hooks)
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert "prepare hook called tools.write_file() at" in (result.outcome.detail or "")
    assert result.stats.turns == 0  # the model never ran


async def test_no_slot_before_the_deadline_is_an_infra_error() -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool, pool.lease("hog"):
        config = attrs.evolve(CONFIG, acquire_timeout_s=0.2, deadline_s=5.0)
        result = await _run(ChatPolicy(_solving_chat()), pool, config)
    assert result.outcome.status is TrajectoryStatus.INFRA_ERROR
    assert result.slot is None
    assert result.outcome.score is None


@attrs.define(eq=False)
class _OpeningPool(FakeSandboxPool):
    """A pool whose slots' server never finishes opening an image (a first use unpacking it)."""

    async def enter_environment(
        self, lease: Lease, environment: str, snapshot: Snapshot | None
    ) -> bool:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_lease_over_an_image_unstarted_at_the_deadline_names_the_image() -> None:
    image = "oci:/images/big"
    async with _OpeningPool(images={image: {"/etc/task": "1"}}) as pool:
        async with ToolDispatcher(pool, BatchConfig()) as dispatcher:
            result = await run_trajectory(
                trajectory_id="t0", messages=TASK, tools=SLOT_TOOL_SPECS, hooks=HOOKS,
                policy=ChatPolicy(_solving_chat()), pool=pool, dispatcher=dispatcher,
                tool_server=None, config=attrs.evolve(CONFIG, deadline_s=0.3),
                environment=image,
            )  # fmt: skip
        assert pool.statistics().leased == 0  # the slot it had went back
    assert result.outcome.status is TrajectoryStatus.INFRA_ERROR
    detail = result.outcome.detail or ""
    assert "no slot before the trajectory deadline" not in detail
    assert detail.startswith(
        f"the lease over {image} had not started before the trajectory's deadline of 0.3 s"
    )
    assert "a first use of an image on a host unpacks it" in detail


async def test_a_crashing_container_is_infra_not_zero() -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        chat = FakeChatServer(script=[Message.assistant("w", tool_calls=[_write_call("c1")])])
        pool.crash_container(pool.container_names()[0])
        result = await _run(ChatPolicy(chat), pool)
    assert result.outcome.status is TrajectoryStatus.INFRA_ERROR
    assert result.outcome.score is None


async def test_group_keeps_healthy_members_and_never_scores_failures() -> None:
    failing = FakeChatServer(script=[Message.assistant("x")])
    failing.inject(*[LLMFault.rejected(400, "bad request")])

    async with (
        FakeSandboxPool(containers=2, slots_per_container=2) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):

        async def member(tid: str) -> TrajectoryResult:
            index = int(tid.rsplit("/", 1)[1])
            policy = ChatPolicy(failing if index == 0 else _solving_chat())
            return await run_trajectory(
                trajectory_id=tid,
                messages=TASK,
                tools=SLOT_TOOL_SPECS,
                hooks=HOOKS,
                policy=policy,
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=CONFIG,
            )

        group = await collect_group(
            group_id="g",
            rules=GroupRules(group_size=4, min_healthy=2, drop_equal_scores=False),
            run_member=member,
        )
    assert group.verdict.status is GroupStatus.PARTIAL
    assert group.verdict.kept == (1, 2, 3)
    assert group.members[0].outcome.status is TrajectoryStatus.MODEL_ERROR
    assert [m.outcome.score for m in group.kept] == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------------------ managed mode


@pytest.fixture(scope="module")
def qwen() -> TransformersTokenizer:
    return TransformersTokenizer.from_path(Path(qwen3_tokenizer_path()))


async def test_managed_mode_keeps_sampled_tokens_exact(qwen: TransformersTokenizer) -> None:
    template = ChatTemplate.learn(qwen)
    parser = get_parser("hermes")
    im_end = qwen.encode("<|im_end|>")
    replies = [
        parser.render([_write_call("x")], content="I will write it."),
        "All done.",
    ]
    sampled: list[TokenCompletion] = []

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        ids = [*qwen.encode(replies[len(sampled)]), *im_end]
        completion = TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)
        sampled.append(completion)
        return completion

    policy = TokenPolicy(
        server=FakeTokenServer(policy=respond), tokenizer=qwen, template=template, parser=parser
    )
    async with FakeSandboxPool() as pool:
        result = await _run(policy, pool)
    assert result.outcome.score == 1.0
    tokens = result.tokens
    assert tokens is not None
    assert result.outcome.has_tokens
    assert tokens.token_exact
    trained = [t for t, m in zip(tokens.tokens, tokens.masks, strict=True) if m != MASKED_LABEL]
    assert trained == [t for c in sampled for t in c.token_ids]
    assert tokens.inference_logprobs is not None
    assert [
        lp
        for lp, m in zip(tokens.inference_logprobs, tokens.masks, strict=True)
        if m != MASKED_LABEL
    ] == [-0.5] * len(trained)
    assert result.drift is not None
