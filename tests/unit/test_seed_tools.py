"""atropos-agent's ``build_tools()``/``self.tools`` and ``run_agent(task)`` run unchanged on the
compat base, on the fakes.

A seed env overrides ``build_tools()`` to add its own tool objects: each must reach the model as
a tool spec, and its ``execute`` must run (in this process) when the model calls it, with its
failures told to the model as tool errors. ``run_agent`` runs the agent on a task text and
answers the seed's ``(final_response, debug)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import pytest

from tests.unit.test_agent_env import _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.compat import (
    AtroposAgentEnv,
    SeedToolRegistry,
    SeedToolResult,
    SlotTool,
    Tool,
    ToolSchema,
)
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolSpec
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Lookup(Tool):
    """A Python tool object: answers from a table, fails for unknown keys."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(
            name="lookup",
            description="Look a key up.",
            parameters={"key": {"type": "string", "description": "the key"}},
            required=["key"],
        )

    async def execute(self, **kwargs: Any) -> SeedToolResult:
        self.calls.append(kwargs)
        table = {"x": "forty-two"}
        if kwargs["key"] not in table:
            return SeedToolResult(success=False, error=f"no key {kwargs['key']!r}")
        return SeedToolResult(success=True, output=table[kwargs["key"]])


class Broken(Tool):
    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(name="broken", description="Raises.")

    async def execute(self, **kwargs: Any) -> str:
        raise RuntimeError("boom")


class Unavailable(Tool):
    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(name="needs_key", description="Needs an API key.")

    async def execute(self, **kwargs: Any) -> str:
        return "never"

    def is_available(self) -> tuple[bool, str | None]:
        return False, "NEEDS_KEY is not set"


class Remote(Tool):
    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(name="web_search", description="On the tool server.", external=True)

    async def execute(self, **kwargs: Any) -> str:
        return "never here"


class LookupEnv(AtroposAgentEnv[str]):
    """A seed-style env: ``build_tools()`` adds tool objects to the default slot tools."""

    name = "lookup_env"

    def build_tools(self) -> SeedToolRegistry:
        tools = super().build_tools()
        self.lookup = Lookup()
        for tool in (self.lookup, Broken(), Unavailable(), Remote()):
            tools.register(tool)
        return tools

    async def get_next_item(self) -> str:
        return "x"

    def build_task(self, item: str) -> str:
        return f"Look {item} up and write the value into done.txt."

    async def score_trajectory(self, item: str, final_response: str) -> float:
        return 1.0 if final_response == "forty-two" else 0.0


def _lookup_chat(*calls: ToolCall) -> FakeChatServer:
    """The model makes ``calls``, then answers with the first tool result's text."""

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            first = next(m for m in messages if m.role == "tool")
            return _turn(Message.assistant(first.content))
        return _turn(Message.assistant("looking", tool_calls=list(calls)))

    return FakeChatServer(policy=respond)


def _lookup(call_id: str, key: str) -> ToolCall:
    return ToolCall(id=call_id, name="lookup", arguments={"key": key})


async def test_a_tool_object_from_build_tools_reaches_the_model_and_runs_in_process() -> None:
    env = LookupEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    chat = _lookup_chat(_lookup("a", "x"))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("x", pool=pool, policy=env.make_policy(chat=chat))
    assert result.verdict.member_scores == (1.0, 1.0)
    offered = {spec.name: spec for spec in chat.requests[0].tools}
    # The registry's tools: the slot tools and the Python ones; not the unavailable tool, and
    # not the external one (no tool server lists it).
    assert set(offered) == {*(s.name for s in SLOT_TOOL_SPECS), "lookup", "broken"}
    assert offered["lookup"].parameters == {
        "type": "object",
        "properties": {"key": {"type": "string", "description": "the key"}},
        "required": ["key"],
    }
    assert env.lookup.calls == [{"key": "x"}, {"key": "x"}]
    for member in result.members:
        (exchange,) = member.exchanges
        assert exchange.result.outcome is ToolOutcome.OK
        assert exchange.result.content == "forty-two"
    assert isinstance(env.tools, SeedToolRegistry)
    assert env.tools.get("lookup") is env.lookup


