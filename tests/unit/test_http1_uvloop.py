"""The HTTP/1.1 client on uvloop (an env may run its event loop on it): uvloop's transports are
not subclasses of ``asyncio.Transport``, and the client speaks over them as over asyncio's,
over TCP and over a Unix socket, keeping its connection alive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from trajcore.adapters.http1.client import HTTPClient
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Origin, Reply, Request, parse_url

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with ``ANSWER`` until the client closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def two_requests(origin: Origin) -> tuple[list[tuple[int, bytes]], int]:
    """Two requests through one client: each answer's status and body, and the connections it
    opened."""
    client = HTTPClient()
    try:
        got = []
        for method in ("GET", "POST"):
            response = await client.request(method, origin, "/x", body=b"{}", timeout_s=5)
            got.append((response.status, response.body))
        return got, client.statistics().connections_opened
    finally:
        await client.aclose()


def on_uvloop(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with asyncio.timeout(5):
            await main()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(bounded())


def test_the_client_speaks_over_uvloops_tcp_transport() -> None:
    async def main() -> None:
        server = await asyncio.start_server(answer_each, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            origin, _ = parse_url(f"http://127.0.0.1:{port}")
            assert await two_requests(origin) == ([(200, b"hello"), (200, b"hello")], 1)

    on_uvloop(main)


def test_the_client_speaks_over_uvloops_unix_transport(tmp_path: Path) -> None:
    path = str(tmp_path / "server.sock")

    async def main() -> None:
        server = await asyncio.start_unix_server(answer_each, path)
        async with server:
            origin, _ = parse_url("http://slot-server", unix_path=path)
            assert await two_requests(origin) == ([(200, b"hello"), (200, b"hello")], 1)

    on_uvloop(main)


def test_the_server_answers_over_uvloops_transports(tmp_path: Path) -> None:
    """trajcore's own HTTP server on uvloop, over TCP and a Unix socket, keeping the connection
    alive for the client's second request (its fakes and the slot server serve on it)."""
    path = str(tmp_path / "server.sock")

    def hello(request: Request) -> Reply:
        return Reply(status=200, body=b"hello")

    async def main() -> None:
        server = HTTPServer(handler=hello)
        try:
            host, port = await server.listen_tcp("127.0.0.1", 0)
            await server.listen_unix(path)
            over_tcp, _ = parse_url(f"http://{host}:{port}")
            over_unix, _ = parse_url("http://slot-server", unix_path=path)
            for origin in (over_tcp, over_unix):
                assert await two_requests(origin) == ([(200, b"hello"), (200, b"hello")], 1)
        finally:
            await server.aclose()

    on_uvloop(main)
