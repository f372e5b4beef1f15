"""Worker threads for a finished trajectory's render: its training tokens and drift, off the loop.

Rendering a whole conversation with the chat template and tokenizing it is CPU work: seconds
for a conversation whose tool results are near ``max_tool_result_chars`` (OpenAI mode's
re-render also measures every assistant turn's prefixes: about twice one render with the
transformers adapter, once per turn with other renderers). Run on the event loop, it holds up
every other trajectory of the env (their model requests, tool calls and deadlines) for that
long. So the trajectory runner hands it to ``RenderThreads``, which keeps these rules:

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
- **A deadline, queueing included, and renders in order.** ``run`` waits at most ``timeout_s``
  in all for a free thread and for the render; renders start in the order they were asked for
  (the pool's queue). When the time is up, a render still waiting for a thread never starts
  (``RenderLate`` with ``started`` false); one that is running is dropped (``started`` true):
  a thread cannot be stopped, so it goes on and its result is thrown away, but it keeps its
  pool thread until it ends, so a slow render never stacks up work beyond the bound.
- **A render given up on does not hold the process's exit.** The threads come from a
  ``RenderPool`` (this layer keeps the rules above, not threads of its own). The entry points
  hand in ``trajcore.adapters.render_pool.DaemonRenderPool``, whose threads are daemon threads:
  a render still running when the env process ends (a Ctrl-C, or the end of a run) is left
  behind. A ``ThreadPoolExecutor``'s threads, which the interpreter joins at exit, would keep
  the process alive until that render ended (tens of seconds for a huge conversation); such an
  executor is the default, for one who calls ``run_trajectory`` directly, who may pass
  ``render_threads=RenderThreads(make_pool=DaemonRenderPool)`` instead. Whatever the pool, the
  thread a caller's wait is parked in ends with the wait, not with the render.
- **Cancellable.** Cancelling the caller (its group or the env shutting down) stops its wait at
  once, as the deadline does, with the same effect on the render.

**The final render's deadline** (``render_final``, which the trajectory runner calls). A
trajectory's render must be done by its deadline plus ``RolloutConfig.render_grace_s``: the
latest moment the trajectory may end, the same moment for every member of a group (they start
together, and a group's preparation is taken off every member's deadline alike), and the one
the Atropos env sizes the grace by, so that a group never outlives ``worker_timeout``. That
moment, not a time counted from each member's own end, is what a render's wait and run are
measured against. A group of members with large conversations that ends near its deadline asks
for all its renders at once, and with one render thread (a 2-CPU host) they run one after
another: given what was left of its deadline or the grace, whichever was more, from its own
end, a member that ended before its deadline lost its render for the time it waited behind its
group, though the group could still run on for the grace. With one shared moment, a member
loses its tokens only if its render cannot start before that moment (it then never starts, and
takes no thread time from the renders of other groups) or does not finish by it; the ones that
do not make it are the group's last asked for. The renders are not reordered (shortest first
would keep more members, but would leave the longest conversations out of training, a bias in
the data, where arrival order is none).

The render must be safe to run beside the loop's own use of the same tokenizer: the shipped
adapters are (``trajcore.adapters.tokenizers``, ``trajcore.adapters.mistral``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, TypeVar

import anyio
import anyio.to_thread
import attrs
from anyio.lowlevel import RunVar

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.drift import Drift
from trajcore.domain.token_ledger.ledger import TrainingTokens
from trajcore.rollout.policy import PolicySession

log = logging.getLogger("trajcore.rollout")

__all__ = [
    "RenderLate",
    "RenderPool",
    "RenderThreads",
    "Rendered",
    "default_render_threads",
    "render_final",
    "render_member",
    "shared_render_threads",
]

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


class RenderLate(TimeoutError):
    """A render not done within its time: ``started`` says whether it was running (it runs on
    in its thread and its result is dropped) or still waiting for a thread (it never starts).

    Attributes:
        timeout_s: The time it had, its wait for a thread included.
        started: Whether it had started when the time was up.
    """

    def __init__(self, timeout_s: float, *, started: bool) -> None:
        self.timeout_s = timeout_s
        self.started = started
        what = "did not finish" if started else "could not start"
        super().__init__(f"the render {what} within {timeout_s:.1f} s")


def _check_threads(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(attribute.name, f"must be a whole number of at least 1, got {value!r}")


class RenderPool(Protocol):
    """The threads renders run in: what ``RenderThreads`` needs of them.

    At most the pool's size of works run at once; the others wait and start in the order they
    were submitted. A work whose future is cancelled while it waits never starts.
    """

    def submit(self, work: Callable[[], T], /) -> Future[T]:
        """``work``'s future: its result, or what it raised, once a thread has run it."""
        ...

    def shutdown(self) -> None:
        """Take no more work, and let each thread end once the work submitted before is done;
        returns at once."""
        ...


@attrs.frozen
class _ExecutorPool:
    """A ``ThreadPoolExecutor`` as a ``RenderPool``. Its threads hold the process's exit: the
    interpreter joins them, and so waits for any render still running."""

    executor: ThreadPoolExecutor

    def submit(self, work: Callable[[], T], /) -> Future[T]:
        return self.executor.submit(work)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False)


def _executor_pool(threads: int) -> RenderPool:
    return _ExecutorPool(ThreadPoolExecutor(threads, thread_name_prefix="trajcore-render"))


