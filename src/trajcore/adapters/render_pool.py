"""Daemon threads for the renders of finished trajectories (``trajcore.rollout.render_threads``).

``RenderThreads`` keeps the rules of a render off the loop (the bound, the deadline, the order);
the threads come from a ``RenderPool``. A ``concurrent.futures.ThreadPoolExecutor``'s threads
are joined when the interpreter exits, so a render the trajectory runner has given up on (its
deadline passed and its result was dropped: a thread cannot be stopped) kept the env process
alive after a Ctrl-C or the end of a run until that render ended, tens of seconds for a huge
conversation. ``DaemonRenderPool`` runs renders in daemon threads instead: the process exits
without waiting for them. It keeps what a ``RenderPool`` promises:

- at most ``size`` threads, started as work comes (they never end early, until ``shutdown``);
- work starts in the order it was submitted; a work whose future is cancelled while it waits
  never starts;
- ``shutdown`` returns at once and lets each thread end once the work submitted before it is
  done; a ``submit`` after it raises ``StateError``. A pool dropped without ``shutdown`` is
  shut down when it is collected, as an executor is: its threads hold its queue, never the
  pool, so no thread is left blocked on a queue nothing can reach.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import attrs

from trajcore.domain.errors import ConfigError, StateError

__all__ = ["DaemonRenderPool"]

T = TypeVar("T")

_Work = tuple["Future[Any]", Callable[[], Any]] | None
"""A submitted work and its future; ``None`` tells the thread that takes it to end."""


def _check_size(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(attribute.name, f"must be a whole number of at least 1, got {value!r}")


@attrs.define
class DaemonRenderPool:
    """At most ``size`` daemon threads running submitted work in the order it came (a
    ``trajcore.rollout.render_threads.RenderPool``; see the module doc).

    Attributes:
        size: The most works that run at once.
    """

    size: int = attrs.field(validator=_check_size)
    _work: queue.SimpleQueue[_Work] = attrs.field(factory=queue.SimpleQueue, init=False)
    _threads: list[threading.Thread] = attrs.field(factory=list, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        weakref.finalize(self, _end_threads, self._work, self._threads)

    def submit(self, work: Callable[[], T], /) -> Future[T]:
        """``work``'s future, run in one of the pool's threads once the works before it started.

        Raises:
            StateError: ``shutdown`` was called.
        """
        future: Future[T] = Future()
        with self._lock:  # a new thread per submit until there are ``size`` of them
            if self._closed:
                raise StateError("the render pool is shut down: no work starts in it")
            self._work.put((future, work))
            if len(self._threads) < self.size:
                thread = threading.Thread(
                    target=_serve,
                    args=(self._work,),
                    name=f"trajcore-render-{len(self._threads)}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self) -> None:
        """Take no more work; each thread ends once the work submitted before this is done.
        Returns at once; a second call does nothing."""
        with self._lock:
            if not self._closed:
                self._closed = True
                _end_threads(self._work, self._threads)


def _serve(work: queue.SimpleQueue[_Work]) -> None:
    while (item := work.get()) is not None:
        _run_one(*item)
        del item  # hold no finished work (a render's conversation) while waiting for the next


def _run_one(future: Future[Any], work: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():  # cancelled while it waited
        return
    try:
        result = work()
    except BaseException as error:  # noqa: BLE001 - handed to the caller, as an executor does
        future.set_exception(error)
    else:
        future.set_result(result)


def _end_threads(work: queue.SimpleQueue[_Work], threads: list[threading.Thread]) -> None:
    """One end mark per thread, queued behind the work submitted so far."""
    for _ in threads:
        work.put(None)
