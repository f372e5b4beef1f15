"""A ``ToolRegistry`` served over MCP: what ``trajcore tool-server --mcp`` runs.

``make_mcp_server(registry)`` is an SDK low-level ``Server`` whose tools are the registry's specs
(the JSON schema is the MCP ``inputSchema``, as is) and whose calls run through ``run_tool``, the
same function the HTTP tool server uses, so a tool behaves the same over either protocol. The
rules it keeps:

- A call's context comes from the request's ``_meta`` (``protocol.CONTEXT_META_KEY``); a client
  that sends none (any MCP client but trajcore's) calls as trajectory ``"mcp-client"``.
- Every trajcore outcome is an MCP tool result, never a JSON-RPC error: ``OK`` is a text result;
  ``REJECTED``, ``TOOL_ERROR`` and ``TIMEOUT`` are ``isError`` results whose text is what the model
  sees (``Error: ...``). The outcome and error also ride in the result's ``_meta``
  (``protocol.OUTCOME_META_KEY``) so trajcore's client keeps ``REJECTED`` and ``TIMEOUT`` apart
  from ``TOOL_ERROR``; other clients ignore it.
- ``bearer_guard`` wraps the streamable-HTTP app: every request without ``Authorization: Bearer
  <token>`` is answered 401 before the SDK sees it.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from trajcore.adapters.mcp.protocol import context_from_meta, outcome_meta
from trajcore.adapters.tool_server import ASGIApp, ToolRegistry, run_tool
from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, WireError
from trajcore.domain.json_values import JSONObject, check_json
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

__all__ = ["bearer_guard", "make_mcp_server", "serve_stdio", "streamable_http_app"]

# The SDK types its handler context over the server's lifespan value, which is Any by default.
_Context = ServerRequestContext[Any]


def make_mcp_server(
    registry: ToolRegistry, *, name: str = "trajcore", call_timeout_s: float = 60.0
) -> Server[Any]:
    """An MCP server offering ``registry``'s tools, each call bounded by ``call_timeout_s``.

    Raises:
        ConfigError: ``call_timeout_s`` not positive.
    """
    validators.check_argument(validators.positive_seconds, "call_timeout_s", call_timeout_s)

    async def list_tools(
        _ctx: _Context, _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec.name, description=spec.description, input_schema=dict(spec.parameters)
                )
                for spec in registry.specs()
            ]
        )

    async def call_tool(
        _ctx: _Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        arguments: object = params.arguments if params.arguments is not None else {}
        call_id = "mcp"
        meta: dict[str, object] | None = dict(params.meta) if params.meta is not None else None
        problem = check_json(arguments)
        if problem or not isinstance(arguments, dict):
            reason = problem or "arguments must be an object"
            return _as_mcp(
                ToolResult(
                    call_id=call_id,
                    name=params.name,
                    outcome=ToolOutcome.REJECTED,
                    content=f"Error: {reason}",
                    error=reason,
                )
            )
        call = ToolCall(id=call_id, name=params.name, arguments=_json_object(arguments))
        try:
            context = context_from_meta(meta)
        except WireError as exc:
            return _as_mcp(ToolResult.failure(call, ToolOutcome.REJECTED, str(exc)))
        spec, handler = registry.lookup(call.name) or (None, None)
        result = await run_tool(spec, handler, call, context, timeout_s=call_timeout_s)
        return _as_mcp(result)

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def _json_object(value: dict[Any, Any]) -> JSONObject:
    # check_json proved every key a string and every value JSON.
    return {str(key): item for key, item in value.items()}


def _as_mcp(result: ToolResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=result.content)],
        is_error=not result.ok,
        _meta=outcome_meta(result),
    )


def bearer_guard(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` behind ``Authorization: Bearer <token>`` (HTTP 401 with a JSON reason otherwise).

    Raises:
        ConfigError: an empty ``token``.
    """
    if not token:
        raise ConfigError("token", "must not be empty")
    expected = f"Bearer {token}".encode()
    refusal = json.dumps(
        {"error": "missing or wrong bearer token @ Authorization", "field": "Authorization"}
    ).encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if hmac.compare_digest(given, expected):
            await app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": refusal})

    return guarded


def serve_stdio(registry: ToolRegistry, *, call_timeout_s: float = 60.0) -> None:
    """Serve ``registry`` over MCP on this process's stdin and stdout until stdin closes."""
    server = make_mcp_server(registry, call_timeout_s=call_timeout_s)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)


def streamable_http_app(
    registry: ToolRegistry,
    *,
    token: str,
    host: str = "127.0.0.1",
    path: str = "/mcp",
    call_timeout_s: float = 60.0,
) -> ASGIApp:
    """The streamable-HTTP ASGI app serving ``registry`` at ``path``, behind the bearer ``token``.

    Its session manager runs in the ASGI lifespan (serve it with lifespan on). ``host`` is where
    it listens: on a loopback host the SDK also refuses requests whose Host or Origin header names
    another host (DNS rebinding).

    Raises:
        ConfigError: an empty ``token`` or a non-positive ``call_timeout_s``.
    """
    server = make_mcp_server(registry, call_timeout_s=call_timeout_s)
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    return bearer_guard(app, token)
