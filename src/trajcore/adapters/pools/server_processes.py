"""What the pools whose slot servers are processes of this machine share (the local pool's
children, the SSH pool's ``ssh`` clients): signalling a server's process group, and the end of
its log for the messages that say why it failed."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["log_tail", "signal_group"]


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
