"""The ToolServer contract against the fake, the HTTP adapter in process (ASGI) and the HTTP
adapter against a real ``trajcore tool-server`` process on loopback; then bad input and faults:
no token, malformed answers, a server killed mid-call, a dead URL, hangs and timeouts."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract.test_mcp_tool_server import ServedToolServer
from tests.strategies import names, tool_calls, tool_results, tool_specs
from trajcore.adapters.fakes.tools import FakeToolServer, ToolFault
from trajcore.adapters.tool_server import (
    INPROCESS,
    ExecuteRequest,
    ExecuteResponse,
    HTTPToolServer,
    ToolListing,
    ToolRegistry,
)
from trajcore.adapters.wire import structure, unstructure
from trajcore.domain.errors import ConfigError, PoolClosed, ToolServerError, WireError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec
from trajcore.entrypoints.tool_server import load_registry, main, make_app
from trajcore.ports.tool_server import ToolServer
from trajcore.testing.tool_server_contract import (
    CONTRACT_CALL_TIMEOUT_S,
    CONTRACT_REGISTRY,
    CONTRACT_TOOLS,
    ToolServerContract,
    ToolServerFactory,
)
from trajcore.testing.tool_server_machine import (
    ToolRegistryServerFactory,
    run_generated_tools_machine,
    run_tool_server_machine,
)

TOKEN = "s3cret-token"
REPO = Path(__file__).resolve().parents[2]
CONTEXT = ToolContext(trajectory_id="traj-1", slot="c0/0")

# ------------------------------------------------------------------------------ real servers


def serve_tools(app: str, token_file: Path) -> ServedToolServer:
    """``trajcore tool-server --app APP`` on loopback HTTP, with the contract's call timeout."""
    return ServedToolServer(
        app, "--listen", "127.0.0.1:0", "--token-file", str(token_file),
        "--call-timeout-s", str(CONTRACT_CALL_TIMEOUT_S),
    )  # fmt: skip


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tool-server") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def served(token_file: Path) -> Iterator[ServedToolServer]:
    server = serve_tools("trajcore.testing.tool_server_contract:CONTRACT_REGISTRY", token_file)
    yield server
    server.stop()
    assert server.process.returncode == 0, server.stderr


# ---------------------------------------------------------------------------------- factories


