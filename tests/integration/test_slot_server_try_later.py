"""A proxy in front of a slot server that answers 408 or 429 ("try again later"), over real HTTP
on loopback: the pools' client sends the request again (after the ``Retry-After`` it asks for,
within its budget of waiting); past that budget a batch's calls are ``INFRA_ERROR``, never the
calls' ``REJECTED``, and the client does not fail the server (a pool would have lost it)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest

from tests.slot_runtime_testbed import searchable_root
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Limits, Reply, Request
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.server import make_handler
from trajcore.domain.errors import SlotServerError
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall, ToolOutcome

HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc, gcc, clang) for the helper"),
]


@attrs.define
class Proxy:
    """What the proxy answers before it lets requests to ``path`` through: one reply each from
    ``replies``, then ``always`` (``None``: through) for every one after; ``seen`` counts the
    requests to ``path`` that came."""

    path: str
    replies: list[Reply]
    always: Reply | None = None
    seen: int = 0


def throttled(status: int, retry_after: str | None = None) -> Reply:
    headers = () if retry_after is None else (("Retry-After", retry_after),)
    return Reply(status=status, body=b'{"error":"slow down"}', headers=headers)


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-try-later-") as path:
        yield path


@asynccontextmanager
async def behind(root: Path, proxy: Proxy) -> AsyncIterator[SlotServerClient]:
    """A client of a real slot server (two slots) behind ``proxy``, its health read."""
    runtime = SlotRuntime(RuntimeConfig(slots=2, root=root, use_cgroups=False))
    await runtime.start()
    inner = make_handler(runtime, None)

    def handler(request: Request) -> Reply | Awaitable[Reply]:
        if request.path == proxy.path:
            proxy.seen += 1
            if proxy.replies:
                return proxy.replies.pop(0)
            if proxy.always is not None:
                return proxy.always
        return inner(request)

    server = HTTPServer(handler, limits=Limits(max_body_bytes=1 << 20))
    try:
        host, port = await server.listen_tcp("127.0.0.1", 0)
        async with SlotServerClient.tcp(f"{host}:{port}", None) as client:
            client.retry_later_s = 5.0
            await client.health()
            yield client
    finally:
        await server.aclose()
        await runtime.aclose()


def write(slot: int, call_id: str, text: str) -> ExecuteCall:
    return ExecuteCall(slot=slot, epoch=1, call_id=call_id, tool="write_file",
                       arguments={"path": "f.txt", "content": text}, timeout_s=10.0)  # fmt: skip


def read(slot: int, call_id: str) -> SlotCall:
    lease = Lease(slot=SlotId(container="c", index=slot), epoch=1, holder="t")
    call = ToolCall(id=call_id, name="read_file", arguments={"path": "f.txt"})
    return SlotCall(lease=lease, call=call, timeout_s=10.0)


@pytest.mark.parametrize(
    "replies",
    [
        [throttled(429, "0"), throttled(408)],
        [throttled(429, "Thu, 01 Jan 1970 00:00:00 GMT")],  # a date passed: at once
        [throttled(408), throttled(429), throttled(429, "0"), throttled(429)],
    ],
    ids=["429-then-408", "429-dated", "four"],
)
def test_a_batch_the_proxy_asks_to_send_later_is_sent_again_and_runs(
    root: Path, replies: list[Reply]
) -> None:
    """Each "try again later" is followed by the same request; the batch then runs once, its
    results are the server's, and the server serves the next batch."""
    proxy = Proxy(path="/v1/execute", replies=list(replies))

    async def main() -> tuple[list[ToolOutcome], list[str], int]:
        async with behind(root, proxy) as client:
            results = await client.execute([write(0, "a", "zero"), write(1, "b", "one")])
            after = await client.execute_slot_calls([read(0, "c"), read(1, "d")])
            return [r.outcome for r in results], [r.content for r in after], proxy.seen

    outcomes, texts, seen = asyncio.run(main())
    assert outcomes == [ToolOutcome.OK, ToolOutcome.OK]
    assert texts == ["zero", "one"]
    assert seen == len(replies) + 2  # each refusal, the batch that ran, the reads


def test_a_proxy_that_keeps_asking_fails_the_calls_as_infrastructure_not_the_server(
    root: Path,
) -> None:
    """Still "try again later" when the budget of waiting is spent: each call is an
    ``INFRA_ERROR`` naming the status (no ``REJECTED``: nothing the calls carry was refused),
    nothing ran, and no ``SlotServerError`` (the pool would lose a healthy server); once the
    proxy lets requests through, the same client's batches run."""
    proxy = Proxy(path="/v1/execute", replies=[], always=throttled(429))

    async def main() -> tuple[list[tuple[ToolOutcome, str]], list[ToolOutcome], int]:
        async with behind(root, proxy) as client:
            client.retry_later_s = 0.3
            refused = await client.execute_slot_calls([read(0, "a"), read(1, "b")])
            tries = proxy.seen
            proxy.always = None
            results = await client.execute([write(0, "c", "later")])
            return (
                [(r.outcome, r.error or "") for r in refused],
                [r.outcome for r in results],
                tries,
            )

    refused, later, tries = asyncio.run(main())
    assert [outcome for outcome, _ in refused] == [ToolOutcome.INFRA_ERROR] * 2
    assert all("HTTP 429 (try again later)" in error for _, error in refused), refused
    assert tries > 1  # it was sent again before it gave up
    assert later == [ToolOutcome.OK]


def test_a_wait_asked_past_the_budget_ends_the_tries_at_once(root: Path) -> None:
    """A ``Retry-After`` longer than what the budget holds is not waited for: the first answer
    is the last (one request), its calls ``INFRA_ERROR``."""
    proxy = Proxy(path="/v1/execute", replies=[], always=throttled(429, "3600"))

    async def main() -> tuple[list[ToolOutcome], int]:
        async with behind(root, proxy) as client:
            results = await client.execute([write(0, "a", "x"), write(0, "b", "y")])
            return [r.outcome for r in results], proxy.seen

    outcomes, seen = asyncio.run(main())
    assert outcomes == [ToolOutcome.INFRA_ERROR] * 2
    assert seen == 1


def test_other_requests_are_sent_again_too_and_fail_the_server_only_past_the_budget(
    root: Path,
) -> None:
    """A reset (any request but a batch) asked to wait is sent again and answered; one the
    proxy keeps refusing past the budget is ``SlotServerError`` naming the status."""
    proxy = Proxy(path="/v1/reset", replies=[throttled(408), throttled(429, "0")])

    async def main() -> tuple[bool, str]:
        async with behind(root, proxy) as client:
            reset = await client.reset(0, 1)
            client.retry_later_s = 0.2
            proxy.always = throttled(429)
            try:
                await client.reset(1, 1)
            except SlotServerError as error:
                return reset.ok, str(error)
            return reset.ok, "answered"

    ok, failed = asyncio.run(main())
    assert ok
    assert "HTTP 429" in failed
