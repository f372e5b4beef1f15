"""Envs written in each seed's style run end to end on the real local pool (bubblewrap).

``examples/atropos_agent_seed_style.py`` (workspace metadata, ``(score, metadata)`` from
verification in the slot, per-item step budgets; a tool object added by ``build_tools()`` and
``run_agent``) and ``examples/hermes_seed_style.py``
(``format_prompt``, ``compute_reward`` with hermes's ``AgentResult`` and an awaited
``HermesToolContext``), each driven by a scripted model through the env's own pool.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from examples.atropos_agent_seed_style import AddTool, CountLinesEnv, CountTask, SumEnv, SumTask
from examples.hermes_seed_style import GreetingFileEnv, Item

from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.compat import AgentResult, HermesToolContext
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.config import AgentEnvConfig

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(**fields: Any) -> AgentEnvConfig:
    base: dict[str, Any] = {
        "tokenizer_name": str(qwen3_tokenizer_path()),
        "use_wandb": False,
        "group_size": 2,
        "max_turns": 6,
        "max_token_length": 8192,
        "local_containers": 1,
        "slots_per_container": 2,
        "require_sandbox": True,
        "terminal_timeout_s": 10.0,
        "slot_lifetime_s": 60.0,
        "acquire_timeout_s": 30.0,
        "include_messages": True,
        "ensure_scores_are_not_same": False,
    }
    base.update(fields)
    return AgentEnvConfig(**base)


def _turn(message: Message) -> ChatTurn:
    reason = FinishReason.TOOL_CALLS if message.tool_calls else FinishReason.STOP
    return ChatTurn(message=message, finish_reason=reason)


def _scripted(first_turns: Sequence[Sequence[ToolCall]]) -> FakeChatServer:
    """Member n's first turn makes ``first_turns[n % len]``'s calls; then it says done."""
    counter = itertools.count()

    def respond(messages: Sequence[Message]) -> ChatTurn:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        calls = first_turns[next(counter) % len(first_turns)]
        return _turn(Message.assistant("working", tool_calls=list(calls)))

    return FakeChatServer(policy=respond)


async def test_an_atropos_agent_style_env_runs_on_the_local_pool() -> None:
    env = CountLinesEnv(_config())
    await env.setup()  # atropos-agent's setup_agent_env
    item = await env.get_next_item()
    assert item == CountTask(lines=3)
    chat = _scripted(
        [
            [ToolCall(id="c", name="bash", arguments={"command": "wc -l < data.txt > answer.txt"})],
            [ToolCall(id="w", name="write_file", arguments={"path": "answer.txt", "content": "7"})],
        ]
    )
    result = await env.run_task(item, policy=env.make_policy(chat=chat))
    assert sorted(s for s in result.verdict.member_scores if s is not None) == [0.0, 1.0]
    # build_agent_config's temperature and "no token cap" reach the model.
    assert {r.sampling.temperature for r in chat.requests} == {0.2}
    assert {r.sampling.max_tokens > 4096 for r in chat.requests} == {True}
    group = env.scored_group(result)
    assert group is not None
    stories = {o["trajcore"]["score_metadata"]["answer"]: o["trajcore"] for o in group["overrides"]}
    assert set(stories) == {"3", "7"}
    for story in stories.values():
        assert story["prepare_metadata"] == {"expected_lines": 3, "written": True}
        assert story["score_metadata"]["expected"] == 3
        assert story["stop_reason"] == "natural"


async def test_build_agent_config_limits_each_items_steps() -> None:
    env = CountLinesEnv(_config())
    await env.setup()
    chat = _scripted(
        [[ToolCall(id="c", name="bash", arguments={"command": "wc -l < data.txt > answer.txt"})]]
    )
    result = await env.run_task(CountTask(lines=2, max_steps=1), policy=env.make_policy(chat=chat))
    for member in result.members:
        assert member.stats.turns == 1
        assert member.stats.stop_reason is not None
        assert member.stats.stop_reason.value == "max_turns"
    # The one turn ran the command, and the score came from the slot.
    assert result.verdict.member_scores == (1.0, 1.0)


def _adder() -> FakeChatServer:
    """The model adds the item's numbers with the ``add`` tool, writes the sum to answer.txt
    with ``bash``, then answers with the sum."""

    def respond(messages: Sequence[Message]) -> ChatTurn:
        last = messages[-1]
        if last.role == "user":
            a, b = (int(w) for w in last.content.replace("?", "").split() if w.isdigit())
            call = ToolCall(id="add", name="add", arguments={"a": a, "b": b})
            return _turn(Message.assistant("adding", tool_calls=[call]))
        if last.name == "add":
            command = f"printf %s {last.content} > answer.txt"
            call = ToolCall(id="write", name="bash", arguments={"command": command})
            return _turn(Message.assistant("writing", tool_calls=[call]))
        total = next(m.content for m in messages if m.role == "tool" and m.name == "add")
        return _turn(Message.assistant(f"The sum is {total}."))

    return FakeChatServer(policy=respond)


async def test_a_tool_object_from_build_tools_runs_beside_the_slot_tools() -> None:
    env = SumEnv(_config())
    await env.setup()
    item = await env.get_next_item()
    assert item == SumTask(a=2, b=3)
    chat = _adder()
    result = await env.run_task(item, policy=env.make_policy(chat=chat))
    assert result.verdict.member_scores == (1.0, 1.0)  # answer.txt, read in the slot
    offered = {spec.name for spec in chat.requests[0].tools}
    assert {"add", "bash", "write_file"} <= offered
    add = env.tools.get("add")
    assert isinstance(add, AddTool)
    assert add.calls == [{"a": 2, "b": 3}, {"a": 2, "b": 3}]  # in this process, once a member
    for member in result.members:
        add_result, bash_result = (e.result for e in member.exchanges)
        assert (add_result.ok, add_result.content) == (True, "5")
        assert bash_result.ok
        assert bash_result.exec is not None
        assert bash_result.exec.sandboxed


async def test_run_agent_runs_the_agent_in_a_slot_of_the_local_pool() -> None:
    env = SumEnv(_config())
    await env.setup()
    chat = _adder()
    async with env.rollout_services(policy=env.make_policy(chat=chat)):
        score, debug = await env.solve(SumTask(a=40, b=2))  # the env's own code: run_agent
        final, again = await env.run_agent("What is 1 + 1?", trajectory_id="direct")
    assert score == 1.0
    assert debug["success"] is True
    assert debug["tool_calls"] == 2
    assert debug["status"] == "finished"
    assert [m["role"] for m in debug["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert debug["messages"][4]["content"] == ""  # printf wrote the file, said nothing
    assert final == "The sum is 2."
    assert again["trajectory_id"] == "direct"
    assert again["success"] is True


class _ProbedGreetingEnv(GreetingFileEnv):
    """Records what compute_reward got, and exercises every HermesToolContext call."""

    def __init__(self, *args: Any, probe_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[AgentResult] = []
        self.probes: list[dict[str, Any]] = []
        self.probe_dir = probe_dir

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: HermesToolContext
    ) -> float:
        self.results.append(result)
        source = self.probe_dir / "blob.bin"
        fetched = self.probe_dir / f"back-{ctx.task_id.replace('/', '_')}.bin"
        self.probes.append(
            {
                "task_id": ctx.task_id,
                "write": await ctx.write_file("probe/note.txt", "needle here\n"),
                "search": await ctx.search("needle", "probe"),
                "upload": await ctx.upload_file(str(source), "probe/blob.bin"),
                "download": await ctx.download_file("probe/blob.bin", str(fetched)),
                "same_bytes": fetched.read_bytes() == source.read_bytes(),
                "call_tool": await ctx.call_tool("read_file", {"path": "probe/note.txt"}),
                "missing": await ctx.read_file("probe/nothing.txt"),
            }
        )
        return await super().compute_reward(item, result, ctx)


async def test_a_hermes_style_env_runs_on_the_local_pool(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 3)
    env = _ProbedGreetingEnv(_config(), probe_dir=tmp_path)
    await env.setup()
    item = await env.get_next_item()

    def write(text: str) -> ToolCall:
        return ToolCall(id="w", name="write_file", arguments={"path": "hello.txt", "content": text})

    absent = ToolCall(id="r", name="read_file", arguments={"path": "absent.txt"})
    chat = _scripted([[write("hello world")], [write("hello"), absent]])
    result = await env.run_task(item, policy=env.make_policy(chat=chat))
    assert sorted(s for s in result.verdict.member_scores if s is not None) == [0.4, 1.0]
    by_errors = sorted(env.results, key=lambda r: len(r.tool_errors))
    clean, failed = by_errors
    assert clean.turns_used == failed.turns_used == 2
    assert clean.finished_naturally
    assert failed.finished_naturally
    assert clean.tool_errors == []
    (error,) = failed.tool_errors
    assert (error.turn, error.tool_name) == (1, "read_file")
    assert error.error.startswith("tool_error")
    assert "absent.txt" in error.arguments
    assert failed.reasoning_per_turn == [None, None]
    assert [m["role"] for m in failed.messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    for probe in env.probes:
        assert probe["write"] == {"success": True}
        assert probe["search"]["matches"] == ["probe/note.txt:1:needle here"]
        assert probe["upload"]["exit_code"] == 0
        assert probe["download"] == {"success": True, "bytes": 768}
        assert probe["same_bytes"] is True
        assert probe["call_tool"] == "needle here\n"
        assert "error" in probe["missing"]
    assert {p["task_id"] for p in env.probes} == {m.trajectory_id for m in result.members}