@attrs.define
class RenderThreads:
    """Runs renders in at most ``threads`` worker threads at once (see the module doc).

    One instance is meant to be shared by all the trajectories of a process
    (``shared_render_threads``); it may serve several event loops, one after another or at once.

    Attributes:
        threads: The most renders that run at once.
        make_pool: Makes the ``RenderPool`` of ``threads`` threads the renders run in; by
            default a ``ThreadPoolExecutor``, whose threads hold the process's exit
            (``trajcore.adapters.render_pool.DaemonRenderPool``'s do not).
    """

    threads: int = attrs.field(factory=default_render_threads, validator=_check_threads)
    make_pool: Callable[[int], RenderPool] = attrs.field(
        default=_executor_pool, kw_only=True, repr=False
    )
    _pool: RenderPool = attrs.field(init=False, repr=False)
    _waits: RunVar[anyio.CapacityLimiter] = attrs.field(init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._pool = self.make_pool(self.threads)
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
            RenderLate: (a ``TimeoutError``) waiting for a thread and running ``work`` took
                longer than ``timeout_s``: ``work`` never starts, or runs on and its result
                is dropped.
            StateError: ``close`` was called: no render starts any more.
        """
        if self._closed:
            raise StateError("the render threads are closed: no render starts in them")
        rendering: Future[T] = self._pool.submit(work)
        # the parked thread waits for the render or for this call's end, whichever comes first:
        # a wait given up on must not outlive the call (anyio's worker threads hold the exit)
        ended: Future[None] = Future()
        try:
            with anyio.move_on_after(timeout_s):
                await anyio.to_thread.run_sync(
                    _first_done, rendering, ended, limiter=self._waiters(), abandon_on_cancel=True
                )
                return rendering.result()  # ``ended`` is set only below: the render is done
            if rendering.cancel():  # still queued: now it never starts
                raise RenderLate(timeout_s, started=False)
            if rendering.done():  # it finished as the time ran out: nothing left to wait for
                return rendering.result()
            raise RenderLate(timeout_s, started=True)
        finally:
            rendering.cancel()  # a no-op once it runs or ran; else it never starts
            ended.set_result(None)

    def close(self) -> None:
        """Let the pool's threads end once the renders they run (or that wait) are done; a
        ``run`` after this raises ``StateError``."""
        self._closed = True
        self._pool.shutdown()


def _first_done(*futures: Future[Any]) -> None:
    wait(futures, return_when=FIRST_COMPLETED)


_SHARED: RenderThreads | None = None


def shared_render_threads() -> RenderThreads:
    """The process's ``RenderThreads`` (``default_render_threads()`` threads), made on first
    use; the trajectory runner uses it unless it is handed its own."""
    global _SHARED  # noqa: PLW0603 - one bound per process, made on first use
    if _SHARED is None:  # two loops in two threads racing here at worst make a spare pool
        _SHARED = RenderThreads()
    return _SHARED


Rendered = tuple[TrainingTokens | None, Drift | None]
"""A finished trajectory's training tokens and drift (either may be ``None``)."""


def _render(
    session: PolicySession,
    messages: Sequence[Message],
    *,
    drift: bool,
    max_token_length: int | None,
) -> Rendered:
    """The training tokens and (when asked) the drift: CPU work, run in a worker thread."""
    tokens = session.training_tokens(messages, max_token_length=max_token_length)
    return tokens, session.drift(messages) if drift else None


def _chars(message: Message) -> int:
    """The characters of ``message`` a render tokenizes: its text, its reasoning and its tool
    calls' arguments (a call that writes a whole file has all of them there)."""
    calls = sum(len(call.arguments_json()) for call in message.tool_calls)
    return len(message.content) + len(message.reasoning or "") + calls


async def render_final(
    session: PolicySession,
    messages: Sequence[Message],
    *,
    drift: bool,
    max_token_length: int | None,
    inline_chars: int,
    threads: RenderThreads,
    timeout_s: float,
) -> tuple[Rendered, str | None]:
    """A finished trajectory's render (its drift only when ``drift``): on the loop when its
    messages hold fewer than ``inline_chars`` characters, else in ``threads`` within
    ``timeout_s`` (the time left to the trajectory's deadline plus its grace: see the module
    doc). ``((None, None), why)`` when the render could not start or finish in that time."""
    size = sum(_chars(m) for m in messages)
    if size < inline_chars:  # a small render: cheaper here than a thread
        return _render(session, messages, drift=drift, max_token_length=max_token_length), None
    try:
        rendered = await threads.run(
            lambda: _render(session, messages, drift=drift, max_token_length=max_token_length),
            timeout_s=timeout_s,
        )
    except RenderLate as late:
        what = (
            "did not finish by"
            if late.started
            else "could not start (the render threads were busy with other renders) before"
        )
        return (None, None), (
            f"no training tokens: their render {what} the trajectory's deadline plus "
            f"render_grace_s, {late.timeout_s:.1f} s after it was asked for"
        )
    return rendered, None


async def render_member(
    trajectory_id: str,
    session: PolicySession | None,
    messages: Sequence[Message],
    *,
    turns: int,
    drift: bool,
    max_token_length: int | None,
    inline_chars: int,
    threads: RenderThreads,
    timeout_s: float,
) -> tuple[Rendered, str | None]:
    """``render_final`` of trajectory ``trajectory_id``: ``((None, None), None)`` where it took
    no turn (no ``session``, or ``turns`` 0); a render that did not make it is logged."""
    if session is None or turns == 0:
        return (None, None), None
    rendered, why = await render_final(
        session,
        messages,
        drift=drift,
        max_token_length=max_token_length,
        inline_chars=inline_chars,
        threads=threads,
        timeout_s=timeout_s,
    )
    if why is not None:
        log.warning("trajectory %s has %s; it is left out of training", trajectory_id, why)
    return rendered, why
