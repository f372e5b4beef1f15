"""The MCP adapter against servers that break the protocol or fail at the HTTP level, written
without the SDK (``mcp_raw_servers.py``): how each fault is labelled (a server's fault is
``INFRA_ERROR``, never the model's), which faults lose the session, and that a server that died
between calls is started again for the next call.

Skipped as a whole when the MCP SDK (the ``mcp`` extra) is not installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

from trajcore.adapters.mcp.client import MCPURL, MCPCommand, MCPToolServer
from trajcore.domain.errors import WireError
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult

RAW = str(Path(__file__).with_name("mcp_raw_servers.py"))
CONTEXT = ToolContext(trajectory_id="t")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextmanager
def raw_http(get_status: int) -> Iterator[str]:
    """The raw HTTP server answering the GET stream with ``get_status``; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, RAW, "http", str(get_status)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdin is not None
    try:
        yield f"http://127.0.0.1:{process.stdout.readline().strip()}/mcp"
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def raw_stdio(*options: str) -> MCPCommand:
    return MCPCommand(argv=(sys.executable, RAW, "stdio", *options))


async def run(server: MCPToolServer, name: str) -> ToolResult:
    (result,) = await server.execute([ToolCall(id="c", name=name, arguments={})], context=CONTEXT)
    return result


@pytest.mark.anyio
async def test_a_405_on_the_optional_get_stream_leaves_the_calls_alone() -> None:
    with raw_http(405) as url:
        async with MCPToolServer(MCPURL(url=url), name="h", call_timeout_s=10) as server:
            await server.list_tools()
            await anyio.sleep(0.3)  # the GET stream has been refused by now
            refused = [(await run(server, "err32602")).outcome for _ in range(4)]
            after = await run(server, "echo")
    assert refused == [ToolOutcome.REJECTED] * 4
    assert after.outcome is ToolOutcome.OK


@pytest.mark.anyio
async def test_a_json_rpc_error_at_http_400_is_the_servers_answer() -> None:
    with raw_http(405) as url:
        async with MCPToolServer(MCPURL(url=url), name="h", call_timeout_s=10) as server:
            result = await run(server, "err400")
    assert result.outcome is ToolOutcome.REJECTED
    assert result.error is not None
    assert "x is too long" in result.error


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["garbage", "html"])
async def test_an_http_answer_that_is_no_json_rpc_is_infra_and_keeps_the_session(
    tool: str,
) -> None:
    with raw_http(405) as url:
        async with MCPToolServer(MCPURL(url=url), name="h", max_restarts=0) as server:
            broken = await run(server, tool)
            after = await run(server, "echo")
    assert broken.outcome is ToolOutcome.INFRA_ERROR
    assert broken.error is not None
    assert "broke the protocol" in broken.error
    assert after.outcome is ToolOutcome.OK  # no restart was needed (max_restarts=0)


@pytest.mark.anyio
@pytest.mark.parametrize(("tool", "status"), [("e500", 500), ("e404", 404)])
async def test_a_5xx_or_404_loses_the_session_which_opens_again(tool: str, status: int) -> None:
    with raw_http(405) as url:
        async with MCPToolServer(MCPURL(url=url), name="h", max_restarts=1) as server:
            lost = await run(server, tool)
            after = await run(server, "echo")
    assert lost.outcome is ToolOutcome.INFRA_ERROR
    assert lost.error is not None
    assert f"HTTP {status}" in lost.error
    assert after.outcome is ToolOutcome.OK


@pytest.mark.anyio
async def test_a_malformed_stdio_line_fails_the_call_at_once_as_infra() -> None:
    async with MCPToolServer(raw_stdio(), name="raw", call_timeout_s=30) as server:
        await server.list_tools()
        with anyio.fail_after(10):  # not the call's 30 s deadline
            broken = await run(server, "garbage")
        after = await run(server, "echo")  # the session was opened again
    assert broken.outcome is ToolOutcome.INFRA_ERROR
    assert broken.error is not None
    assert "broke the protocol" in broken.error
    assert after.outcome is ToolOutcome.OK


@pytest.mark.anyio
async def test_a_server_that_died_between_calls_is_started_again_for_the_next_call() -> None:
    async with MCPToolServer(raw_stdio(), name="raw", max_restarts=1) as server:
        first = int((await run(server, "pid")).content)
        os.kill(first, signal.SIGKILL)  # no call in flight
        await anyio.sleep(0.5)
        after = await run(server, "pid")
    assert after.outcome is ToolOutcome.OK
    assert int(after.content) != first


@pytest.mark.anyio
async def test_a_tool_trajcore_cannot_take_is_a_wire_error_from_list_tools() -> None:
    schema = '{"type": "object", "properties": {"k": {"type": "string", "optional": true}}}'
    async with MCPToolServer(raw_stdio("schema=" + schema), name="raw") as server:
        with pytest.raises(WireError) as caught:
            await server.list_tools()
    assert caught.value.field == "$.tools[8].inputSchema.properties.k.optional"
    assert caught.value.reason.count("tool 'schema':") == 1


@pytest.mark.anyio
async def test_a_servers_own_schema_keys_named_as_annotations_let_its_tools_in() -> None:
    """A server whose schemas carry a key of its own (``markdownDescription``) is refused, the
    error saying where such a key goes; named in its ``annotations`` it is taken, and its
    schema's keywords are still enforced before a call reaches it."""
    schema = (
        '{"type": "object", "required": ["k"], '
        '"properties": {"k": {"type": "string", "maxLength": 3, "markdownDescription": "**k**"}}}'
    )
    async with MCPToolServer(raw_stdio("schema=" + schema), name="raw") as server:
        with pytest.raises(WireError) as caught:
            await server.list_tools()
    assert caught.value.field == "$.tools[8].inputSchema.properties.k.markdownDescription"
    assert "goes in its annotations" in caught.value.reason
    taken = MCPToolServer(
        raw_stdio("schema=" + schema), name="raw", annotations=["markdownDescription"]
    )
    async with taken as server:
        assert "schema" in [spec.name for spec in await server.list_tools()]
        call = ToolCall(id="c", name="schema", arguments={"k": "abcd"})
        (result,) = await server.execute([call], context=CONTEXT)
    assert result.outcome is ToolOutcome.REJECTED
    assert "must be at most 3 characters long @ schema.k" in (result.error or ""), result
