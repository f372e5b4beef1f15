"""hermes-agent envs as their authors wrote them: config subclasses that redeclare a seed name,
hermes's own defaults passed explicitly, and ``HermesToolContext`` misuse that must not score."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from pydantic import Field, field_serializer, field_validator

from tests.unit.test_agent_env import QWEN, _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.compat import AgentResult, HermesAgentEnv, HermesAgentEnvConfig, HermesToolContext
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.seed_settings import SeedSettingWarning

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


with warnings.catch_warnings():
    warnings.simplefilter("ignore", SeedSettingWarning)

    class TerminalBenchConfig(HermesAgentEnvConfig):
        """hermes's TerminalBench2EvalConfig: seed names redeclared with defaults of its own."""

        dataset_name: str = Field(default="NousResearch/terminal-bench-2")
        max_agent_turns: int = Field(default=60)
        terminal_backend: str = "docker"


def _bench(**fields: Any) -> TerminalBenchConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SeedSettingWarning)
        return TerminalBenchConfig(tokenizer_name=QWEN, **fields)


def test_a_redeclared_seed_field_sets_the_trajcore_setting_it_names() -> None:
    config = _bench(max_agent_turns=7, dataset_name="mine/ds")
    assert config.max_turns == 7
    assert config.dataset == config.dataset_name == "mine/ds"
    config = _bench(max_turns=8, dataset="theirs/ds")
    assert (config.max_agent_turns, config.dataset_name) == (8, "theirs/ds")


def test_a_redeclared_seed_default_is_the_trajcore_settings_default() -> None:
    config = _bench()
    assert config.max_turns == 60
    assert config.dataset == "NousResearch/terminal-bench-2"
    assert config.sandbox == "container"  # hermes's docker backend, with its meaning
    assert config.terminal_backend == "docker"
    assert "dataset_name" not in TerminalBenchConfig.model_fields
    assert TerminalBenchConfig.model_fields["max_turns"].metadata  # trajcore's checks kept
    with pytest.raises(ConfigError, match="max_turns"):
        _bench(max_agent_turns=0)


def test_a_redeclared_seed_field_warns_once_when_the_class_is_defined() -> None:
    with pytest.warns(SeedSettingWarning, match=r"max_agent_turns .* max_turns .*Own"):

        class Own(HermesAgentEnvConfig):
            max_agent_turns: int = 12

    assert Own(tokenizer_name=QWEN).max_turns == 12


def test_a_redeclared_seed_field_that_cannot_map_exactly_is_refused_naming_both() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SeedSettingWarning)
        with pytest.raises(ConfigError, match="max_agent_turns") as info:

            class Both(HermesAgentEnvConfig):
                max_agent_turns: int = 12
                max_turns: int = 13

        assert "max_turns" in str(info.value)
        with pytest.raises(ConfigError, match=r"Constrained\.max_agent_turns"):

            class Constrained(HermesAgentEnvConfig):
                max_agent_turns: int = Field(default=5, le=10)

        with pytest.raises(ConfigError, match=r"needs a default.*Required\.dataset_name"):

            class Required(HermesAgentEnvConfig):
                dataset_name: str


def test_a_validator_on_a_redeclared_seed_field_checks_the_trajcore_setting() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SeedSettingWarning)

        class Checked(HermesAgentEnvConfig):
            dataset_name: str = Field(default="x.jsonl")

            @field_validator("dataset_name")
            @classmethod
            def _jsonl(cls, value: str | None) -> str | None:
                if value is not None and not value.endswith(".jsonl"):
                    raise ValueError("needs a .jsonl file")
                return value

            @field_serializer("dataset_name")
            def _upper(self, value: str | None) -> str | None:
                return None if value is None else value.upper()

        class Inherited(Checked):
            @field_validator("max_agent_turns")
            @classmethod
            def _even(cls, value: int) -> int:
                if value % 2:
                    raise ValueError("needs an even count")
                return value

        assert Checked(tokenizer_name=QWEN).dataset == "x.jsonl"
        assert Checked(tokenizer_name=QWEN, dataset_name="y.jsonl").dataset_name == "y.jsonl"
        assert Checked(tokenizer_name=QWEN).model_dump()["dataset"] == "X.JSONL"
        with pytest.raises(ConfigError, match=r"needs a .jsonl file @ dataset"):
            Checked(tokenizer_name=QWEN, dataset="y.csv")
        seed_named = Inherited(tokenizer_name=QWEN, max_agent_turns=4)  # type: ignore[call-arg]
        assert seed_named.max_turns == 4
        with pytest.raises(ConfigError, match="needs an even count @ max_turns"):
            Inherited(tokenizer_name=QWEN, max_turns=3)


