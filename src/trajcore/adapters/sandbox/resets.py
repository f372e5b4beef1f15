"""Ending a slot's lease and proving the slot clean before anyone else gets it.

A reset ends the lease's agent (with bubblewrap, its pid namespace takes every process of the
lease with it, tmux included; the keeper reaps them), then checks the slot's cgroup, when there
is one: it must hold nothing but the keeper's own processes. Then the workspace is wiped and
given back to the slot's uid. A slot that cannot be proven clean is reported, never reused
silently: the caller marks it broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

from trajcore.adapters.sandbox.sandboxes import Sandboxes, Slot

__all__ = ["clean_slot"]


async def clean_slot(sandboxes: Sandboxes, slot: Slot) -> str | None:
    """End the slot's lease and wipe its workspace; ``None`` when the slot is proven clean,
    else why not. Raises ``OSError`` when the workspace cannot be wiped."""
    await sandboxes.stop_agent(slot)
    problem = await _prove_empty(slot)
    if problem is not None:
        return problem
    # Most workspaces end a lease small: an empty one costs one directory read here, not a
    # trip through the thread pool.
    if _holds_anything(slot.workspace.root):
        await asyncio.to_thread(slot.workspace.wipe)
    sandboxes.own_workspace(slot)
    if slot.state_dir.exists():  # bare agents only
        await asyncio.to_thread(_wipe_dir, slot.state_dir)
    return None


async def _prove_empty(slot: Slot) -> str | None:
    """``None`` once the slot's cgroup holds no process but its keeper's (the cgroup is kept
    for the next lease)."""
    if slot.cgroup is None:
        return None
    keeper = slot.keeper
    expected = keeper.pids if keeper is not None and keeper.alive() else frozenset()
    extra: list[int] = []
    for _ in range(200):
        extra = [pid for pid in slot.cgroup.pids() if pid not in expected]
        if not extra:
            return None
        if expected:
            for pid in extra:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        else:
            slot.cgroup.kill_all()
        await asyncio.sleep(0.01)
    return f"processes {extra[:5]} of the slot survived SIGKILL"


def _holds_anything(path: Path) -> bool:
    with os.scandir(path) as entries:
        return any(True for _ in entries)


def _wipe_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