@asynccontextmanager
async def fake() -> AsyncIterator[ToolServer]:
    server = FakeToolServer.with_tools(CONTRACT_TOOLS, call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    try:
        yield server
    finally:
        await server.aclose()


@asynccontextmanager
async def in_process() -> AsyncIterator[ToolServer]:
    app = make_app(CONTRACT_REGISTRY, token=TOKEN, call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    server = HTTPToolServer(INPROCESS, token=TOKEN, app=app, timeout_s=30)
    try:
        yield server
    finally:
        await server.aclose()


@asynccontextmanager
async def fake_offering(registry: ToolRegistry) -> AsyncIterator[ToolServer]:
    server = FakeToolServer(registry=registry, call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    try:
        yield server
    finally:
        await server.aclose()


@asynccontextmanager
async def in_process_offering(registry: ToolRegistry) -> AsyncIterator[ToolServer]:
    app = make_app(registry, token=TOKEN, call_timeout_s=CONTRACT_CALL_TIMEOUT_S)
    server = HTTPToolServer(INPROCESS, token=TOKEN, app=app, timeout_s=30)
    try:
        yield server
    finally:
        await server.aclose()


class TestFakeToolServer(ToolServerContract):
    machine_scale = 0.02  # two sequences: the lockstep test below runs five on all three

    @pytest.fixture
    def tool_server_factory(self) -> ToolServerFactory:
        return fake

    @pytest.fixture
    def tool_registry_server_factory(self) -> ToolRegistryServerFactory:
        return fake_offering


class TestHTTPToolServerInProcess(ToolServerContract):
    machine_scale = 0.02  # two sequences: the lockstep test below runs five on all three

    @pytest.fixture
    def tool_server_factory(self) -> ToolServerFactory:
        return in_process

    @pytest.fixture
    def tool_registry_server_factory(self) -> ToolRegistryServerFactory:
        return in_process_offering


class TestHTTPToolServerOnLoopback(ToolServerContract):
    machine_scale = 0.02  # two sequences: the lockstep test below runs five on all three

    @pytest.fixture
    def tool_server_factory(self, served: ServedToolServer) -> ToolServerFactory:
        @asynccontextmanager
        async def on_loopback() -> AsyncIterator[ToolServer]:
            server = HTTPToolServer(served.url, token=TOKEN, timeout_s=30)
            try:
                yield server
            finally:
                await server.aclose()

        return on_loopback


# ------------------------------------------------------------------------- bad input and faults


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _echo(text: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(id=call_id, name="echo", arguments={"text": text})


@pytest.mark.anyio
async def test_request_without_the_token_is_refused_with_401(served: ServedToolServer) -> None:
    async with httpx.AsyncClient(base_url=served.url, trust_env=False) as raw:
        for path in ("/v1/tools", "/v1/execute"):
            response = await raw.request("GET" if path == "/v1/tools" else "POST", path)
            assert response.status_code == 401
            assert response.json()["field"] == "Authorization"
        health = await raw.get("/v1/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "protocol": 1, "tools": len(CONTRACT_TOOLS)}


@pytest.mark.anyio
@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_client_without_the_right_token_names_the_auth(
    served: ServedToolServer, token: str | None
) -> None:
    server = HTTPToolServer(served.url, token=token, timeout_s=10)
    try:
        with pytest.raises(ToolServerError, match=r"bearer token .*HTTP 401"):
            await server.list_tools()
        (result,) = await server.execute([_echo("hi")], context=CONTEXT)
        health = await server.health()
    finally:
        await server.aclose()
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "401" in result.error
    assert "token" in result.error
    assert health.protocol == 1


@pytest.mark.anyio
async def test_malformed_request_is_400_naming_the_path() -> None:
    app = make_app(CONTRACT_REGISTRY, token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(base_url="http://t", transport=transport, headers=headers) as raw:
        not_json = await raw.post("/v1/execute", content=b"{nope")
        too_deep = await raw.post("/v1/execute", content=b"[" * 5_000 + b"]" * 5_000)
        bad_call = await raw.post(
            "/v1/execute",
            json={"calls": [{"id": "c1", "name": 7}], "context": {"trajectory_id": "t"}},
        )
        no_context = await raw.post("/v1/execute", json={"calls": []})
    assert (not_json.status_code, not_json.json()["field"]) == (400, "$")
    assert (too_deep.status_code, too_deep.json()["field"]) == (400, "$")
    assert (bad_call.status_code, bad_call.json()["field"]) == (400, "$.calls[0].name")
    assert (no_context.status_code, no_context.json()["field"]) == (400, "$.context")


def _stub_app(status: int, body: bytes) -> Any:
    """A plain ASGI app answering every request with ``status`` and ``body``."""

    async def app(
        scope: MutableMapping[str, Any],
        receive: Any,
        send: Any,
    ) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@asynccontextmanager
async def stubbed(status: int, body: JSON | bytes) -> AsyncIterator[HTTPToolServer]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    server = HTTPToolServer(INPROCESS, app=_stub_app(status, raw), timeout_s=10)
    try:
        yield server
    finally:
        await server.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"<html>", "$"),
        ({"tools": [{"name": 5}]}, "$.tools[0].name"),
        ({"tools": [{"name": "ok", "parameters": {"type": "array"}}]}, "$.tools[0].parameters"),
        ({"tools": [{"name": "a"}, {"name": "a"}]}, "$.tools[1].name"),
        ({"items": []}, "$.tools"),
    ],
)
async def test_malformed_tool_listing_is_a_wire_error_with_its_path(
    body: JSON | bytes, field: str
) -> None:
    async with stubbed(200, body) as server:
        with pytest.raises(WireError) as caught:
            await server.list_tools()
    assert caught.value.field.startswith(field)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"not json", "@ $"),
        ({"results": [{"call_id": "c1", "name": "echo", "outcome": "bogus"}]},
         "@ $.results[0].outcome"),
        ({"results": []}, "expected 1 results, got 0 @ $.results"),
        ({"results": [{"call_id": "zz", "name": "echo", "outcome": "ok"}]},
         "@ $.results[0].call_id"),
        # only a slot server ends a lease for its budget: a tool server's marker would end the
        # trajectory with sandbox_budget_score, the score hook never called
        ({"results": [{"call_id": "c1", "name": "echo", "outcome": "tool_error", "error": "full",
                       "sandbox_budget": "disk"}]},
         "@ $.results[0].sandbox_budget"),
    ],
)  # fmt: skip
async def test_malformed_execute_answer_gives_infra_errors_naming_the_path(
    body: JSON | bytes, where: str
) -> None:
    async with stubbed(200, body) as server:
        (result,) = await server.execute([_echo("hi")], context=CONTEXT)
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "broke the protocol" in result.error
    assert where in result.error


