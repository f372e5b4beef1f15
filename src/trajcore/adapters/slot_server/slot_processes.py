"""Ending a slot's processes and running short commands, within deadlines.

A slot's keeper, a bare agent and whatever their commands started are sessions (process groups
started with ``start_new_session``) and, where there is one, a cgroup: these end them all and
reap them, each within a bounded time. ``run_bounded`` runs a short command to its end or its
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from trajcore.adapters.slot_server.limits import SlotCgroup

__all__ = [
    "as_ids",
    "end_process",
    "end_sessions",
    "kill_session",
    "kill_sessions",
    "run_bounded",
    "tmux_output",
]


def kill_session(process: asyncio.subprocess.Process) -> None:
    """SIGKILL a process started with ``start_new_session`` and its whole process group.

    ``process.kill()`` only where the group is gone: it polls the child first, and a poll that
    reaps it takes the exit status from the event loop's child watcher."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.kill()


async def end_process(process: asyncio.subprocess.Process, cgroup: SlotCgroup | None) -> None:
    """Kill ``process``'s session and everything in ``cgroup``, and reap it (within 5 s)."""
    if process.returncode is None:
        kill_session(process)
    if cgroup is not None:
        cgroup.kill_all()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await process.wait()


async def end_sessions(sessions: set[int]) -> None:
    """SIGKILL every process of ``sessions``, scanning again while any is found (a job may fork
    while a scan runs), for at most half a second."""
    for _ in range(50):
        if not kill_sessions(sessions):
            return
        await asyncio.sleep(0.01)


async def tmux_output(tmux: str, shell_socket: Path, *args: str) -> str:
    """What ``tmux -S shell_socket args`` prints (within 5 s; empty when it fails)."""
    try:
        code, out, _ = await run_bounded([tmux, "-S", str(shell_socket), *args], timeout_s=5)
    except OSError:
        return ""
    return out if code == 0 else ""


async def run_bounded(
    argv: list[str], *, timeout_s: float, ids: tuple[int, int] | None = None
) -> tuple[int | None, str, str]:
    """Run ``argv`` (as ``ids``, with no input) to its end: its exit code, stdout and stderr.

    The code is ``None`` when it ran past ``timeout_s`` and was killed. Raises ``OSError`` when
    it cannot start.
    """
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **as_ids(ids),
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return None, "", "timed out"
    return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def kill_sessions(sessions: set[int]) -> bool:
    """SIGKILL every process whose session is one of ``sessions``; whether any was found."""
    found = False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != b"Z" and int(fields[3]) in sessions:
            found = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
    return found


def as_ids(ids: tuple[int, int] | None) -> dict[str, Any]:
    """``create_subprocess_exec`` arguments that start a slot's sandbox as the slot's uid and
    gid with no supplementary group."""
    if ids is None:
        return {}
    return {"user": ids[0], "group": ids[1], "extra_groups": []}
