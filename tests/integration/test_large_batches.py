"""Calls whose arguments are large never cost a slot server: each call gets its own answer.

A batch whose body would pass the server's ``MAX_REQUEST_BYTES`` goes in several requests; a call
that could not fit one even alone is ``REJECTED`` naming its argument and the limit, never sent;
a request the server refuses itself (HTTP 413 here) is answered call by call. The pool loses no
container for any of these, and the slot goes on serving. Real slot servers under a local pool
(bubblewrap), and a slot runtime in this process behind an HTTP server with a smaller body limit.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest

from tests.slot_runtime_testbed import searchable_root
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Limits, Reply, Request
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool, start_local_pool
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.server import make_handler
from trajcore.domain.errors import SlotServerError, WireError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import MAX_REQUEST_BYTES, ExecuteCall
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc, gcc, clang) for the helper"),
]

_ids = itertools.count(1)
MB = 1_000_000


def write(lease: Lease, path: str, size: int) -> SlotCall:
    """``write_file`` of ``size`` bytes of text to ``path`` in ``lease``'s slot."""
    arguments: dict[str, JSON] = {"path": path, "content": "x" * size}
    return SlotCall(lease=lease, call=ToolCall(id=f"w{next(_ids)}", name="write_file",
                                               arguments=arguments), timeout_s=60)  # fmt: skip


def bash(lease: Lease, command: str) -> SlotCall:
    call = ToolCall(id=f"b{next(_ids)}", name="bash", arguments={"command": command})
    return SlotCall(lease=lease, call=call, timeout_s=20)


def pool_config() -> LocalPoolConfig:
    """One slot server of two slots whose files may be as large as the calls here write."""
    isolation = SlotIsolation(require_sandbox=True, min_timeout_s=0.2, file_cap_bytes=48 << 20)
    settings = SlotServerSettings(slots_per_container=2, acquire_timeout_s=60.0,
                                  isolation=isolation)  # fmt: skip
    return LocalPoolConfig(containers=1, server=settings)


def still_serving(pool: LocalSandboxPool) -> tuple[int, int, int]:
    """Containers lost, containers in service, and joins since the start."""
    return pool.containers_lost, pool.statistics().containers, pool.containers_joined


def test_two_calls_that_fit_alone_but_not_together_are_both_answered() -> None:
    size = 40 * MB  # each call's request fits MAX_REQUEST_BYTES; the two together do not
    assert size < MAX_REQUEST_BYTES < 2 * size

    async def main() -> tuple[list[ToolResult], list[ToolResult], tuple[int, int, int]]:
        async with (
            start_local_pool(pool_config()) as pool,
            pool.lease("a") as first,
            pool.lease("b") as second,
        ):
            container = first.slot.container
            assert second.slot.container == container
            calls = [write(first, "big.txt", size), write(second, "big.txt", size)]
            results = await pool.execute(container, calls)
            after = await pool.execute(
                container, [bash(first, "wc -c < big.txt"), bash(second, "wc -c < big.txt")]
            )
            return results, after, still_serving(pool)

    results, after, serving = asyncio.run(main())
    assert [r.outcome for r in results] == [ToolOutcome.OK, ToolOutcome.OK], results
    assert [(r.outcome, r.content.split()[0]) for r in after] == [
        (ToolOutcome.OK, str(size)),
        (ToolOutcome.OK, str(size)),
    ]
    assert serving == (0, 1, 1)  # nothing lost, nothing replaced


def test_a_call_too_large_alone_is_rejected_naming_its_argument_and_the_limit() -> None:
    async def main() -> tuple[list[ToolResult], ToolResult, tuple[int, int, int]]:
        async with (
            start_local_pool(pool_config()) as pool,
            pool.lease("a") as first,
            pool.lease("b") as second,
        ):
            container = first.slot.container
            calls = [
                write(first, "huge.txt", 70 * MB),
                bash(second, "echo beside"),
                write(second, "small.txt", 1000),
            ]
            results = await pool.execute(container, calls)
            (later,) = await pool.execute(container, [bash(first, "echo later; ls")])
            return results, later, still_serving(pool)

    (huge, beside, small), later, serving = asyncio.run(main())
    assert huge.outcome is ToolOutcome.REJECTED
    assert huge.error is not None
    assert huge.error.endswith(f"over the slot server's limit of {MAX_REQUEST_BYTES} @ $.content")
    assert (beside.outcome, beside.content) == (ToolOutcome.OK, "beside\n")
    assert small.outcome is ToolOutcome.OK
    assert later.outcome is ToolOutcome.OK
    assert later.content.split() == ["later"]  # the refused call never ran: no huge.txt
    assert serving == (0, 1, 1)


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-large-batches-") as path:
        yield path


def written(slot: int, call_id: str, size: int) -> ExecuteCall:
    arguments: dict[str, JSON] = {"path": "f.txt", "content": "y" * size}
    return ExecuteCall(slot=slot, epoch=1, call_id=call_id, tool="write_file",
                       arguments=arguments, timeout_s=10.0)  # fmt: skip


