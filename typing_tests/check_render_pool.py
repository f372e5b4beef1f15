"""The render pools satisfy ``RenderPool`` (mypy checks this file; pytest never runs it)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import assert_type

from trajcore.adapters.render_pool import DaemonRenderPool
from trajcore.rollout.render_threads import RenderPool, RenderThreads


def check_daemon_pool_is_a_render_pool(pool: DaemonRenderPool) -> RenderPool:
    return pool


def check_daemon_pool_makes_render_threads() -> RenderThreads:
    make: Callable[[int], RenderPool] = DaemonRenderPool
    return RenderThreads(4, make_pool=make)


def check_submit_keeps_the_result_type(pool: RenderPool) -> None:
    assert_type(pool.submit(lambda: "tokens"), Future[str])
