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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import anyio
import anyio.abc
import attrs

__all__ = ["GuardProcess"]

_DEVNULL = -3  # subprocess.DEVNULL, without importing subprocess into the async code


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
        """Start ``argv`` as the guard: its own session, the pipe as its stdin, its output to
        nowhere but its warnings (stderr, the env's)."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = await anyio.open_process(
                list(argv), stdin=read_fd, stdout=_DEVNULL, stderr=None, start_new_session=True
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._fd = write_fd

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
