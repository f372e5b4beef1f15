"""A pool's guard process: a small process that outlives a killed env and cleans up after it.

A pool whose process is killed outright (SIGKILL by a scheduler, the out-of-memory killer, a
second signal during a hung close) runs none of its close. What it leaves depends on the pool:
the local pool's directory (``local_pool.guard_directory``), the container pool's containers
(``container_guard.guard_containers``). So such a pool starts one guard when it opens: a
process in a session of its own, whose stdin is a pipe with the pool's process as its only
writer. The pool tells it, a line at a time, what it starts; ``done`` once its close has
cleaned up. The pipe's end without ``done`` means the pool's process is gone, however it ended
(the kernel closes the pipe): the guard then cleans up what the lines named, within a deadline
of its own, and exits. ``GuardProcess`` is the pool's side of that: start, tell, release.

What a guard has to say (what it removed after a killed env, what it could not) it appends to
its log, ``guard_log()`` (``$XDG_STATE_HOME/trajcore/guards.log``, else
``~/.local/state/trajcore/guards.log``), one dated line per event; the pool's start names that
file in its log. Not to the env's stderr: the guard outlives the env by design, and a process
that reads the env's stderr to its end (a supervisor collecting logs, a test harness) would
wait for the guard's exit as long as the guard held it. The guard's stdout goes nowhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc
import attrs

__all__ = ["GuardProcess", "guard_log", "guard_says"]

_DEVNULL = -3  # subprocess.DEVNULL, without importing subprocess into the async code
_log = logging.getLogger(__name__)


def guard_log() -> Path:
    """The file guards append what they have to say to (module doc)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "trajcore" / "guards.log"


def guard_says(line: str) -> None:
    """For a guard process: append ``line``, dated, to its stderr (``guard_log()``)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S %z')} {line}\n")
        sys.stderr.flush()


def _open_log(path: Path) -> int | None:
    """``path`` opened to append (its folder made, private), or ``None`` (said in the log)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        return os.open(path, flags, 0o600)
    except OSError as error:
        _log.warning("a pool's guard cannot write its log %s (%s): it reports nothing", path, error)
        return None


@attrs.define(eq=False)
class GuardProcess:
    """The pool's side of its guard process.

    Attributes:
        exit_s: How long ``release`` waits for the guard to exit once told ``done`` before it
            kills it.
    """

    exit_s: float = 5.0
    _process: anyio.abc.Process | None = attrs.field(default=None, init=False)
    _fd: int | None = attrs.field(default=None, init=False)  # the guard's stdin

    @property
    def pid(self) -> int | None:
        """The guard's pid while it runs."""
        return None if self._process is None else self._process.pid

    async def start(self, argv: Sequence[str]) -> None:
        """Start ``argv`` as the guard: its own session, the pipe as its stdin, its stderr
        appended to ``guard_log()`` (never the env's), its stdout to nowhere."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        log = guard_log()
        log_fd = _open_log(log)
        try:
            self._process = await anyio.open_process(
                list(argv), stdin=read_fd, stdout=_DEVNULL,
                stderr=_DEVNULL if log_fd is None else log_fd, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
            if log_fd is not None:
                os.close(log_fd)
        self._fd = write_fd
        if log_fd is not None:
            _log.info(
                "the pool's guard (pid %d) cleans up after this process if it is killed and "
                "reports to %s",
                self._process.pid,
                log,
            )

    def tell(self, line: str) -> None:
        """Send ``line``; a guard gone is no error (the pool's close cleans up itself)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._fd, f"{line}\n".encode())

    def done(self) -> None:
        """Say the close has cleaned up, and close the pipe: the guard exits (synchronous)."""
        self.tell("done")
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    async def release(self) -> None:
        """``done``, then wait for the guard's exit (bounded: killed after ``exit_s``)."""
        self.done()
        process, self._process = self._process, None
        if process is not None:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(self.exit_s):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
