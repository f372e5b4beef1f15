"""Client throughput against a loopback chat-completions stub, beside the stub's own ceiling.

Run: ``.venv/bin/python -m bench.llm [--seconds 2] [--concurrency 256]``

The stub (``trajcore.testing.llm_stubs``) runs in its own process. In the same run this measures:

1. the ceiling: a raw asyncio keep-alive client (pre-built request bytes, no JSON work) at the
   target concurrency -- the most the stub can serve here;
2. trajcore's ``adapters.http1.HTTPClient``, aiohttp's ``ClientSession`` and httpx's
   ``AsyncClient`` posting the same bytes at concurrency 1, 64 and the target (the measurement
   behind the HTTP-client choice in ``trajcore.adapters.llm.transport``);
3. trajcore's ``OpenAIChatServer.chat`` at the target concurrency: the full path, building the
   request from domain values and parsing the answer into a ``ChatTurn``.

It prints requests/s for each and the ratio of (3) to (1). Target: (3) >= 3,000 req/s or >= half
the ceiling. Numbers are what this machine measured in this run; nothing is estimated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx

from trajcore.adapters.http1.client import HTTPClient
from trajcore.adapters.http1.values import parse_url
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams

BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        "temperature": 0.0,
    }
).encode()


async def _run_for(seconds: float, concurrency: int, one: Callable[[], Awaitable[None]]) -> float:
    """Requests/s of ``concurrency`` workers calling ``one`` for ``seconds`` (after warm-up)."""
    count = 0
    stop_at = 0.0
    counting = False

    async def worker() -> None:
        nonlocal count
        while True:
            await one()
            if counting:
                count += 1
            if time.perf_counter() >= stop_at and counting:
                return

    stop_at = time.perf_counter() + 10_000
    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(0.3)  # warm-up: open connections
    counting = True
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*tasks)
    return count / (time.perf_counter() - start)


async def raw_ceiling(port: int, seconds: float, concurrency: int) -> float:
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: "
        + str(len(BODY)).encode()
        + b"\r\n\r\n"
        + BODY
    )
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    free = list(streams)

    async def one() -> None:
        reader, writer = free.pop()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        free.append((reader, writer))

    try:
        return await _run_for(seconds, concurrency, one)
    finally:
        for _, writer in streams:
            writer.close()


async def http1_rate(url: str, seconds: float, concurrency: int) -> float:
    origin, target = parse_url(url)
    client = HTTPClient(headers={"content-type": "application/json"})

    async def one() -> None:
        await client.request("POST", origin, target, body=BODY)

    try:
        return await _run_for(seconds, concurrency, one)
    finally:
        await client.aclose()


async def aiohttp_rate(url: str, seconds: float, concurrency: int) -> float:
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(
                url, data=BODY, headers={"content-type": "application/json"}
            ) as response:
                await response.read()

        return await _run_for(seconds, concurrency, one)


async def httpx_rate(url: str, seconds: float, concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:

        async def one() -> None:
            response = await client.post(
                url, content=BODY, headers={"content-type": "application/json"}
            )
            response.read()

        return await _run_for(seconds, concurrency, one)


async def trajcore_rate(base: str, seconds: float, concurrency: int) -> float:
    server = OpenAIChatServer(base_url=f"{base}/v1", model="m", max_connections=concurrency)
    messages = [Message.user("hello")]
    sampling = SamplingParams(max_tokens=16, temperature=0.0)

    async def one() -> None:
        await server.chat(messages, tools=(), sampling=sampling)

    try:
        return await _run_for(seconds, concurrency, one)
    finally:
        await server.aclose()


async def measure(port: int, seconds: float, concurrency: int) -> None:
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/chat/completions"
    rows: list[tuple[str, int, float]] = []
    ceiling = await raw_ceiling(port, seconds, concurrency)
    rows.append(("raw asyncio keep-alive (ceiling)", concurrency, ceiling))
    levels = (1, 64, concurrency)
    rows.extend(
        [("trajcore http1.HTTPClient", c, await http1_rate(url, seconds, c)) for c in levels]
    )
    rows.extend([("aiohttp ClientSession", c, await aiohttp_rate(url, seconds, c)) for c in levels])
    rows.extend([("httpx AsyncClient", c, await httpx_rate(url, seconds, c)) for c in levels])
    ours = await trajcore_rate(base, seconds, concurrency)
    rows.append(("trajcore OpenAIChatServer.chat", concurrency, ours))
    again = await raw_ceiling(port, seconds, concurrency)
    rows.append(("raw asyncio keep-alive (ceiling, again)", concurrency, again))
    print(f"{'client':42} {'conc':>5} {'req/s':>9}")
    for name, c, rate in rows:
        print(f"{name:42} {c:>5} {rate:>9.0f}")
    best = max(ceiling, again)
    ratio = ours / best
    verdict = "met" if ours >= 3000 or ratio >= 0.5 else "NOT met"
    print(
        f"\ntrajcore chat at concurrency {concurrency}: {ours:.0f} req/s = {ratio:.2f} of the "
        f"ceiling {best:.0f} req/s; target (>= 3000 req/s or >= 0.5 of ceiling): {verdict}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    stub = subprocess.Popen(
        [sys.executable, "-m", "trajcore.testing.llm_stubs"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stub.stdout is not None
        asyncio.run(measure(int(stub.stdout.readline()), args.seconds, args.concurrency))
    finally:
        stub.terminate()
        stub.wait()
