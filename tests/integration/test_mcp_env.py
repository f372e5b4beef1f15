"""An env whose model calls tools of MCP servers named in its ``tool_servers`` setting, end to
end: the servers are real child processes (``trajcore tool-server --mcp stdio``), their tools
are offered beside the slot tools as a toolset per server, the model's calls reach them with the
trajectory's context, and a tool name offered by two servers stops the env at start naming both.

Skipped as a whole when the MCP SDK (the ``mcp`` extra) is not installed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

from tests.contract.test_mcp_tool_server import serve_command
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools, ToolCall, Transcript

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CONTRACT_APP = "trajcore.testing.tool_server_contract:CONTRACT_REGISTRY"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SumEnv(AgentEnv[str]):
    """The model must find 2 + 3 with the MCP server's ``add`` tool and say the sum."""

    name = "sum_env"

    async def get_next_item(self) -> str:
        return "5"

    def build_task(self, item: str) -> str:
        return "What is 2 + 3? Use the add tool."

    async def verify_and_score(self, item: str, tools: SlotTools, transcript: Transcript) -> float:
        return 1.0 if transcript[-1].content == f"the sum is {item}" else 0.0


def _config(tool_servers: dict[str, dict[str, Any]], **fields: Any) -> AgentEnvConfig:
    return AgentEnvConfig(
        **fields,
        tokenizer_name=str(qwen3_tokenizer_path()),
        use_wandb=False,
        group_size=2,
        max_turns=4,
        max_tokens=256,
        max_token_length=8192,
        acquire_timeout_s=10.0,
        terminal_timeout_s=10.0,
        ensure_scores_are_not_same=False,
        include_messages=True,
        tool_servers=tool_servers,
    )


def _server() -> dict[str, Any]:
    return {"command": list(serve_command(CONTRACT_APP, "--mcp", "stdio"))}


def _turn(message: Message) -> ChatTurn:
    reason = FinishReason.TOOL_CALLS if message.tool_calls else FinishReason.STOP
    return ChatTurn(message=message, finish_reason=reason)


async def test_an_env_calls_an_mcp_servers_tools_named_in_its_settings() -> None:
    env = SumEnv(_config({"calc": _server(), "other": {**_server(), "prefix": "o_"}}))
    ids = itertools.count()

    def respond(messages: Sequence[Message]) -> ChatTurn:
        if messages[-1].role == "tool":
            return _turn(Message.assistant(f"the sum is {messages[-1].content}"))
        call = ToolCall(id=f"c{next(ids)}", name="add", arguments={"a": 2, "b": 3})
        return _turn(Message.assistant("adding", tool_calls=[call]))

    chat = FakeChatServer(policy=respond)
    async with FakeSandboxPool() as pool:
        result = await env.run_task("5", pool=pool, policy=env.make_policy(chat=chat))
    offered = {spec.name for spec in chat.requests[0].tools}
    assert {"add", "echo", "o_add", "o_echo", "bash", "read_file"} <= offered
    assert [member.outcome.score for member in result.members] == [1.0, 1.0]
    assert [member.messages[-1].content for member in result.members] == ["the sum is 5"] * 2
    assert env.scored_group(result) is not None


async def test_each_mcp_server_is_a_toolset_named_after_it() -> None:
    env = SumEnv(
        _config(
            {"calc": _server(), "other": {**_server(), "prefix": "o_"}}, enabled_toolsets=["other"]
        )
    )

    def respond(messages: Sequence[Message]) -> ChatTurn:
        return _turn(Message.assistant("nothing to do"))

    chat = FakeChatServer(policy=respond)
    async with FakeSandboxPool() as pool:
        await env.run_task("5", pool=pool, policy=env.make_policy(chat=chat))
    offered = {spec.name for spec in chat.requests[0].tools}
    assert offered == {"o_echo", "o_add", "o_whoami", "o_fail", "o_sleep"}


async def test_a_tool_offered_by_two_mcp_servers_stops_the_env_naming_both() -> None:
    env = SumEnv(_config({"first": _server(), "second": _server()}))
    chat = FakeChatServer(policy=lambda messages: _turn(Message.assistant("never asked")))
    async with FakeSandboxPool() as pool:
        with pytest.raises(ConfigError) as caught:
            await env.run_task("5", pool=pool, policy=env.make_policy(chat=chat))
    assert "first" in str(caught.value)
    assert "second" in str(caught.value)
    assert chat.requests == []


def test_a_misspelt_server_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as caught:
        _config({"calc": {**_server(), "scpoe": "run"}})
    assert "tool_servers.calc" in str(caught.value)