def test_a_class_var_with_a_seed_name_stays_a_class_attribute() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SeedSettingWarning)  # no field is rewritten

        class Steps(HermesAgentEnvConfig):
            # the seed names' properties are shadowed on purpose
            agent_max_steps: ClassVar[int] = 7  # type: ignore[misc]
            dataset_name: ClassVar[str] = "kept"  # type: ignore[misc]  # a string annotation

    assert Steps.agent_max_steps == 7
    assert Steps.dataset_name == "kept"
    assert (
        Steps.model_fields["max_turns"].default
        == HermesAgentEnvConfig.model_fields["max_turns"].default
    )
    assert Steps.model_fields["dataset"].default is None


def test_hermes_disabled_toolsets_none_means_nothing_disabled() -> None:
    # hermes's default, which its envs pass explicitly
    assert _config(disabled_toolsets=None).disabled_toolsets == []
    assert _config(disabled_toolsets="None").disabled_toolsets == []


def _writes_a_txt() -> FakeChatServer:
    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        call = ToolCall(id="w", name="write_file", arguments={"path": "a.txt", "content": "x"})
        return _turn(Message.assistant("writing", tool_calls=[call]))

    return FakeChatServer(policy=respond)


class ForgotAwait(HermesAgentEnv[str]):
    """hermes's reward line, ported without its ``await``."""

    name = "forgot_await"

    async def get_next_item(self) -> str:
        return "x"

    def format_prompt(self, item: str) -> str:
        return "Write a.txt."

    async def compute_reward(self, item: str, result: AgentResult, ctx: HermesToolContext) -> float:
        check = ctx.terminal("cat a.txt")
        return 1.0 if check["exit_code"] == 0 else 0.0  # type: ignore[index]  # the bug


class ForgotAwaitUnused(ForgotAwait):
    """A call whose answer is never looked at: the command never ran, the score means nothing."""

    async def compute_reward(self, item: str, result: AgentResult, ctx: HermesToolContext) -> float:
        ctx.write_file("b.txt", "y")  # type: ignore[unused-coroutine]  # the bug
        return 1.0


@pytest.mark.parametrize("env_class", [ForgotAwait, ForgotAwaitUnused])
async def test_a_forgotten_await_on_the_tool_context_is_an_env_error_naming_the_call(
    env_class: type[ForgotAwait],
) -> None:
    env = env_class(_config(group_size=2, min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("x", pool=pool, policy=env.make_policy(chat=_writes_a_txt()))
    assert [m.outcome.status.value for m in result.members] == ["env_error"] * 2
    method = "terminal" if env_class is ForgotAwait else "write_file"
    for member in result.members:
        detail = str(member.outcome.detail)
        assert f"ctx.{method}() at test_agent_env_hermes_port.py:" in detail, detail
        assert "without await" in detail
    assert env.tool_error_metrics().get("trajcore/reward_errors", 0) == 0  # never a 0


class CleansUp(ForgotAwait):
    async def compute_reward(self, item: str, result: AgentResult, ctx: HermesToolContext) -> float:
        ctx.cleanup()  # hermes called it without await
        await ctx.cleanup()  # a port that added one everywhere
        return 1.0 if (await ctx.read_file("a.txt")).get("content") == "x" else 0.0


async def test_hermes_cleanup_runs_with_or_without_await_and_leaves_the_slot_to_trajcore() -> None:
    env = CleansUp(_config(group_size=2, min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("x", pool=pool, policy=env.make_policy(chat=_writes_a_txt()))
    assert [m.outcome.score for m in result.members] == [1.0, 1.0]