def test_a_batch_the_server_refuses_as_too_large_is_answered_call_by_call(root: Path) -> None:
    """A server whose body limit is smaller than the pools' (another version, a proxy): its 413
    is no sign of a dead server; the calls go again alone, and one refused alone is
    ``REJECTED`` with the server's reason."""
    config = RuntimeConfig(slots=2, root=root, use_cgroups=False)
    limit = 4096

    async def main() -> tuple[list[ToolResult], list[ToolResult]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        server = HTTPServer(make_handler(runtime, None), limits=Limits(max_body_bytes=limit))
        try:
            host, port = await server.listen_tcp("127.0.0.1", 0)
            async with SlotServerClient.tcp(f"{host}:{port}", None) as client:
                await client.health()
                calls = [written(0, "a", 1500), written(1, "b", 1500), written(0, "c", 5000)]
                results = await client.execute(calls)
                lease = Lease(slot=SlotId(container="c", index=1), epoch=1, holder="t")
                read = ToolCall(id="d", name="read_file", arguments={"path": "f.txt"})
                after = await client.execute_slot_calls(
                    [SlotCall(lease=lease, call=read, timeout_s=10.0)]
                )
                return results, after
        finally:
            await server.aclose()
            await runtime.aclose()

    results, after = asyncio.run(main())
    assert [r.outcome for r in results] == [
        ToolOutcome.OK,
        ToolOutcome.OK,
        ToolOutcome.REJECTED,
    ], results
    assert results[2].error is not None
    assert "HTTP 413" in results[2].error
    assert results[2].error.endswith("@ $.content")
    assert after[0].outcome is ToolOutcome.OK
    assert after[0].content.count("y") == 1500


@pytest.mark.parametrize("status", [403, 404, 405])
def test_a_refusal_that_is_not_about_the_calls_is_the_servers_failure(
    root: Path, status: int
) -> None:
    """A 4xx that does not name what the calls carry (a proxy's 403, another service at the
    address) is the server's failure (``SlotServerError``, or ``WireError`` for an answer
    outside the protocol: the pool fails the batch as infrastructure either way), never the
    calls' ``REJECTED``, which the model would be scored on."""
    config = RuntimeConfig(slots=2, root=root, use_cgroups=False)

    async def main() -> None:
        runtime = SlotRuntime(config)
        await runtime.start()
        inner = make_handler(runtime, None)

        def handler(request: Request) -> Reply | Awaitable[Reply]:
            if request.path == "/v1/execute":
                return Reply(status=status, body=b'{"error":"not here"}')
            return inner(request)

        server = HTTPServer(handler, limits=Limits(max_body_bytes=1 << 20))
        try:
            host, port = await server.listen_tcp("127.0.0.1", 0)
            async with SlotServerClient.tcp(f"{host}:{port}", None) as client:
                await client.health()
                with pytest.raises((SlotServerError, WireError), match="not here"):
                    await client.execute([written(0, "a", 10), written(1, "b", 10)])
        finally:
            await server.aclose()
            await runtime.aclose()

    asyncio.run(main())


def test_after_a_refusal_the_slots_calls_go_again_at_once(root: Path) -> None:
    """Sent again alone after the server refused their batch, the calls of different slots run
    at the same time (each slot's in its order), so the batch still ends within the slowest
    slot's time, which is what the dispatcher waits for: each call records when it started and
    ended, and the two slots' calls overlap."""
    config = RuntimeConfig(slots=2, root=root, use_cgroups=False)
    stamp = "date +%s.%N >> /tmp/t; sleep 1; date +%s.%N >> /tmp/t; cat /tmp/t"

    def timed(slot: int, call_id: str) -> ExecuteCall:
        return ExecuteCall(slot=slot, epoch=1, call_id=call_id, tool="bash",
                           arguments={"command": stamp, "pad": "z" * 300},
                           timeout_s=20.0)  # fmt: skip

    async def main() -> list[ToolResult]:
        runtime = SlotRuntime(config)
        await runtime.start()
        server = HTTPServer(make_handler(runtime, None), limits=Limits(max_body_bytes=600))
        try:
            host, port = await server.listen_tcp("127.0.0.1", 0)
            async with SlotServerClient.tcp(f"{host}:{port}", None) as client:
                await client.health()
                return await client.execute([timed(0, "a"), timed(1, "b")])
        finally:
            await server.aclose()
            await runtime.aclose()

    first, second = asyncio.run(main())
    assert (first.outcome, second.outcome) == (ToolOutcome.OK, ToolOutcome.OK), (first, second)
    start_a, end_a = map(float, first.content.split())
    start_b, end_b = map(float, second.content.split())
    assert start_a < end_b  # the two slots' calls ran at the same time
    assert start_b < end_a
