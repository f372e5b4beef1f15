"""A slot server's answer that arrives while this process's event loop is held up (a long
synchronous step: the tokenizer rendering a trajectory with a large tool result, a CPU starved
by load) is read when the loop runs again, not counted as a server that did not answer. Before,
the request's deadline fired on resuming, the pool lost a healthy slot server, and every
trajectory on it ended ``infra_error``."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.test_slot_server import call, searchable_dir, start_server, stop_server
from trajcore.adapters.pools import client as client_module
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.errors import SlotServerError
from trajcore.domain.tools import ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(
        not any(shutil.which(name) for name in ("cc", "gcc", "clang")),
        reason="no C compiler (cc, gcc, clang) for the helper",
    ),
]


def test_an_answer_that_came_while_the_loop_was_blocked_is_read() -> None:
    with searchable_dir("stalled") as folder:
        server = start_server(folder / "root")
        try:

            async def main() -> list[ToolResult]:
                async with server.client() as client:
                    client.grace_s = 0.5
                    warm = await client.execute([call(0, "bash", command="true")])
                    assert warm[0].outcome is ToolOutcome.OK, warm
                    batch = asyncio.ensure_future(
                        client.execute(
                            [call(0, "bash", command="sleep 0.5; echo hi", timeout_s=1.0)]
                        )
                    )
                    await asyncio.sleep(0.1)  # the request is out; its answer comes in 0.5 s
                    _hold_up(3.0)  # the loop is held up past the limit (1 s + 0.5 s)
                    return await batch

            (result,) = asyncio.run(main())
        finally:
            assert stop_server(server) == 0
    assert result.outcome is ToolOutcome.OK, result
    assert result.content == "hi\n"


def test_a_server_that_never_answers_still_fails_at_its_limit() -> None:
    error, took = asyncio.run(_fail_against_a_mute_server(timeout_s=0.5))
    assert "no answer within 0.8 s" in error
    assert 0.7 < took < 3.0, took


def test_a_loop_held_up_again_and_again_still_gives_up_on_a_mute_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stalls add to a request's limit at most ``_STALL_ROOM_S`` in all (2 s here, 30 s in
    use): a loop that is always busy in long synchronous steps still fails a mute server."""
    monkeypatch.setattr(client_module, "_STALL_ROOM_S", 2.0)

    async def busy() -> None:
        while True:
            _hold_up(2.0)  # each look of the deadline comes late
            await asyncio.sleep(0.02)

    error, took = asyncio.run(_fail_against_a_mute_server(timeout_s=1.0, meanwhile=busy))
    assert "no answer within 1.3 s" in error
    assert took < 1.3 + 2.0 + 2 * 2.0 + 1.0, took  # the limit, the room, the steps between


async def _fail_against_a_mute_server(
    *, timeout_s: float, meanwhile: Callable[[], Awaitable[None]] | None = None
) -> tuple[str, float]:
    """One call to a server that reads nothing and answers nothing (grace 0.3 s), with
    ``meanwhile`` running beside it; its error and how long it took to come (30 s at most)."""
    held: list[asyncio.StreamWriter] = []

    async def mute(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    listener = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = SlotServerClient.tcp(f"127.0.0.1:{port}", None, grace_s=0.3)
    other = asyncio.ensure_future(meanwhile()) if meanwhile is not None else None
    started = time.monotonic()
    try:
        async with asyncio.timeout(30):
            await client.execute([call(0, "bash", command="true", timeout_s=timeout_s)])
    except SlotServerError as error:
        return str(error), time.monotonic() - started
    finally:
        if other is not None:
            other.cancel()
        await client.aclose()
        for writer in held:
            writer.close()
        listener.close()
        await listener.wait_closed()
    raise AssertionError("the batch did not fail")


def _hold_up(seconds: float) -> None:
    """Block the calling thread (the event loop's): a long synchronous step of some task."""
    time.sleep(seconds)
