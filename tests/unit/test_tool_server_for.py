"""The env's external tool server (``tool_server_for``) keeps the env's per-call limit,
``terminal_timeout_s``, for each call, in process and remote alike: a tool past it is the
server's ``TIMEOUT``, and a request of several calls gets that limit for each of them."""

from __future__ import annotations

import anyio
import pytest

from trajcore.adapters.tool_server import HTTPToolServer, ToolRegistry
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.services import tool_server_for

NAPS = ToolRegistry()
CONTEXT = ToolContext(trajectory_id="t")


@NAPS.tool(parameters={"type": "object", "properties": {"s": {"type": "number"}}})
async def nap(arguments: JSONObject, _context: ToolContext) -> JSON:
    """Sleep ``s`` seconds."""
    seconds = arguments["s"]
    assert isinstance(seconds, int | float)
    await anyio.sleep(seconds)
    return "awake"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def in_process(limit: float) -> HTTPToolServer:
    config = AgentEnvConfig(tool_server_url="inprocess", terminal_timeout_s=limit)
    server = tool_server_for(config, NAPS, env_name="naps")
    assert isinstance(server, HTTPToolServer)
    return server


@pytest.mark.anyio
async def test_a_tool_past_the_env_limit_is_a_timeout() -> None:
    server = in_process(1.0)
    try:
        with anyio.fail_after(20):
            (result,) = await server.execute(
                [ToolCall(id="a", name="nap", arguments={"s": 5})], context=CONTEXT
            )
    finally:
        await server.aclose()
    assert result.outcome is ToolOutcome.TIMEOUT


@pytest.mark.anyio
async def test_calls_each_within_the_limit_are_ok_together_past_it() -> None:
    server = in_process(1.0)
    calls = [ToolCall(id=i, name="nap", arguments={"s": 0.7}) for i in "ab"]
    try:
        results = await server.execute(calls, context=CONTEXT)
    finally:
        await server.aclose()
    assert [r.outcome for r in results] == [ToolOutcome.OK] * 2


def test_a_remote_tool_server_gets_the_limit_per_call() -> None:
    config = AgentEnvConfig(tool_server_url="http://127.0.0.1:1", terminal_timeout_s=7.0)
    server = tool_server_for(config, None, env_name="remote")
    assert isinstance(server, HTTPToolServer)
    assert (server.timeout_s, server.call_timeout_s) == (7.0, 7.0)
