"""Ending a slot's lease and proving the slot clean before anyone else gets it.

A reset ends the lease's agent (with bubblewrap, its pid namespace takes every process of the
lease with it, tmux included; the keeper reaps them), then checks the slot's cgroup, when there
is one: it must hold nothing but the keeper's own processes. Then the workspace is wiped and
given back to the slot's uid. A slot that cannot be proven clean is reported, never reused
silently: the caller marks it broken, and the pool quarantines it.

The wipe has a budget (``wipe_timeout_s``). Whatever a lease left (a tree too deep or too wide
to remove within it, entries that will not go), the slot is not lost for it: its sandbox is
ended, the whole workspace directory is renamed into the server's ``trash`` (one rename,
whatever the tree), and the slot gets a new, empty workspace. The trash is emptied in the
background (``empty_trash``), within its own deadline; what it cannot remove stays counted.
Only when even that fails is the slot reported unclean.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.channel import AgentLost
from trajcore.adapters.slot_server.sandboxes import Sandboxes, Slot

__all__ = ["clean_slot", "empty_trash", "warm_keeper"]


async def clean_slot(
    sandboxes: Sandboxes, slot: Slot, *, wipe_timeout_s: float, trash: Path
) -> str | None:
    """End the slot's lease and wipe its workspace (or set it aside, adding one to
    ``slot.set_aside``); ``None`` when the slot is proven clean, else why not. Never raises for
    what the lease left behind."""
    await sandboxes.stop_agent(slot)
    if not sandboxes.config.isolation.read_only_root:
        # the writable root is the keeper's own tmpfs, which every lease of the keeper shares:
        # it goes with the keeper, so the next lease starts on a fresh one
        await sandboxes.stop_keeper(slot)
    frozen = slot.snapshot
    if frozen is not None and frozen.store.forked(slot.workspace.root):
        # The keeper's copy of a fork's workspace overlay would outlive the host's unmount (a
        # mount propagated into a less privileged namespace is locked there, and an unmount
        # does not reach it): the keeper ends with it, and the next lease starts a fresh one.
        await sandboxes.stop_keeper(slot)
    problem = await _prove_empty(slot)
    if problem is not None:
        return problem
    if slot.image is not None:  # the lease ran over an image: its writable layer goes
        problem = _discard_layer(sandboxes, slot, trash)
        if problem is not None:
            return problem
    # Most workspaces end a lease small: an empty one costs one directory read here, not a
    # trip through the thread pool.
    if _holds_anything(slot.workspace.root):
        try:
            await asyncio.to_thread(slot.workspace.wipe, timeout_s=wipe_timeout_s)
        except Exception as failed:  # noqa: BLE001 - whatever stopped the wipe, set it aside
            problem = await _set_aside(sandboxes, slot, trash, failed)
            if problem is not None:
                return problem
    sandboxes.own_workspace(slot)
    if slot.state_dir.exists():  # bare agents only
        try:
            await asyncio.to_thread(remove_tree, slot.state_dir, timeout_s=wipe_timeout_s)
        except OSError as failed:
            return f"cannot remove the slot's state directory: {failed}"
    return None


def warm_keeper(sandboxes: Sandboxes, slot: Slot) -> asyncio.Task[None] | None:
    """Start the slot's keeper again, off the next lease's path, where the reset ended it (a
    fork's: its workspace overlay goes with it) and keepers live on between leases; the
    lease's calls wait for it as for a warming lease. A failure is left for the next call to
    meet (it starts the keeper again and reports why)."""
    if (
        not sandboxes.sandboxed
        or not sandboxes.config.isolation.read_only_root
        or slot.keeper is not None
        or slot.warming is not None
    ):
        return None

    async def start() -> None:
        with contextlib.suppress(AgentLost, OSError):
            await sandboxes.ensure_keeper(slot)

    return slot.warm_with(start())


async def _set_aside(sandboxes: Sandboxes, slot: Slot, trash: Path, why: Exception) -> str | None:
    """Give the slot a new workspace and move the old one into ``trash``; ``None`` on success,
    else why the slot stays unclean."""
    # The keeper's sandbox has the old directory bound: it ends, and the next lease starts a
    # sandbox over the new one.
    await sandboxes.stop_keeper(slot)
    try:
        await asyncio.to_thread(_swap_workspace, slot.workspace.root, trash)
    except OSError as failed:
        return (
            f"cannot wipe the workspace ({type(why).__name__}: {why}), nor set it aside: {failed}"
        )
    slot.set_aside += 1
    return None


def _discard_layer(sandboxes: Sandboxes, slot: Slot, trash: Path) -> str | None:
    """Set aside what the lease wrote over its image (its upper layer, the overlay's work
    directory, and a fork's workspace overlay, unmounted: renamed into ``trash``, which the
    runtime empties in the background, so the reset does not wait for their removal) and stop
    holding the image and the snapshot it started from; ``None`` once the layer directory is
    empty."""
    frozen = slot.snapshot
    if frozen is not None:  # a fork's workspace overlay goes first: it reads the snapshot's
        problem = frozen.store.unmount(slot.workspace.root, trash)
        if problem is not None:
            return problem
    use, slot.image, slot.image_epoch = slot.image, None, None
    if use is not None:
        use.close()
    slot.snapshot = None
    if frozen is not None:
        frozen.close()  # the last lease over a dropped snapshot removes it
    layer = sandboxes.layer_dir(slot)
    try:
        if not layer.is_dir():  # the lease started no sandbox (file tools only): no layer
            return None
        with os.scandir(layer) as entries:
            names = [entry.name for entry in entries]
        if names:
            trash.mkdir(mode=0o700, exist_ok=True)
            aside = trash / f"layer-{slot.index}-{os.urandom(6).hex()}"
            aside.mkdir(mode=0o700)
            for name in names:
                (layer / name).rename(aside / name)
    except OSError as failed:
        return f"cannot discard the lease's writable layer: {failed}"
    return None


def _swap_workspace(root: Path, trash: Path) -> None:
    trash.mkdir(mode=0o700, exist_ok=True)
    root.rename(trash / f"{root.name}-{os.urandom(6).hex()}")
    root.mkdir(mode=0o700)


def empty_trash(trash: Path, timeout_s: float) -> list[str]:
    """Remove every workspace set aside in ``trash``; returns a line for each that could not
    be removed within ``timeout_s`` (each) or at all."""
    left: list[str] = []
    if not trash.exists():
        return left
    for entry in sorted(trash.iterdir()):
        try:
            remove_tree(entry, timeout_s=timeout_s)
        except OSError as failed:
            left.append(f"{entry.name}: {failed}")
    return left


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
