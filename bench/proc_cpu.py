"""CPU seconds of processes and of the trees below them, read from ``/proc`` (clock ticks)."""

from __future__ import annotations

import os


def _stat_after_name(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, by parent pid."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (after := _stat_after_name(entry)) is not None:
            tree.setdefault(int(after[1]), []).append(int(entry))
    return tree


def cpu_s(pid: int, *, reaped: bool) -> float:
    """``pid``'s CPU seconds (with ``reaped``: and its reaped children's); 0 once it is gone."""
    after = _stat_after_name(pid)
    if after is None:
        return 0.0
    ticks = sum(int(v) for v in after[11 : 15 if reaped else 13])
    return ticks / os.sysconf("SC_CLK_TCK")


def user_sys_s(pid: int) -> tuple[float, float]:
    """``pid``'s user and system CPU seconds; zeros once it is gone."""
    after = _stat_after_name(pid)
    if after is None:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(after[11]) / tick, int(after[12]) / tick


def below_s(pid: int, tree: dict[int, list[int]] | None = None) -> float:
    """CPU seconds of every process below ``pid`` (with what each reaped)."""
    tree = children_by_parent() if tree is None else tree
    total, stack = 0.0, list(tree.get(pid, []))
    while stack:
        child = stack.pop()
        total += cpu_s(child, reaped=True)
        stack += tree.get(child, [])
    return total
