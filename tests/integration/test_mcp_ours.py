"""``trajcore tool-server --mcp`` driven by the SDK's own client (``mcp.ClientSession``) over stdio
and streamable HTTP; the bearer token; the command line; and the adapter's faults against real
child processes: a server that crashes (restarted, bounded), one that never answers, one that
cannot start, sessions per trajectory, release and idleness, a close during a call.

Skipped as a whole when the MCP SDK (the ``mcp`` extra) is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

import httpx
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.contract.test_mcp_tool_server import REPO, TOKEN, ServedMCP, serve_command
from trajcore.adapters.mcp.client import MCPURL, MCPCommand, MCPToolServer, SessionScope
from trajcore.adapters.mcp.protocol import OUTCOME_META_KEY
from trajcore.adapters.mcp.settings import open_tool_servers, parse_tool_servers
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.errors import PoolClosed, ToolServerError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome
from trajcore.testing.tool_server_contract import CONTRACT_TOOLS

CONTRACT_APP = "trajcore.testing.tool_server_contract:CONTRACT_REGISTRY"
FAULTS_APP = "tests.integration.test_mcp_ours:FAULT_TOOLS"

# ------------------------------------------------------------- tools served by child processes

FAULT_TOOLS = ToolRegistry()
_MEMORY: dict[str, str] = {}


@FAULT_TOOLS.tool(
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
)
def remember(arguments: JSONObject, _context: ToolContext) -> JSON:
    """Keep the text in this server process."""
    _MEMORY["text"] = str(arguments["text"])
    return "kept"


@FAULT_TOOLS.tool()
def recall(_arguments: JSONObject, _context: ToolContext) -> JSON:
    """The text this server process kept, or an empty string."""
    return _MEMORY.get("text", "")


@FAULT_TOOLS.tool()
def pid(_arguments: JSONObject, _context: ToolContext) -> JSON:
    """This server's process id."""
    return os.getpid()


