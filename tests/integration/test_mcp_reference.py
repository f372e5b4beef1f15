"""The MCP adapter against servers this project did not write: the MCP reference servers from npm,
``@modelcontextprotocol/server-everything`` (over stdio and streamable HTTP) and
``@modelcontextprotocol/server-filesystem`` rooted in a temporary directory.

The shipped contract suite (``trajcore.testing.tool_server_contract``) needs a server offering its
own tools; these servers offer theirs, so the same promises of the port are checked here with
their tools: one result per call in order, text verbatim, unknown tools and bad arguments
rejected naming the field (every keyword of their schemas), ``isError`` as a tool error, a
call past its limit a timeout, concurrent requests, prompt cancellation, ``aclose``; then
every mapping (structured content, images, embedded resources, resource links) and a server
that dies (an infrastructure error, then reopened).

The servers are installed by ``.ci/mcp-servers`` into ``.cache/mcp-servers`` (npm, pinned
versions); when they are missing the fixture runs it once. The tests skip, saying why, only when
the MCP SDK is not installed or npm is absent or cannot install them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

from tests.processes import free_port
from trajcore.adapters.mcp.client import MCPURL, MCPCommand, MCPToolServer
from trajcore.adapters.mcp.settings import open_tool_servers, parse_tool_servers
from trajcore.domain.errors import ConfigError, PoolClosed
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / ".ci" / "mcp-servers"
BIN = REPO / ".cache" / "mcp-servers" / "node_modules" / ".bin"
EVERYTHING = BIN / "mcp-server-everything"
FILESYSTEM = BIN / "mcp-server-filesystem"
CONTEXT = ToolContext(trajectory_id="traj-1", slot="c0/0")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def reference_servers() -> Path:
    """The folder of the installed servers' executables, installing them once when missing."""
    if EVERYTHING.exists() and FILESYSTEM.exists():
        return BIN
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip(f"the MCP reference servers are not installed and npm/node are not on PATH "
                    f"(run {INSTALLER.relative_to(REPO)} where npm is)")  # fmt: skip
    try:
        done = subprocess.run(
            [str(INSTALLER)], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm did not install the MCP reference servers within 600 s ({INSTALLER})")
    if done.returncode != 0 or not (EVERYTHING.exists() and FILESYSTEM.exists()):
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        pytest.skip(f"npm could not install the MCP reference servers: {tail}")
    return BIN


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def call(call_id: str, name: str, **arguments: JSON) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


@asynccontextmanager
async def everything(
    reference_servers: Path, *, call_timeout_s: float = 30
) -> AsyncIterator[MCPToolServer]:
    command = MCPCommand(argv=(str(reference_servers / "mcp-server-everything"),))
    async with MCPToolServer(command, name="everything", call_timeout_s=call_timeout_s) as server:
        yield server


# ------------------------------------------------------------------ the port's promises, theirs


@pytest.mark.anyio
async def test_tools_are_listed_with_their_schemas_kept_whole(reference_servers: Path) -> None:
    async with everything(reference_servers) as server:
        specs = {spec.name: spec for spec in await server.list_tools()}
    assert {"echo", "get-sum", "get-structured-content", "get-tiny-image"} <= specs.keys()
    echo = specs["echo"]
    assert echo.description
    assert echo.parameters["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert echo.parameters["required"] == ["message"]
    links = specs["get-resource-links"].parameters["properties"]
    assert isinstance(links, dict)
    assert links["count"] == {
        "default": 3,
        "description": "Number of resource links to return (1-10)",
        "type": "number",
        "minimum": 1,
        "maximum": 10,
    }


@pytest.mark.anyio
async def test_one_result_per_call_in_order(reference_servers: Path) -> None:
    calls = [
        call("c1", "echo", message="first"),
        call("c2", "get-sum", a=2, b=40),
        call("c3", "echo", message="third"),
    ]
    async with everything(reference_servers) as server:
        results = await server.execute(calls, context=CONTEXT)
        assert await server.execute([], context=CONTEXT) == []
    assert [(r.call_id, r.name, r.outcome, r.content, r.error) for r in results] == [
        ("c1", "echo", ToolOutcome.OK, "Echo: first", None),
        ("c2", "get-sum", ToolOutcome.OK, "The sum of 2 and 40 is 42.", None),
        ("c3", "echo", ToolOutcome.OK, "Echo: third", None),
    ]


@pytest.mark.anyio
async def test_text_is_kept_verbatim(reference_servers: Path) -> None:
    text = 'ünïcode ✓ 日本 "quoted" \\ back\nslash\ttab {"json": [1]}'
    async with everything(reference_servers) as server:
        (result,) = await server.execute([call("c1", "echo", message=text)], context=CONTEXT)
    assert (result.outcome, result.content) == (ToolOutcome.OK, f"Echo: {text}")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("no_such_tool", {}, "unknown tool 'no_such_tool' @ name"),
        ("get-sum", {"a": 1}, "required @ get-sum.b"),
        ("get-sum", {"a": "1", "b": 2}, "expected number, got string @ get-sum.a"),
        ("get-structured-content", {"location": "Paris"}, "must be one of"),
    ],
)
async def test_unknown_tools_and_bad_arguments_are_rejected_before_they_are_sent(
    reference_servers: Path, name: str, arguments: dict[str, JSON], error: str
) -> None:
    calls = [ToolCall(id="c1", name=name, arguments=arguments), call("c2", "echo", message="ok")]
    async with everything(reference_servers) as server:
        rejected, echo = await server.execute(calls, context=CONTEXT)
    assert rejected.outcome is ToolOutcome.REJECTED
    assert rejected.error is not None
    assert error in rejected.error
    assert (echo.outcome, echo.content) == (ToolOutcome.OK, "Echo: ok")


