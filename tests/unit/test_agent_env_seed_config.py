"""Porting a seed config: unknown names refused, every seed name accepted with its meaning.

Also the settings that came with the seeds: a named toolset distribution, a dataset behind the
built-in ``get_next_item``, threads for synchronous tools, a slot's idle lifetime, and a
``tool_registry()`` offered in-process with no further setting.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow  # type: ignore[import-untyped]  # pyarrow ships no types
import pyarrow.parquet  # type: ignore[import-untyped]
import pytest
from atroposlib.utils.cli import merge_dicts  # type: ignore[import-untyped]

from tests.unit.test_agent_env import QWEN, FileEnv, _alternating_chat, _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.container_pool import ContainerSandboxPool
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolContext
from trajcore.domain.toolsets import DistributionRegistry, ToolsetDistribution
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.seed_settings import SEED_FIELDS, SeedSettingWarning
from trajcore.rollout.tools import SlotTools

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The seeds' config fields (atropos-agent's AgentEnvConfig: 24; hermes-agent's
# HermesAgentEnvConfig: 15), each with a value a user might have written.
ATROPOS_AGENT: dict[str, object] = {
    "tool_pool_mode": "nomad",
    "allow_network": True,
    "require_sandbox": False,
    "require_stateful_sandbox": False,
    "tool_batch_window_ms": 20,
    "tool_max_batch_size": 200,
    "nomad_address": "http://localhost:4646",
    "sandbox_job_id": "atropos-sandbox-agent-env",
    "sandbox_image": "atropos-sandbox:local",
    "slots_per_container": 10,
    "min_containers": 1,
    "max_containers": 10,
    "privileged": False,
    "acquire_timeout_s": 30.0,
    "purge_job_on_start": True,
    "purge_job_on_shutdown": True,
    "agent_max_steps": 50,
    "agent_temperature": 0.7,
    "agent_max_tokens": None,
    "agent_tool_delay_s": 0.5,
    "enabled_toolsets": ["terminal"],
    "disabled_toolsets": [],
    "tool_server_url": "http://tools:9000",
    "tool_server_token": "secret",
}
HERMES_AGENT: dict[str, object] = {
    "enabled_toolsets": ["terminal", "file"],
    "disabled_toolsets": ["stateful_terminal"],
    "distribution": None,
    "max_agent_turns": 30,
    "system_prompt": "You are an agent.",
    "agent_temperature": 1.0,
    "terminal_backend": "local",
    "terminal_timeout": 120,
    "terminal_lifetime": 3600,
    "dataset_name": None,
    "dataset_split": "train",
    "prompt_field": "prompt",
    "tool_pool_size": 128,
    "tool_call_parser": "hermes",
    "extra_body": {"provider": {"order": ["Together"]}},
}


def test_the_seed_lists_are_whole() -> None:
    assert len(ATROPOS_AGENT) == 24
    assert len(HERMES_AGENT) == 15
    renamed = set(SEED_FIELDS)
    assert len(renamed & ATROPOS_AGENT.keys()) == 10
    assert renamed <= ATROPOS_AGENT.keys() | HERMES_AGENT.keys()


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("max_turn", "max_turns"),
        ("tool_batch_window", "tool_batch_window_ms"),
        ("enable_toolsets", "enabled_toolsets"),
        ("sandbox_imag", "sandbox_image"),
    ],
)
def test_an_unknown_field_is_refused_naming_it_and_the_closest(name: str, closest: str) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentEnvConfig(tokenizer_name=QWEN, **{name: 1})
    assert caught.value.field == name
    assert f"did you mean {closest!r}" in caught.value.reason


def test_a_name_like_nothing_is_refused_without_a_guess() -> None:
    with pytest.raises(ConfigError) as caught:
        AgentEnvConfig(tokenizer_name=QWEN, zzzz=1)
    assert caught.value.field == "zzzz"
    assert caught.value.reason == "unknown setting"


def test_a_subclass_field_is_known() -> None:
    class TasksConfig(AgentEnvConfig):
        tasks_file: str = "tasks.jsonl"

    assert TasksConfig(tokenizer_name=QWEN, tasks_file="x.jsonl").tasks_file == "x.jsonl"
    with pytest.raises(ConfigError, match="did you mean 'tasks_file'"):
        TasksConfig(tokenizer_name=QWEN, task_file="x.jsonl")  # type: ignore[call-arg]  # the typo


@pytest.mark.parametrize("seed", [ATROPOS_AGENT, HERMES_AGENT], ids=["atropos-agent", "hermes"])
def test_every_seed_field_is_accepted_with_one_warning_per_renamed_name(
    seed: dict[str, object],
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = AgentEnvConfig(tokenizer_name=QWEN, **seed)
    warned = [w for w in caught if issubclass(w.category, SeedSettingWarning)]
    renamed = [name for name in seed if name in SEED_FIELDS]
    assert len(warned) == len(renamed) == len(caught)
    for name, warning in zip(renamed, warned, strict=True):
        text = str(warning.message)
        assert text.startswith(f"{name} is the ")
        assert f"trajcore's {SEED_FIELDS[name].target}" in text
    assert isinstance(config, AgentEnvConfig)


def test_atropos_agent_values_keep_their_meaning() -> None:
    with pytest.warns(SeedSettingWarning):
        config = AgentEnvConfig(tokenizer_name=QWEN, **ATROPOS_AGENT)
    assert config.sandbox == "nomad"
    assert config.batch_window_ms == 20
    assert config.max_batch_size == 200
    assert config.nomad_job().job_id == "atropos-sandbox-agent-env"
    assert config.nomad_job().image == "atropos-sandbox:local"
    assert config.purge_on_start is True
    assert config.purge_on_shutdown is True
    assert config.max_turns == 50
    assert config.max_tokens is None
    assert config.tool_delay_s == 0.5
    assert config.allow_network is True
    assert config.acquire_timeout_s == 30.0
    settings = config.settings()
    assert settings.batching.window_ms == 20
    assert settings.rollout.tool_delay_s == 0.5
    assert settings.rollout.agent.max_turns == 50


def test_hermes_values_keep_their_meaning() -> None:
    with pytest.warns(SeedSettingWarning):
        config = AgentEnvConfig(tokenizer_name=QWEN, **HERMES_AGENT)
    assert config.sandbox == "local"
    assert config.max_turns == 30
    assert config.terminal_timeout_s == 120
    assert config.slot_idle_timeout_s == 3600
    assert config.tool_threads == 128
    assert config.dataset is None
    assert config.settings().rollout.tool_timeout_s == 120


def test_agent_max_tokens_none_lets_each_turn_use_the_context_left() -> None:
    with pytest.warns(SeedSettingWarning, match="trajcore's max_tokens"):
        config = AgentEnvConfig(tokenizer_name=QWEN, agent_max_tokens=None, max_token_length=8192)
    assert config.max_tokens is None
    assert config.settings().rollout.sampling.max_tokens == 8192
    assert AgentEnvConfig(tokenizer_name=QWEN, max_tokens=None).max_tokens is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("terminal_backend", "singularity"),
        ("tool_pool_mode", "modal"),
    ],
)
def test_a_backend_without_a_pool_is_refused_naming_it(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentEnvConfig(tokenizer_name=QWEN, **{field: value})
    assert caught.value.field == field
    assert repr(value) in caught.value.reason
    assert "'local'" in caught.value.reason
    assert "'nomad'" in caught.value.reason


def test_hermes_docker_backend_runs_terminals_in_the_container_pool() -> None:
    with pytest.warns(SeedSettingWarning) as caught:
        config = AgentEnvConfig(
            tokenizer_name=QWEN,
            terminal_backend="docker",
            terminal_timeout=45,
            local_containers=3,
            slots_per_container=5,
            require_stateful_sandbox=True,
        )
    assert any("docker" in str(warning.message) for warning in caught)
    assert config.sandbox == "container"
    pool = FileEnv(config).make_pool()  # unopened: nothing starts
    assert isinstance(pool, ContainerSandboxPool)
    assert pool.config.image == config.container_image
    assert (pool.config.containers, pool.config.server.slots_per_container) == (3, 5)
    assert pool.config.server.require_tmux
    assert pool.config.server.isolation == config.slot_isolation()
    assert pool.config.server.isolation.default_timeout_s == 45


@pytest.mark.skipif(
    shutil.which("tmux") is None,
    reason="tmux is not installed: the env refuses a stateful local pool before building it",
)
@pytest.mark.parametrize("stateful", [True, False])
def test_the_local_pool_requires_tmux_exactly_when_the_env_requires_a_stateful_sandbox(
    stateful: bool,
) -> None:
    config = AgentEnvConfig(
        tokenizer_name=QWEN,
        sandbox="local",
        local_containers=2,
        slots_per_container=3,
        require_stateful_sandbox=stateful,
    )
    pool = FileEnv(config).make_pool()  # unopened: nothing starts
    assert isinstance(pool, LocalSandboxPool)
    assert (pool.config.containers, pool.config.server.slots_per_container) == (2, 3)
    assert pool.config.server.require_tmux is stateful
    assert pool.rules.require_tmux is stateful  # what a slot server must show to join
    assert pool.config.server.isolation == config.slot_isolation()


def test_a_seed_name_wins_over_the_defaults_atropos_merges_it_onto() -> None:
    defaults = AgentEnvConfig(tokenizer_name=QWEN)
    # What Atropos's CLI does with a YAML ``env:`` block: the defaults' dump, the YAML on top.
    yaml_env = {"agent_max_steps": 7, "terminal_timeout": 33}
    merged = merge_dicts(defaults.model_dump(), yaml_env, {})
    with pytest.warns(SeedSettingWarning) as caught:
        config = type(defaults)(**merged)
    assert len(caught) == 2
    assert "(it replaces max_turns=30)" in str(caught[0].message)
    assert config.max_turns == 7
    assert config.terminal_timeout_s == 33


def test_two_seed_names_for_one_field_must_agree() -> None:
    with pytest.raises(ConfigError) as both, pytest.warns(SeedSettingWarning):
        AgentEnvConfig(tokenizer_name=QWEN, agent_max_steps=7, max_agent_turns=5)
    assert both.value.field == "max_agent_turns"
    assert "agent_max_steps" in both.value.reason
    with pytest.warns(SeedSettingWarning):
        assert (
            AgentEnvConfig(tokenizer_name=QWEN, agent_max_steps=7, max_agent_turns=7).max_turns == 7
        )


# ----------------------------------------------------------------- named distributions


class DevEnv(FileEnv):
    def toolset_distributions(self) -> DistributionRegistry:
        return DistributionRegistry(
            distributions=[
                ToolsetDistribution(name="development", probabilities={"file": 1.0}),
                ToolsetDistribution(name="terminal_tasks", probabilities={"terminal": 1.0}),
            ]
        )


async def test_a_named_distribution_is_drawn_from_the_envs_registry() -> None:
    with pytest.warns(SeedSettingWarning, match="toolset_distribution"):
        config = _config(distribution="development")
    env = DevEnv(config)
    chat = _alternating_chat()
    async with FakeSandboxPool(containers=2, slots_per_container=2) as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    offered = {tuple(spec.name for spec in request.tools) for request in chat.requests}
    assert offered == {("read_file", "write_file")}  # the file toolset only


def test_an_unknown_distribution_name_fails_at_start() -> None:
    with pytest.raises(ConfigError) as caught:
        DevEnv(_config(toolset_distribution="research"))
    assert caught.value.field == "toolset_distribution"
    assert "'research'" in caught.value.reason
    assert "development" in caught.value.reason


# -------------------------------------------------------------------------------- dataset


class RowsEnv(AgentEnv[dict[str, JSON]]):
    """Neither get_next_item nor build_task: both come from the dataset."""

    name = "rows"

    async def verify_and_score(
        self, item: dict[str, JSON], tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return 1.0 if item.get("answer") == messages[-1].content else 0.0


def _rows_config(dataset: Path, **fields: Any) -> AgentEnvConfig:
    return _config(dataset=str(dataset), group_size=2, ensure_scores_are_not_same=False, **fields)


def _echo_answer() -> FakeChatServer:
    def respond(messages: Sequence[Message]) -> Any:
        task = messages[-1].content
        return _turn(Message.assistant(task.split()[-1]))

    return FakeChatServer(policy=respond)


async def test_the_builtin_get_next_item_reads_a_local_jsonl(tmp_path: Path) -> None:
    rows = [
        {"question": "say alpha", "answer": "alpha"},
        {"question": "say beta", "answer": "beta"},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = RowsEnv(_rows_config(path, prompt_field="question"))
    items = [await env.get_next_item() for _ in range(3)]
    assert items == [rows[0], rows[1], rows[0]]
    chat = _echo_answer()
    async with FakeSandboxPool() as pool:
        result = await env.run_task(items[1], pool=pool, policy=env.make_policy(chat=chat))
    assert chat.requests[0].messages[-1].content == "say beta"
    assert result.verdict.member_scores == (1.0, 1.0)


async def test_the_builtin_get_next_item_reads_a_local_parquet(tmp_path: Path) -> None:
    path = tmp_path / "tasks.parquet"
    pyarrow.parquet.write_table(
        pyarrow.Table.from_pylist([{"prompt": "say gamma", "answer": "gamma"}]), path
    )
    env = RowsEnv(_rows_config(path))
    assert await env.get_next_item() == {"prompt": "say gamma", "answer": "gamma"}
    assert env.build_task({"prompt": "say gamma"}) == "say gamma"


async def test_env_processes_given_shards_of_one_dataset_share_no_row(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(7)))
    seen = []
    for index in range(3):
        env = RowsEnv(_rows_config(path, dataset_shard=f"{index}/3"))
        seen.append([(await env.get_next_item())["prompt"] for _ in range(4)])
    assert seen == [
        ["say 0", "say 3", "say 6", "say 0"],  # each shard cycles through its own rows
        ["say 1", "say 4", "say 1", "say 4"],
        ["say 2", "say 5", "say 2", "say 5"],
    ]


@pytest.mark.parametrize(
    ("shard", "reason"),
    [
        ("1of3", "String should match pattern"),
        ("-1/3", "String should match pattern"),
        ("3/3", "expected I/K with 0 <= I < K, got '3/3'"),
        ("0/0", "expected I/K with 0 <= I < K, got '0/0'"),
        ("7/9", "shard 7/9 of the dataset's 7 rows holds no row"),
    ],
)
def test_a_shard_that_is_no_shard_of_the_dataset_fails_at_start(
    tmp_path: Path, shard: str, reason: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(7)))
    with pytest.raises(ConfigError) as caught:
        RowsEnv(_rows_config(path, dataset_shard=shard))
    assert caught.value.field == "dataset_shard"
    assert reason in caught.value.reason


def test_a_dataset_row_without_the_prompt_field_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "ok"}\n{"question": "no prompt"}\n')
    with pytest.raises(ConfigError) as caught:
        RowsEnv(_rows_config(path))
    assert caught.value.field == "prompt_field"
    assert f"{path}:2 has no text field" in caught.value.reason


def test_a_missing_dataset_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        RowsEnv(_rows_config(tmp_path / "nope.jsonl"))
    assert caught.value.field == "dataset"


def test_an_env_without_items_or_dataset_fails_at_start() -> None:
    with pytest.raises(ConfigError) as caught:
        RowsEnv(_config())
    assert caught.value.field == "dataset"
    assert "get_next_item or build_task" in caught.value.reason


def test_hermes_dataset_name_is_the_dataset(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "say delta"}\n')
    with pytest.warns(SeedSettingWarning, match="trajcore's dataset"):
        config = _config(dataset_name=str(path))
    assert config.dataset == str(path)


# -------------------------------------------------------- threads, idle lifetime, registry


class SlowToolEnv(FileEnv):
    """A synchronous tool that sleeps, recording how many ran at once."""

    running = 0
    peak = 0
    lock = threading.Lock()

    def tool_registry(self) -> ToolRegistry:
        registry = ToolRegistry()
        owner = type(self)

        @registry.tool()
        def slow(arguments: JSONObject, context: ToolContext) -> str:
            """Sleep a little."""
            with owner.lock:
                owner.running += 1
                owner.peak = max(owner.peak, owner.running)
            time.sleep(0.2)
            with owner.lock:
                owner.running -= 1
            return "slept"

        return registry


async def test_synchronous_registry_tools_run_in_tool_threads_threads() -> None:
    env = SlowToolEnv(_config(group_size=4, tool_threads=2, ensure_scores_are_not_same=False))
    ids = itertools.count()

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        call = ToolCall(id=f"s{next(ids)}", name="slow", arguments={})
        return _turn(Message.assistant("sleeping", tool_calls=[call]))

    async with FakeSandboxPool(containers=1, slots_per_container=4) as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=FakeChatServer(policy=respond))
        )
    assert [m.exchanges[0].result.content for m in result.members] == ["slept"] * 4
    assert SlowToolEnv.peak == 2


async def test_a_slot_idle_past_its_lifetime_ends_the_trajectory_on_that_budget() -> None:
    """The idle lifetime is a loop budget, not a model server's failure: the member that waited
    too long for its turn ends as ``idle_limit`` (budget exhausted), and its slot is released."""
    with pytest.warns(SeedSettingWarning, match="slot_idle_timeout_s"):
        config = _config(group_size=2, terminal_lifetime=0.2, on_failure="keep_healthy")
    env = FileEnv(config)
    chat = _alternating_chat()
    chat.inject(LLMFault.delay(30.0))  # one member's first turn never comes in time
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
        assert pool.statistics().leased == 0
    idle = [m for m in result.members if m.stats.stop_reason is StopReason.IDLE_LIMIT]
    assert len(idle) == 1
    assert idle[0].outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED
    assert idle[0].outcome.detail is not None
    assert "slot_idle_timeout_s=0.2" in idle[0].outcome.detail
    assert not any(m.outcome.status is TrajectoryStatus.MODEL_ERROR for m in result.members)


async def test_a_tool_registry_is_offered_in_process_with_no_setting() -> None:
    env = FileEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    assert env.config.tool_server_url is None

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant(f"sum {messages[-1].content}"))
        call = ToolCall(id="a", name="add", arguments={"a": 1, "b": 2})
        return _turn(Message.assistant("adding", tool_calls=[call]))

    chat = FakeChatServer(policy=respond)
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    assert "add" in {spec.name for spec in chat.requests[0].tools}
    assert [m.messages[-1].content for m in result.members] == ["sum 3"] * 2


async def test_a_registry_and_a_remote_tool_server_fail_at_start_naming_both() -> None:
    env = FileEnv(_config(tool_server_url="http://tools.example:9000"))
    async with FakeSandboxPool() as pool:
        with pytest.raises(ConfigError) as caught:
            async with env.rollout_services(pool=pool, policy=env.make_policy(chat=_echo_answer())):
                pass
    assert caught.value.field == "tool_server_url"
    assert "tool_registry()" in caught.value.reason
    assert "http://tools.example:9000" in caught.value.reason


async def test_the_builtin_get_next_item_reads_a_saved_hugging_face_dataset(
    tmp_path: Path,
) -> None:
    import datasets  # type: ignore[import-untyped]  # datasets ships no types

    folder = tmp_path / "saved"
    rows = [{"prompt": "say epsilon", "answer": "epsilon"}]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    env = RowsEnv(_rows_config(folder, dataset_split="test"))
    assert await env.get_next_item() == rows[0]
    with pytest.raises(ConfigError) as caught:
        RowsEnv(_rows_config(folder, dataset_split="train"))
    assert caught.value.field == "dataset_split"
