"""Where renders run: ``DaemonRenderPool``, whose threads do not hold the process's exit, the
env's render threads made of it, and ``RenderThreads`` closed."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_trajectory_render_threads import WAIT_S, anyio_backend
from trajcore.adapters.render_pool import DaemonRenderPool
from trajcore.domain.errors import ConfigError, StateError
from trajcore.entrypoints.atropos.services import env_render_threads
from trajcore.rollout.render_threads import RenderThreads

pytestmark = pytest.mark.anyio
__all__ = ["anyio_backend"]  # the fixture shared with the trajectory tests

SRC = Path(__file__).resolve().parents[2] / "src"

_GIVEN_UP = """
import threading, anyio
from trajcore.adapters.render_pool import DaemonRenderPool
from trajcore.rollout.render_threads import RenderLate, RenderThreads

async def main() -> None:
    threads = RenderThreads(threads=1, make_pool=DaemonRenderPool)
    try:
        await threads.run(threading.Event().wait, timeout_s=0.2)  # a render that never ends
    except RenderLate as late:
        print("late", late.started, flush=True)

anyio.run(main)
"""


def test_a_render_given_up_does_not_hold_the_process_exit() -> None:
    """A render still running when the process ends (its result already dropped) does not keep
    the process alive: neither its thread nor the thread its caller's wait was parked in. An
    env process that is told to stop, or has done its work, exits at once instead of waiting
    for a render nobody wants (here one that never ends)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", _GIVEN_UP],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,  # generous: it exits as soon as main returns, or never
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "late True\n", "")


async def test_the_envs_render_threads_are_the_processs_daemon_threads() -> None:
    render_threads = env_render_threads()
    assert env_render_threads() is render_threads  # one bound per process
    thread = await render_threads.run(threading.current_thread, timeout_s=WAIT_S)
    assert thread.daemon
    assert thread is not threading.current_thread()


@pytest.mark.parametrize("daemon", [False, True], ids=["executor", "daemon"])
async def test_a_render_asked_of_closed_threads_is_refused_at_once(daemon: bool) -> None:
    """Not what the pool raises, nor a wait of its whole time for a thread that will never
    take it, reported as a render that could not start because the threads were busy."""
    render_threads = (
        RenderThreads(threads=1, make_pool=DaemonRenderPool) if daemon else RenderThreads(threads=1)
    )
    assert await render_threads.run(lambda: "before", timeout_s=WAIT_S) == "before"
    render_threads.close()
    render_threads.close()  # a second close does nothing
    with pytest.raises(StateError, match="closed"):
        await render_threads.run(lambda: "after", timeout_s=WAIT_S)


def _held(release: threading.Event, ran: list[int], index: int) -> Callable[[], int]:
    """A work that says it started, then waits for ``release``."""

    def run() -> int:
        ran.append(index)
        release.wait(WAIT_S)
        return index

    return run


def test_daemon_pool_starts_work_in_the_order_it_came() -> None:
    pool = DaemonRenderPool(1)
    release = threading.Event()
    started: list[int] = []
    try:
        futures = [pool.submit(_held(release, started, index)) for index in range(5)]
        dropped = pool.submit(_held(release, started, 99))
        assert dropped.cancel()  # cancelled while it waits: it never starts
        release.set()
        assert [future.result(WAIT_S) for future in futures] == list(range(5))
    finally:
        release.set()
        pool.shutdown()
    assert started == list(range(5))


def test_daemon_pool_runs_at_most_size_works_at_once() -> None:
    pool = DaemonRenderPool(2)
    release, started = threading.Event(), threading.Semaphore(0)

    def work() -> None:
        started.release()
        release.wait(WAIT_S)

    try:
        futures = [pool.submit(work) for _ in range(4)]
        for _ in range(2):  # two run together...
            assert started.acquire(timeout=WAIT_S)
        assert [future.running() for future in futures] == [True, True, False, False]
        release.set()  # ...and the others wait for one of them to end
        for future in futures:
            future.result(WAIT_S)
    finally:
        release.set()
        pool.shutdown()


def test_daemon_pool_hands_the_caller_what_work_raised() -> None:
    pool = DaemonRenderPool(1)

    def broken() -> None:
        raise ConfigError("messages", "the chat template refused them")

    try:
        with pytest.raises(ConfigError, match="refused"):
            pool.submit(broken).result(WAIT_S)
        assert pool.submit(lambda: "next").result(WAIT_S) == "next"  # its thread lives on
    finally:
        pool.shutdown()


def test_daemon_pool_shut_down_takes_no_work_and_its_threads_end() -> None:
    pool = DaemonRenderPool(2)
    release = threading.Event()
    running = pool.submit(lambda: release.wait(WAIT_S))
    queued = pool.submit(threading.current_thread)
    pool.shutdown()  # returns at once: the work submitted before still runs
    with pytest.raises(StateError, match="shut down"):
        pool.submit(lambda: None)
    release.set()
    assert running.result(WAIT_S) is True
    thread = queued.result(WAIT_S)
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_daemon_pool_dropped_unclosed_leaves_no_thread_behind() -> None:
    """As an executor is: a process that makes many pools keeps none of their threads."""
    pool = DaemonRenderPool(1)
    thread = pool.submit(threading.current_thread).result(WAIT_S)
    del pool
    gc.collect()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_daemon_pool_size_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="size"):
        DaemonRenderPool(0)