@pytest.mark.anyio
async def test_every_keyword_of_their_schemas_is_enforced_before_a_call_is_sent(
    reference_servers: Path,
) -> None:
    # ``maximum`` in their schema: trajcore's JSON Schema validator refuses the call naming the
    # field, as it does for its own tools (their ``isError`` results: the filesystem test below).
    calls = [call("c1", "get-resource-links", count=50), call("c2", "get-sum", a=1, b=1)]
    async with everything(reference_servers) as server:
        refused, added = await server.execute(calls, context=CONTEXT)
    assert (refused.outcome, refused.error) == (
        ToolOutcome.REJECTED,
        "must be <= 10 @ get-resource-links.count",
    )
    assert (added.outcome, added.content) == (ToolOutcome.OK, "The sum of 1 and 1 is 2.")


@pytest.mark.anyio
async def test_a_call_past_its_limit_is_a_timeout_and_the_session_goes_on(
    reference_servers: Path,
) -> None:
    calls = [
        call("c1", "trigger-long-running-operation", duration=30, steps=3),
        call("c2", "echo", message="after"),
    ]
    async with everything(reference_servers, call_timeout_s=1) as server:
        with anyio.fail_after(20):
            slow, echo = await server.execute(calls, context=CONTEXT)
    assert slow.outcome is ToolOutcome.TIMEOUT
    assert slow.error == "ran past its 1 s limit @ trigger-long-running-operation"
    assert (echo.outcome, echo.content) == (ToolOutcome.OK, "Echo: after")


@pytest.mark.anyio
async def test_concurrent_requests_get_their_own_results(reference_servers: Path) -> None:
    seen: dict[int, list[str]] = {}
    async with everything(reference_servers) as server:

        async def one(i: int) -> None:
            context = ToolContext(trajectory_id=f"t{i}")
            calls = [call(f"{i}-a", "echo", message=f"m{i}"), call(f"{i}-b", "get-sum", a=i, b=1)]
            results = await server.execute(calls, context=context)
            assert [r.call_id for r in results] == [c.id for c in calls]
            seen[i] = [r.content for r in results]

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for i in range(16):
                    group.start_soon(one, i)
    assert seen == {i: [f"Echo: m{i}", f"The sum of {i} and 1 is {i + 1}."] for i in range(16)}


