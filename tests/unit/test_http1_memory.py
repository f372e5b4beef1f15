"""The HTTP client over ``MemoryTransport``: its in-memory connections go through the same
pool as sockets (kept alive, capped, replayed once when a reused one is lost)."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from trajcore.adapters.http1.client import HTTPClient, MemoryTransport
from trajcore.adapters.http1.server import AbortConnection
from trajcore.adapters.http1.values import Origin, Reply, Request

pytestmark = pytest.mark.anyio
ORIGIN = Origin(host="stub.invalid", port=80)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_in_memory_requests_keep_one_connection_alive() -> None:
    def answer(request: Request) -> Reply:
        return Reply(body=request.target.encode())

    client = HTTPClient(transport=MemoryTransport(answer))
    first = await client.request("GET", ORIGIN, "/a")
    second = await client.request("GET", ORIGIN, "/b")
    stats = client.statistics()
    await client.aclose()
    assert (first.body, second.body) == (b"/a", b"/b")
    assert (stats.requests, stats.connections_opened, stats.open, stats.idle) == (2, 1, 1, 1)


async def test_an_in_memory_answer_that_closes_is_not_reused() -> None:
    def answer(request: Request) -> Reply:
        del request
        return Reply(body=b"ok", headers=(("Connection", "close"),))

    client = HTTPClient(transport=MemoryTransport(answer))
    for _ in range(3):
        assert (await client.request("GET", ORIGIN, "/")).body == b"ok"
    stats = client.statistics()
    await client.aclose()
    assert (stats.connections_opened, stats.idle) == (3, 0)


async def test_in_memory_requests_wait_for_the_capped_pool() -> None:
    gate = asyncio.Event()
    entered = 0

    async def answer(request: Request) -> Reply:
        nonlocal entered
        entered += 1
        await gate.wait()
        return Reply(body=request.body)

    client = HTTPClient(max_connections=1, transport=MemoryTransport(answer))

    async def post(i: int) -> None:
        assert (await client.request("POST", ORIGIN, "/", body=str(i).encode())).body == b"%d" % i

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(post, i)
            await wait_all_tasks_blocked()
            held, entered_then = client.statistics(), entered
            gate.set()
    stats = client.statistics()
    await client.aclose()
    assert (held.open, held.waiting, entered_then) == (1, 1, 1)
    assert (stats.requests, stats.connections_opened) == (2, 1)


async def test_a_lost_reused_in_memory_connection_replays_an_idempotent_request_once() -> None:
    calls = 0

    def answer(request: Request) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise AbortConnection
        return Reply(body=request.target.encode())

    client = HTTPClient(transport=MemoryTransport(answer))
    await client.request("GET", ORIGIN, "/warm")
    replayed = await client.request("GET", ORIGIN, "/again")
    stats = client.statistics()
    await client.aclose()
    assert replayed.body == b"/again"
    assert (calls, stats.replays, stats.connections_opened) == (3, 1, 2)
