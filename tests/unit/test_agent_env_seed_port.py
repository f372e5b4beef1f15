"""Seed envs run unchanged, and errors are told apart by who caused them.

Each test writes a hook the way a seed declared it (atropos-agent's ``AgentEnv``, hermes-agent's
``HermesAgentBaseEnv``) and runs a group on the fakes: the hook's own signature decides what it
is passed, every ``AgentConfig`` field reaches the model request or the loop, a raising reward
is scored as hermes scored it, and an exception in env code is an ``env_error``, not an
infrastructure failure.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from tests.unit.test_agent_env import QWEN, FileEnv, _alternating_chat, _config, _turn, _write
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.compat import (
    AgentConfig,
    AgentResult,
    AtroposAgentEnv,
    AtroposAgentEnvConfig,
    ExecTool,
    HermesAgentEnv,
    HermesAgentEnvConfig,
    HermesToolContext,
)
from trajcore.domain.errors import ConfigError, SlotInfraError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.seed_settings import SeedSettingWarning, translate_seed_flags
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import Transcript

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _solver() -> FakeChatServer:
    """Every member writes ``ok`` into done.txt, then says done."""

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        return _turn(Message.assistant("writing", tool_calls=[_write("c", "ok")]))

    return FakeChatServer(policy=respond)


class _SeedBase(AtroposAgentEnv[str]):
    name = "seed_base"

    async def get_next_item(self) -> str:
        return "ok"

    def build_task(self, item: str) -> str:
        return f"Create done.txt containing {item}."

    async def score_trajectory(self, item: str, final_response: str) -> float:
        return 0.0


async def _answer(exec_tool: ExecTool, trajectory_id: str) -> str:
    call = ToolCall(id=f"{trajectory_id}-v", name="terminal", arguments={"command": "cat done.txt"})
    result = await exec_tool(call)
    return result.exec.stdout if result.exec is not None else ""


# ------------------------------------------------------------------- 1. the seeds' signatures


class WithoutWorkspaceMeta(_SeedBase):
    """atropos-agent's signature before ``workspace_meta`` existed."""

    async def verify_and_score_trajectory(
        self,
        item: str,
        final_response: str,
        *,
        trajectory_id: str,
        exec_tool: ExecTool,
        agent_result: Transcript | None = None,
    ) -> tuple[float, dict[str, Any]]:
        answer = await _answer(exec_tool, trajectory_id)
        turns = agent_result.stats.turns if agent_result is not None else -1
        return (1.0 if answer == item else 0.0), {"answer": answer, "turns": turns}


class OldestSignature(_SeedBase):
    """atropos-agent's first signature: no ``agent_result``, no ``workspace_meta``."""

    async def verify_and_score_trajectory(
        self, item: str, final_response: str, *, trajectory_id: str, exec_tool: ExecTool
    ) -> tuple[float, dict[str, Any]]:
        return (1.0 if await _answer(exec_tool, trajectory_id) == item else 0.0), {}


class TakesKeywords(_SeedBase):
    """Takes ``**kwargs``: gets every keyword there is."""

    seen: list[set[str]]

    async def verify_and_score_trajectory(
        self, item: str, final_response: str, **kwargs: Any
    ) -> tuple[float, dict[str, Any]]:
        self.seen.append(set(kwargs))
        return 1.0, {}


@pytest.mark.parametrize("env_cls", [WithoutWorkspaceMeta, OldestSignature])
async def test_a_verify_hook_with_a_seeds_signature_is_passed_only_what_it_declares(
    env_cls: type[_SeedBase],
) -> None:
    env = env_cls(_config(group_size=2, ensure_scores_are_not_same=False))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    assert [m.outcome.status for m in result.members] == [TrajectoryStatus.FINISHED] * 2
    assert result.verdict.member_scores == (1.0, 1.0)
    if env_cls is WithoutWorkspaceMeta:
        assert {m.score_metadata["turns"] for m in result.members if m.score_metadata} == {2}


async def test_a_verify_hook_taking_kwargs_gets_every_keyword() -> None:
    env = TakesKeywords(_config(group_size=1, min_healthy=1))
    env.seen = []
    async with FakeSandboxPool() as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    assert env.seen == [{"trajectory_id", "exec_tool", "agent_result", "workspace_meta"}]


