"""A handler of ``HTTPServer`` that answers with an ``asyncio.Future``: the reply is written from
the future's done callback, with no task, and everything a task's answer gets still holds (its
exception a 500, ``AbortConnection`` a reset, pipelined requests in order, ``aclose`` waiting
for it, then cancelling it)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from trajcore.adapters.http1.server import AbortConnection, HTTPServer
from trajcore.adapters.http1.values import Reply, Request

pytestmark = pytest.mark.anyio

TWO = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Later:
    """A handler answering ``/a`` with a future the test settles, anything else at once."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[Reply]] = []
        self.tasks_when_asked: set[asyncio.Task[object]] = set()

    def __call__(self, request: Request) -> Reply | asyncio.Future[Reply]:
        if request.path != "/a":
            return Reply(body=request.path.encode())
        self.tasks_when_asked = asyncio.all_tasks()
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    async def wait_asked(self) -> asyncio.Future[Reply]:
        while not self.futures:  # noqa: ASYNC110 - the handler runs in the server's read
            await asyncio.sleep(0.005)
        return self.futures[-1]


async def _open(server: HTTPServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    _, port = await server.listen_tcp("127.0.0.1", 0)
    return await asyncio.open_connection("127.0.0.1", port)


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 0.3)
        except TimeoutError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


async def test_the_futures_reply_is_written_without_a_task_and_in_order() -> None:
    handler = Later()
    server = HTTPServer(handler)
    with anyio.fail_after(5):
        reader, writer = await _open(server)
        writer.write(TWO)
        future = await handler.wait_asked()
        await asyncio.sleep(0.05)
        assert await _read_all(reader) == b""  # /b waits for /a's answer
        assert asyncio.all_tasks() <= handler.tasks_when_asked  # no task waits on the future
        future.set_result(Reply(body=b"first"))
        data = await _read_all(reader)
        writer.close()
        await server.aclose(grace_s=1)
    first, second = data.split(b"HTTP/1.1 200 OK")[1:]
    assert first.endswith(b"\r\n\r\nfirst")
    assert second.endswith(b"\r\n\r\n/b")
    assert not server._tasks


async def test_the_futures_exception_is_a_500_and_the_connection_goes_on() -> None:
    handler = Later()
    server = HTTPServer(handler)
    with anyio.fail_after(5):
        reader, writer = await _open(server)
        writer.write(TWO)
        (await handler.wait_asked()).set_exception(RuntimeError("boom"))
        data = await _read_all(reader)
        writer.close()
        await server.aclose(grace_s=1)
    assert data.startswith(b"HTTP/1.1 500 ")
    assert b"RuntimeError" in data
    assert data.endswith(b"/b")


async def test_abort_connection_from_the_future_resets_the_connection() -> None:
    handler = Later()
    server = HTTPServer(handler)
    with anyio.fail_after(5):
        reader, writer = await _open(server)
        writer.write(TWO)
        (await handler.wait_asked()).set_exception(AbortConnection())
        try:
            data = await _read_all(reader)
        except ConnectionResetError:
            data = b""
        writer.close()
        await server.aclose(grace_s=1)
    assert data == b""  # no answer, to /a nor /b


async def test_close_waits_for_a_pending_future_then_cancels_it() -> None:
    handler = Later()
    server = HTTPServer(handler)
    with anyio.fail_after(5):
        reader, writer = await _open(server)
        writer.write(TWO)
        future = await handler.wait_asked()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server.aclose(grace_s=0.2)
        waited = loop.time() - started
        data = await _read_all(reader)
        writer.close()
    assert future.cancelled()
    assert waited >= 0.15
    assert data == b""  # cancelled: never answered, and the connection is closed
    assert not server._tasks


async def test_close_lets_a_future_settled_within_the_grace_answer() -> None:
    handler = Later()
    server = HTTPServer(handler)
    with anyio.fail_after(5):
        reader, writer = await _open(server)
        writer.write(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
        future = await handler.wait_asked()
        asyncio.get_running_loop().call_later(0.05, future.set_result, Reply(body=b"late"))
        await server.aclose(grace_s=2)
        data = await _read_all(reader)
        writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert b"Connection: close" in data
    assert data.endswith(b"late")
