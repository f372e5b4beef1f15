"""External tools over HTTP: the tool-server protocol, how a tool call runs, and the client.

A tool server offers tools that do not run in a sandbox slot (search, web APIs, plain Python
functions). This module holds everything about them that both ends share, so the server app
(``trajcore.entrypoints.tool_server``), the in-memory ``FakeToolServer`` and the client below keep
one behaviour:

- The protocol, version 1, JSON over HTTP with a bearer token (``Authorization: Bearer <token>``)::

      GET  /v1/health    -> {"status": "ok", "protocol": 1, "tools": N}        (no token needed)
      GET  /v1/tools     -> {"tools": [ToolSpec, ...]}
      POST /v1/execute   {"calls": [ToolCall, ...], "context": ToolContext}
                         -> {"results": [ToolResult, ...]}   one per call, in order

  A missing or wrong token is HTTP 401; a malformed request is HTTP 400 with
  ``{"error": "reason @ $.path", "field": "$.path"}``. The shapes are the values of
  ``trajcore.domain.tools`` as ``trajcore.adapters.wire`` writes them.
- The tools: a ``ToolRegistry`` maps names to a ``ToolSpec`` and a handler, a sync or async
  function ``(arguments, context) -> JSON``; the server app and the fake both serve one.
- How one call runs (``run_tool``): an unknown tool or arguments that miss the tool's schema are a
  ``REJECTED`` result naming the field (``required @ add.b``); a tool that raises is a
  ``TOOL_ERROR`` result carrying the exception's message; a tool that runs past its per-call
  timeout is a ``TIMEOUT`` result. A tool returns a string (the model sees it as is) or any JSON
  value (the model sees it as JSON text). The calls of one request run one after another, in
  order, because the calls of one trajectory may depend on each other's side effects.

``HTTPToolServer`` is the ``ToolServer`` port's HTTP adapter. It speaks to a server at a URL, or,
with ``url="inprocess"`` and an ASGI ``app``, to that app inside this process through
``httpx.ASGITransport``: the same protocol, the same codec, no socket. The client is httpx: tool
calls are few next to LLM and slot calls, so its per-request cost (which grows with concurrency)
does not matter here, and its ASGI transport gives the in-process mode for free. The rules it
keeps:

- ``execute`` raises only ``PoolClosed``. Everything else that goes wrong becomes the results:
  a server that cannot be reached, refuses the token, answers an HTTP error, crashes mid-request or
  does not answer within ``timeout_s`` gives every call an ``INFRA_ERROR`` result saying why; an
  answer that breaks the protocol does too, its error reading ``reason @ $.results[0].outcome``.
  Calls are never retried: a tool may have side effects.
- ``list_tools`` raises ``ToolServerError`` for the same server failures and ``WireError`` (with
  the JSON path) for a malformed answer.
- Each request has a deadline of ``timeout_s``, and an ``execute`` request ``call_timeout_s`` more
  per call it carries (the server runs them one after another, each bounded by its own per-call
  limit, which ``call_timeout_s`` should match): a tool past the server's limit comes back as the
  server's ``TIMEOUT`` result, never cut short by the client. The caller's own anyio cancel scope
  is honoured as well (a cancelled ``execute`` raises the cancellation, never a result).
- ``aclose`` is idempotent; any call after it raises ``PoolClosed``.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import partial
from typing import Any, Final, TypeAlias, TypeVar

import anyio
import anyio.to_thread
import attrs
import httpx

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.adapters.wire import structure, unstructure
from trajcore.domain import validators
from trajcore.domain.errors import (
    ConfigError,
    PoolClosed,
    ToolArgumentError,
    ToolServerError,
    WireError,
)
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec

__all__ = [
    "INPROCESS",
    "PROTOCOL_VERSION",
    "ASGIApp",
    "ExecuteRequest",
    "ExecuteResponse",
    "HTTPToolServer",
    "ToolHandler",
    "ToolListing",
    "ToolRegistry",
    "ToolServerHealth",
    "check_answers",
    "check_tool_listing",
    "rejected_result",
    "run_tool",
]

PROTOCOL_VERSION: Final = 1
INPROCESS: Final = "inprocess"
"""The ``tool_server_url`` that means: run the registered tools inside this process."""

ToolHandler: TypeAlias = Callable[[JSONObject, ToolContext], "JSON | Awaitable[JSON]"]
"""A tool: a sync or async function of the decoded arguments and the caller's context."""

# The ASGI application shape (scope, receive, send), as httpx's ASGI transport calls it. ASGI
# messages are untyped mappings by definition; the ``Any`` stays inside this alias.
_ASGIMessage: TypeAlias = MutableMapping[str, Any]
ASGIApp: TypeAlias = Callable[
    [
        _ASGIMessage,
        Callable[[], Awaitable[_ASGIMessage]],
        Callable[[_ASGIMessage], Awaitable[None]],
    ],
    Awaitable[None],
]


