"""The ToolServer contract through the MCP adapter against ``trajcore tool-server --mcp``, over
stdio (a child process per test) and over streamable HTTP (one process, a session per test), with
one session per run and one per trajectory; then every mapping from MCP values to trajcore's.

Skipped as a whole when the MCP SDK (the ``mcp`` extra) is not installed.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

import mcp_types as types

from trajcore.adapters.mcp.client import MCPURL, MCPCommand, MCPToolServer, SessionScope
from trajcore.adapters.mcp.protocol import (
    ANONYMOUS_TRAJECTORY,
    CONTEXT_META_KEY,
    OUTCOME_META_KEY,
    context_from_meta,
    context_meta,
    tool_result,
    tool_spec,
)
from trajcore.domain.errors import ConfigError, StateError, WireError
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome
from trajcore.ports.tool_server import ToolServer
from trajcore.testing.tool_server_contract import (
    CONTRACT_CALL_TIMEOUT_S,
    ToolServerContract,
    ToolServerFactory,
)

TOKEN = "mcp-s3cret"
REPO = Path(__file__).resolve().parents[2]
CONTRACT_APP = "trajcore.testing.tool_server_contract:CONTRACT_REGISTRY"


def serve_command(app: str, *extra: str) -> tuple[str, ...]:
    """``trajcore tool-server --app APP`` run by this interpreter, then ``extra``."""
    code = "import sys; from trajcore.entrypoints.tool_server import main; sys.exit(main())"
    return (sys.executable, "-c", code, "--app", app, *extra)


class ServedToolServer:
    """``trajcore tool-server --app APP`` (``serve_command``) with ``flags``, serving HTTP, as a
    child process; ``ready`` and ``url`` from its ready line."""

    def __init__(self, app: str, *flags: str) -> None:
        self.process = subprocess.Popen(
            serve_command(app, *flags), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.stderr = ""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise AssertionError(f"tool server {' '.join(flags)} did not start: {self.stderr}")
        self.ready = json.loads(line)
        assert self.ready["ready"] is True, self.ready
        self.url: str = self.ready["address"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()


class ServedMCP(ServedToolServer):
    """``trajcore tool-server --mcp http`` as a child process; ``url`` from its ready line."""

    def __init__(self, app: str, token_file: Path, *extra: str) -> None:
        super().__init__(app, "--mcp", "http", "--listen", "127.0.0.1:0",
                         "--token-file", str(token_file), *extra)  # fmt: skip


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def served(token_file: Path) -> Iterator[ServedMCP]:
    server = ServedMCP(CONTRACT_APP, token_file, "--call-timeout-s", str(CONTRACT_CALL_TIMEOUT_S))
    yield server
    server.stop()
    assert server.process.returncode == 0, server.stderr


def over_stdio(scope: SessionScope = SessionScope.RUN) -> ToolServerFactory:
    command = MCPCommand(
        argv=serve_command(
            CONTRACT_APP, "--mcp", "stdio", "--call-timeout-s", str(CONTRACT_CALL_TIMEOUT_S)
        ),
        cwd=str(REPO),
    )

    @asynccontextmanager
    async def factory() -> AsyncIterator[ToolServer]:
        async with MCPToolServer(command, scope=scope, connect_timeout_s=60) as server:
            yield server

    return factory


def over_http(url: str, scope: SessionScope = SessionScope.RUN) -> ToolServerFactory:
    @asynccontextmanager
    async def factory() -> AsyncIterator[ToolServer]:
        endpoint = MCPURL(url=url, token=TOKEN)
        async with MCPToolServer(endpoint, scope=scope, connect_timeout_s=30) as server:
            yield server

    return factory


@pytest.mark.slow
class TestMCPOverStdio(ToolServerContract):
    @pytest.fixture
    def tool_server_factory(self) -> ToolServerFactory:
        return over_stdio()


class TestMCPOverHTTP(ToolServerContract):
    @pytest.fixture
    def tool_server_factory(self, served: ServedMCP) -> ToolServerFactory:
        return over_http(served.url)


class TestMCPOverHTTPSessionPerTrajectory(ToolServerContract):
    @pytest.fixture
    def tool_server_factory(self, served: ServedMCP) -> ToolServerFactory:
        return over_http(served.url, SessionScope.TRAJECTORY)


# ------------------------------------------------------------------------- MCP -> trajcore values

CALL = ToolCall(id="c1", name="look", arguments={"q": "x"})


def _answer(
    *blocks: types.ContentBlock,
    structured: object = None,
    is_error: bool = False,
    meta: dict[str, object] | None = None,
) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {
            "content": [block.model_dump(by_alias=True, exclude_none=True) for block in blocks],
            "structuredContent": structured,
            "isError": is_error,
            "_meta": meta,
        }
    )


def test_one_text_block_is_kept_verbatim() -> None:
    text = ' ünïcode ✓\n\ttabs "quotes" \\ {"json": 1} '
    result = tool_result(CALL, _answer(types.TextContent(text=text)))
    assert (result.outcome, result.content, result.error) == (ToolOutcome.OK, text, None)
    assert (result.call_id, result.name) == ("c1", "look")


def test_text_blocks_are_joined_by_newlines() -> None:
    answer = _answer(types.TextContent(text="one"), types.TextContent(text="two"))
    assert tool_result(CALL, answer).content == "one\ntwo"


def test_structured_content_without_text_is_json_text() -> None:
    result = tool_result(CALL, _answer(structured={"temperature": 21.5, "city": "Zürich"}))
    assert result.outcome is ToolOutcome.OK
    assert json.loads(result.content) == {"temperature": 21.5, "city": "Zürich"}
    assert "Zürich" in result.content


def test_text_wins_over_its_structured_copy() -> None:
    answer = _answer(types.TextContent(text='{"a": 1}'), structured={"a": 1})
    assert tool_result(CALL, answer).content == '{"a": 1}'


def test_is_error_is_a_tool_error_carrying_the_text() -> None:
    answer = _answer(types.TextContent(text="disk\non fire"), is_error=True)
    result = tool_result(CALL, answer)
    assert result.outcome is ToolOutcome.TOOL_ERROR
    assert result.error == "disk on fire"
    assert result.content == "Error: disk on fire"


def test_is_error_without_text_still_says_which_tool_failed() -> None:
    result = tool_result(CALL, _answer(is_error=True))
    assert result.outcome is ToolOutcome.TOOL_ERROR
    assert result.error == "look failed (isError)"


def test_media_and_resources_are_named_not_dropped() -> None:
    answer = _answer(
        types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
        types.AudioContent(data="aGk=", mime_type="audio/wav"),
        types.EmbeddedResource(
            resource=types.TextResourceContents(uri="file:///a.txt", text="inside", mime_type=None)
        ),
        types.EmbeddedResource(
            resource=types.BlobResourceContents(
                uri="file:///b.bin", blob="AAE=", mime_type="application/zip"
            )
        ),
        types.ResourceLink(name="readme", uri="file:///README.md"),
    )
    assert tool_result(CALL, answer).content.splitlines() == [
        "[image: image/png, 8 base64 characters]",
        "[audio: audio/wav, 4 base64 characters]",
        "inside",
        "[resource file:///b.bin: application/zip, not text]",
        "[resource link: readme <file:///README.md>]",
    ]


@pytest.mark.parametrize(
    "outcome", [ToolOutcome.REJECTED, ToolOutcome.TIMEOUT, ToolOutcome.TOOL_ERROR]
)
def test_our_servers_outcome_survives_the_trip(outcome: ToolOutcome) -> None:
    meta: dict[str, object] = {
        OUTCOME_META_KEY: {"outcome": outcome.value, "error": "why @ look.q"}
    }
    answer = _answer(types.TextContent(text="Error: why @ look.q"), is_error=True, meta=meta)
    result = tool_result(CALL, answer)
    assert (result.outcome, result.error) == (outcome, "why @ look.q")


def test_a_malformed_outcome_entry_falls_back_to_is_error() -> None:
    meta: dict[str, object] = {OUTCOME_META_KEY: {"outcome": "exploded"}}
    answer = _answer(types.TextContent(text="bad"), is_error=True, meta=meta)
    assert tool_result(CALL, answer).outcome is ToolOutcome.TOOL_ERROR


def test_an_ok_outcome_cannot_hide_is_error() -> None:
    meta: dict[str, object] = {OUTCOME_META_KEY: {"outcome": "ok", "error": None}}
    answer = _answer(types.TextContent(text="bad"), is_error=True, meta=meta)
    assert tool_result(CALL, answer).outcome is ToolOutcome.TOOL_ERROR


def test_a_tool_becomes_a_spec_with_its_schema_kept_whole() -> None:
    schema: dict[str, object] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"count": {"type": "number", "minimum": 1, "maximum": 10, "default": 3}},
        "required": ["count"],
    }
    tool = types.Tool(name="get-links", description=None, input_schema=schema)
    spec = tool_spec(tool, 0)
    assert (spec.name, spec.description, spec.parameters) == ("get-links", "", schema)
    assert [str(p) for p in spec.validate_arguments({"count": "3"})] == [
        "expected number, got string @ $.count"
    ]


@pytest.mark.parametrize(
    ("name", "schema", "field"),
    [
        ("has space", {"type": "object"}, "$.tools[3].name"),
        ("x" * 65, {"type": "object"}, "$.tools[3].name"),
        ("ok", {"type": "array"}, "$.tools[3].inputSchema.type"),
        ("ok", {"type": "object", "required": "nope", "properties": {}},
         "$.tools[3].inputSchema.required"),
        ("ok", {"type": "object", "properties": {"a": {"$ref": "https://elsewhere/a.json"}}},
         "$.tools[3].inputSchema.properties.a.$ref"),
        ("ok", {"type": "object", "properties": {"a": {"type": "strng"}}},
         "$.tools[3].inputSchema.properties.a.type"),
        ("ok", {"type": "object", "properties": {"a": {"type": "string", "optional": True}}},
         "$.tools[3].inputSchema.properties.a.optional"),
    ],
)  # fmt: skip
def test_a_tool_trajcore_cannot_take_is_a_wire_error_naming_it(
    name: str, schema: dict[str, object], field: str
) -> None:
    with pytest.raises(WireError) as caught:
        tool_spec(types.Tool(name=name, input_schema=schema), 3)
    assert caught.value.field == field
    assert caught.value.reason.count(f"tool {name!r}:") == 1  # named once


def test_context_round_trips_through_meta() -> None:
    for context in (ToolContext(trajectory_id="t-1", slot="c0/2"), ToolContext(trajectory_id="t")):
        assert context_from_meta(context_meta(context)) == context
    assert context_from_meta(None) == ToolContext(trajectory_id=ANONYMOUS_TRAJECTORY)
    assert context_from_meta({"other/key": 1}) == ToolContext(trajectory_id=ANONYMOUS_TRAJECTORY)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("t-1", f'$._meta["{CONTEXT_META_KEY}"]'),
        ({"trajectory_id": ""}, f'$._meta["{CONTEXT_META_KEY}"].trajectory_id'),
        ({"trajectory_id": "t", "slot": 3}, f'$._meta["{CONTEXT_META_KEY}"].slot'),
    ],
)
def test_a_malformed_context_names_the_field(entry: object, field: str) -> None:
    with pytest.raises(WireError) as caught:
        context_from_meta({CONTEXT_META_KEY: entry})
    assert caught.value.field == field


# ------------------------------------------------------------------------------ bad settings


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: MCPCommand.parse(""), "argv"),
        (lambda: MCPCommand.parse("npx 'unclosed"), "argv"),
        (lambda: MCPCommand(argv=("node", "")), "argv"),
        (lambda: MCPCommand.parse("node", env={"A": 1}), "env"),  # type: ignore[dict-item]  # bad input on purpose
        (lambda: MCPURL(url="ftp://host/mcp"), "url"),
        (lambda: MCPToolServer(MCPCommand.parse("x"), call_timeout_s=0), "call_timeout_s"),
        (lambda: MCPToolServer(MCPCommand.parse("x"), connect_timeout_s=math.nan),
         "connect_timeout_s"),
        (lambda: MCPToolServer(MCPCommand.parse("x"), max_restarts=-1), "max_restarts"),
        (lambda: MCPToolServer(MCPCommand.parse("x"), idle_close_s=-5), "idle_close_s"),
        (lambda: MCPToolServer("npx server"), "endpoint"),  # type: ignore[arg-type]  # bad input on purpose
        (lambda: MCPToolServer(MCPCommand.parse("x"), scope="run"), "scope"),  # type: ignore[arg-type]  # bad input on purpose
        (lambda: MCPToolServer(MCPCommand.parse("x"), annotations="markdownDescription"),
         "annotations"),  # one string, not a list of keys
    ],
)  # fmt: skip
def test_bad_settings_name_the_field(build: object, field: str) -> None:
    assert callable(build)
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.field == field


def test_the_token_is_not_in_the_repr() -> None:
    assert TOKEN not in repr(MCPURL(url="http://h/mcp", token=TOKEN))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_server_never_entered_refuses_calls() -> None:
    server = MCPToolServer(MCPCommand.parse("never-started"))
    with pytest.raises(StateError, match="async with"):
        await server.execute([CALL], context=ToolContext(trajectory_id="t"))