@pytest.mark.anyio
async def test_server_error_status_is_a_tool_server_error() -> None:
    async with stubbed(503, {"error": "overloaded"}) as server:
        with pytest.raises(ToolServerError, match="HTTP 503"):
            await server.list_tools()
        (result,) = await server.execute([_echo("hi")], context=CONTEXT)
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "overloaded" in result.error


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.anyio
async def test_dead_url_fails_every_call_as_infrastructure() -> None:
    server = HTTPToolServer(_dead_url(), token=TOKEN, timeout_s=5)
    try:
        with pytest.raises(ToolServerError, match="ConnectError"):
            await server.list_tools()
        results = await server.execute([_echo("a", "c1"), _echo("b", "c2")], context=CONTEXT)
    finally:
        await server.aclose()
    assert [(r.call_id, r.outcome) for r in results] == [
        ("c1", ToolOutcome.INFRA_ERROR),
        ("c2", ToolOutcome.INFRA_ERROR),
    ]


KILL_REGISTRY = ToolRegistry()


@KILL_REGISTRY.tool(parameters={"type": "object", "properties": {"marker": {"type": "string"}}})
async def mark_then_wait(arguments: JSONObject, _context: ToolContext) -> JSON:
    """Create the marker file, then wait for a long time."""
    await anyio.Path(str(arguments["marker"])).write_text("running")
    await anyio.sleep(60)
    return "done"


@pytest.mark.anyio
async def test_server_killed_mid_call_gives_infra_error_results(
    token_file: Path, tmp_path: Path
) -> None:
    served = serve_tools("tests.contract.test_tool_server:KILL_REGISTRY", token_file)
    marker = tmp_path / "running"
    call = ToolCall(id="c1", name="mark_then_wait", arguments={"marker": str(marker)})
    server = HTTPToolServer(served.url, token=TOKEN, timeout_s=30)
    try:
        results: list[Any] = []

        async def run() -> None:
            results.extend(await server.execute([call, _echo("x", "c2")], context=CONTEXT))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                while not await anyio.Path(marker).exists():  # noqa: ASYNC110 - another process writes it
                    await anyio.sleep(0.01)
                served.process.kill()
    finally:
        await server.aclose()
        served.stop()
    assert served.process.returncode == -signal.SIGKILL
    assert [(r.call_id, r.outcome) for r in results] == [
        ("c1", ToolOutcome.INFRA_ERROR),
        ("c2", ToolOutcome.INFRA_ERROR),
    ]