# ------------------------------------------------------------------------------- protocol values


@attrs.frozen(kw_only=True)
class ToolListing:
    """The answer to ``GET /v1/tools``.

    Attributes:
        tools: Every tool the server offers.
    """

    tools: tuple[ToolSpec, ...]


@attrs.frozen(kw_only=True)
class ExecuteRequest:
    """The body of ``POST /v1/execute``.

    Attributes:
        calls: The calls to run, in order.
        context: The trajectory (and slot) they run for.
    """

    calls: tuple[ToolCall, ...]
    context: ToolContext


@attrs.frozen(kw_only=True)
class ExecuteResponse:
    """The answer to ``POST /v1/execute``.

    Attributes:
        results: One result per call of the request, in the same order.
    """

    results: tuple[ToolResult, ...]


@attrs.frozen(kw_only=True)
class ToolServerHealth:
    """The answer to ``GET /v1/health``.

    Attributes:
        status: ``"ok"`` when the server serves.
        protocol: The protocol version it speaks.
        tools: How many tools it offers.
    """

    status: str
    protocol: int
    tools: int


def check_answers(calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> None:
    """Check that ``results`` answer ``calls`` one to one, in order.

    Raises:
        WireError: at ``$.results`` for a wrong count, at ``$.results[i].call_id`` for a result
            that answers another call, at ``$.results[i].sandbox_budget`` for a result that
            says a lease was ended (a slot server's marker: it would end the trajectory with
            the env's fixed score, its score hook never called).
    """
    if len(results) != len(calls):
        raise WireError("$.results", f"expected {len(calls)} results, got {len(results)}")
    for i, (call, result) in enumerate(zip(calls, results, strict=True)):
        if result.call_id != call.id:
            raise WireError(
                f"$.results[{i}].call_id", f"answers call {result.call_id!r}, not {call.id!r}"
            )
        if result.sandbox_budget is not None:
            raise WireError(
                f"$.results[{i}].sandbox_budget",
                "only a slot server ends a lease for its budget; a tool server cannot say so",
            )


def check_tool_listing(listing: ToolListing) -> None:
    """Raise ``WireError`` at ``$.tools[i].name`` for a tool name listed twice."""
    seen: set[str] = set()
    for i, spec in enumerate(listing.tools):
        if spec.name in seen:
            raise WireError(f"$.tools[{i}].name", f"tool {spec.name!r} is listed twice")
        seen.add(spec.name)


# ----------------------------------------------------------------------- tools and running a call


_Handler = TypeVar("_Handler", bound=ToolHandler)


@attrs.define
class ToolRegistry:
    """The Python tools one tool server offers, by name, in registration order."""

    _tools: dict[str, tuple[ToolSpec, ToolHandler]] = attrs.field(init=False, factory=dict)

    def register(self, spec: ToolSpec, handler: ToolHandler) -> None:
        """Offer ``spec``, answered by ``handler`` (sync or async, ``(arguments, context)``).

        Raises:
            ConfigError: a tool of that name is already registered (field ``name``).
        """
        if spec.name in self._tools:
            raise ConfigError("name", f"tool {spec.name!r} is already registered")
        self._tools[spec.name] = (spec, handler)

    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: JSONObject | None = None,
    ) -> Callable[[_Handler], _Handler]:
        """Decorator: register the function as a tool and return it unchanged.

        ``name`` defaults to the function's name, ``description`` to the first line of its
        docstring, ``parameters`` to an object schema without properties.

        Raises:
            ConfigError: an invalid name or schema, or a name already registered.
        """

        def decorate(handler: _Handler) -> _Handler:
            doc = (handler.__doc__ or "").strip().splitlines()
            spec = ToolSpec(
                name=name if name is not None else getattr(handler, "__name__", ""),
                description=description if description is not None else (doc[0] if doc else ""),
                parameters=parameters
                if parameters is not None
                else {"type": "object", "properties": {}},
                validator=JSONSchemaValidator(),
            )
            self.register(spec, handler)
            return handler

        return decorate

    def specs(self) -> list[ToolSpec]:
        """Every registered spec, in registration order."""
        return [spec for spec, _ in self._tools.values()]

    def lookup(self, name: str) -> tuple[ToolSpec, ToolHandler] | None:
        """The spec and handler of tool ``name``, or ``None``."""
        return self._tools.get(name)

    def __len__(self) -> int:
        return len(self._tools)