@pytest.mark.anyio
async def test_cancellation_is_prompt_and_the_server_stays_usable(reference_servers: Path) -> None:
    async with everything(reference_servers) as server:
        await server.list_tools()
        started = time.monotonic()
        with anyio.move_on_after(0.2) as scope:
            await server.execute(
                [call("c1", "trigger-long-running-operation", duration=30, steps=3)],
                context=CONTEXT,
            )
            pytest.fail("execute returned instead of being cancelled")
        assert scope.cancelled_caught
        assert time.monotonic() - started < 5
        with anyio.fail_after(10):
            (result,) = await server.execute([call("c2", "echo", message="ok")], context=CONTEXT)
    assert (result.outcome, result.content) == (ToolOutcome.OK, "Echo: ok")


@pytest.mark.anyio
async def test_aclose_is_idempotent_and_later_calls_raise_pool_closed(
    reference_servers: Path,
) -> None:
    async with everything(reference_servers) as server:
        await server.execute([call("c1", "echo", message="hi")], context=CONTEXT)
        await server.aclose()
        await server.aclose()
        with pytest.raises(PoolClosed):
            await server.execute([call("c2", "echo", message="hi")], context=CONTEXT)
        with pytest.raises(PoolClosed):
            await server.list_tools()


# ------------------------------------------------------------------------------- the mappings


@pytest.mark.anyio
async def test_structured_media_and_resource_results(reference_servers: Path) -> None:
    calls = [
        call("c1", "get-structured-content", location="Chicago"),
        call("c2", "get-tiny-image"),
        call("c3", "get-resource-reference", resourceType="Text", resourceId=1),
        call("c4", "get-resource-links", count=1),
    ]
    async with everything(reference_servers) as server:
        weather, image, reference, links = await server.execute(calls, context=CONTEXT)
    assert all(r.outcome is ToolOutcome.OK for r in (weather, image, reference, links))
    assert set(json.loads(weather.content)) == {"temperature", "conditions", "humidity"}
    assert "\n[image: image/png, " in image.content
    assert "Resource 1:" in reference.content
    assert "[resource link: " in links.content


# ---------------------------------------------------------------------- over streamable HTTP