async def _sleep_30(server: HTTPToolServer) -> ToolResult:
    """The result of a 30 s ``sleep`` call through ``server`` (closed after), within 10 s."""
    try:
        with anyio.fail_after(10):
            (result,) = await server.execute(
                [ToolCall(id="c1", name="sleep", arguments={"seconds": 30})], context=CONTEXT
            )
    finally:
        await server.aclose()
    return result


@pytest.mark.anyio
async def test_request_past_its_deadline_is_an_infra_error() -> None:
    app = make_app(CONTRACT_REGISTRY, token=TOKEN, call_timeout_s=60)
    result = await _sleep_30(HTTPToolServer(INPROCESS, token=TOKEN, app=app, timeout_s=0.2))
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "did not answer" in result.error


@pytest.mark.anyio
async def test_a_tool_past_the_servers_limit_is_its_timeout_not_the_clients() -> None:
    app = make_app(CONTRACT_REGISTRY, token=TOKEN, call_timeout_s=0.5)
    server = HTTPToolServer(INPROCESS, token=TOKEN, app=app, timeout_s=0.5, call_timeout_s=0.5)
    result = await _sleep_30(server)
    assert result.outcome is ToolOutcome.TIMEOUT


@pytest.mark.anyio
async def test_calls_each_within_the_limit_are_ok_however_long_together() -> None:
    app = make_app(CONTRACT_REGISTRY, token=TOKEN, call_timeout_s=0.5)
    server = HTTPToolServer(INPROCESS, token=TOKEN, app=app, timeout_s=0.5, call_timeout_s=0.5)
    calls = [ToolCall(id=f"c{i}", name="sleep", arguments={"seconds": 0.3}) for i in range(3)]
    try:
        results = await server.execute(calls, context=CONTEXT)
    finally:
        await server.aclose()
    assert [r.outcome for r in results] == [ToolOutcome.OK] * 3


@pytest.mark.anyio
async def test_tool_returning_a_non_json_value_is_a_tool_error() -> None:
    registry = ToolRegistry()

    @registry.tool()
    def odd(_arguments: JSONObject, _context: ToolContext) -> Any:
        """Return a set."""
        return {1, 2}

    server = HTTPToolServer(INPROCESS, app=make_app(registry))
    try:
        (result,) = await server.execute([ToolCall(id="c1", name="odd")], context=CONTEXT)
    finally:
        await server.aclose()
    assert result.outcome is ToolOutcome.TOOL_ERROR
    assert result.error is not None
    assert "set is not a JSON value" in result.error


def test_client_settings_are_checked() -> None:
    app = make_app(CONTRACT_REGISTRY)
    with pytest.raises(ConfigError) as caught:
        HTTPToolServer(INPROCESS)
    assert caught.value.field == "app"
    with pytest.raises(ConfigError) as caught:
        HTTPToolServer("http://127.0.0.1:1", app=app)
    assert caught.value.field == "app"
    with pytest.raises(ConfigError) as caught:
        HTTPToolServer("ftp://example")
    assert caught.value.field == "url"
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError) as caught:
            HTTPToolServer("http://127.0.0.1:1", timeout_s=bad)
        assert caught.value.field == "timeout_s"
        with pytest.raises(ConfigError) as caught:
            HTTPToolServer("http://127.0.0.1:1", call_timeout_s=bad)
        assert caught.value.field == "call_timeout_s"


