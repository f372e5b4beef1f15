"""A process's state as ``/proc`` shows it, for tests that check what is still running.

Reading ``/proc/PID/stat`` races the process's end: it may exit and be reaped between any two
reads. Both helpers answer for a process that is gone instead of raising, so a test asking
"is it still there?" never fails on the answer "no".
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["running", "stat_fields"]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first, so field ``n``
    of proc(5) is index ``n - 3``), or ``None`` once the process is gone. The name may hold
    spaces and parentheses: the fields follow its last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (ENOENT), or exiting as it was read (ESRCH)
        return None
    return text.rpartition(")")[2].split()


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited: a zombie not yet reaped counts as ended."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"
