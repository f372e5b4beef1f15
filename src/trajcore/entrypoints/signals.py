"""SIGINT and SIGTERM end a run with its sandbox pool closed; a second signal forces the end.

Every program trajcore starts an env with (``python my_env.py serve|process|evaluate``, through
``AgentEnv.cli``; ``trajcore demo``; ``trajcore run``) runs inside ``closing_on_signals``. The
slot server has its own handlers (``trajcore.entrypoints.slot_server``), to the same rules.

What a signal does:

- The first SIGINT or SIGTERM turns into cancellation. While an asyncio event loop runs in the
  main thread (``asyncio.run``, ``anyio.run``, whoever called it: Atropos's CLI does), the
  loop stops at its next step with ``Interrupted`` (a ``KeyboardInterrupt``, raised between two
  callbacks, never in the middle of one), and the runner then cancels every task once and runs
  them to their end: each ``async with`` unwinds, so the pool closes as after any error, under
  its own shielded, time-bounded close (its slot servers stopped, its sandboxes and tmux
  servers with them, its directory removed). Without a running loop the signal raises
  ``Interrupted`` where the program is, as Ctrl-C does.
- A second signal, or the first one's shutdown running past ``grace_s``, forces the end: every
  open local pool's slot servers get SIGTERM and then SIGKILL, its directory is removed
  (``abandon_local_pools``), every open container pool's containers are removed with the
  engine's ``rm --force`` and its token folder with them (``abandon_container_pools``), and
  the process exits at once with ``128 + signal``.
- A SIGTERM that comes again within ``REPEAT_WINDOW_S`` of the first is the same request, and
  changes nothing: GNU ``timeout`` (and other supervisors) send SIGTERM to the child and then
  to its whole process group, so the env gets it twice within milliseconds. A SIGTERM after
  the window, or a second SIGINT at any time (a double Ctrl-C), still forces the end.
- The block ends with ``SystemExit(128 + signal)`` (130 for SIGINT, 143 for SIGTERM) after one
  line on stderr, instead of a traceback.
- A signal ignored when the block is entered (``nohup``, a background job's SIGINT) stays
  ignored. Outside the main thread the block does nothing (Python delivers signals there only).

Even a SIGKILL of the env leaves nothing behind: the local pool starts its servers with
``--parent-pid`` and ``--parent-dir``, so they get SIGHUP when the env dies, close their
sandboxes and remove the pool's directory (``/tmp/trajcore-pool-*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

import attrs

from trajcore.adapters.pools.container_pool import abandon_container_pools
from trajcore.adapters.pools.local_pool import abandon_local_pools

__all__ = ["Interrupted", "closing_on_signals", "exit_status"]

_HANDLED = (signal.SIGINT, signal.SIGTERM)

REPEAT_WINDOW_S = 1.0
"""A SIGTERM this soon after the first SIGTERM is that one sent again, not a second request."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(signum: int) -> int:
    """The shell's exit status for a process ended by ``signum``: ``128 + signum``."""
    return 128 + signum


def _stderr(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _interrupt(signum: int) -> None:
    raise Interrupted(signum)


@attrs.define
class _Shutdown:
    name: str
    grace_s: float
    clock: Callable[[], float] = time.monotonic
    end: Callable[[int], NoReturn] = os._exit
    first: int | None = None
    first_at: float = 0.0
    timer: threading.Timer | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        now = self.clock()
        if self.first is not None:
            if signum == self.first == signal.SIGTERM and now - self.first_at < REPEAT_WINDOW_S:
                return  # the same SIGTERM again (to the process, then to its group)
            self.force(signum, "a second signal")
        self.first, self.first_at = signum, now
        again = "again a second later" if signum == signal.SIGTERM else "again"
        _stderr(
            f"{self.name}: {signal.Signals(signum).name}: stopping and closing the sandbox pool "
            f"(send it {again} to stop at once)"
        )
        self.timer = threading.Timer(
            self.grace_s, self.force, (signum, f"the shutdown took over {self.grace_s:g} s")
        )
        self.timer.daemon = True
        self.timer.start()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs here: stop where the program is, as Ctrl-C does
            raise Interrupted(signum) from None
        loop.call_soon_threadsafe(_interrupt, signum)

    def force(self, signum: int, why: str) -> NoReturn:
        _stderr(f"{self.name}: {why}: ending the slot servers and stopping now")
        with contextlib.suppress(Exception):
            abandon_local_pools()
        with contextlib.suppress(Exception):
            abandon_container_pools()
        self.end(exit_status(signum))

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


@contextlib.contextmanager
def closing_on_signals(name: str = "trajcore", *, grace_s: float = 60.0) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop the run as the module docstring says.

    ``name`` starts the lines written to stderr. ``grace_s`` bounds the shutdown after the
    first signal. An ``Interrupted`` that leaves the block becomes ``SystemExit(128 + signal)``.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    shutdown = _Shutdown(name=name, grace_s=grace_s)
    previous: dict[signal.Signals, object] = {}
    for signum in _HANDLED:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:
            continue
        previous[signum] = current
        signal.signal(signum, shutdown.handle)
    try:
        yield
    except Interrupted as stop:
        _stderr(f"{name}: stopped by {signal.Signals(stop.signum).name}")
        raise SystemExit(exit_status(stop.signum)) from None
    finally:
        shutdown.cancel()
        for signum, handler in previous.items():
            if handler is not None:  # (None: installed outside Python, cannot be restored)
                signal.signal(signum, handler)  # type: ignore[arg-type]  # what getsignal gave