def test_registry_takes_names_and_descriptions_from_functions_and_refuses_duplicates() -> None:
    registry = ToolRegistry()

    @registry.tool()
    def lookup(_arguments: JSONObject, _context: ToolContext) -> JSON:
        """Look something up.

        More words.
        """
        return None

    assert registry.specs() == [ToolSpec(name="lookup", description="Look something up.")]
    with pytest.raises(ConfigError) as caught:
        registry.register(ToolSpec(name="lookup"), lookup)
    assert caught.value.field == "name"
    with pytest.raises(ConfigError):
        registry.tool(name="bad name!")(lookup)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("no_colon", "expected module:attribute"),
        ("trajcore.no_such_module:x", "cannot import"),
        ("trajcore.testing.tool_server_contract:CONTRACT_TOOLS", "not a ToolRegistry"),
    ],
)
def test_load_registry_names_the_app_flag(target: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        load_registry(target)
    assert caught.value.field == "--app"


def test_an_app_module_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trajcore tool-server --app my_tools:registry`` run where ``my_tools.py`` lies (as
    docs/mcp.md has it; the console script's ``sys.path`` does not hold the current directory)."""
    name = f"tools_here_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from trajcore.env import ToolRegistry\nregistry = ToolRegistry()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert isinstance(load_registry(f"{name}:registry"), ToolRegistry)


def test_main_exits_2_on_a_bad_configuration(
    tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = "trajcore.testing.tool_server_contract:CONTRACT_REGISTRY"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cases = [
        (["--app", app, "--listen", "127.0.0.1:0", "--token-file", str(empty)], "--token-file"),
        (["--app", app, "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "none")],
         "--token-file"),
        (["--app", app, "--listen", "nowhere", "--token-file", str(token_file)], "--listen"),
        (["--app", "x:y", "--listen", "127.0.0.1:0", "--token-file", str(token_file)], "--app"),
    ]  # fmt: skip
    for argv, field in cases:
        assert main(argv) == 2
        assert f"@ {field}" in capsys.readouterr().err


# ------------------------------------------------------------------------------ fake's faults


@pytest.mark.anyio
async def test_fake_records_calls_with_their_contexts() -> None:
    server = FakeToolServer.with_tools(CONTRACT_TOOLS)
    other = ToolContext(trajectory_id="traj-2")
    await server.execute([_echo("a", "c1"), _echo("b", "c2")], context=CONTEXT)
    await server.execute([ToolCall(id="c3", name="nope")], context=other)
    await server.list_tools()
    await server.aclose()
    assert [(r.call.id, r.context, r.result.outcome) for r in server.calls] == [
        ("c1", CONTEXT, ToolOutcome.OK),
        ("c2", CONTEXT, ToolOutcome.OK),
        ("c3", other, ToolOutcome.REJECTED),
    ]
    assert server.requests == 3


@pytest.mark.anyio
@pytest.mark.parametrize("fault", [ToolFault.unreachable(), ToolFault.crash(delay_s=0.01)])
async def test_fake_unreachable_or_crashed_fails_the_request(fault: ToolFault) -> None:
    server = FakeToolServer.with_tools(CONTRACT_TOOLS)
    server.inject(fault, fault)
    with pytest.raises(ToolServerError):
        await server.list_tools()
    results = await server.execute([_echo("a", "c1"), _echo("b", "c2")], context=CONTEXT)
    assert [r.outcome for r in results] == [ToolOutcome.INFRA_ERROR] * 2
    (after,) = await server.execute([_echo("a")], context=CONTEXT)
    assert after.outcome is ToolOutcome.OK


@pytest.mark.anyio
async def test_fake_hang_ends_by_cancellation_or_request_deadline() -> None:
    server = FakeToolServer.with_tools(CONTRACT_TOOLS)
    server.request_timeout_s = 0.05
    server.inject(ToolFault.hang(), ToolFault.hang())
    with anyio.move_on_after(0.02) as scope:
        await server.execute([_echo("a")], context=CONTEXT)
    assert scope.cancelled_caught
    with anyio.fail_after(10):
        (result,) = await server.execute([_echo("a")], context=CONTEXT)
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "did not answer" in result.error


@pytest.mark.anyio
async def test_fake_slow_answers_and_raises_makes_tool_errors() -> None:
    server = FakeToolServer.with_tools(CONTRACT_TOOLS)
    server.inject(ToolFault.slow(0.01), ToolFault.raises("boom"))
    (slow,) = await server.execute([_echo("a")], context=CONTEXT)
    raised, unknown = await server.execute(
        [_echo("a"), ToolCall(id="c2", name="nope")], context=CONTEXT
    )
    assert (slow.outcome, slow.content) == (ToolOutcome.OK, "a")
    assert raised.outcome is ToolOutcome.TOOL_ERROR
    assert raised.error == "RuntimeError: boom"
    assert unknown.outcome is ToolOutcome.REJECTED


@pytest.mark.anyio
async def test_fake_refuses_after_close_and_checks_its_settings() -> None:
    server = FakeToolServer()
    await server.aclose()
    with pytest.raises(PoolClosed):
        await server.execute([], context=CONTEXT)
    with pytest.raises(ConfigError):
        ToolFault.slow(-1.0)
    with pytest.raises(ConfigError):
        FakeToolServer.with_tools([*CONTRACT_TOOLS, CONTRACT_TOOLS[0]])


# ------------------------------------------------------------------------------ wire and threads

contexts = st.builds(ToolContext, trajectory_id=names, slot=st.none() | names)
# The values inside are round-tripped at length in tests/unit/test_wire.py; these check the
# envelopes, so fewer examples do.
ENVELOPES = settings(max_examples=40)


@ENVELOPES
@given(calls=st.lists(tool_calls, max_size=4), context=contexts)
def test_execute_request_round_trips(calls: list[ToolCall], context: ToolContext) -> None:
    request = ExecuteRequest(calls=tuple(calls), context=context)
    assert structure(json.loads(json.dumps(unstructure(request))), ExecuteRequest) == request


@ENVELOPES
@given(results=st.lists(tool_results, max_size=4), specs=st.lists(tool_specs(), max_size=3))
def test_execute_response_and_listing_round_trip(
    results: list[ToolResult], specs: list[ToolSpec]
) -> None:
    response = ExecuteResponse(results=tuple(results))
    listing = ToolListing(tools=tuple(specs))
    assert structure(json.loads(json.dumps(unstructure(response))), ExecuteResponse) == response
    assert structure(json.loads(json.dumps(unstructure(listing))), ToolListing) == listing


@pytest.mark.anyio
async def test_blocking_sync_tool_times_out_without_stalling_other_requests() -> None:
    release = threading.Event()
    registry = ToolRegistry()

    @registry.tool()
    def block(_arguments: JSONObject, _context: ToolContext) -> JSON:
        """Block the calling thread until released."""
        release.wait(30)
        return "released"

    registry.register(*CONTRACT_TOOLS[0])
    server = HTTPToolServer(INPROCESS, app=make_app(registry, call_timeout_s=0.3), timeout_s=20)
    order: list[str] = []
    try:

        async def blocked() -> None:
            (result,) = await server.execute([ToolCall(id="b", name="block")], context=CONTEXT)
            order.append(f"block:{result.outcome.value}")

        async def echo() -> None:
            (result,) = await server.execute([_echo("free")], context=CONTEXT)
            order.append(f"echo:{result.outcome.value}")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(blocked)
                await anyio.sleep(0.05)
                group.start_soon(echo)
    finally:
        release.set()
        await server.aclose()
    assert order == ["echo:ok", "block:timeout"]


# ------------------------------------------------------------------------------------ lockstep


def test_the_fake_and_the_http_tool_servers_agree(served: ServedToolServer) -> None:
    """The same generated sequences on the fake, the in-process app and the loopback server:
    every batch's results must be the same on all three (and each checked on its own)."""

    @asynccontextmanager
    async def on_loopback() -> AsyncIterator[ToolServer]:
        server = HTTPToolServer(served.url, token=TOKEN, timeout_s=30)
        try:
            yield server
        finally:
            await server.aclose()

    run_tool_server_machine([fake, in_process, on_loopback], scale=0.05)


def test_the_fake_and_the_http_tool_server_agree_on_generated_tools() -> None:
    """Generated tool lists offered by the fake and by the in-process app: every listing and
    every batch's results must be the same on both (and each checked on its own)."""
    run_generated_tools_machine([fake_offering, in_process_offering], scale=0.3)
