"""Several tool servers as one (``JoinedToolServer``): the ToolServer contract through a join whose
tools are split over two members, routing, prefixes, a clash of names naming both owners, one
toolset per member, a failing member; then the env-side ``tool_servers`` setting, every mistake
naming its field.

Skipped as a whole when the MCP SDK (the ``mcp`` extra) is not installed (the package imports it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

from trajcore.adapters.fakes.tools import FakeToolServer, ToolFault
from trajcore.adapters.mcp.client import MCPURL, MCPCommand, SessionScope
from trajcore.adapters.mcp.join import JoinedMember, JoinedToolServer
from trajcore.adapters.mcp.settings import open_tool_servers, parse_tool_servers
from trajcore.domain.errors import ConfigError, PoolClosed, ToolServerError
from trajcore.domain.json_values import JSON
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome
from trajcore.domain.toolsets import Toolset
from trajcore.ports.tool_server import ToolServer
from trajcore.testing.tool_server_contract import (
    CONTRACT_CALL_TIMEOUT_S,
    CONTRACT_TOOLS,
    ToolServerContract,
    ToolServerFactory,
)

CONTEXT = ToolContext(trajectory_id="traj-1")


def split_fakes() -> tuple[FakeToolServer, FakeToolServer]:
    """The contract tools over two fakes: echo and add, then whoami, fail and sleep."""
    first = FakeToolServer.with_tools(CONTRACT_TOOLS[:2], call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    second = FakeToolServer.with_tools(CONTRACT_TOOLS[2:], call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    return first, second


@asynccontextmanager
async def joined_split() -> AsyncIterator[ToolServer]:
    first, second = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="first", server=first), JoinedMember(name="second", server=second)]
    )
    try:
        yield server
    finally:
        await server.aclose()


class TestJoinedToolServer(ToolServerContract):
    @pytest.fixture
    def tool_server_factory(self) -> ToolServerFactory:
        return joined_split


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def call(call_id: str, name: str, **arguments: JSON) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


@pytest.mark.anyio
async def test_calls_keep_their_order_and_runs_go_as_one_request() -> None:
    first, second = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="first", server=first), JoinedMember(name="second", server=second)]
    )
    calls = [
        call("c1", "echo", text="a"),
        call("c2", "add", a=1, b=2),
        call("c3", "whoami"),
        call("c4", "nope"),
        call("c5", "echo", text="b"),
    ]
    results = await server.execute(calls, context=CONTEXT)
    assert [(r.call_id, r.outcome, r.content) for r in results] == [
        ("c1", ToolOutcome.OK, "a"),
        ("c2", ToolOutcome.OK, "3"),
        ("c3", ToolOutcome.OK, '{"trajectory": "traj-1", "slot": null}'),
        ("c4", ToolOutcome.REJECTED, "Error: unknown tool 'nope' @ name"),
        ("c5", ToolOutcome.OK, "b"),
    ]
    assert (first.requests, second.requests) == (2 + 1, 1 + 1)  # listings, then [c1 c2], [c5]


@pytest.mark.anyio
async def test_a_prefix_renames_the_tools_and_calls_reach_the_real_name() -> None:
    first, second = split_fakes()
    server = JoinedToolServer(
        [
            JoinedMember(name="first", server=first, prefix="one_"),
            JoinedMember(name="second", server=second),
        ]
    )
    names = [spec.name for spec in await server.list_tools()]
    assert names == ["one_echo", "one_add", "whoami", "fail", "sleep"]
    (echoed, unprefixed) = await server.execute(
        [call("c1", "one_echo", text="hi"), call("c2", "echo", text="hi")], context=CONTEXT
    )
    assert (echoed.name, echoed.outcome, echoed.content) == ("one_echo", ToolOutcome.OK, "hi")
    assert unprefixed.outcome is ToolOutcome.REJECTED
    assert [c.call.name for c in first.calls] == ["echo"]
    assert server.toolsets() == [
        Toolset(name="first", tools=["one_echo", "one_add"], description="the tools of first"),
        Toolset(
            name="second", tools=["whoami", "fail", "sleep"], description="the tools of second"
        ),
    ]


@pytest.mark.anyio
async def test_a_name_offered_twice_fails_naming_both_servers() -> None:
    first, _ = split_fakes()
    again, _ = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="alpha", server=first), JoinedMember(name="beta", server=again)]
    )
    with pytest.raises(ConfigError) as caught:
        await server.list_tools()
    assert caught.value.field == "tools"
    assert caught.value.reason == (
        "tool 'echo' is offered by both tool server 'alpha' and tool server 'beta'"
    )


@pytest.mark.anyio
async def test_a_reserved_name_fails_naming_its_owner() -> None:
    first, _ = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="alpha", server=first)], reserved={"add": "the slot tools"}
    )
    with pytest.raises(
        ConfigError, match="'add' is offered by both the slot tools and tool server"
    ):
        await server.list_tools()


@pytest.mark.anyio
async def test_a_prefix_that_makes_a_bad_name_is_refused() -> None:
    first, _ = split_fakes()
    server = JoinedToolServer([JoinedMember(name="alpha", server=first, prefix="x" * 62)])
    with pytest.raises(ConfigError) as caught:
        await server.list_tools()
    assert caught.value.field == "alpha.prefix"


@pytest.mark.anyio
async def test_a_failing_member_fails_only_its_calls() -> None:
    first, second = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="first", server=first), JoinedMember(name="second", server=second)]
    )
    await server.list_tools()
    second.inject(ToolFault.unreachable())
    echoed, who = await server.execute(
        [call("c1", "echo", text="a"), call("c2", "whoami")], context=CONTEXT
    )
    assert (echoed.outcome, who.outcome) == (ToolOutcome.OK, ToolOutcome.INFRA_ERROR)


@pytest.mark.anyio
async def test_toolsets_need_a_listing_and_close_closes_every_member() -> None:
    first, second = split_fakes()
    server = JoinedToolServer(
        [JoinedMember(name="first", server=first), JoinedMember(name="second", server=second)]
    )
    with pytest.raises(ConfigError, match="list_tools"):
        server.toolsets()
    await server.aclose()
    await server.aclose()
    assert (first.closed, second.closed) == (True, True)
    with pytest.raises(PoolClosed):
        await server.execute([call("c1", "echo", text="a")], context=CONTEXT)


def test_member_names_must_be_unique() -> None:
    first, second = split_fakes()
    with pytest.raises(ConfigError, match="repeated: \\['same'\\]"):
        JoinedToolServer(
            [JoinedMember(name="same", server=first), JoinedMember(name="same", server=second)]
        )


# ----------------------------------------------------------------------- the tool_servers setting


def test_settings_by_command_and_by_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_TOKEN", "tok-1")
    everything, files, search = parse_tool_servers(
        {
            "everything": {"command": "npx -y @modelcontextprotocol/server-everything"},
            "files": {
                "command": ["mcp-server-filesystem", "/srv/data"],
                "prefix": "fs_",
                "scope": "trajectory",
                "env": {"LANG": "C"},
                "cwd": "/srv",
                "idle_close_s": None,
                "annotations": ["markdownDescription", "enumDescriptions"],
            },
            "search": {
                "url": "https://search.example/mcp",
                "token_env": "SEARCH_TOKEN",
                "call_timeout_s": 30,
                "max_restarts": 0,
            },
        }
    )
    assert everything.endpoint == MCPCommand(
        argv=("npx", "-y", "@modelcontextprotocol/server-everything")
    )
    assert (everything.scope, everything.prefix, everything.call_timeout_s) == (
        SessionScope.RUN,
        "",
        None,
    )
    assert files.endpoint == MCPCommand(
        argv=("mcp-server-filesystem", "/srv/data"), env={"LANG": "C"}, cwd="/srv"
    )
    assert (files.scope, files.prefix, files.idle_close_s) == (SessionScope.TRAJECTORY, "fs_", None)
    assert files.client(default_call_timeout_s=1).annotations == (
        "markdownDescription",
        "enumDescriptions",
    )
    assert everything.annotations == ()
    assert search.endpoint == MCPURL(url="https://search.example/mcp", token="tok-1")
    assert (search.call_timeout_s, search.max_restarts) == (30.0, 0)
    client = search.client(default_call_timeout_s=120)
    assert (client.name, client.call_timeout_s) == ("search", 30.0)
    assert everything.client(default_call_timeout_s=120).call_timeout_s == 120


def test_settings_from_json_text_and_none() -> None:
    (only,) = parse_tool_servers('{"a": {"url": "http://127.0.0.1:9/mcp"}}')
    assert only.endpoint == MCPURL(url="http://127.0.0.1:9/mcp")
    assert parse_tool_servers(None) == ()


@pytest.mark.parametrize(
    ("value", "field", "reason"),
    [
        ("{not json", "tool_servers", "JSON"),
        (["a"], "tool_servers", "expected a mapping"),
        ({"bad name": {"url": "http://h/mcp"}}, "tool_servers", "server name"),
        ({"a": "npx x"}, "tool_servers.a", "expected a mapping"),
        ({"a": {}}, "tool_servers.a", "exactly one of command"),
        ({"a": {"command": "x", "url": "http://h/mcp"}}, "tool_servers.a", "exactly one"),
        ({"a": {"comand": "x"}}, "tool_servers.a.comand", "unknown setting"),
        ({"a": {"command": ""}}, "tool_servers.a.command", "non-empty"),
        ({"a": {"command": 3}}, "tool_servers.a.command", "expected a command line"),
        ({"a": {"command": "x", "token": "t"}},
         "tool_servers.a.token", "only for a server given by url"),
        ({"a": {"command": "x", "env": {"A": 1}}}, "tool_servers.a.env", "string values"),
        ({"a": {"url": "ftp://h"}}, "tool_servers.a.url", "http(s)"),
        ({"a": {"url": "http://h/mcp", "annotations": "markdownDescription"}},
         "tool_servers.a.annotations", "expected a list of keys"),
        ({"a": {"url": "http://h/mcp", "annotations": ["$ref"]}},
         "tool_servers.a.annotations", "not '$...'"),
        ({"a": {"url": "http://h/mcp", "annotations": [""]}},
         "tool_servers.a.annotations", "names of schema keys"),
        ({"a": {"url": "http://h/mcp", "cwd": "/"}},
         "tool_servers.a.cwd", "only for a server given by command"),
        ({"a": {"url": "http://h/mcp", "token_env": "TRAJCORE_NO_SUCH_VAR"}},
         "tool_servers.a.token_env", "not set"),
        ({"a": {"url": "http://h/mcp", "token": "t", "token_env": "X"}},
         "tool_servers.a.token", "not both"),
        ({"a": {"url": "http://h/mcp", "token": ""}}, "tool_servers.a.token", "non-empty"),
        ({"a": {"command": "x", "scope": "group"}},
         "tool_servers.a.scope", "'run' or 'trajectory'"),
        ({"a": {"command": "x", "prefix": "has space"}},
         "tool_servers.a.prefix", "expected up to 64"),
        ({"a": {"command": "x", "call_timeout_s": 0}}, "tool_servers.a.call_timeout_s", "> 0"),
        ({"a": {"command": "x", "call_timeout_s": "5"}}, "tool_servers.a.call_timeout_s", "number"),
        ({"a": {"command": "x", "connect_timeout_s": None}},
         "tool_servers.a.connect_timeout_s", "number"),
        ({"a": {"command": "x", "connect_timeout_s": 0}},
         "tool_servers.a.connect_timeout_s", "> 0"),
        ({"a": {"command": "x", "max_restarts": -1}}, "tool_servers.a.max_restarts", ">= 0"),
        ({"a": {"command": "x", "max_restarts": True}},
         "tool_servers.a.max_restarts", "whole number"),
        ({"a": {"command": "x", "idle_close_s": -1}}, "tool_servers.a.idle_close_s", "> 0"),
    ],
)  # fmt: skip
def test_a_bad_setting_names_its_field(value: object, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tool_servers(value)
    assert caught.value.field == field
    assert reason in caught.value.reason


@pytest.mark.anyio
async def test_open_tool_servers_joins_after_the_members_given_before() -> None:
    first, _ = split_fakes()
    settings = parse_tool_servers({"dead": {"command": "/nonexistent/mcp", "max_restarts": 0}})
    async with open_tool_servers(
        settings,
        default_call_timeout_s=5,
        before=[JoinedMember(name="external", server=first)],
    ) as joined:
        assert [m.name for m in joined.members] == ["external", "dead"]
        with pytest.raises(ToolServerError, match="/nonexistent/mcp"):
            await joined.list_tools()
    assert first.closed
