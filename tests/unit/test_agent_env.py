"""AgentEnv against the fakes: config errors, groups as ScoredDataGroups, failures, logging."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from anyio import wait_all_tasks_blocked

from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.fakes.tools import FakeToolServer
from trajcore.adapters.llm.chat_wire import parse_chat_body
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.errors import ConfigError, SlotFileError, StateError
from trajcore.domain.groups import GroupStatus, TrajectoryStatus
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.ledger import MASKED_LABEL
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolContext
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.scored_data import ScoredGroup, render_transcript
from trajcore.entrypoints.gc_tuning import DEFAULT_YOUNG_GC_THRESHOLD
from trajcore.rollout.tools import SlotTools
from trajcore.testing.tokenizers import write_llama3_shaped_tokenizer

pytestmark = pytest.mark.anyio

QWEN = str(qwen3_tokenizer_path())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FileEnv(AgentEnv[str]):
    """Items are the text the model must write to ``done.txt``."""

    name = "file_env"
    eval_set: Sequence[str] = ()

    async def get_next_item(self) -> str:
        return "ok"

    def build_task(self, item: str) -> str:
        return f"Create done.txt containing {item}."

    async def prepare_workspace(self, item: str, tools: SlotTools) -> None:
        await tools.write_file("README", "task files")

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        try:
            return 1.0 if (await tools.read_file("done.txt")) == item else 0.0
        except SlotFileError:  # no such file
            return 0.0

    async def eval_items(self) -> Sequence[str]:
        return self.eval_set

    def tool_registry(self) -> ToolRegistry:
        registry = ToolRegistry()

        @registry.tool(
            parameters={
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            }
        )
        def add(arguments: JSONObject, context: ToolContext) -> str:
            """Add two integers."""
            a, b = arguments["a"], arguments["b"]
            assert isinstance(a, int)
            assert isinstance(b, int)
            return str(a + b)

        return registry


def _config(**fields: Any) -> AgentEnvConfig:
    base: dict[str, Any] = {
        "tokenizer_name": QWEN,
        "use_wandb": False,
        "group_size": 4,
        "max_turns": 4,
        "max_tokens": 256,
        "max_token_length": 8192,
        "slot_lifetime_s": 30.0,
        "acquire_timeout_s": 10.0,
        "terminal_timeout_s": 5.0,
        "include_messages": True,
    }
    base.update(fields)
    return AgentEnvConfig(**base)


def _write(call_id: str, content: str) -> ToolCall:
    return ToolCall(
        id=call_id, name="write_file", arguments={"path": "done.txt", "content": content}
    )


def _alternating_chat() -> FakeChatServer:
    """Members alternately solve the task and write the wrong text (so scores differ)."""
    counter = itertools.count()

    def respond(messages: Sequence[Message]) -> Message:
        if messages[-1].role == "tool":
            return Message.assistant("done")
        n = next(counter)
        return Message.assistant("writing", tool_calls=[_write(f"c{n}", "ok" if n % 2 else "no")])

    return FakeChatServer(policy=lambda messages: _turn(respond(messages)))


def _turn(message: Message) -> Any:
    from trajcore.domain.sampling import ChatTurn

    reason = FinishReason.TOOL_CALLS if message.tool_calls else FinishReason.STOP
    return ChatTurn(message=message, finish_reason=reason)


def _check_shapes(group: ScoredGroup, size: int) -> None:
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == size
    assert group["messages"] is not None  # include_messages is on in these tests
    assert len(group["messages"]) == len(group["overrides"]) == size
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        assert len(tokens) == len(masks)
        trained = [m for m in masks if m != MASKED_LABEL]
        assert trained, "every member has some completion tokens"
        assert len(trained) < len(masks), "the prompt is masked"
        for token, mask in zip(tokens, masks, strict=True):
            assert mask in (MASKED_LABEL, token)
    json.dumps(group)  # what goes over the wire is plain JSON


@pytest.fixture(scope="module")
def env() -> FileEnv:
    return FileEnv(_config())


# ------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": "many"}, "max_turns"),
        ({"agent_temperature": -1}, "agent_temperature"),
        ({"tool_call_parser": "nope"}, "tool_call_parser"),
        ({"sandbox": "docker"}, "sandbox"),
        ({"tool_server_url": "ftp://x"}, "tool_server_url"),
        ({"on_failure": "retry"}, "on_failure"),
        ({"toolset_distribution": "terminal=lots"}, "toolset_distribution"),
        ({"extra_body": "top_k"}, "extra_body"),
        ({"environment_field": ""}, "environment_field"),  # no row has a field ''
        ({"prompt_field": ""}, "prompt_field"),
        ({"extra_body": '{"n": 4}'}, "extra_body.n"),
        ({"extra_body": {"best_of": 2}}, "extra_body.best_of"),
        ({"extra_body": {"sampling_params": {"n": 4}}}, "extra_body.sampling_params.n"),
    ],
)
def test_invalid_fields_are_config_errors_naming_them(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(**fields)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"sandbox": "nomad", "nomad_driver": "podman"}, "nomad_driver", "raw_exec"),
        ({"mode": "managed"}, "tool_call_parser", "hermes"),
        ({"min_healthy": 5}, "min_healthy", "group_size"),
        ({"slot_lifetime_s": 700, "worker_timeout": 600}, "slot_lifetime_s", "worker_timeout"),
        (
            {"sandbox": "nomad", "min_containers": 3, "max_containers": 2},
            "max_containers",
            "min_containers",
        ),
        ({"min_containers": 3}, "min_containers", "sandbox 'local' never reads it"),
        ({"toolset_distribution": {"terminal": 2.0}}, "toolset_distribution.terminal", "[0, 1]"),
        (
            {"enabled_toolsets": ["file"], "toolset_distribution": {"file": 1.0}},
            "toolset_distribution",
            "not both",
        ),
    ],
)
def test_settings_that_cannot_work_fail_at_start(
    fields: dict[str, Any], field: str, words: str
) -> None:
    config = _config(tokenizer_name="/no/such/tokenizer", **fields)
    with pytest.raises(ConfigError) as caught:
        FileEnv(config)  # before Atropos loads the (missing) tokenizer
    assert caught.value.field == field
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("lifetime", "worker_timeout"), [(540.0, 600.0), (100.0, 600.0), (599.0, 600.0)]
)
def test_a_render_past_the_deadline_still_ends_before_worker_timeout(
    lifetime: float, worker_timeout: float
) -> None:
    # The final render may run its grace past the trajectory's deadline (slot_lifetime_s):
    # the group must still end before Atropos's worker_timeout cancels it whole.
    config = _config(slot_lifetime_s=lifetime, worker_timeout=worker_timeout)
    rollout = config.settings().rollout
    assert rollout.deadline_s == lifetime
    assert rollout.deadline_s + rollout.render_grace_s < worker_timeout


def test_without_worker_timeout_the_render_keeps_the_rollouts_grace() -> None:
    rollout = _config(worker_timeout=-1).settings().rollout
    assert rollout.render_grace_s == 120.0


def test_a_tokenizer_that_cannot_be_loaded_offline_is_named_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(tokenizer_name="no-such-org/no-such-model"))
    assert caught.value.field == "tokenizer_name"
    assert "'no-such-org/no-such-model' could not be loaded" in caught.value.reason
    assert "offline, a model name loads only from the local cache" in caught.value.reason
    assert str(qwen3_tokenizer_path()) in caught.value.reason


def test_a_tokenizer_folder_that_is_not_there_is_said_to_be_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A path that names no folder is said to be missing, not read as a malformed model
    name ("Repo id must be in the form ...")."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no-such-tokenizer")
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(tokenizer_name=missing))
    assert caught.value.field == "tokenizer_name"
    assert caught.value.reason.startswith(f"{missing!r}: no such folder; "), caught.value.reason


def test_cli_text_becomes_lists_and_mappings() -> None:
    config = _config(
        enabled_toolsets="terminal,file",
        disabled_toolsets=["stateful_terminal"],
        extra_body='{"top_k": 5}',
    )
    assert config.enabled_toolsets == ["terminal", "file"]
    assert config.disabled_toolsets == ["stateful_terminal"]
    assert config.extra_body == {"top_k": 5}
    assert _config(extra_body={"n": 1}).extra_body == {"n": 1}  # one completion: as sent
    assert _config(toolset_distribution="terminal=1,file=0.5").toolset_distribution == {
        "terminal": 1.0,
        "file": 0.5,
    }
    assert _config(toolset_distribution='{"file": 1}').toolset_distribution == {"file": 1.0}


def test_the_mode_switch() -> None:
    assert _config().resolved_mode == "openai"
    # No token server type known: a parser alone does not switch to managed mode.
    assert _config(tool_call_parser="hermes").resolved_mode == "openai"
    assert _config(tool_call_parser="hermes", mode="managed").resolved_mode == "managed"
    assert _config(tool_call_parser="hermes", mode="openai").resolved_mode == "openai"


async def test_an_unknown_toolset_fails_when_services_start(env: FileEnv) -> None:
    bad = FileEnv(_config(enabled_toolsets=["file", "web"]))
    async with FakeSandboxPool() as pool:
        with pytest.raises(ConfigError) as caught:
            async with bad.rollout_services(
                pool=pool, policy=env.make_policy(chat=FakeChatServer())
            ):
                pass
    assert caught.value.field == "enabled_toolsets[1]"


# ------------------------------------------------------------------------- OpenAI mode


async def test_openai_mode_group_is_a_scored_data_group_marked_inexact(env: FileEnv) -> None:
    async with FakeSandboxPool(containers=2, slots_per_container=2) as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
        assert pool.statistics().leased == 0
    assert result.verdict.status is GroupStatus.COMPLETE
    assert sorted(s for s in result.verdict.member_scores if s is not None) == [0.0, 0.0, 1.0, 1.0]
    group = env.scored_group(result)
    assert group is not None
    _check_shapes(group, 4)
    assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
    assert group["inference_logprobs"] is None
    assert group["group_overrides"]["token_exact"] is False
    assert "group_size" not in group["group_overrides"]
    assert all(o["token_exact"] is False for o in group["overrides"])
    conversations = group["messages"]
    assert conversations is not None
    roles = [m["role"] for m in conversations[0]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert conversations[0][1]["tool_calls"][0]["function"]["name"] == "write_file"
    text = render_transcript(conversations[0])
    assert ">>> write_file(" in text
    assert "--- tool result [write_file]" in text


async def test_the_system_prompt_opens_the_task() -> None:
    env = FileEnv(_config(system_prompt="You are careful.", group_size=2))
    chat = _alternating_chat()
    async with FakeSandboxPool() as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    first = chat.requests[0].messages
    assert [m.role for m in first] == ["system", "user"]
    assert first[0].content == "You are careful."


async def test_collect_trajectories_inside_services(env: FileEnv) -> None:
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        group, backlog = await env.collect_trajectories("ok")
    assert backlog == []
    assert group is not None
    _check_shapes(group, 4)
    with pytest.raises(StateError):
        _ = env.services


# ------------------------------------------------------------------------------ failures


async def test_partial_group_carries_its_size_and_never_scores_failures() -> None:
    env = FileEnv(_config(on_failure="keep_healthy", min_healthy=2))
    chat = _alternating_chat()
    chat.inject(LLMFault.rejected(400, "bad request"))  # one member's first call
    async with FakeSandboxPool(containers=2, slots_per_container=2) as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    assert result.verdict.status is GroupStatus.PARTIAL
    failed = [m for m in result.members if m.outcome.status is TrajectoryStatus.MODEL_ERROR]
    assert len(failed) == 1
    assert failed[0].outcome.score is None
    group = env.scored_group(result)
    assert group is not None
    _check_shapes(group, 3)
    assert group["group_overrides"]["group_size"] == 3
    sent = {o["trajcore"]["trajectory_id"] for o in group["overrides"]}
    assert failed[0].trajectory_id not in sent


async def test_dropped_group_is_none_with_the_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FileEnv(_config(on_failure="drop"))
    chat = _alternating_chat()
    chat.inject(LLMFault.rejected(400, "bad request"))
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with (
        FakeSandboxPool(containers=2, slots_per_container=2) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=chat)),
    ):
        group, _ = await env.collect_trajectories("ok")
    assert group is None
    assert any(
        "dropped" in r.getMessage() and "on_failure is drop" in r.getMessage()
        for r in caplog.records
    )
    assert env.tool_error_metrics()["trajcore/groups_dropped/member_failed"] == 1


async def test_equal_scores_drop_the_group_as_atropos_would() -> None:
    env = FileEnv(_config(group_size=2))
    chat = FakeChatServer(policy=lambda messages: _turn(Message.assistant("no idea")))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    assert result.verdict.all_equal
    assert env.scored_group(result) is None


async def test_a_cancelled_worker_releases_its_slots(env: FileEnv) -> None:
    chat = FakeChatServer(policy=lambda messages: _turn(Message.assistant("slow")))
    chat.inject(*[LLMFault.delay(60.0)] * 4)
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=chat)),
    ):
        worker = asyncio.create_task(env.collect_trajectories("ok"))  # as Atropos runs it
        await wait_all_tasks_blocked()
        assert pool.statistics().leased == 4
        worker.cancel()  # as Atropos cancels a worker
        with pytest.raises(asyncio.CancelledError):
            await worker
        assert pool.statistics().leased == 0
        assert pool.statistics().free == 4


@pytest.mark.parametrize("template", ["qwen3", "llama3-shaped"])
async def test_a_call_whose_arguments_are_no_object_is_trained_as_written_or_not_at_all(
    template: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the server keeps the call with {} (the replay pairs its answer); the training render writes
    # the model's text where the template writes it as it is (Qwen3), else masks the turn
    folder = QWEN if template == "qwen3" else str(write_llama3_shaped_tokenizer(tmp_path))
    env = FileEnv(_config(tokenizer_name=folder, group_size=2, ensure_scores_are_not_same=False))
    raw = '{"path": "done.txt", "content": "unterminated'
    garbled = {"id": "c1", "function": {"name": "write_file", "arguments": raw}}

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        message = {"role": "assistant", "content": "", "tool_calls": [garbled]}
        return parse_chat_body({"choices": [{"message": message, "finish_reason": "tool_calls"}]})

    chat = FakeChatServer(policy=respond)
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    group = env.scored_group(result)
    assert group is not None
    tokenizer = env.tokenizer_port()
    pairs = zip(group["tokens"][0], group["masks"][0], strict=True)
    trained = tokenizer.decode([t for t, m in pairs if m != MASKED_LABEL])
    untrained = group["overrides"][0]["trajcore"]["untrained_turns"]
    if template == "qwen3":
        assert f'"arguments": {raw}}}' in trained
        assert untrained == []
    else:
        assert "write_file" not in trained
        assert trained.startswith("done")
        assert [u["turn"] for u in untrained] == [1]
        assert "call c1 (write_file)" in untrained[0]["reason"]
        assert any("turn 1 not trained" in r.getMessage() for r in caplog.records)
    # the assistant turn as the server reads it again: the call, with {}
    (replayed,) = [m for m in chat.requests[-1].messages if m.tool_calls]
    assert replayed.tool_calls[0].arguments == {}
    assert replayed.tool_calls[0].raw_arguments is None


# --------------------------------------------------------------------- tools and logging


async def test_tool_errors_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    env = FileEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    calls = itertools.count()

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        n = next(calls)
        return _turn(
            Message.assistant(
                "looking",
                tool_calls=[
                    ToolCall(id=f"r{n}", name="read_file", arguments={"path": "missing.txt"}),
                    ToolCall(id=f"x{n}", name="browse", arguments={}),
                ],
            )
        )

    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with FakeSandboxPool() as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=FakeChatServer(policy=respond))
        )
    group = env.scored_group(result)
    assert group is not None
    metrics = env.tool_error_metrics()
    assert metrics["trajcore/tool_calls"] == 4
    assert metrics["trajcore/tool_errors/tool_error"] == 2
    assert metrics["trajcore/tool_errors/rejected"] == 2
    assert metrics["trajcore/tool_error_rate"] == 1.0
    assert group["overrides"][0]["trajcore"]["tool_errors"] == 2
    logged = [r.getMessage() for r in caplog.records]
    assert any("read_file(" in line and "tool_error" in line for line in logged)
    assert any("browse(" in line and "rejected" in line for line in logged)
    await env.wandb_log({})  # wandb off: counters go to the log and start again
    assert env.tool_error_metrics()["trajcore/tool_calls"] == 0
    assert any("trajcore metrics" in r.getMessage() for r in caplog.records)


async def test_a_toolset_distribution_is_drawn_once_per_group() -> None:
    env = FileEnv(_config(toolset_distribution={"file": 1.0, "terminal": 0.0}, toolset_seed=7))
    chat = _alternating_chat()
    async with FakeSandboxPool(containers=2, slots_per_container=2) as pool:
        await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    offered = {tuple(spec.name for spec in request.tools) for request in chat.requests}
    assert offered == {("read_file", "write_file")}


async def test_inprocess_tool_server_tools_are_offered_and_run() -> None:
    env = FileEnv(
        _config(group_size=2, tool_server_url="inprocess", ensure_scores_are_not_same=False)
    )
    adds = itertools.count()

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant(f"the sum is {messages[-1].content}"))
        return _turn(
            Message.assistant(
                "adding",
                tool_calls=[ToolCall(id=f"a{next(adds)}", name="add", arguments={"a": 2, "b": 3})],
            )
        )

    chat = FakeChatServer(policy=respond)
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=chat))
    assert "add" in {spec.name for spec in chat.requests[0].tools}
    assert [m.messages[-1].content for m in result.members] == ["the sum is 5"] * 2


async def test_every_member_is_released_on_the_tool_server_when_it_ends() -> None:
    env = FileEnv(_config(group_size=3, ensure_scores_are_not_same=False))
    tools = FakeToolServer()
    async with FakeSandboxPool() as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat()), tool_server=tools
        )
    assert sorted(tools.released) == sorted(m.trajectory_id for m in result.members)
    assert len(set(tools.released)) == 3


# -------------------------------------------------------------------------- managed mode


async def test_managed_mode_sends_exact_tokens_and_logprobs() -> None:
    env = FileEnv(_config(mode="managed", tool_call_parser="hermes", group_size=2))
    tokenizer = env.tokenizer_port()
    im_end = tokenizer.encode("<|im_end|>")
    parser = get_parser("hermes")
    sampled: list[list[int]] = []
    counter = itertools.count()

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        n = next(counter)
        text = (
            "All done."
            if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1
            else parser.render([_write("x", "ok" if n % 2 else "no")], content="Writing.")
        )
        ids = [*tokenizer.encode(text), *im_end]
        sampled.append(ids)
        return TokenCompletion.of(ids, [-0.25] * len(ids), FinishReason.STOP)

    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(token=FakeTokenServer(policy=respond))
        )
    group = env.scored_group(result)
    assert group is not None
    _check_shapes(group, 2)
    assert group["group_overrides"]["token_exact"] is True
    logprobs = group["inference_logprobs"]
    assert logprobs is not None
    all_sampled = [t for ids in sampled for t in ids]
    for tokens, masks, lps in zip(group["tokens"], group["masks"], logprobs, strict=True):
        assert len(lps) == len(tokens)
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != MASKED_LABEL]
        assert len(trained) > 0
        assert all(t in all_sampled for t in trained)
        assert [lp for lp, m in zip(lps, masks, strict=True) if m != MASKED_LABEL] == [-0.25] * len(
            trained
        )
    assert sorted(group["scores"]) == [0.0, 1.0]


# ------------------------------------------------------------------------------ evaluate


async def test_evaluate_runs_the_eval_items_and_writes_metrics(tmp_path: Path) -> None:
    env = FileEnv(_config(data_dir_to_save_evals=str(tmp_path), min_healthy=3))
    env.eval_set = ("ok", "ok", "ok", "ok")
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        await env.evaluate()
    metrics = json.loads((tmp_path / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/items"] == 4
    assert metrics["eval/mean_score"] == 0.5
    assert (tmp_path / "samples.jsonl").is_file()


# ---------------------------------------------------------------- the env process's collector


class CliFileEnv(FileEnv):
    """``FileEnv`` as a CLI run builds it: its own model server (so no endpoint is probed) and
    its own pool."""

    def make_chat_server(self) -> FakeChatServer:
        return _alternating_chat()

    def make_pool(self) -> FakeSandboxPool:
        return FakeSandboxPool(containers=1, slots_per_container=2)


@pytest.mark.parametrize(
    ("field", "young"), [({}, DEFAULT_YOUNG_GC_THRESHOLD), ({"gc_young_threshold": 1234}, 1234)]
)
async def test_a_run_collects_young_objects_at_its_threshold_and_puts_the_old_one_back(
    field: dict[str, int], young: int
) -> None:
    env = CliFileEnv(_config(**field))
    before = gc.get_threshold()
    during: list[tuple[int, ...]] = []

    async def run() -> None:
        during.append(gc.get_threshold())
        assert env.services.pool is not None  # inside the run's services

    await env._run_with_services(run)
    assert during == [(young, *before[1:])]
    assert gc.get_threshold() == before


async def test_gc_young_threshold_none_leaves_the_collector_alone() -> None:
    env = CliFileEnv(_config(gc_young_threshold=None))
    before = gc.get_threshold()
    during: list[tuple[int, ...]] = []

    async def run() -> None:
        during.append(gc.get_threshold())

    await env._run_with_services(run)
    assert during == [before]


def test_gc_young_threshold_below_one_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="gc_young_threshold"):
        _config(gc_young_threshold=0)
