"""``trajcore tool-server``: serve registered Python functions as external tools (or over MCP).

::

    trajcore tool-server --app my_tools:registry --listen 127.0.0.1:8765 --token-file token

An env author collects tools in a ``ToolRegistry`` (``from trajcore.env import ToolRegistry``;
defined in ``trajcore.adapters.tool_server``, where the fake uses it too)::

    registry = ToolRegistry()

    @registry.tool(parameters={"type": "object", "properties": {"q": {"type": "string"}},
                               "required": ["q"]})
    async def search(arguments: JSONObject, context: ToolContext) -> JSON:
        "Search the web."
        return await my_search(str(arguments["q"]))

and either serves it as a process (the command above) or, with ``tool_server_url="inprocess"``,
inside the env process: ``HTTPToolServer("inprocess", app=make_app(registry))`` speaks the very
same protocol to the app through an ASGI transport.

The app (a Starlette ASGI app) speaks the protocol described in ``trajcore.adapters.tool_server``:
``GET /v1/health`` (open), ``GET /v1/tools`` and ``POST /v1/execute`` (both behind the bearer
token when one is set; 401 without it). The rules it keeps:

- A request that is not the protocol is HTTP 400 naming the JSON path at fault; it runs nothing.
- A call is answered by ``run_tool``: an unknown tool or bad arguments are ``REJECTED``, an
  exception in the tool is ``TOOL_ERROR`` with the exception's message, a tool past
  ``call_timeout_s`` is ``TIMEOUT``. One bad tool never turns the request into a 500.
- The calls of one request run one after another in order; requests run concurrently. Sync tools
  run in worker threads so a blocking tool does not stall the server; past its timeout such a
  thread is abandoned, not killed (Python cannot kill a thread), so a sync tool that may hang
  should bound itself.

With ``--mcp`` it speaks the Model Context Protocol instead, so any MCP client can use the same
tools (``trajcore.adapters.mcp.server``; the SDK is the optional ``mcp`` extra)::

    trajcore tool-server --app my_tools:registry --mcp stdio
    trajcore tool-server --app my_tools:registry --mcp http --listen 127.0.0.1:8765 --token-file t

``--mcp stdio`` serves on stdin/stdout until stdin closes (exit 0) and takes neither ``--listen``
nor ``--token-file``; ``--mcp http`` serves streamable HTTP at ``/mcp`` behind the bearer token,
and its ready line's ``address`` is that endpoint and its ``protocol`` is ``"mcp"``.

When the process serves over HTTP, it prints one line of JSON on stdout, ``{"ready": true,
"address": "http://host:port", "pid": ..., "tools": N, "protocol": 1}``; ``--listen HOST:0`` picks
a free port and the line names it. SIGTERM or SIGINT stops it with status 0. A bad flag, an
``--app`` that is not a ``ToolRegistry``, an unreadable token file, or ``--mcp`` without the SDK
exits 2 with ``reason @ field`` on stderr.
"""

from __future__ import annotations

import argparse
import hmac
import importlib
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, ModuleType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from trajcore.adapters.tool_server import (
    PROTOCOL_VERSION,
    ASGIApp,
    ExecuteRequest,
    ExecuteResponse,
    ToolListing,
    ToolRegistry,
    ToolServerHealth,
    run_tool,
)
from trajcore.adapters.wire import structure, unstructure
from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, WireError
from trajcore.domain.json_values import JSON

__all__ = [
    "load_registry",
    "main",
    "make_app",
    "parse_args",
]


def _json_response(payload: JSON, status: int = 200) -> Response:
    # ASCII-escaped, so a tool's text with lone surrogates still makes valid UTF-8 JSON.
    return Response(json.dumps(payload), status_code=status, media_type="application/json")


def _problem(status: int, field: str, reason: str) -> Response:
    return _json_response({"error": f"{reason} @ {field}", "field": field}, status)


def make_app(
    registry: ToolRegistry, *, token: str | None = None, call_timeout_s: float = 60.0
) -> Starlette:
    """The ASGI app serving ``registry`` over the tool-server protocol.

    ``token`` guards ``/v1/tools`` and ``/v1/execute`` (``None``: no token, for in-process use
    only). ``call_timeout_s`` bounds each call.

    Raises:
        ConfigError: ``call_timeout_s`` not positive, or an empty ``token``.
    """
    validators.check_argument(validators.positive_seconds, "call_timeout_s", call_timeout_s)
    if token == "":
        raise ConfigError("token", "must not be empty (None means no token)")
    expected = f"Bearer {token}".encode() if token is not None else None

    def authorized(request: Request) -> bool:
        if expected is None:
            return True
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    def refused() -> Response:
        return _problem(401, "Authorization", "missing or wrong bearer token")

    async def health(_: Request) -> Response:
        answer = ToolServerHealth(status="ok", protocol=PROTOCOL_VERSION, tools=len(registry))
        return _json_response(unstructure(answer))

    async def tools(request: Request) -> Response:
        if not authorized(request):
            return refused()
        return _json_response(unstructure(ToolListing(tools=tuple(registry.specs()))))

    async def execute(request: Request) -> Response:
        if not authorized(request):
            return refused()
        try:
            data = json.loads(await request.body())
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            return _problem(400, "$", f"the body is not JSON: {exc}")
        try:
            batch = structure(data, ExecuteRequest)
        except WireError as exc:
            return _problem(400, exc.field, exc.reason)
        results = []
        for call in batch.calls:
            spec, handler = registry.lookup(call.name) or (None, None)
            results.append(
                await run_tool(spec, handler, call, batch.context, timeout_s=call_timeout_s)
            )
        return _json_response(unstructure(ExecuteResponse(results=tuple(results))))

    return Starlette(
        routes=[
            Route("/v1/health", health, methods=["GET"]),
            Route("/v1/tools", tools, methods=["GET"]),
            Route("/v1/execute", execute, methods=["POST"]),
        ]
    )


