"""``failing_groups.RunStop``: a worker's error ends serve's loop; the loop's own errors pass as is.

- ``stop(error)`` from another task cancels the loop and ``run`` raises ``error``.
- An error the loop raises itself (Atropos's ``RetryError`` when ``run-api`` cannot be reached)
  comes out of ``run`` as that error, not wrapped in an exception group.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from trajcore.entrypoints.atropos.failing_groups import GroupsFailing, RunStop

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_stop_from_a_worker_cancels_the_loop_and_raises_its_error() -> None:
    stop = RunStop()
    cancelled = False
    workers: list[asyncio.Task[None]] = []

    async def worker() -> None:
        await anyio.sleep(0.01)
        stop.stop(GroupsFailing("3 groups in a row failed"))

    async def loop() -> None:  # as Atropos's: a worker task whose errors it never awaits
        nonlocal cancelled
        workers.append(asyncio.get_running_loop().create_task(worker()))
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise

    with anyio.fail_after(5):
        with pytest.raises(GroupsFailing, match="3 groups in a row failed"):
            await stop.run(loop)
    assert cancelled
    await asyncio.gather(*workers)


async def test_the_loops_own_error_comes_out_as_raised() -> None:
    async def loop() -> None:
        raise ConnectionRefusedError("run-api is down")

    with pytest.raises(ConnectionRefusedError, match="run-api is down"):
        await RunStop().run(loop)


async def test_a_loop_that_returns_ends_the_run() -> None:
    async def loop() -> None:
        return None

    with anyio.fail_after(5):
        await RunStop().run(loop)
