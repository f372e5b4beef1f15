"""Worker threads for a finished trajectory's render: its training tokens and drift, off the loop.

Rendering a whole conversation with the chat template and tokenizing it is CPU work: seconds
for a conversation whose tool results are near ``max_tool_result_chars``, and OpenAI mode's
re-render does it once per assistant turn. Run on the event loop, it holds up every other
trajectory of the env (their model requests, tool calls and deadlines) for that long. So the
trajectory runner hands it to ``RenderThreads``, which keeps these rules:

- **Bounded.** At most ``threads`` renders run at once, in a thread pool of that size of their
  own, so they never take the threads other ``to_thread`` work needs. The default is one thread
  per CPU this process may use, less one for the event loop, at least 1 and at most 8
  (``default_render_threads``). The Rust tokenizer's batch encoder, which
  ``TransformersTokenizer`` calls, releases the GIL while it runs, so the tokenizing of several
  renders can overlap on a multi-core host; the chat template (jinja) is Python and holds it.
  A trajectory waits for its render's result parked in an anyio worker thread (a blocked
  thread, no CPU), of a capacity limiter of 64 threads per event loop (``_PARKED_WAITS``, or
  ``threads`` if more), not of the default one that file and DNS work share. The two thread
  switches this costs are paid only by a conversation long enough to need them: a shorter
  one renders on the loop (``RolloutConfig.render_inline_chars``).
- **A deadline.** ``run`` raises ``TimeoutError`` when the wait for a thread and the render
  together take longer than ``timeout_s``. A render that has not started by then never starts.
  A thread cannot be stopped: a render already running goes on and its result is dropped, but
  it keeps its pool thread until it ends, so a slow render never stacks up work beyond the
  bound (the renders behind it wait, each under its own deadline).
- **Cancellable.** Cancelling the caller (its group or the env shutting down) stops its wait at
  once, as the deadline does, with the same effect on the render.

The render must be safe to run beside the loop's own use of the same tokenizer: the shipped
adapters are (``trajcore.adapters.tokenizers``, ``trajcore.adapters.mistral``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import anyio
import anyio.to_thread
import attrs
from anyio.lowlevel import RunVar

from trajcore.domain.errors import ConfigError

__all__ = ["RenderThreads", "default_render_threads", "shared_render_threads"]

T = TypeVar("T")

_MAX_DEFAULT_THREADS = 8
_PARKED_WAITS = 64


def default_render_threads() -> int:
    """One thread per CPU this process may use, less one for the event loop; 1 to 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_THREADS, cpus - 1))


def _check_threads(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(attribute.name, f"must be a whole number of at least 1, got {value!r}")


@attrs.define
class RenderThreads:
    """Runs renders in at most ``threads`` worker threads at once (see the module doc).

    One instance is meant to be shared by all the trajectories of a process
    (``shared_render_threads``); it may serve several event loops, one after another or at once.

    Attributes:
        threads: The most renders that run at once.
    """

    threads: int = attrs.field(factory=default_render_threads, validator=_check_threads)
    _pool: ThreadPoolExecutor = attrs.field(init=False, repr=False)
    _waits: RunVar[anyio.CapacityLimiter] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="trajcore-render")
        self._waits = RunVar("trajcore_render_waits")  # keyed by the RunVar, not its name

    def _waiters(self) -> anyio.CapacityLimiter:
        try:
            return self._waits.get()
        except LookupError:
            limiter = anyio.CapacityLimiter(max(_PARKED_WAITS, self.threads))
            self._waits.set(limiter)
            return limiter

    async def run(self, work: Callable[[], T], *, timeout_s: float) -> T:
        """``work()``'s result, computed in a pool thread; what it raises is raised here.

        Raises:
            TimeoutError: waiting for a thread and running ``work`` took longer than
                ``timeout_s`` (``work`` may still be running; its result is dropped).
        """
        rendering: Future[T] = self._pool.submit(work)
        try:
            with anyio.fail_after(timeout_s):
                return await anyio.to_thread.run_sync(
                    rendering.result, limiter=self._waiters(), abandon_on_cancel=True
                )
        finally:
            rendering.cancel()  # a no-op once it runs or ran; else it never starts

    def close(self) -> None:
        """Let the pool's threads end once the renders they run (or that wait) are done."""
        self._pool.shutdown(wait=False)


_SHARED: RenderThreads | None = None


def shared_render_threads() -> RenderThreads:
    """The process's ``RenderThreads`` (``default_render_threads()`` threads), made on first
    use; the trajectory runner uses it unless it is handed its own."""
    global _SHARED  # noqa: PLW0603 - one bound per process, made on first use
    if _SHARED is None:  # two loops in two threads racing here at worst make a spare pool
        _SHARED = RenderThreads()
    return _SHARED
