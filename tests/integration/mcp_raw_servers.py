"""Two MCP servers written without the SDK, whose tools break the protocol on purpose, for
``test_mcp_faults.py``. Run as ``python mcp_raw_servers.py stdio [schema=<json>]`` (one JSON-RPC
message a line on stdin and stdout) or ``python mcp_raw_servers.py http <get-status>`` (streamable
HTTP with JSON answers and a session id; prints its port, then serves; the optional GET stream is
answered with ``get-status``, which the spec lets be 405).

The tools (every one takes ``{"x": string}``):

- ``echo``: a text result. ``pid``: the server's process id (stdio).
- ``err32602``: a JSON-RPC invalid-params error; ``err400``: the same at HTTP 400 (HTTP).
- ``garbage``: a line or body that is not JSON; ``html``: a ``text/html`` page (HTTP);
  ``e500``: HTTP 500 with a text body; ``e404``: HTTP 404, the session is gone (HTTP).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}
NAMES = ["echo", "pid", "err32602", "err400", "garbage", "html", "e500", "e404"]


def listing(extra_schema: str | None) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [
        {"name": n, "description": n, "inputSchema": SCHEMA} for n in NAMES
    ]
    if extra_schema is not None:
        tools.append(
            {"name": "schema", "description": "s", "inputSchema": json.loads(extra_schema)}
        )
    return tools


def answer(request: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The answer to a request that needs no fault; ``None`` for a notification or a response."""
    ident, method = request.get("id"), request.get("method")
    if ident is None or method is None:
        return None
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call":
        name = request["params"]["name"]
        if name == "err32602":
            error = {"code": -32602, "message": "x is too long"}
            return {"jsonrpc": "2.0", "id": ident, "error": error}
        text = str(os.getpid()) if name == "pid" else "echo"
        result = {"content": [{"type": "text", "text": text}]}
    else:
        result = {}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def serve_stdio(options: dict[str, str]) -> None:
    tools = listing(options.get("schema"))
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("method") == "tools/call" and request["params"]["name"] == "garbage":
            sys.stdout.write("this is not json\n")
        else:
            reply = answer(request, tools)
            if reply is None:
                continue
            sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def serve_http(get_status: int) -> None:
    tools = listing(None)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def send(self, status: int, body: bytes = b"", content_type: str = "application/json",
                 session: bool = False) -> None:  # fmt: skip
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if session:
                self.send_header("Mcp-Session-Id", "session-1")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self.send(get_status)

        def do_DELETE(self) -> None:
            self.send(200)

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            name = request["params"]["name"] if request.get("method") == "tools/call" else None
            if name == "err400":
                error = {"code": -32602, "message": "x is too long"}
                body = {"jsonrpc": "2.0", "id": request["id"], "error": error}
                self.send(400, json.dumps(body).encode())
            elif name == "garbage":
                self.send(200, b"{not json")
            elif name == "html":
                self.send(200, b"<html>sign in</html>", "text/html")
            elif name in ("e500", "e404"):
                self.send(int(name[1:]), b"oops", "text/plain")
            else:
                reply = answer(request, tools)
                if reply is None:
                    self.send(202)
                else:
                    initialize = request.get("method") == "initialize"
                    self.send(200, json.dumps(reply).encode(), session=initialize)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # until the test closes our stdin (or dies)
    server.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        serve_stdio(dict(a.split("=", 1) for a in sys.argv[2:]))
    else:
        serve_http(int(sys.argv[2]))