def rejected_result(spec: ToolSpec | None, call: ToolCall) -> ToolResult | None:
    """The ``REJECTED`` result for ``call`` if it must not run, else ``None``.

    ``spec`` is the called tool's spec, ``None`` when the server has no such tool. The error names
    the field at fault: ``unknown tool 'x' @ name`` or ``required @ add.b`` (every problem, joined
    by ``; ``).
    """
    if spec is None:
        return ToolResult.unknown_tool(call)
    problems = spec.validate_arguments(call.arguments)
    if not problems:
        return None
    error = "; ".join(f"{p.reason} @ {call.name}{p.path[1:]}" for p in problems)
    return ToolResult.failure(call, ToolOutcome.REJECTED, error)


async def run_tool(
    spec: ToolSpec | None,
    handler: ToolHandler | None,
    call: ToolCall,
    context: ToolContext,
    *,
    timeout_s: float,
    sync_in_thread: bool = True,
) -> ToolResult:
    """Run one call through ``handler`` and say how it went; never raises for the tool's faults.

    ``spec``/``handler`` are ``None`` for an unknown tool. The handler gets a deep copy of the
    arguments. A sync handler runs in a worker thread when ``sync_in_thread`` (so a blocking tool
    does not stall the event loop; past its timeout the thread is abandoned, not killed) and
    inline otherwise. Cancellation of the caller propagates.

    Returns:
        ``REJECTED`` (unknown tool, arguments that miss the schema, or the tool raised
        ``ToolArgumentError``), ``TOOL_ERROR`` (the tool raised, or returned a non-JSON value),
        ``TIMEOUT`` (it ran past ``timeout_s``) or ``OK`` with the tool's answer as content.
    """
    rejected = rejected_result(spec, call)
    if rejected is not None:
        return rejected
    if handler is None:
        return ToolResult.failure(
            call, ToolOutcome.REJECTED, f"no handler for {call.name!r} @ name"
        )
    arguments = copy.deepcopy(call.arguments)
    with anyio.move_on_after(timeout_s) as scope:
        try:
            answer = await _invoke(handler, arguments, context, sync_in_thread=sync_in_thread)
        except ToolArgumentError as exc:
            return ToolResult.failure(call, ToolOutcome.REJECTED, f"{exc.reason} @ {exc.field}")
        except Exception as exc:  # noqa: BLE001 - whatever a tool raises is that call's result
            return ToolResult.failure(call, ToolOutcome.TOOL_ERROR, _describe_exception(exc))
    if scope.cancelled_caught:
        return ToolResult.failure(
            call, ToolOutcome.TIMEOUT, f"ran past its {timeout_s:g} s limit @ {call.name}"
        )
    return _ok_result(call, answer)


async def _invoke(
    handler: ToolHandler, arguments: JSONObject, context: ToolContext, *, sync_in_thread: bool
) -> object:
    if inspect.iscoroutinefunction(handler) or not sync_in_thread:
        answer: object = handler(arguments, context)
    else:
        answer = await anyio.to_thread.run_sync(
            partial(handler, arguments, context), abandon_on_cancel=True
        )
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


def _describe_exception(exc: Exception) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _ok_result(call: ToolCall, answer: object) -> ToolResult:
    if isinstance(answer, str):
        content = answer
    elif answer is None:
        content = ""
    else:
        problem = check_json(answer)
        if problem:
            return ToolResult.failure(
                call, ToolOutcome.TOOL_ERROR, f"the tool returned {problem.replace('$', 'result')}"
            )
        content = json.dumps(answer, ensure_ascii=False)
    return ToolResult.success(call, content)


# ----------------------------------------------------------------------------------- the client