async def test_a_tool_objects_failures_are_tool_errors_the_model_sees() -> None:
    env = LookupEnv(_config(group_size=1, min_healthy=1))
    calls = (
        _lookup("a", "nope"),  # the tool answers success=False
        ToolCall(id="b", name="broken", arguments={}),  # the tool raises
        ToolCall(id="c", name="lookup", arguments={"key": 7}),  # misses the schema
        ToolCall(id="d", name="needs_key", arguments={}),  # not offered
    )
    chat = _lookup_chat(*calls)
    async with FakeSandboxPool() as pool:
        result = await env.run_task("x", pool=pool, policy=env.make_policy(chat=chat))
    (member,) = result.members
    by_id = {e.call.id: e.result for e in member.exchanges}
    assert by_id["a"].outcome is ToolOutcome.TOOL_ERROR
    assert by_id["a"].error == "ToolFailed: no key 'nope'"
    assert by_id["b"].outcome is ToolOutcome.TOOL_ERROR
    assert by_id["b"].error == "RuntimeError: boom"
    assert by_id["c"].outcome is ToolOutcome.REJECTED
    assert "lookup.key" in (by_id["c"].error or "")
    assert by_id["d"].outcome is ToolOutcome.REJECTED
    assert env.lookup.calls == [{"key": "nope"}]  # the misfit never ran
    tool_messages = [m.content for m in member.messages if m.role == "tool"]
    assert tool_messages[0] == "Error: ToolFailed: no key 'nope'"


async def test_the_default_registry_offers_what_agent_env_offers() -> None:
    class Plain(AtroposAgentEnv[str]):
        async def get_next_item(self) -> str:
            return "x"

        def build_task(self, item: str) -> str:
            return item

        async def score_trajectory(self, item: str, final_response: str) -> float:
            return 0.0

    env = Plain(_config())
    assert [t.name for t in env.tools] == [s.name for s in SLOT_TOOL_SPECS]
    assert all(isinstance(t, SlotTool) for t in env.tools)
    assert env.tools([]) == SLOT_TOOL_SPECS  # AgentEnv.tools(external), answered by the registry
    assert env.tool_registry() is None  # no Python tools: no in-process tool server
    bash = env.tools.get("bash")
    assert bash is not None
    assert bash.schema.required == ["command"]
    answer = await env.tools.execute(ToolCall(id="q", name="bash", arguments={"command": "ls"}))
    assert not answer.success
    assert "exec_tool" in answer.error


async def test_the_seed_registry_keeps_the_seeds_behaviour() -> None:
    registry = SeedToolRegistry()
    lookup = Lookup()
    registry.register(Broken())
    registry.register(lookup)
    assert [t.name for t in registry.list_tools()] == ["broken", "lookup"]
    assert [s.name for s in registry.get_schemas()] == ["broken", "lookup"]
    assert "lookup" in registry
    assert len(registry) == 2
    answer = await registry.execute(_lookup("u1", "x"))
    assert (answer.success, answer.output, answer.uniq_id) == (True, "forty-two", "u1")
    failed = await registry.execute(ToolCall(id="u2", name="broken"))
    assert (failed.success, failed.error) == (False, "Tool execution error: boom")
    unknown = await registry.execute(ToolCall(id="u3", name="nothing"))
    assert unknown.error == "Unknown tool: nothing"
    assert lookup.schema.to_dict()["function"]["parameters"]["required"] == ["key"]
    assert "**lookup**" in registry.get_prompt_description()
    with pytest.raises(ConfigError) as refused:
        registry.register("bash")  # type: ignore[arg-type]
    assert refused.value.field == "build_tools()"


async def test_a_bad_tool_schema_is_refused_naming_the_tool() -> None:
    class BadSchema(Lookup):
        @property
        def schema(self) -> ToolSchema:
            return ToolSchema(name="bad", description="", parameters={"k": {"type": "no-such"}})

    registry = SeedToolRegistry()
    registry.register(BadSchema())
    with pytest.raises(ConfigError) as refused:
        registry.python_tools()
    assert refused.value.field.startswith("build_tools()['bad']")


def test_a_subclass_defining_tools_is_refused() -> None:
    class Clash(LookupEnv):
        def tools(self, external: Sequence[ToolSpec]) -> Sequence[ToolSpec]:  # type: ignore[override]
            return external

    with pytest.raises(ConfigError) as refused:
        Clash(_config())
    assert refused.value.field == "tools"
    assert "build_tools()" in refused.value.reason


