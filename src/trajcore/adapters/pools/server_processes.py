"""What the pools whose slot servers are processes of this machine share (the local pool's
children, the SSH pool's ``ssh`` clients, the container pool's engine): signalling a server's
process group, the end of its log for the messages that say why it failed, and ending every
open pool of a kind at once when the process must exit now (``abandon_each``)."""

from __future__ import annotations

import os
from collections.abc import Set
from pathlib import Path
from typing import Protocol

__all__ = ["Abandonable", "abandon_each", "log_tail", "signal_group"]


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