@FAULT_TOOLS.tool()
def crash(_arguments: JSONObject, _context: ToolContext) -> JSON:
    """Die at once, as a crashing server would."""
    sys.stderr.write("dying on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@FAULT_TOOLS.tool()
async def hang(_arguments: JSONObject, _context: ToolContext) -> JSON:
    """Never answer (within the test)."""
    await anyio.sleep(3600)
    return "woke"


def faults_over_stdio() -> MCPCommand:
    return MCPCommand(argv=serve_command(FAULTS_APP, "--mcp", "stdio"), cwd=str(REPO))


def call(name: str, call_id: str = "c1", **arguments: JSON) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


def alive(process_id: int) -> bool:
    try:
        os.kill(process_id, 0)
    except ProcessLookupError:
        return False
    return True


async def pid_of(server: MCPToolServer, trajectory: str = "t") -> int:
    (result,) = await server.execute([call("pid")], context=ToolContext(trajectory_id=trajectory))
    assert result.outcome is ToolOutcome.OK, result
    return int(result.content)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp-ours") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def served(token_file: Path) -> Iterator[ServedMCP]:
    server = ServedMCP(CONTRACT_APP, token_file, "--call-timeout-s", "0.5")
    yield server
    server.stop()
    assert server.process.returncode == 0, server.stderr


# -------------------------------------------------------------- the SDK's own client drives ours


@asynccontextmanager
async def sdk_over_stdio() -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=list(serve_command(CONTRACT_APP, "--mcp", "stdio", "--call-timeout-s", "0.5")[1:]),
        cwd=REPO,
    )
    with tempfile.TemporaryFile("w+") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def sdk_over_http(url: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, trust_env=False) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _text(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def _drive(session: ClientSession) -> None:
    listing = await session.list_tools()
    assert [(t.name, t.description, t.input_schema) for t in listing.tools] == [
        (spec.name, spec.description, spec.parameters) for spec, _ in CONTRACT_TOOLS
    ]
    echoed = await session.call_tool("echo", {"text": "ünï\ncode ✓"})
    assert (echoed.is_error, _text(echoed)) == (False, "ünï\ncode ✓")
    added = await session.call_tool("add", {"a": 2, "b": 40})
    assert (added.is_error, _text(added)) == (False, "42")
    who = await session.call_tool("whoami", {})
    assert json.loads(_text(who)) == {"trajectory": "mcp-client", "slot": None}
    failed = await session.call_tool("fail", {"message": "disk on fire"})
    assert failed.is_error
    assert "disk on fire" in _text(failed)
    assert failed.meta is not None
    assert failed.meta[OUTCOME_META_KEY]["outcome"] == "tool_error"
    bad = await session.call_tool("add", {"a": 1})
    assert (bad.is_error, _text(bad)) == (True, "Error: required @ add.b")
    assert bad.meta is not None
    assert bad.meta[OUTCOME_META_KEY] == {"outcome": "rejected", "error": "required @ add.b"}
    slow = await session.call_tool("sleep", {"seconds": 30})
    assert slow.is_error
    assert "0.5 s limit" in _text(slow)
    unknown = await session.call_tool("no_such_tool", {})
    assert (unknown.is_error, _text(unknown)) == (True, "Error: unknown tool 'no_such_tool' @ name")


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_sdk_client_drives_ours_over_stdio() -> None:
    with anyio.fail_after(60):
        async with sdk_over_stdio() as session:
            await _drive(session)


@pytest.mark.anyio
async def test_the_sdk_client_drives_ours_over_http(served: ServedMCP) -> None:
    assert served.ready["protocol"] == "mcp"
    assert served.url.endswith("/mcp")
    with anyio.fail_after(60):
        async with sdk_over_http(served.url) as session:
            await _drive(session)


@pytest.mark.anyio
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}"])
async def test_http_without_the_token_is_refused_with_401(
    served: ServedMCP, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient(trust_env=False, headers=headers) as raw:
        response = await raw.post(served.url, json=body)
    assert response.status_code == 401
    assert response.json()["field"] == "Authorization"


@pytest.mark.anyio
async def test_the_adapter_names_a_refused_token(served: ServedMCP) -> None:
    async with MCPToolServer(MCPURL(url=served.url, token="wrong"), max_restarts=0) as server:
        with pytest.raises(ToolServerError, match=r"HTTP 401: check the bearer token"):
            await server.list_tools()
        (result,) = await server.execute(
            [call("echo", text="x")], context=ToolContext(trajectory_id="t")
        )
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "401" in result.error


# -------------------------------------------------------------------------------- command line


def _run_cli(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        serve_command(CONTRACT_APP, *flags), cwd=REPO, capture_output=True, text=True,
        timeout=60, check=False, input="",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--mcp", "stdio", "--listen", "127.0.0.1:0"), "--listen has no use with --mcp stdio"),
        (("--mcp", "stdio", "--token-file", "t"), "--token-file has no use with --mcp stdio"),
        (("--mcp", "http", "--token-file", "t"), "--listen is required with --mcp http"),
        (("--mcp", "http", "--listen", "127.0.0.1:0"), "--token-file is required with --mcp http"),
        (("--mcp", "sse"), "invalid choice: 'sse'"),
        (("--listen", "127.0.0.1:0"), "--token-file is required"),
    ],
)
def test_bad_mcp_flags_exit_2_naming_the_flag(flags: tuple[str, ...], message: str) -> None:
    done = _run_cli(*flags)
    assert done.returncode == 2
    assert message in done.stderr


def test_stdio_server_exits_0_when_its_client_closes_stdin() -> None:
    done = _run_cli("--mcp", "stdio")
    assert (done.returncode, done.stdout) == (0, "")


# --------------------------------------------------------------------- faults in real processes


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_crashed_server_is_started_again_within_the_budget() -> None:
    context = ToolContext(trajectory_id="t")
    async with MCPToolServer(faults_over_stdio(), max_restarts=1, connect_timeout_s=60) as server:
        first = await pid_of(server)
        (crashed,) = await server.execute([call("crash")], context=context)
        assert crashed.outcome is ToolOutcome.INFRA_ERROR
        assert crashed.error is not None
        assert "dying on purpose" in crashed.error  # the server's stderr is quoted
        with anyio.fail_after(10):
            while alive(first):  # noqa: ASYNC110 - no event tells when another process is reaped
                await anyio.sleep(0.05)
        second = await pid_of(server)  # started again: a new process
        assert second != first
        (again,) = await server.execute([call("crash")], context=context)
        assert again.outcome is ToolOutcome.INFRA_ERROR
        (refused,) = await server.execute([call("recall")], context=context)
    assert refused.outcome is ToolOutcome.INFRA_ERROR
    assert refused.error is not None
    assert "max_restarts=1" in refused.error
    assert not alive(second)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_server_that_never_initializes_fails_within_the_connect_deadline(
    tmp_path: Path,
) -> None:
    mute = MCPCommand(argv=(sys.executable, "-c", "import time; time.sleep(600)"))
    started = time.monotonic()
    async with MCPToolServer(mute, connect_timeout_s=1, max_restarts=0) as server:
        with pytest.raises(ToolServerError, match=r"did not initialize .* within 1 s"):
            await server.list_tools()
        (result,) = await server.execute([call("x")], context=ToolContext(trajectory_id="t"))
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert time.monotonic() - started < 15