def test_self_tools_takes_only_a_registry() -> None:
    env = LookupEnv(_config())
    replaced = SeedToolRegistry()
    env.tools = replaced  # the seed's envs may rebuild it
    assert env.tools is replaced
    with pytest.raises(ConfigError) as refused:
        env.tools = ["bash"]  # type: ignore[assignment]
    assert refused.value.field == "tools"


# ------------------------------------------------------------------------------- run_agent


class AgentOnFakes(LookupEnv):
    """``run_agent`` without services opened by the caller: the env's own makers are used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat = _lookup_chat(_lookup("a", "x"))
        self.pools: list[FakeSandboxPool] = []
        self.pools_closed = 0

    def make_chat_server(self) -> ChatServer:
        return self.chat

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return self._pool()

    @contextlib.asynccontextmanager
    async def _pool(self) -> AsyncIterator[SandboxPool]:
        async with FakeSandboxPool() as pool:
            self.pools.append(pool)
            yield pool
        self.pools_closed += 1


async def test_run_agent_runs_the_agent_on_a_task_text() -> None:
    env = AgentOnFakes(_config(system_prompt="Be brief.", agent_temperature=0.3))
    final, debug = await env.run_agent("Look x up.", trajectory_id="t-1")
    assert final == "forty-two"
    assert debug["success"] is True
    assert debug["error"] is None
    assert debug["tool_calls"] == 1
    assert (debug["trajectory_id"], debug["status"], debug["stop_reason"]) == (
        "t-1",
        "finished",
        "natural",
    )
    assert debug["turns"] == 2
    assert [m["role"] for m in debug["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert debug["messages"][1]["content"] == "Look x up."
    (first, _) = env.chat.requests
    assert "lookup" in {s.name for s in first.tools}
    assert first.sampling.temperature == 0.3  # the config's agent_temperature
    assert env.lookup.calls == [{"key": "x"}]
    (pool,) = env.pools  # opened for the call, and closed after it
    assert env.pools_closed == 1
    assert pool.statistics().leases_granted == 1


class AgentOnAStalledServer(AgentOnFakes):
    """The model server never answers, and Atropos's health check marks every server down."""

    def make_chat_server(self) -> ChatServer:
        chat = FakeChatServer(script=[Message.assistant("late")])
        chat.inject(LLMFault.delay(60.0))
        for server in cast("Any", self.server).servers:  # atroposlib's, untyped
            server.server_healthy = False
        return chat


async def test_run_agent_reports_a_stalled_model_server_as_its_failure() -> None:
    env = AgentOnAStalledServer(_config(slot_lifetime_s=2.0, score_reserve_s=0.5))
    _, debug = await env.run_agent("Look x up.", trajectory_id="t-stalled")
    assert (debug["status"], debug["stop_reason"]) == ("model_error", "model_error")
    assert debug["success"] is False
    assert "is marked unhealthy by Atropos's health check" in debug["error"]


async def test_run_agent_uses_the_open_services_and_reports_failures() -> None:
    env = LookupEnv(_config(max_turns=1))
    chat = _lookup_chat(_lookup("a", "x"))
    async with FakeSandboxPool() as pool:
        async with env.rollout_services(pool=pool, policy=env.make_policy(chat=chat)):
            final, debug = await env.run_agent("Look x up.")
        assert pool.statistics().leases_granted == 1  # the caller's pool
    assert final == "looking"
    assert debug["success"] is True  # the budget ended it: a healthy ending
    assert debug["stop_reason"] == "max_turns"
    assert debug["status"] == TrajectoryStatus.BUDGET_EXHAUSTED.value
    assert debug["trajectory_id"].startswith("LookupEnv-agent-")

    async with FakeSandboxPool() as pool:
        failed_chat = _lookup_chat()
        failed_chat.inject(LLMFault.rejected(message="no such model"))
        async with env.rollout_services(pool=pool, policy=env.make_policy(chat=failed_chat)):
            final, debug = await env.run_agent("Look x up.")
    assert final == ""
    assert debug["success"] is False
    assert debug["status"] == "model_error"
    assert debug["error"]