# -------------------------------------------------------------- 2. every AgentConfig field


class PerItemAgent(_SeedBase):
    """The seed's own pattern: a low temperature, no token cap, a delay, a prompt, per item."""

    async def verify_and_score_trajectory(
        self,
        item: str,
        final_response: str,
        *,
        trajectory_id: str,
        exec_tool: ExecTool,
        agent_result: Transcript | None = None,
        workspace_meta: dict[str, Any] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        return (1.0 if await _answer(exec_tool, trajectory_id) == item else 0.0), {}

    def build_agent_config(self, item: str) -> AgentConfig:
        return AgentConfig(
            max_steps=3,
            temperature=0.2,
            max_tokens=None,
            tool_delay_s=0.3,
            system_prompt="You fix files.",
        )


async def test_every_agent_config_field_reaches_the_model_and_the_loop() -> None:
    # The config says otherwise on every field, so only build_agent_config can explain what
    # the model is sent.
    config = _config(
        group_size=2,
        ensure_scores_are_not_same=False,
        agent_temperature=0.9,
        max_tokens=256,
        max_turns=1,
        system_prompt="config prompt",
    )
    env = PerItemAgent(config)
    chat = _solver()
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    assert chat.requests
    for request in chat.requests:
        assert request.sampling.temperature == 0.2
        # None: the backend decides, bounded only by the context left (8192 here), not 256
        # (the config's) nor 4096 (trajcore's default).
        assert request.sampling.max_tokens > 4096
        assert request.messages[0] == Message.system("You fix files.")
        assert "config prompt" not in [m.content for m in request.messages]
    for member in result.members:
        assert member.stats.turns == 2  # max_steps=3 let the second turn happen (max_turns=1)
        assert member.duration_s >= 0.3  # the tool delay before the one batch of calls
    assert result.verdict.member_scores == (1.0, 1.0)


@pytest.mark.parametrize("config_prompt", [None, "config prompt"])
async def test_the_items_system_prompt_follows_the_thinking_prompt(
    config_prompt: str | None,
) -> None:
    config = _config(
        group_size=1,
        min_healthy=1,
        thinking_mode=True,
        custom_thinking_prompt="Think first.",
        system_prompt=config_prompt,
    )
    env, chat = PerItemAgent(config), _solver()
    async with FakeSandboxPool() as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    systems = [m.content for m in chat.requests[0].messages if m.role == "system"]
    assert systems == ["Think first.\n\nYou fix files."]


def test_the_seed_agent_config_has_the_seeds_defaults_and_refuses_a_working_dir() -> None:
    assert AgentConfig() == AgentConfig(
        temperature=0.7, max_tokens=None, max_steps=50, system_prompt=None, tool_delay_s=0.0
    )
    with pytest.raises(ConfigError) as caught:
        AgentConfig(working_dir="/repo")
    assert caught.value.field == "working_dir"
    with pytest.raises(ConfigError) as negative:
        AgentConfig(tool_delay_s=-1)
    assert negative.value.field == "tool_delay_s"


# ------------------------------------------------------- 3. errors by who caused them


class BuggyEnv(FileEnv):
    """Its verification has a bug (and, on request, so does its prepare hook)."""

    broken_prepare = False

    async def prepare_workspace(self, item: str, tools: SlotTools) -> None:
        if self.broken_prepare:
            dict[str, int]()["missing"]
        await super().prepare_workspace(item, tools)

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        raise ValueError("forgot to parse the answer")


class SlotLostEnv(FileEnv):
    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        raise SlotInfraError("the slot server died")


async def test_an_exception_in_the_envs_code_is_an_env_error_with_its_last_frame() -> None:
    env = BuggyEnv(_config(group_size=2, on_failure="keep_healthy", min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    for member in result.members:
        outcome = member.outcome
        assert outcome.status is TrajectoryStatus.ENV_ERROR
        assert outcome.score is None
        assert outcome.detail is not None
        assert "ValueError: forgot to parse the answer" in outcome.detail
        assert f"{Path(__file__).name}:" in outcome.detail
        assert "in verify_and_score" in outcome.detail
    assert result.verdict.failed == (0, 1)
    counted = env.tool_error_metrics()
    assert counted["trajcore/trajectories/env_error"] == 2
    assert "trajcore/trajectories/infra_error" not in counted


async def test_a_bug_in_the_prepare_hook_is_an_env_error_too() -> None:
    env = BuggyEnv(_config(group_size=2, on_failure="keep_healthy", min_healthy=1))
    env.broken_prepare = True
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        assert member.stats.stop_reason is not None
        assert member.stats.stop_reason.value == "env_error"
        assert "KeyError: 'missing'" in (member.outcome.detail or "")
        assert "in prepare_workspace" in (member.outcome.detail or "")


async def test_an_infrastructure_error_in_a_hook_stays_an_infra_error() -> None:
    env = SlotLostEnv(_config(group_size=2, on_failure="keep_healthy", min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    assert {m.outcome.status for m in result.members} == {TrajectoryStatus.INFRA_ERROR}


class RaisingReward(HermesAgentEnv[str]):
    """hermes-style: ``compute_reward`` raises for one of the two answers."""

    name = "raising_reward"

    async def get_next_item(self) -> str:
        return "ok"

    def format_prompt(self, item: str) -> str:
        return f"Create done.txt containing {item}."

    async def compute_reward(self, item: str, result: AgentResult, ctx: HermesToolContext) -> float:
        read = await ctx.read_file("done.txt")
        if read.get("content") != item:
            raise RuntimeError("reward model timed out")
        return 1.0


async def test_a_raising_compute_reward_scores_zero_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = RaisingReward(_config(group_size=4, on_failure="drop"))
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with FakeSandboxPool() as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
    assert sorted(result.verdict.member_scores, key=str) == [0.0, 0.0, 1.0, 1.0]
    assert not result.verdict.dropped  # nothing failed: the group is sent, as in hermes
    errors = [m.score_metadata for m in result.members if m.outcome.score == 0.0]
    for metadata in errors:
        assert metadata is not None
        assert "RuntimeError: reward model timed out" in str(metadata["reward_error"])
    assert env.tool_error_metrics()["trajcore/reward_errors"] == 2
    logged = [r for r in caplog.records if "as hermes-agent did" in r.getMessage()]
    assert len(logged) == 2
    assert all(r.exc_info is not None for r in logged)  # with the traceback


async def test_reward_error_score_none_fails_the_member_as_env_error() -> None:
    class Strict(RaisingReward):
        reward_error_score = None

    env = Strict(_config(group_size=4, on_failure="keep_healthy", min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
    statuses = sorted(m.outcome.status.value for m in result.members)
    assert statuses == ["env_error", "env_error", "finished", "finished"]


# -------------------------------------------- 4. a parser with an OpenAI-type server is ignored


def _server(server_type: str) -> Any:
    return APIServerConfig(
        server_type=server_type,
        base_url="http://127.0.0.1:9/v1",
        model_name="m",
        api_key="x",
        tokenizer_name=QWEN,
    )


def test_a_parser_with_an_openai_server_keeps_openai_mode_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trajcore.env")
    env = FileEnv(_config(tool_call_parser="hermes"), [_server("openai")])
    assert env.settings.mode == "openai"
    assert isinstance(env.make_policy(chat=_solver()), ChatPolicy)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "tool_call_parser 'hermes' is ignored" in warning
    assert "mode managed" in warning
    forced = FileEnv(_config(tool_call_parser="hermes", mode="managed"), [_server("openai")])
    assert (forced.settings.mode, forced.settings.parser) == ("managed", "hermes")


def test_a_seed_configs_own_parser_default_is_not_warned_about_as_chosen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Atropos rebuilds the config from model_dump(), which sets every field: hermes's default
    # parser is still the default, so OpenAI mode is logged, not warned about
    caplog.set_level(logging.WARNING, logger="trajcore.env")
    rebuilt = HermesAgentEnvConfig.model_validate(
        HermesAgentEnvConfig(tokenizer_name=QWEN).model_dump()
    )
    assert "tool_call_parser" in rebuilt.model_fields_set
    env = RaisingReward(rebuilt, [_server("openai")])
    assert env.settings.mode == "openai"
    assert env.settings.ignored_parser == "hermes"
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    chosen = HermesAgentEnvConfig(tokenizer_name=QWEN, tool_call_parser="qwen3_coder")
    RaisingReward(chosen, [_server("openai")])
    assert [r for r in caplog.records if "is ignored" in r.getMessage()]


# ------------------------------------------------------------------ 5. seed names as names


def test_seed_names_read_and_write_as_their_fields() -> None:
    with pytest.warns(SeedSettingWarning):
        config = _config(agent_max_steps=7, terminal_backend="docker")
    assert config.agent_max_steps == config.max_turns == 7
    assert config.max_agent_turns == 7
    assert config.terminal_backend == "docker"  # the seed's word for the container pool
    assert config.sandbox == "container"
    with pytest.warns(SeedSettingWarning, match="trajcore's tool_threads"):
        config.tool_pool_size = 12
    assert config.tool_threads == 12
    with pytest.raises(ConfigError) as caught, pytest.warns(SeedSettingWarning):
        config.agent_max_steps = 0
    assert caught.value.field == "max_turns"


def test_seed_names_are_command_line_flags_with_the_rename_warning() -> None:
    argv = [
        "process",
        "--env.agent_max_steps", "3",
        "--env.terminal_backend=docker",
        "--env.max_tokens", "64",
        "--openai.base_url", "http://x/v1",
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = translate_seed_flags(argv, known=AgentEnvConfig.model_fields)
    assert out == [
        "process",
        "--env.max_turns", "3",
        "--env.sandbox", "container",
        "--env.max_tokens", "64",
        "--openai.base_url", "http://x/v1",
    ]  # fmt: skip
    assert [str(w.message).split(" is the ")[0] for w in caught] == [
        "agent_max_steps",
        "terminal_backend",
    ]


def test_a_mistyped_env_flag_names_the_closest_setting() -> None:
    """argparse would only say "unrecognized arguments"; the env's own flags are known, so a
    typo gets the setting it most likely meant, as ``--set`` and the YAML do."""
    with pytest.raises(ConfigError) as caught:
        translate_seed_flags(
            ["process", "--env.group_sise", "2"], known=AgentEnvConfig.model_fields
        )
    assert (caught.value.field, caught.value.reason) == (
        "env.group_sise",
        "unknown setting; did you mean --env.group_size?",
    )
    with pytest.raises(ConfigError, match=r"did you mean --env\.max_turns"):
        translate_seed_flags(["--env.max_turn=3"], known=AgentEnvConfig.model_fields)
    with pytest.raises(ConfigError) as caught:
        translate_seed_flags(["--env.zzzzzz", "1"], known=AgentEnvConfig.model_fields)
    assert caught.value.reason == "unknown setting"


def test_the_cli_command_rewrites_seed_flags_before_atropos_parses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["env.py", "process", "--env.agent_max_steps", "3"])
    with pytest.warns(SeedSettingWarning, match="agent_max_steps"):
        command = FileEnv.get_cli_process_config_cls()
    assert sys.argv[1:] == ["process", "--env.max_turns", "3"]
    assert "env.max_turns" in cast("Any", command).model_fields


# ------------------------------------------------------------------ 6. silent seed settings


async def test_thinking_mode_puts_the_thinking_prompt_first() -> None:
    prompt = "Think step by step inside <think>."
    for thinking, expected in ((True, [prompt]), (False, [])):
        env = FileEnv(
            _config(
                group_size=1, min_healthy=1, thinking_mode=thinking, custom_thinking_prompt=prompt
            )
        )
        chat = _solver()
        async with FakeSandboxPool() as pool:
            await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
        systems = [m.content for m in chat.requests[0].messages if m.role == "system"]
        assert systems == expected


@pytest.mark.parametrize("include", [True, False])
async def test_include_messages_decides_whether_conversations_are_sent(include: bool) -> None:
    env = FileEnv(_config(group_size=2, ensure_scores_are_not_same=False, include_messages=include))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    group = env.scored_group(result)
    assert group is not None
    if include:
        assert group["messages"] is not None
        assert [m["role"] for m in group["messages"][0]][:2] == ["user", "assistant"]
    else:
        assert group["messages"] is None
    assert len(group["tokens"]) == 2  # the training data is sent either way


class HermesToolNames(HermesAgentEnv[str]):
    """Verifies with hermes's tool names and hermes's default terminal timeout."""

    name = "hermes_tools"
    answers: list[dict[str, Any]]

    async def get_next_item(self) -> str:
        return "ok"

    def format_prompt(self, item: str) -> str:
        return "Say ok."

    async def compute_reward(self, item: str, result: AgentResult, ctx: HermesToolContext) -> float:
        self.answers.append(
            {
                "slow": await ctx.terminal("sleep 0.6"),  # timeout 180 (hermes's default)
                "terminal": await ctx.call_tool("terminal", {"command": "echo hi"}),
            }
        )
        return 1.0


async def test_hermes_tool_names_and_verification_timeouts_are_honoured() -> None:
    # terminal_timeout_s bounds the model's calls; the verification asked for 180 s.
    env = HermesToolNames(_config(group_size=1, min_healthy=1, terminal_timeout_s=0.2))
    env.answers = []
    async with FakeSandboxPool() as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    (answer,) = env.answers
    assert answer["slow"]["exit_code"] == 0
    assert answer["terminal"] == "hi\n"


async def test_enabled_toolsets_default_means_the_seeds_default_set() -> None:
    env = FileEnv(_config(group_size=1, min_healthy=1, enabled_toolsets=["default"]))
    chat = _solver()
    async with FakeSandboxPool() as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    offered = {spec.name for spec in chat.requests[0].tools}
    assert {"bash", "bash_stateful", "tmux", "read_file", "write_file", "add"} <= offered


def test_the_compat_configs_have_the_seeds_defaults() -> None:
    atropos = AtroposAgentEnvConfig(tokenizer_name=QWEN)
    assert (atropos.max_turns, atropos.agent_temperature, atropos.max_tokens) == (50, 0.7, None)
    assert atropos.enabled_toolsets == ["default"]
    assert (atropos.batch_window_ms, atropos.max_batch_size) == (20.0, 200)
    assert atropos.allow_network is False  # not the seed's True: said at start
    hermes = HermesAgentEnvConfig(tokenizer_name=QWEN)
    assert (hermes.tool_call_parser, hermes.slot_idle_timeout_s) == ("hermes", 3600.0)
    assert hermes.tool_threads == 128
    assert hermes.settings(server_types=["openai"]).mode == "openai"
    assert hermes.settings(server_types=["vllm"]).parser == "hermes"
    with pytest.raises(ConfigError):
        AtroposAgentEnvConfig(tokenizer_name=QWEN, max_turns=0)


def test_the_atropos_agent_base_says_network_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trajcore.env")
    _SeedBase(AtroposAgentEnvConfig(tokenizer_name=QWEN))
    assert any("allow_network is off" in r.getMessage() for r in caplog.records)


class OwnItems(AgentEnv[str]):
    """Writes its own items (as hermes envs did, loading their data in setup)."""

    name = "own_items"

    async def get_next_item(self) -> str:
        return "ok"

    def build_task(self, item: str) -> str:
        return item

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return 1.0


def test_a_dataset_is_not_loaded_for_an_env_with_its_own_items(tmp_path: Path) -> None:
    with pytest.warns(SeedSettingWarning, match="trajcore's dataset"):
        config = _config(dataset_name=str(tmp_path / "loaded-in-setup.jsonl"))
    env = OwnItems(config)  # the file does not exist: nothing tried to read it
    assert env.config.dataset_name == str(tmp_path / "loaded-in-setup.jsonl")


# -------------------------------------------------------------- 9. config values stay checked


def test_assignment_and_model_copy_check_values_and_names() -> None:
    config = _config()
    with pytest.raises(ConfigError) as parser:
        config.tool_call_parser = "qwen4"
    assert parser.value.field == "tool_call_parser"
    with pytest.raises(ConfigError) as turns:
        config.max_turns = 0
    assert turns.value.field == "max_turns"
    with pytest.raises(ConfigError) as unknown:
        config.max_turn = 3
    assert "did you mean 'max_turns'" in unknown.value.reason
    with pytest.raises(ConfigError) as copied:
        config.model_copy(update={"max_turn": 8})
    assert copied.value.field == "max_turn"
    assert "did you mean 'max_turns'" in copied.value.reason
    with pytest.raises(ConfigError) as bad_copy:
        config.model_copy(update={"group_size": "four"})
    assert bad_copy.value.field == "group_size"
    good = config.model_copy(update={"group_size": 3, "max_turns": 8})
    assert (good.group_size, good.max_turns, good.tokenizer_name) == (3, 8, QWEN)
    assert config.max_turns == 4  # the original is untouched


# ------------------------------------------------------------------- the table of defaults

# The seeds' defaults, by trajcore setting (atropos-agent's AgentEnvConfig, hermes-agent's
# HermesAgentEnvConfig), for every setting both seeds had.
SEED_DEFAULTS: dict[str, tuple[str, object]] = {
    "sandbox": ("atropos-agent", "nomad"),
    "allow_network": ("atropos-agent", True),
    "require_sandbox": ("atropos-agent", False),
    "require_stateful_sandbox": ("atropos-agent", False),
    "batch_window_ms": ("atropos-agent", 20.0),
    "max_batch_size": ("atropos-agent", 200),
    "nomad_address": ("atropos-agent", "http://localhost:4646"),
    "nomad_job_id": ("atropos-agent", "atropos-sandbox-agent-env"),
    "nomad_image": ("atropos-agent", "atropos-sandbox:local"),
    "slots_per_container": ("atropos-agent", 10),
    "min_containers": ("atropos-agent", 1),
    "max_containers": ("atropos-agent", 10),
    "privileged": ("atropos-agent", False),
    "acquire_timeout_s": ("atropos-agent", 30.0),
    "purge_on_start": ("atropos-agent", False),
    "purge_on_shutdown": ("atropos-agent", True),
    "max_turns": ("atropos-agent", 50),
    "agent_temperature": ("atropos-agent", 0.7),
    "max_tokens": ("atropos-agent", None),
    "tool_delay_s": ("atropos-agent", 0.0),
    "enabled_toolsets": ("atropos-agent", ["default"]),
    "tool_server_url": ("atropos-agent", None),
    "tool_server_token": ("atropos-agent", None),
    "disabled_toolsets": ("hermes-agent", None),
    "toolset_distribution": ("hermes-agent", None),
    "system_prompt": ("hermes-agent", None),
    "terminal_timeout_s": ("hermes-agent", 120.0),
    "slot_idle_timeout_s": ("hermes-agent", 3600.0),
    "dataset": ("hermes-agent", None),
    "dataset_split": ("hermes-agent", "train"),
    "prompt_field": ("hermes-agent", "prompt"),
    "tool_threads": ("hermes-agent", 128),
    "tool_call_parser": ("hermes-agent", "hermes"),
    "extra_body": ("hermes-agent", None),
}


def test_every_default_that_differs_from_a_seeds_is_in_the_porting_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    section = docs.split("### Every default that differs from a seed's, and why")[1]
    table = section.split("\n\n")[2]
    rows = {line.split("|")[1].split("`")[1]: line for line in table.splitlines()[2:]}
    plain = AgentEnvConfig(tokenizer_name=QWEN)
    compat = {
        "atropos-agent": AtroposAgentEnvConfig(tokenizer_name=QWEN),
        "hermes-agent": HermesAgentEnvConfig(tokenizer_name=QWEN),
    }
    for name, (seed, default) in SEED_DEFAULTS.items():
        ours = getattr(plain, name)
        if ours == default or (name == "disabled_toolsets" and ours == []):
            assert getattr(compat[seed], name) == ours, name
            continue
        assert name in rows, f"{name}: {ours!r} here, {default!r} in {seed}, and no row"
        assert seed in rows[name], name