@attrs.define
class HTTPToolServer:
    """The ``ToolServer`` port over HTTP, or over ASGI inside this process.

    Attributes:
        url: The server's base URL (``http://host:port``), or ``"inprocess"`` to call ``app``.
        token: The bearer token; ``None`` sends none (for a server that wants none).
        timeout_s: Deadline of one request (connect, answer); an ``execute`` request gets
            ``call_timeout_s`` more per call it carries.
        call_timeout_s: The server's per-call limit (``make_app``'s ``call_timeout_s``, ``trajcore
            tool-server --call-timeout-s``); ``None``: ``timeout_s`` bounds a whole request.
        app: The ASGI app to call when ``url`` is ``"inprocess"``
            (``trajcore.entrypoints.tool_server.make_app``); must be ``None`` otherwise.
        transport: An httpx transport to use instead of the network (tests, custom proxies).

    Raises:
        ConfigError: a malformed ``url``, a non-positive ``timeout_s`` or ``call_timeout_s``,
            ``"inprocess"`` without
            an ``app``, or an ``app`` with a network URL.
    """

    url: str
    token: str | None = attrs.field(default=None, kw_only=True, repr=False)
    timeout_s: float = attrs.field(
        default=60.0, kw_only=True, validator=validators.positive_seconds
    )
    call_timeout_s: float | None = attrs.field(
        default=None, kw_only=True, validator=validators.optional_seconds
    )
    app: ASGIApp | None = attrs.field(default=None, kw_only=True, repr=False)
    transport: httpx.AsyncBaseTransport | None = attrs.field(default=None, kw_only=True, repr=False)
    _client: httpx.AsyncClient = attrs.field(init=False, repr=False)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        transport = self.transport
        if self.url == INPROCESS:
            if self.app is None:
                raise ConfigError("app", "url 'inprocess' needs the ASGI app to call")
            transport = transport or httpx.ASGITransport(app=self.app)
            base_url = "http://inprocess"
        else:
            if self.app is not None:
                raise ConfigError("app", "an ASGI app is only called when url is 'inprocess'")
            if not self.url.startswith(("http://", "https://")):
                raise ConfigError(
                    "url", f"expected http(s)://host:port or 'inprocess', got {self.url!r}"
                )
            base_url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(self.timeout_s),
            trust_env=False,
        )

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` has been called."""
        return self._closed

    async def health(self) -> ToolServerHealth:
        """The server's health answer.

        Raises:
            ToolServerError: unreachable, HTTP error, no answer in time. WireError: malformed.
            PoolClosed: after ``aclose``.
        """
        return structure(await self._request("GET", "/v1/health"), ToolServerHealth)

    async def list_tools(self) -> list[ToolSpec]:
        """The tools the server offers, in its order.

        Raises:
            ToolServerError: the server is unreachable, refused the token, answered an HTTP error
                or did not answer within ``timeout_s``.
            WireError: the answer is malformed; ``field`` is its JSON path (``$.tools[1].name``).
            PoolClosed: after ``aclose``.
        """
        listing = structure(await self._request("GET", "/v1/tools"), ToolListing)
        check_tool_listing(listing)
        return list(listing.tools)

    async def execute(self, calls: Sequence[ToolCall], *, context: ToolContext) -> list[ToolResult]:
        """Run ``calls`` for ``context`` on the server; one result per call, in order.

        Returns:
            The server's results; when the server fails or breaks the protocol, an
            ``INFRA_ERROR`` result per call whose error says why.

        Raises:
            PoolClosed: after ``aclose`` (and for a call cut short by it).
        """
        calls = tuple(calls)
        if self._closed:
            raise PoolClosed("the tool server client is closed")
        if not calls:
            return []
        body = unstructure(ExecuteRequest(calls=calls, context=context))
        deadline = self.timeout_s + len(calls) * (self.call_timeout_s or 0.0)
        try:
            answer = structure(
                await self._request("POST", "/v1/execute", body, timeout_s=deadline),
                ExecuteResponse,
            )
            check_answers(calls, answer.results)
        except (ToolServerError, WireError) as exc:
            reason = (
                f"tool server broke the protocol: {exc}" if isinstance(exc, WireError) else str(exc)
            )
            return ToolResult.infra_errors(calls, reason)
        return list(answer.results)

    async def release(self, trajectory_id: str) -> None:
        """Nothing to end: the tool server's protocol keeps no state per trajectory."""
        del trajectory_id

    async def aclose(self) -> None:
        """Close the connections. Idempotent; later calls raise ``PoolClosed``."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._client.aclose()

    async def _request(
        self, method: str, path: str, body: JSON = None, *, timeout_s: float | None = None
    ) -> object:
        """Send one request and decode its JSON answer, within ``timeout_s`` (default: the
        client's ``timeout_s``).

        Raises:
            PoolClosed, ToolServerError, WireError (at ``$`` for a body that is not JSON).
        """
        if self._closed:
            raise PoolClosed("the tool server client is closed")
        where = f"tool server {self.url}"
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if content is not None else None
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            with anyio.fail_after(limit):
                response = await self._client.request(
                    method, path, content=content, headers=headers, timeout=httpx.Timeout(limit)
                )
        except TimeoutError as exc:
            raise ToolServerError(f"{where} did not answer {path} within {limit:g} s") from exc
        except (httpx.HTTPError, RuntimeError) as exc:
            if self._closed:
                raise PoolClosed("the tool server client was closed during the call") from exc
            if isinstance(exc, RuntimeError):
                raise
            raise ToolServerError(f"{where} failed on {path}: {_describe_exception(exc)}") from exc
        if response.status_code == 401:
            raise ToolServerError(
                f"{where} refused the bearer token on {path} (HTTP 401): check token / --token-file"
            )
        if response.status_code != 200:
            raise ToolServerError(
                f"{where} answered HTTP {response.status_code} on {path}: {response.text[:300]}"
            )
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise WireError("$", f"the answer to {path} is not JSON: {exc}") from exc
