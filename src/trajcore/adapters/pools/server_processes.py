"""What the pools whose slot servers are processes of this machine share (the local pool's
children, the SSH pool's ``ssh`` clients, the container pool's engine): signalling a server's
process group, the end of its log for the messages that say why it failed, ending every open
pool of a kind at once when the process must exit now (``abandon_each``), and running a short
command that a cancellation cannot leave half-started (``run_command``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence, Set
from pathlib import Path
from typing import Protocol

import anyio
from anyio.abc import ByteReceiveStream

__all__ = ["Abandonable", "abandon_each", "log_tail", "run_command", "signal_group"]


class Abandonable(Protocol):
    """An open pool's launcher that can end what it started synchronously, without its close."""

    def abandon(self, grace_s: float) -> None:
        """End it all now (``grace_s`` bounds each wait), and leave the open set."""
        ...


def abandon_each(opened: Set[Abandonable], grace_s: float) -> int:
    """``abandon(grace_s)`` every launcher in ``opened`` (a module's set of open ones, which
    each leaves as it is abandoned); safe from a signal handler or another thread. Returns how
    many it ended."""
    while True:
        try:
            launchers = list(opened)
        except RuntimeError:  # changed size while copied (another thread): try again
            continue
        break
    for launcher in launchers:
        launcher.abandon(grace_s)
    return len(launchers)


def signal_group(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process group ``pid`` leads; False when the group is gone (or not
    ours to signal)."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def log_tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` bytes of the log at ``path`` as text (undecodable bytes replaced,
    stripped); empty when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace").strip()


async def run_command(
    argv: Sequence[str], *, start_new_session: bool = False
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` to its end and return its exit code and both outputs (``anyio.run_process``
    with ``check=False``), safe to cancel. The start is shielded: asyncio's subprocess start,
    cancelled half-way, returns before the child is reaped and its pipes are connected, and
    leaves them to whatever runs the loop next (or to the garbage collector, once the loop is
    closed, as resource warnings). Once started, a cancellation kills the command and
    waits for it before it propagates, so no command outlives its caller."""
    with anyio.CancelScope(shield=True):  # bounded: a fork and two pipes, not the command's run
        process = await anyio.open_process(list(argv), start_new_session=start_new_session)
    outputs: tuple[list[bytes], list[bytes]] = ([], [])

    async def drain(stream: ByteReceiveStream | None, into: list[bytes]) -> None:
        if stream is not None:
            into.extend([chunk async for chunk in stream])

    async with process:  # (its close kills and reaps the command when cancelled)
        async with anyio.create_task_group() as group:
            group.start_soon(drain, process.stdout, outputs[0])
            group.start_soon(drain, process.stderr, outputs[1])
        returncode = await process.wait()
    return subprocess.CompletedProcess(list(argv), returncode, *map(b"".join, outputs))
