"""The HTTP/1.1 server's ``Later`` replies: given from a plain callback, answered inside it.

A handler that returns ``Later`` is answered when it calls ``give`` (no task): in order with
the connection's other requests, with a 500 for a maker that raises, unanswered (the connection
ended) for one that raises ``AbortConnection``, and waited for by ``aclose`` up to its grace,
after which it is dropped.
Every test runs against a real server on loopback, bounded by a deadline of a few seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from trajcore.adapters.http1.server import AbortConnection, HTTPServer
from trajcore.adapters.http1.values import Handler, Later, Reply, Request

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[int, HTTPServer]]:
    server = HTTPServer(handler)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    try:
        yield port, server
    finally:
        await server.aclose(grace_s=1)


def body_reply(text: str) -> Callable[[], Reply]:
    return lambda: Reply(body=text.encode(), content_type="text/plain")


async def read_replies(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The bodies of ``count`` responses (each framed by ``Content-Length``)."""
    bodies = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        bodies.append(head.split(b" ", 2)[1] + b" " + await reader.readexactly(length))
    return bodies


def later_after(delays: dict[str, float]) -> Handler:
    """Answers each path with its own text, given from a timer after ``delays[path]`` s."""

    def handle(request: Request) -> Later:
        later = Later()
        give = later.give
        asyncio.get_running_loop().call_later(delays[request.path], give, body_reply(request.path))
        return later

    return handle


async def test_a_later_reply_is_answered_when_given_and_in_the_connection_s_order() -> None:
    async with serving(later_after({"/slow": 0.1, "/fast": 0.0})) as (port, _):
        with anyio.fail_after(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
            writer.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
            assert await read_replies(reader, 2) == [b"200 /slow", b"200 /fast"]
            writer.close()


async def test_a_later_given_before_the_server_took_it_is_answered_once() -> None:
    made: list[str] = []

    def handle(request: Request) -> Later:
        later = Later()

        def make() -> Reply:
            made.append(request.path)
            return Reply(body=b"at once")

        later.give(make)
        later.give(body_reply("a second give is ignored"))
        return later

    async with serving(handle) as (port, _):
        with anyio.fail_after(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
            assert await read_replies(reader, 1) == [b"200 at once"]
            writer.close()
    assert made == ["/a"]


async def test_a_later_whose_maker_raises_is_a_500_or_a_reset() -> None:
    def handle(request: Request) -> Later:
        def make() -> Reply:
            if request.path == "/abort":
                raise AbortConnection
            raise ValueError("no reply")

        later = Later()
        asyncio.get_running_loop().call_soon(later.give, make)
        return later

    async with serving(handle) as (port, _):
        with anyio.fail_after(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /fail HTTP/1.1\r\nHost: h\r\n\r\n")
            (reply,) = await read_replies(reader, 1)
            assert reply.startswith(b"500 ")
            assert b"internal error: ValueError" in reply
            writer.write(b"GET /abort HTTP/1.1\r\nHost: h\r\n\r\n")
            assert await reader.read() == b""  # ended without an answer
            writer.close()


async def test_close_waits_for_a_later_reply_then_drops_one_never_given() -> None:
    pending: list[Later] = []
    handled: list[str] = []
    both_taken = asyncio.Event()

    def handle(request: Request) -> Later:
        later = Later()
        if request.path == "/soon":
            asyncio.get_running_loop().call_later(0.3, later.give, body_reply("in time"))
        else:
            pending.append(later)
        handled.append(request.path)
        if len(handled) == 2:
            both_taken.set()
        return later

    server = HTTPServer(handle)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    with anyio.fail_after(5):
        soon_reader, soon = await asyncio.open_connection("127.0.0.1", port)
        never_reader, never = await asyncio.open_connection("127.0.0.1", port)
        soon.write(b"GET /soon HTTP/1.1\r\nHost: h\r\n\r\n")
        never.write(b"GET /never HTTP/1.1\r\nHost: h\r\n\r\n")
        await both_taken.wait()
        started = asyncio.get_running_loop().time()
        await server.aclose(grace_s=0.5)
        waited = asyncio.get_running_loop().time() - started
        assert 0.4 <= waited < 2.0  # the grace, for the reply never given
        assert await read_replies(soon_reader, 1) == [b"200 in time"]
        assert await never_reader.read() == b""  # closed unanswered
        pending[0].give(body_reply("too late"))  # dropped: nothing is written, nothing raised
        soon.close()
        never.close()