class EverythingOverHTTP:
    """server-everything's streamable-HTTP mode as a child process on a free port."""

    def __init__(self, reference_servers: Path, port: int) -> None:
        self.port = port
        env = {**os.environ, "PORT": str(port)}
        self.process = subprocess.Popen(
            [str(reference_servers / "mcp-server-everything"), "streamableHttp"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            if "listening on port" in line:
                return
        self.stop()
        raise AssertionError(f"server-everything did not listen on {port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def everything_http(reference_servers: Path) -> Iterator[EverythingOverHTTP]:
    server = EverythingOverHTTP(reference_servers, free_port())
    yield server
    server.stop()


@pytest.mark.anyio
async def test_over_http_and_a_server_that_dies_then_comes_back(
    reference_servers: Path, everything_http: EverythingOverHTTP
) -> None:
    endpoint = MCPURL(url=everything_http.url)
    async with MCPToolServer(endpoint, connect_timeout_s=10, call_timeout_s=5) as server:
        assert "echo" in {spec.name for spec in await server.list_tools()}
        ok, refused = await server.execute(
            [call("c1", "get-sum", a=3, b=4), call("c2", "get-resource-links", count=99)],
            context=CONTEXT,
        )
        assert (ok.outcome, ok.content) == (ToolOutcome.OK, "The sum of 3 and 4 is 7.")
        assert refused.outcome is ToolOutcome.REJECTED

        everything_http.stop()  # the server dies: an infrastructure error, never the model's
        (dead,) = await server.execute([call("c3", "echo", message="x")], context=CONTEXT)
        assert dead.outcome is ToolOutcome.INFRA_ERROR
        assert dead.error is not None
        assert dead.error.startswith(f"MCP server {everything_http.url} failed")

        back = EverythingOverHTTP(reference_servers, everything_http.port)
        try:
            with anyio.fail_after(30):
                (again,) = await server.execute([call("c4", "echo", message="y")], context=CONTEXT)
        finally:
            back.stop()
    assert (again.outcome, again.content) == (ToolOutcome.OK, "Echo: y")


# ----------------------------------------------------------------- server-filesystem, rooted


@pytest.mark.anyio
async def test_filesystem_server_rooted_in_a_temporary_directory(
    reference_servers: Path, tmp_path: Path
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    canary = outside / "canary.txt"
    command = MCPCommand(argv=(str(reference_servers / "mcp-server-filesystem"), str(root)))
    calls = [
        call("c1", "write_file", path=str(root / "notes.txt"), content="hello ✓\nline 2\n"),
        call("c2", "read_text_file", path=str(root / "notes.txt")),
        call("c3", "list_directory", path=str(root)),
        call("c4", "read_text_file", path=str(root / "missing.txt")),
        call("c5", "write_file", path=str(canary), content="escaped"),
        call("c6", "write_file", path=f"{root}/../outside/canary.txt", content="escaped"),
        call("c7", "read_text_file"),
    ]
    async with MCPToolServer(command, name="filesystem") as server:
        assert "read_text_file" in {spec.name for spec in await server.list_tools()}
        wrote, read, listed, missing, escape, dotdot, no_path = await server.execute(
            calls, context=CONTEXT
        )
    assert wrote.outcome is ToolOutcome.OK
    assert (root / "notes.txt").read_text(encoding="utf-8") == "hello ✓\nline 2\n"  # from the host
    assert (read.outcome, read.content) == (ToolOutcome.OK, "hello ✓\nline 2\n")
    assert (listed.outcome, listed.content) == (ToolOutcome.OK, "[FILE] notes.txt")
    assert missing.outcome is ToolOutcome.TOOL_ERROR
    assert missing.error is not None
    assert "ENOENT" in missing.error
    for refused in (escape, dotdot):
        assert refused.outcome is ToolOutcome.TOOL_ERROR
        assert refused.error is not None
        assert "outside allowed directories" in refused.error
    assert not canary.exists()  # checked from the host
    assert (no_path.outcome, no_path.error) == (
        ToolOutcome.REJECTED,
        "required @ read_text_file.path",
    )
    # the control: the path the server refused is writable by this process
    canary.write_text("reachable", encoding="utf-8")
    assert canary.read_text(encoding="utf-8") == "reachable"


def test_the_installer_is_a_no_op_when_the_servers_are_installed(reference_servers: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [str(INSTALLER)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "added" not in done.stdout
    assert time.monotonic() - started < 30


# ------------------------------------------------------- several servers joined, as an env does


@pytest.mark.anyio
async def test_reference_servers_joined_beside_the_slot_tools(
    reference_servers: Path, tmp_path: Path
) -> None:
    slot_tools = {spec.name: "the slot tools" for spec in SLOT_TOOL_SPECS}
    entries: dict[str, dict[str, object]] = {
        "everything": {"command": [str(reference_servers / "mcp-server-everything")]},
        "files": {"command": [str(reference_servers / "mcp-server-filesystem"), str(tmp_path)]},
    }
    async with open_tool_servers(
        parse_tool_servers(entries), default_call_timeout_s=30, reserved=slot_tools
    ) as clashing:
        with pytest.raises(ConfigError) as caught:
            await clashing.list_tools()
    assert caught.value.reason == (
        "tool 'read_file' is offered by both the slot tools and tool server 'files'"
    )

    entries["files"]["prefix"] = "fs_"
    async with open_tool_servers(
        parse_tool_servers(entries), default_call_timeout_s=30, reserved=slot_tools
    ) as joined:
        names = [spec.name for spec in await joined.list_tools()]
        toolsets = {toolset.name: toolset.tools for toolset in joined.toolsets()}
        echo, wrote, listed = await joined.execute(
            [
                call("c1", "echo", message="joined"),
                call("c2", "fs_write_file", path=str(tmp_path / "a.txt"), content="A"),
                call("c3", "fs_list_directory", path=str(tmp_path)),
            ],
            context=CONTEXT,
        )
    assert "echo" in names
    assert "fs_read_file" in names
    assert not set(names) & set(slot_tools)
    assert list(toolsets) == ["everything", "files"]
    assert "fs_write_file" in toolsets["files"]
    assert "echo" in toolsets["everything"]
    assert (echo.outcome, echo.content) == (ToolOutcome.OK, "Echo: joined")
    assert (wrote.name, wrote.outcome) == ("fs_write_file", ToolOutcome.OK)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "A"
    assert (listed.outcome, listed.content) == (ToolOutcome.OK, "[FILE] a.txt")