def load_registry(target: str) -> ToolRegistry:
    """Import ``module:attribute`` (looked for in the current directory too) and return it.

    Raises:
        ConfigError: at ``--app`` when the target is malformed, cannot be imported, or is not a
            ``ToolRegistry``.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigError("--app", f"expected module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:  # as ``python -m`` and ``trajcore run`` find one here
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("--app", f"cannot import {module_name!r}: {exc}") from None
    registry = getattr(module, attribute, None)
    if not isinstance(registry, ToolRegistry):
        found = type(registry).__name__
        raise ConfigError("--app", f"{target} is a {found}, not a ToolRegistry")
    return registry


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, parsed (argparse exits 2 on a malformed one)."""
    parser = argparse.ArgumentParser(
        prog="trajcore tool-server", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--app", required=True, help="module:attribute naming a ToolRegistry")
    parser.add_argument(
        "--mcp",
        choices=MCP_TRANSPORTS,
        default=None,
        help="speak MCP instead of trajcore's protocol: over stdin/stdout (stdio) or streamable "
        "HTTP at /mcp (http)",
    )
    parser.add_argument(
        "--listen", help="HOST:PORT to listen on; port 0 = any (not with --mcp stdio)"
    )
    parser.add_argument(
        "--token-file", type=Path, help="file holding the bearer token (not with --mcp stdio)"
    )
    parser.add_argument("--call-timeout-s", type=float, default=60.0, help="limit per call")
    args = parser.parse_args(argv)
    over_stdio = args.mcp == "stdio"
    for flag, value in (("--listen", args.listen), ("--token-file", args.token_file)):
        if over_stdio and value is not None:
            parser.error(f"{flag} has no use with --mcp stdio")
        if not over_stdio and value is None:
            parser.error(f"{flag} is required" + (" with --mcp http" if args.mcp else ""))
    return args


def _listen_address(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError("--listen", f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError("--token-file", f"cannot read: {exc.strerror}") from None
    if not token:
        raise ConfigError("--token-file", "the file is empty")
    return token


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT. Returns the exit status (0, or 2 on a bad configuration)."""
    args = parse_args(argv)
    app: ASGIApp
    try:
        registry = load_registry(args.app)
        if args.mcp == "stdio":
            return _serve_mcp_stdio(registry, call_timeout_s=args.call_timeout_s)
        host, port = _listen_address(args.listen)
        token = _read_token(args.token_file)
        if args.mcp == "http":
            app = _mcp_http_app(
                registry, token=token, host=host, call_timeout_s=args.call_timeout_s
            )
        else:
            app = make_app(registry, token=token, call_timeout_s=args.call_timeout_s)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except ConfigError as exc:
        sys.stderr.write(f"trajcore tool-server: {exc}\n")
        return 2
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
        ready = {
            "ready": True,
            "address": f"http://{shown}:{bound_port}",
            "pid": os.getpid(),
            "tools": len(registry),
            "protocol": "mcp" if args.mcp else PROTOCOL_VERSION,
        }
        if args.mcp:
            ready["address"] = f"{ready['address']}{MCP_PATH}"
        # The socket already listens: a client that reads this line and connects is queued
        # until uvicorn accepts.
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        # The MCP app's session manager runs in the ASGI lifespan.
        config = uvicorn.Config(
            app,
            lifespan="on" if args.mcp else "off",
            log_level="warning",
            access_log=False,
            loop="asyncio",
        )
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
        # handler it found; a no-op one makes that graceful stop exit with status 0.
        previous = {sig: signal.signal(sig, _ignore_signal) for sig in _STOP_SIGNALS}
        try:
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except OSError as exc:
        sys.stderr.write(f"trajcore tool-server: {exc} @ --listen\n")
        return 2
    finally:
        sock.close()
    return 0


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

MCP_TRANSPORTS = ("stdio", "http")
MCP_PATH = "/mcp"


def _mcp_server_module() -> ModuleType:
    """``trajcore.adapters.mcp.server``, imported only when MCP is asked for (the SDK is the
    optional ``mcp`` extra).

    Raises:
        ConfigError: at ``--mcp`` when the SDK is not installed.
    """
    try:
        return importlib.import_module("trajcore.adapters.mcp.server")
    except ImportError as exc:
        raise ConfigError(
            "--mcp", f"needs the MCP SDK: pip install 'trajcore[mcp]' ({exc})"
        ) from None


def _serve_mcp_stdio(registry: ToolRegistry, *, call_timeout_s: float) -> int:
    """Serve ``registry`` over MCP on stdin/stdout until stdin closes; returns 0."""
    serve_stdio = _mcp_server_module().serve_stdio
    serve_stdio(registry, call_timeout_s=call_timeout_s)
    return 0


def _mcp_http_app(
    registry: ToolRegistry, *, token: str, host: str, call_timeout_s: float
) -> ASGIApp:
    app: ASGIApp = _mcp_server_module().streamable_http_app(
        registry, token=token, host=host, path=MCP_PATH, call_timeout_s=call_timeout_s
    )
    return app


def _ignore_signal(_signum: int, _frame: FrameType | None) -> None:
    """Stand-in for the default handler, called once uvicorn has already stopped."""


if __name__ == "__main__":
    sys.exit(main())
