"""The ``ToolServer`` port over an MCP server: a command line (stdio) or a URL (streamable HTTP).

::

    async with MCPToolServer(MCPCommand.parse("mcp-server-everything"), name="everything") as tools:
        specs = await tools.list_tools()
        results = await tools.execute(calls, context=ToolContext(trajectory_id="t1"))

How it holds its sessions. The SDK's transports and ``ClientSession`` are anyio context managers
with task groups inside; a cancel scope must be left in the task that entered it. So each MCP
session lives in a task of the adapter's own task group (entered by ``async with``), which opens
the transport, initializes, lists the tools, and then waits until the session is closed; calls
from any task go through the open session. Nothing of the SDK is ever entered in one task and left
in another.

The rules it keeps:

- ``scope``: ``SessionScope.RUN`` (default) is one session for the adapter's lifetime, shared by
  every trajectory, which the server tells apart by the context in each request's ``_meta``
  (``trajcore.adapters.mcp.protocol``). ``SessionScope.TRAJECTORY`` is one session per trajectory
  id, for stateful servers, opened on the trajectory's first call and closed by ``release``, by
  ``idle_close_s`` without calls, or by ``aclose``.
- Tools are listed once per session (every page). The first listing is what ``list_tools``
  returns; a session whose listing differs from it (a restarted server that changed) is refused.
- A call is checked against the listing before it is sent: an unknown tool or arguments that miss
  the schema are ``REJECTED`` naming the field, as in every trajcore tool server. The calls of one
  ``execute`` run one after another, in order; concurrent ``execute`` calls share the session.
- Results: see ``protocol.tool_result`` (``isError`` is ``TOOL_ERROR``). A JSON-RPC error the
  server sent is ``REJECTED`` for invalid params (-32602), ``TIMEOUT`` for a request timeout
  (-32001), ``INFRA_ERROR`` for a parse error or an invalid request (-32700, -32600: the exchange
  itself broke, which is also how the SDK reports an answer it cannot read) and ``TOOL_ERROR``
  otherwise, naming the code. A call past ``call_timeout_s`` is ``TIMEOUT`` (the SDK tells the
  server it was cancelled). A session that cannot be opened, a server that dies or breaks the
  protocol gives its calls ``INFRA_ERROR``; calls are never retried (a tool may have side effects).
- Over HTTP, the status of each call's own POST is kept for that call (a context variable the
  SDK carries to the task that sends it): 404 (the session is gone) and 5xx lose the session;
  another 4xx with a JSON-RPC error body is that error, without one it is ``INFRA_ERROR`` naming
  the status. The statuses of other requests (the optional GET stream, which a server may answer
  405) never decide a call's outcome.
- A session dies when its transport ends (a stdio server that exits, even between calls) or
  yields something that is not a JSON-RPC message (a malformed line): its calls in flight are
  ``INFRA_ERROR`` at once, and the next call opens it again (a stdio server is started again), at
  most ``max_restarts`` times per session over the adapter's lifetime; past that its calls are
  ``INFRA_ERROR`` saying so. A failed open counts as one.
- Deadlines: opening (initialize and listing) ``connect_timeout_s``; each call ``call_timeout_s``;
  closing a session is bounded by the SDK (stdin closed, then the process tree is killed) and
  shielded. The caller's cancellation propagates from ``execute``, never becomes a result, and
  leaves the session usable.
- ``execute`` raises only ``PoolClosed`` (after ``aclose``, or for a call cut short by it), and
  ``StateError`` when the adapter was never entered; ``list_tools`` raises ``ToolServerError`` when
  the session cannot be opened and ``WireError`` for a tool trajcore cannot take. ``aclose`` is
  idempotent.
- A stdio server's stderr goes to a temporary file; its last lines are quoted when it dies.
"""

from __future__ import annotations

import copy
import enum
import shlex
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import IO, Final, Self, TypeAlias, cast

import anyio
import anyio.abc
import attrs
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.adapters.mcp.protocol import context_meta, tool_result, tool_spec
from trajcore.adapters.mcp.transport import (
    EXCHANGE,
    Exchange,
    WatchedReadStream,
    note_post,
    refusal_in,
)
from trajcore.adapters.tool_server import ToolListing, check_tool_listing, rejected_result
from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, PoolClosed, StateError, ToolServerError, WireError
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec

__all__ = ["MCPURL", "MCPCommand", "MCPEndpoint", "MCPToolServer", "SessionScope"]

_STDERR_TAIL: Final = 600
_MAX_PAGES: Final = 100
_RUN_KEY: Final = ""
# JSON-RPC errors that say the exchange broke, not that the tool refused or failed; the SDK's
# HTTP transport also makes these up for an answer it cannot read (not JSON, not JSON-RPC, HTML).
_BROKENEXCHANGE: Final = frozenset({types.PARSE_ERROR, types.INVALID_REQUEST})


class SessionScope(enum.Enum):
    """Which calls share one MCP session."""

    RUN = "run"
    """One session for the adapter's lifetime, shared by every trajectory."""
    TRAJECTORY = "trajectory"
    """One session per trajectory id (for servers that keep state per session)."""


def _argv(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(p, str) and p for p in value)
    ):
        raise ConfigError(attribute.name, f"expected a non-empty command line, got {value!r}")


def _to_tuple(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_env(value: Mapping[str, str]) -> dict[str, str]:
    items: list[tuple[object, object]] = list(value.items())
    bad = [k for k, v in items if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ConfigError("env", f"names and values must be strings: {bad!r}")
    return dict(value)


@attrs.frozen(kw_only=True)
class MCPCommand:
    """An MCP server to start as a child process and speak to over its stdin and stdout.

    Attributes:
        argv: The program and its arguments.
        env: Variables set for the server, over the SDK's safe defaults (PATH, HOME, ...): the
            server does not inherit the rest of this process's environment.
        cwd: Its working directory (default: this process's).
    """

    argv: tuple[str, ...] = attrs.field(converter=_to_tuple, validator=_argv)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_to_env, hash=False)
    cwd: str | None = None

    @classmethod
    def parse(
        cls, command: str | Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> MCPCommand:
        """A command from a shell-like line (``"npx -y pkg --flag"``) or an argv list.

        Raises:
            ConfigError: at ``argv`` for an empty or unparsable line.
        """
        if isinstance(command, str):
            try:
                argv: Sequence[str] = shlex.split(command)
            except ValueError as exc:
                raise ConfigError("argv", f"cannot split {command!r}: {exc}") from None
        else:
            argv = command
        return cls(argv=tuple(argv), env=dict(env or {}))

    def describe(self) -> str:
        """The command line, for messages."""
        return shlex.join(self.argv)


def _http_url(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError(attribute.name, f"expected an http(s):// URL, got {value!r}")


@attrs.frozen(kw_only=True)
class MCPURL:
    """An MCP server reached over streamable HTTP.

    Attributes:
        url: Its endpoint (``https://host/mcp``).
        token: Sent as ``Authorization: Bearer <token>``; ``None`` sends none.
    """

    url: str = attrs.field(validator=_http_url)
    token: str | None = attrs.field(default=None, repr=False)

    def describe(self) -> str:
        """The URL, for messages."""
        return self.url


MCPEndpoint: TypeAlias = MCPCommand | MCPURL
"""Where an MCP server is: a command to start or a URL to reach."""


class _State(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    DEAD = "dead"
    RETIRED = "retired"


@attrs.define(eq=False)
class _Session:
    """One MCP session, run by a task of the adapter's task group (``MCPToolServer._serve``)."""

    key: str
    state: _State = _State.OPENING
    client: ClientSession | None = None
    specs: list[ToolSpec] = attrs.field(factory=list)
    failure: str | None = None
    in_flight: int = 0
    last_used: float = attrs.field(factory=time.monotonic)
    opened: anyio.Event = attrs.field(factory=anyio.Event)
    stop: anyio.Event = attrs.field(factory=anyio.Event)
    done: anyio.Event = attrs.field(factory=anyio.Event)
    stderr: IO[str] | None = None
    opening: Exchange = attrs.field(factory=Exchange)
    open_scope: anyio.CancelScope | None = None
    refusal: WireError | None = None

    def die(self, reason: str) -> None:
        if self.state in (_State.OPEN, _State.OPENING):
            self.state = _State.DEAD
            self.failure = reason
            if self.open_scope is not None:
                self.open_scope.cancel()
        self.stop.set()

    def hint(self, status: int | None = None) -> str:
        """What the transport saw beyond the SDK's message: an HTTP error status (``status``, of
        the request that failed), else the server's stderr."""
        if status is not None and status >= 400:
            why = ": check the bearer token" if status in (401, 403) else ""
            return f" (HTTP {status}{why})"
        return self.stderr_tail()

    def stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        try:
            self.stderr.flush()
            self.stderr.seek(0)
            text = self.stderr.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends: {' | '.join(text.splitlines()[-6:])}" if text else ""


_Streams: TypeAlias = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


def _key_names(keys: Iterable[str]) -> tuple[str, ...]:
    """``keys`` as a tuple; one string is refused (its letters would be the keys)."""
    if isinstance(keys, str):
        raise ConfigError("annotations", f"expected a list of keys, got the string {keys!r}")
    return tuple(keys)


@attrs.define
class MCPToolServer:
    """The ``ToolServer`` port over one MCP server. Use it as ``async with MCPToolServer(...)``.

    Attributes:
        endpoint: The server: ``MCPCommand`` (stdio) or ``MCPURL`` (streamable HTTP).
        name: What messages call it (default: the command line or URL).
        scope: Which calls share a session (``SessionScope``).
        call_timeout_s: Deadline of one tool call.
        connect_timeout_s: Deadline of opening a session (start, initialize, list the tools).
        max_restarts: How many times a session that died is opened again, per session.
        idle_close_s: Per-trajectory sessions without a call for this long are closed (``None``:
            only ``release`` and ``aclose`` close them). Ignored for ``SessionScope.RUN``.
        annotations: Keys the server's schemas use that are no keyword of their draft, read as
            annotations (nothing enforces them); any other such key refuses the listing.

    Raises:
        ConfigError: a field out of range, naming it.
    """

    endpoint: MCPEndpoint
    name: str = attrs.field(default="", kw_only=True)
    scope: SessionScope = attrs.field(default=SessionScope.RUN, kw_only=True)
    call_timeout_s: float = attrs.field(
        default=60.0, kw_only=True, validator=validators.positive_seconds
    )
    connect_timeout_s: float = attrs.field(
        default=30.0, kw_only=True, validator=validators.positive_seconds
    )
    max_restarts: int = attrs.field(default=3, kw_only=True, validator=validators.non_negative_int)
    idle_close_s: float | None = attrs.field(
        default=600.0, kw_only=True, validator=validators.optional_seconds
    )
    annotations: tuple[str, ...] = attrs.field(default=(), kw_only=True, converter=_key_names)
    _tasks: anyio.abc.TaskGroup | None = attrs.field(init=False, default=None, repr=False)
    _sessions: dict[str, _Session] = attrs.field(init=False, factory=dict, repr=False)
    _restarts: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _specs: list[ToolSpec] | None = attrs.field(init=False, default=None, repr=False)
    _by_name: dict[str, ToolSpec] = attrs.field(init=False, factory=dict, repr=False)
    _listing: anyio.Lock = attrs.field(init=False, factory=anyio.Lock, repr=False)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.endpoint, MCPCommand | MCPURL):
            raise ConfigError("endpoint", f"expected MCPCommand or MCPURL, got {self.endpoint!r}")
        if not isinstance(self.scope, SessionScope):
            raise ConfigError("scope", f"expected a SessionScope, got {self.scope!r}")
        if not self.name:
            self.name = self.endpoint.describe()

    # ------------------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> Self:
        if self._tasks is not None or self._closed:
            raise StateError(f"MCP server {self.name}: already entered or closed")
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.aclose()
        finally:
            if self._tasks is not None:
                # Only the session tasks are cancelled, and they catch their own faults: what
                # the caller's block raised propagates as it is, not wrapped in a group.
                self._tasks.cancel_scope.cancel()
                await self._tasks.__aexit__(None, None, None)

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` has been called."""
        return self._closed

    async def aclose(self) -> None:
        """Close every session (each bounded and shielded). Idempotent; later calls raise
        ``PoolClosed``."""
        if self._closed:
            return
        self._closed = True
        sessions = list(self._sessions.values())
        for session in sessions:
            session.stop.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.connect_timeout_s + 10):
            for session in sessions:
                await session.done.wait()

    async def release(self, trajectory_id: str) -> None:
        """Close the session of ``trajectory_id`` (``SessionScope.TRAJECTORY``); no-op otherwise."""
        session = self._sessions.get(trajectory_id)
        if self.scope is not SessionScope.TRAJECTORY or session is None:
            return
        del self._sessions[trajectory_id]
        self._restarts.pop(trajectory_id, None)
        if session.state is _State.OPEN:
            session.state = _State.RETIRED
        session.stop.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.connect_timeout_s + 10):
            await session.done.wait()

    # ------------------------------------------------------------------------------ the port

    async def list_tools(self) -> list[ToolSpec]:
        """The server's tools (the first listing, every page), in its order.

        Raises:
            ToolServerError: the server cannot be started, reached or initialized, or did not
                list its tools within ``connect_timeout_s``.
            WireError: a tool trajcore cannot take (``$.tools[i].name``) or listed twice.
            PoolClosed: after ``aclose``.
        """
        return list(await self._ensure_specs())

    async def execute(self, calls: Sequence[ToolCall], *, context: ToolContext) -> list[ToolResult]:
        """Run ``calls`` for ``context``, in order; one result per call (see the module's rules).

        Raises:
            PoolClosed: after ``aclose``, or for a call cut short by it.
            StateError: the adapter was never entered (``async with``).
        """
        calls = tuple(calls)
        self._check_open()
        if not calls:
            return []
        try:
            await self._ensure_specs()
        except (ToolServerError, WireError) as exc:
            return [ToolResult.failure(c, ToolOutcome.INFRA_ERROR, str(exc)) for c in calls]
        key = _RUN_KEY if self.scope is SessionScope.RUN else context.trajectory_id
        results: list[ToolResult] = []
        for call in calls:
            rejected = rejected_result(self._by_name.get(call.name), call)
            if rejected is not None:
                results.append(rejected)
                continue
            session = await self._session(key)
            if isinstance(session, str):
                results.append(ToolResult.failure(call, ToolOutcome.INFRA_ERROR, session))
            else:
                results.append(await self._call(session, call, context))
        return results

    # ------------------------------------------------------------------------------ sessions

    def _check_open(self) -> anyio.abc.TaskGroup:
        if self._closed:
            raise PoolClosed(f"MCP server {self.name}: the client is closed")
        if self._tasks is None:
            raise StateError(f"MCP server {self.name}: enter it first (async with MCPToolServer)")
        return self._tasks

    async def _ensure_specs(self) -> list[ToolSpec]:
        self._check_open()
        async with self._listing:
            if self._specs is not None:
                return self._specs
            key = _RUN_KEY if self.scope is SessionScope.RUN else "\0listing"
            session = await self._session(key)
            if isinstance(session, str):
                failed = self._sessions.get(key)
                if failed is not None and failed.refusal is not None:
                    raise failed.refusal
                raise ToolServerError(session)
            if self.scope is SessionScope.TRAJECTORY:
                # A per-trajectory server's tools are listed on a session of their own.
                session.state = _State.RETIRED
                session.stop.set()
                del self._sessions[key]
            return self._listed()

    def _listed(self) -> list[ToolSpec]:
        if self._specs is None:  # an open session has always accepted its listing
            raise ToolServerError(f"MCP server {self.name}: no tool listing")
        return self._specs

    async def _session(self, key: str) -> _Session | str:
        """The open session for ``key``, opened (again) as needed; a reason when there is none."""
        tasks = self._check_open()
        while True:
            session = self._sessions.get(key)
            if session is not None and session.state is _State.OPEN:
                return session
            if session is not None and session.state is _State.OPENING:
                await session.opened.wait()
                continue
            if session is not None and session.state is _State.DEAD:
                used = self._restarts.get(key, 0)
                if used >= self.max_restarts:
                    return (
                        f"MCP server {self.name} failed and was not started again "
                        f"(max_restarts={self.max_restarts} used): {session.failure}"
                    )
                self._restarts[key] = used + 1
            session = _Session(key=key)
            self._sessions[key] = session
            # The adapter's task opens it, so a caller cancelled meanwhile leaves it opening for
            # the next caller; opening is bounded by connect_timeout_s.
            tasks.start_soon(self._serve, session)
            await session.opened.wait()
            if session.state is _State.OPEN:
                return session
            if session.failure is not None:
                return session.failure
            return f"MCP server {self.name}: the session closed while it opened"

    async def _serve(self, session: _Session) -> None:
        """Open ``session``, report it opened (or failed), hold it until it is stopped."""
        started = False
        EXCHANGE.set(session.opening)  # this task's own context: the POSTs that open it

        def ended() -> None:
            if not session.stop.is_set():
                session.die(f"MCP server {self.name} closed the connection{session.hint()}")

        async def on_message(message: types.ServerNotification | Exception) -> None:
            if isinstance(message, Exception):
                session.die(f"MCP server {self.name} broke the protocol: {_describe(message)}")

        try:
            async with (
                self._open_streams(session) as (read, write),
                ClientSession(
                    WatchedReadStream(read, ended), write, message_handler=on_message
                ) as client,
            ):
                specs: list[ToolSpec] = []
                with anyio.move_on_after(self.connect_timeout_s) as opening:
                    session.open_scope = opening
                    await client.initialize()
                    specs = await self._list_all(client)
                    self._accept_listing(specs)
                session.open_scope = None
                if opening.cancelled_caught:
                    session.die(
                        f"MCP server {self.name} did not initialize and list its tools within "
                        f"{self.connect_timeout_s:g} s{session.hint(session.opening.status)}"
                    )
                    return
                session.client, session.specs = client, specs
                session.state = _State.OPEN
                session.opened.set()
                started = True
                await self._hold(session)
        except Exception as exc:  # noqa: BLE001 - whatever ends a session becomes its reason
            refusal = refusal_in(exc)
            if refusal is not None:
                session.refusal = refusal
                session.die(f"MCP server {self.name}: its tool listing was refused: {refusal}")
            else:
                verb = "failed" if started else "could not be started or reached"
                hint = session.hint(None if started else session.opening.status)
                session.die(f"MCP server {self.name} {verb}: {_describe(exc)}{hint}")
        finally:
            session.client = None
            if session.state in (_State.OPEN, _State.OPENING):
                # Closed by aclose, release or idleness (or cancelled while it opened).
                session.state = _State.RETIRED
                session.failure = session.failure or f"MCP server {self.name}: session closed"
            if session.stderr is not None:
                session.stderr.close()
            session.opened.set()
            session.done.set()

    @asynccontextmanager
    async def _open_streams(self, session: _Session) -> AsyncIterator[_Streams]:
        endpoint = self.endpoint
        if isinstance(endpoint, MCPCommand):
            session.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed when the session ends
            params = StdioServerParameters(
                command=endpoint.argv[0],
                args=list(endpoint.argv[1:]),
                env=dict(endpoint.env) or None,
                cwd=endpoint.cwd,
            )
            async with stdio_client(params, errlog=session.stderr) as streams:
                yield streams
            return
        headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        timeout = httpx2.Timeout(self.connect_timeout_s, read=self.call_timeout_s + 30)
        # The SDK turns an HTTP error into a generic JSON-RPC error; keep each POST's status.
        hooks = {"response": [note_post]}
        async with (
            httpx2.AsyncClient(
                headers=headers, timeout=timeout, trust_env=False, event_hooks=hooks
            ) as http,
            streamable_http_client(endpoint.url, http_client=http) as streams,
        ):
            yield streams

    async def _list_all(self, client: ClientSession) -> list[ToolSpec]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        else:
            raise WireError("$.nextCursor", f"the listing did not end within {_MAX_PAGES} pages")
        validator = JSONSchemaValidator(annotations=self.annotations)
        specs = [tool_spec(tool, i, validator) for i, tool in enumerate(tools)]
        check_tool_listing(ToolListing(tools=tuple(specs)))
        return specs

    def _accept_listing(self, specs: list[ToolSpec]) -> None:
        if self._specs is None:
            self._specs = specs
            self._by_name = {spec.name: spec for spec in specs}
        elif specs != self._specs:
            raise WireError("$.tools", "the server's tools changed since it first listed them")

    async def _hold(self, session: _Session) -> None:
        idle = self.idle_close_s if self.scope is SessionScope.TRAJECTORY else None
        while not session.stop.is_set():
            if idle is None:
                await session.stop.wait()
                return
            with anyio.move_on_after(idle):
                await session.stop.wait()
            if session.in_flight == 0 and time.monotonic() - session.last_used >= idle:
                session.state = _State.RETIRED
                self._sessions.pop(session.key, None)
                return

    # ------------------------------------------------------------------------------ one call

    async def _call(self, session: _Session, call: ToolCall, context: ToolContext) -> ToolResult:
        client = session.client
        if client is None:
            return ToolResult.failure(
                call, ToolOutcome.INFRA_ERROR, f"MCP server {self.name}: no session"
            )
        meta = cast("types.RequestParamsMeta", context_meta(context))
        exchange = Exchange()
        # The SDK sends the request's POST in a task that copies this context.
        token = EXCHANGE.set(exchange)
        session.in_flight += 1
        try:
            with anyio.move_on_after(self.call_timeout_s) as deadline:
                answer = await client.call_tool(
                    call.name, copy.deepcopy(dict(call.arguments)), meta=meta
                )
            if deadline.cancelled_caught:
                return ToolResult.failure(
                    call,
                    ToolOutcome.TIMEOUT,
                    f"ran past its {self.call_timeout_s:g} s limit @ {call.name}",
                )
        except MCPError as exc:
            status = exchange.status
            if exc.code == types.CONNECTION_CLOSED or session.stop.is_set():
                return self._lost(session, call, f"connection closed: {exc.message}", status)
            if status is not None and (status == 404 or status >= 500):
                return self._lost(session, call, exc.message, status)
            if exc.code in _BROKENEXCHANGE or (
                status is not None and status >= 400 and not exchange.json_body
            ):
                return ToolResult.failure(
                    call,
                    ToolOutcome.INFRA_ERROR,
                    f"MCP server {self.name} broke the protocol: MCP error {exc.code}: "
                    f"{exc.message} @ {call.name}{session.hint(status)}",
                )
            if exc.code == types.INVALID_PARAMS:
                return ToolResult.failure(
                    call, ToolOutcome.REJECTED, f"{exc.message} @ {call.name}"
                )
            if exc.code == types.REQUEST_TIMEOUT:
                return ToolResult.failure(call, ToolOutcome.TIMEOUT, f"{exc.message} @ {call.name}")
            return ToolResult.failure(
                call, ToolOutcome.TOOL_ERROR, f"MCP error {exc.code}: {exc.message}"
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            return self._lost(session, call, f"connection lost ({_describe(exc)})")
        except Exception as exc:  # noqa: BLE001 - the port raises only PoolClosed
            return ToolResult.failure(
                call,
                ToolOutcome.INFRA_ERROR,
                f"MCP server {self.name} broke the protocol: {_describe(exc)}",
            )
        finally:
            EXCHANGE.reset(token)
            session.in_flight -= 1
            session.last_used = time.monotonic()
        return tool_result(call, answer)

    def _lost(
        self, session: _Session, call: ToolCall, reason: str, status: int | None = None
    ) -> ToolResult:
        if self._closed:
            raise PoolClosed(f"MCP server {self.name}: closed during the call")
        if session.state is _State.DEAD and session.failure is not None:
            message = session.failure  # it died first (exited, broke the protocol): say why
        else:
            message = f"MCP server {self.name} failed during the call: {reason}"
            message += session.hint(status)
            session.die(message)
        return ToolResult.failure(call, ToolOutcome.INFRA_ERROR, message)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