@pytest.mark.anyio
async def test_a_command_that_cannot_start_is_named() -> None:
    missing = MCPCommand.parse("/nonexistent/mcp-server --flag")
    async with MCPToolServer(missing, max_restarts=2) as server:
        for _ in range(4):  # each try spends one restart, then no more are made
            with pytest.raises(ToolServerError, match="/nonexistent/mcp-server"):
                await server.list_tools()
        calls = [call("a", "c1"), call("b", "c2")]
        results = await server.execute(calls, context=ToolContext(trajectory_id="t"))
    assert [r.outcome for r in results] == [ToolOutcome.INFRA_ERROR] * 2
    assert all("max_restarts=2" in (r.error or "") for r in results)


@pytest.mark.slow
@pytest.mark.anyio
async def test_sessions_per_trajectory_keep_their_own_state() -> None:
    one, two = ToolContext(trajectory_id="one"), ToolContext(trajectory_id="two")
    command = faults_over_stdio()
    async with MCPToolServer(
        command, scope=SessionScope.TRAJECTORY, connect_timeout_s=60
    ) as server:
        await server.execute([call("remember", text="first")], context=one)
        await server.execute([call("remember", text="second")], context=two)
        (recalled,) = await server.execute([call("recall")], context=one)
        assert recalled.content == "first"
        pid_one = await pid_of(server, "one")
        await server.release("one")
        assert not alive(pid_one)
        (fresh,) = await server.execute([call("recall")], context=one)
        assert (fresh.outcome, fresh.content) == (ToolOutcome.OK, "")
    # the control: one shared session sees the last write of any trajectory
    async with MCPToolServer(command, connect_timeout_s=60) as shared:
        await shared.execute([call("remember", text="first")], context=one)
        await shared.execute([call("remember", text="second")], context=two)
        (recalled,) = await shared.execute([call("recall")], context=one)
    assert recalled.content == "second"


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_idle_trajectory_session_is_closed() -> None:
    command = faults_over_stdio()
    async with MCPToolServer(
        command, scope=SessionScope.TRAJECTORY, idle_close_s=0.5, connect_timeout_s=60
    ) as server:
        first = await pid_of(server)
        with anyio.fail_after(15):
            while alive(first):  # noqa: ASYNC110 - no event tells when another process is reaped
                await anyio.sleep(0.1)
        assert await pid_of(server) != first  # opened again on the next call


@pytest.mark.slow
@pytest.mark.anyio
async def test_aclose_during_a_call_raises_pool_closed_and_stops_the_server() -> None:
    async with MCPToolServer(faults_over_stdio(), connect_timeout_s=60) as server:
        server_pid = await pid_of(server)
        outcome: list[BaseException] = []

        async def call_hang() -> None:
            try:
                await server.execute([call("hang")], context=ToolContext(trajectory_id="t"))
            except PoolClosed as exc:
                outcome.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(call_hang)
                await anyio.sleep(0.5)
                await server.aclose()
    assert len(outcome) == 1
    assert not alive(server_pid)


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_joined_server_releases_a_trajectory_on_its_members() -> None:
    settings = parse_tool_servers(
        {
            "state": {
                "command": list(faults_over_stdio().argv),
                "cwd": str(REPO),
                "scope": "trajectory",
                "connect_timeout_s": 60,
            }
        }
    )
    async with open_tool_servers(settings, default_call_timeout_s=30) as joined:
        (member,) = joined.members
        assert isinstance(member.server, MCPToolServer)
        await joined.execute(
            [call("remember", text="kept")], context=ToolContext(trajectory_id="t")
        )
        first = await pid_of(member.server)
        await joined.release("t")
        assert not alive(first)
        (fresh,) = await joined.execute([call("recall")], context=ToolContext(trajectory_id="t"))
    assert (fresh.outcome, fresh.content) == (ToolOutcome.OK, "")
