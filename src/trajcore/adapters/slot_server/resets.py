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
background (``Trash``), within its own deadline; what it cannot remove stays counted.
Only when even that fails is the slot reported unclean.

What a lease over an environment wrote (its upper layer over the image and, for a fork, its
workspace overlay's upper layer) is set aside by its reset into one ``layer-*`` folder of the
trash; the sweep measures it (``measure_layer``: a ``du``-like walk, each inode once, within
``LAYER_MEASURE_TIMEOUT_S``) before removing it, and counts it in ``Trash.layers`` (health's
``lease_layers``) at once, so the measuring costs the reset nothing, and a layer gone from the
trash is counted.

A ``layer-*`` folder is filled in steps (a fork's workspace overlay is unmounted into it, which
waits for the kernel, then the layer is renamed into it), while other slots' resets start
sweeps. A sweep leaves a folder alone while a reset fills it (``Trash.setting_aside``):
removed half filled, the reset's next rename into it would fail, and the slot, clean, would be
reported unclean and quarantined.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import attrs

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.channel import AgentLost
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.snapshots import SnapshotUse
from trajcore.domain.task_environments import LeaseLayerStatistics

__all__ = [
    "LAYER_MEASURE_TIMEOUT_S",
    "LayerSize",
    "Trash",
    "clean_slot",
    "empty_trash",
    "measure_layer",
    "warm_keeper",
]

LAYER_MEASURE_TIMEOUT_S = 5.0
"""How long the sweep measures one lease's layer at most (past it, a lower bound is counted)."""
_TRASH_TIMEOUT_S = 600.0  # one set-aside workspace's removal in the background, at most
_LAYER_PREFIX = "layer-"


async def clean_slot(
    sandboxes: Sandboxes, slot: Slot, *, wipe_timeout_s: float, trash: Trash
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
        problem = await _discard_layer(sandboxes, slot, trash)
        if problem is not None:
            return problem
    # Most workspaces end a lease small: an empty one costs one directory read here, not a
    # trip through the thread pool.
    if _holds_anything(slot.workspace.root):
        try:
            await asyncio.to_thread(slot.workspace.wipe, timeout_s=wipe_timeout_s)
        except Exception as failed:  # noqa: BLE001 - whatever stopped the wipe, set it aside
            problem = await _set_aside(sandboxes, slot, trash.folder, failed)
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
    """Ready the slot's next lease over an image, off its path, once a reset proved the slot
    clean: start the keeper again where the reset ended it (a fork's: its workspace overlay
    goes with it) and keepers live on between leases, and have the keeper ready the next
    lease's first process and namespaces (``Sandboxes.ready_lease``). The lease's calls wait
    for it as for a warming lease. A failure is left for the next call to meet (it starts the
    keeper again and reports why)."""
    if (
        not sandboxes.sandboxed
        or not sandboxes.config.isolation.read_only_root
        or slot.agent is not None
        or slot.warming is not None
    ):
        return None

    async def start() -> None:
        with contextlib.suppress(AgentLost, OSError):
            await sandboxes.ensure_keeper(slot)
            await sandboxes.ready_lease(slot)

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


async def _discard_layer(sandboxes: Sandboxes, slot: Slot, trash: Trash) -> str | None:
    """Set aside what the lease wrote over its image (its upper layer, the overlay's work
    directory, and a fork's workspace overlay, unmounted: renamed into one ``layer-*`` folder of
    ``trash``, which the runtime measures and empties in the background, so the reset waits
    for neither) and stop holding the image and the snapshot it started from; ``None`` once
    the layer directory is empty. A fork's unmounts run in a worker thread: each detach waits
    for the kernel (an RCU grace period), which would stall the server's event loop, every
    other slot's calls with it."""
    frozen = slot.snapshot
    layer = sandboxes.layer_dir(slot)
    # one folder in the trash for all the lease wrote, which the sweep measures as one layer
    with trash.setting_aside(f"{_LAYER_PREFIX}{slot.index}") as aside:
        if frozen is not None and frozen.store.forked(slot.workspace.root):
            # a fork's workspace overlay goes first: it reads the snapshot's
            unmounted, problem = await asyncio.to_thread(
                _unmount, frozen, slot, trash.folder, aside
            )
        else:
            unmounted, problem = True, None
        if not unmounted:
            return problem
        use, slot.image, slot.image_epoch = slot.image, None, None
        slot.drop_clones()  # made ahead for a lease that never started its keeper's lease
        if use is not None:
            use.close()
        slot.snapshot = None
        if frozen is not None:
            frozen.close()  # the last lease over a dropped snapshot removes it
        if problem is None:
            problem = _set_layer_aside(layer, trash.folder, aside)
    if problem is None and layer.is_dir():
        try:
            sandboxes.ready_layer(slot)  # the next lease's, off its setup
        except OSError as failed:
            return f"cannot make the next lease's layer: {failed}"
    return problem


def _unmount(frozen: SnapshotUse, slot: Slot, trash: Path, aside: Path) -> tuple[bool, str | None]:
    """Unmount the slot's forked workspace into ``aside`` (blocking): (unmounted, problem)."""
    try:
        trash.mkdir(mode=0o700, exist_ok=True)
        aside.mkdir(mode=0o700)
    except OSError as failed:
        return False, f"cannot set the forked workspace aside: {failed}"
    problem = frozen.store.unmount(slot.workspace.root, aside)
    return problem is None, problem


def _set_layer_aside(layer: Path, trash: Path, aside: Path) -> str | None:
    """Rename what the lease wrote (its ``upper`` and ``work``, and anything else there) into
    ``aside``; the empty folders the keeper mounts on in the lease's own namespace (``root``,
    ``lower-N``: nothing is ever mounted on them here) stay for the next lease, whose keeper
    would otherwise make them again: an ext4 ``mkdir`` each, and the keepers' ``mkdir`` calls
    were a quarter of their CPU when a group's forks started at once."""
    try:
        if not layer.is_dir():  # the lease started no sandbox (file tools only): no layer
            return None
        with os.scandir(layer) as entries:
            names = [entry.name for entry in entries if not _mount_point(entry)]
        if names:
            trash.mkdir(mode=0o700, exist_ok=True)
            aside.mkdir(mode=0o700, exist_ok=True)
            for name in names:
                (layer / name).rename(aside / name)
    except OSError as failed:
        return f"cannot discard the lease's writable layer: {failed}"
    return None


def _mount_point(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` of a layer folder is an empty folder the keeper mounts on (``root``,
    ``lower-N``)."""
    name = entry.name
    if name != "root" and not (name.startswith("lower-") and name[6:].isdigit()):
        return False
    if not entry.is_dir(follow_symlinks=False):
        return False
    with os.scandir(entry.path) as inside:
        return next(inside, None) is None


def _swap_workspace(root: Path, trash: Path) -> None:
    trash.mkdir(mode=0o700, exist_ok=True)
    root.rename(trash / f"{root.name}-{os.urandom(6).hex()}")
    root.mkdir(mode=0o700)


@attrs.frozen
class LayerSize:
    """One lease's layer as ``measure_layer`` found it."""

    bytes: int
    entries: int
    cut_short: bool
    seconds: float


def measure_layer(folder: Path, *, timeout_s: float = LAYER_MEASURE_TIMEOUT_S) -> LayerSize:
    """What a lease's layer folder in the trash holds: its ``upper`` and its fork's
    ``fork-*/upper``, walked without following a link, each inode's allocated blocks counted
    once (as ``du`` does) and every entry counted; past ``timeout_s`` the walk stops and says
    so (``cut_short``: a lower bound). A folder that cannot be read counts what was read."""
    started = time.monotonic()
    deadline = started + timeout_s
    total = entries = 0
    seen: set[tuple[int, int]] = set()
    pending = [str(folder / "upper")]
    with contextlib.suppress(OSError):
        pending += [str(fork / "upper") for fork in folder.glob("fork-*")]
    cut = False
    while pending and not cut:
        try:
            with os.scandir(pending.pop()) as found:
                for entry in found:
                    if time.monotonic() > deadline:
                        cut = True
                        break
                    info = entry.stat(follow_symlinks=False)
                    entries += 1
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(entry.path)
                    elif info.st_nlink > 1:
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
        except OSError:
            continue  # a missing upper (the lease wrote no root), or one gone meanwhile
    return LayerSize(total, entries, cut, time.monotonic() - started)


def empty_trash(
    trash: Path,
    timeout_s: float,
    *,
    measured: set[str] | None = None,
    filling: Collection[str] = (),
    measure_s: float = LAYER_MEASURE_TIMEOUT_S,
    on_layer: Callable[[LayerSize], None] | None = None,
) -> tuple[list[str], list[LayerSize]]:
    """Remove everything set aside in ``trash``, measuring each lease's layer folder first
    (``on_layer`` hears of each before it is removed); returns a line for each entry that
    could not be removed within ``timeout_s`` (each) or at all, and the layers measured.
    ``measured`` names the layer folders an earlier sweep measured (and could not remove):
    they are not measured again; it is kept up to date. ``filling`` names the entries a reset
    is filling now: they are left for a later sweep (looked up as each entry's turn comes, so
    it may change meanwhile)."""
    left: list[str] = []
    layers: list[LayerSize] = []
    if not trash.exists():
        return left, layers
    done = set() if measured is None else measured
    for entry in sorted(trash.iterdir()):
        if entry.name in filling:
            continue
        if entry.name.startswith(_LAYER_PREFIX) and entry.name not in done:
            layers.append(measure_layer(entry, timeout_s=measure_s))
            done.add(entry.name)
            if on_layer is not None:
                on_layer(layers[-1])
        try:
            remove_tree(entry, timeout_s=timeout_s)
        except OSError as failed:
            left.append(f"{entry.name}: {failed}")
            continue
        done.discard(entry.name)
    return left, layers


@attrs.define
class Trash:
    """A server's trash folder, emptied in the background (one sweep at a time; one asked for
    meanwhile runs once the current one ends).

    Attributes:
        folder: The trash folder.
        left: What the last sweep could not remove (one line each).
        layers: The leases' layers measured so far.
    """

    folder: Path
    left: tuple[str, ...] = ()
    layers: LeaseLayerStatistics = attrs.field(factory=LeaseLayerStatistics)
    _sweeping: bool = False
    _again: bool = False
    _measured: set[str] = attrs.field(factory=set)
    _filling: set[str] = attrs.field(factory=set)  # read by the sweep's thread: see below

    @contextlib.contextmanager
    def setting_aside(self, prefix: str) -> Iterator[Path]:
        """A path for a new folder of the trash (``prefix``, a dash and a random suffix), which
        the caller makes and fills within the block: no sweep measures or removes it before
        the block ends (a sweep asked for at the end, as every reset asks, takes it)."""
        name = f"{prefix}-{os.urandom(6).hex()}"
        # Named before the folder exists: a sweep that lists it finds the name here, and the
        # name goes only once the folder is filled. The sweep's thread only tests membership
        # (one set operation, atomic), while the event loop adds and discards.
        self._filling.add(name)
        try:
            yield self.folder / name
        finally:
            self._filling.discard(name)

    def sweep(self, tasks: set[asyncio.Task[None]]) -> None:
        """Empty the trash in the background when it holds anything (the task goes into
        ``tasks`` while it runs)."""
        if self._sweeping:
            self._again = True
            return
        if not self.folder.exists() or not any(self.folder.iterdir()):
            return
        self._sweeping = True
        task = asyncio.get_running_loop().create_task(self._run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self) -> None:
        try:
            again = True
            while again:
                self._again = False
                left, _ = await asyncio.to_thread(
                    empty_trash, self.folder, _TRASH_TIMEOUT_S, measured=self._measured,
                    filling=self._filling, on_layer=self._count,
                )  # fmt: skip
                self.left = tuple(left)
                again = self._again
        finally:
            self._sweeping = False

    def _count(self, size: LayerSize) -> None:
        # in the sweep's thread, before the layer's removal: once a layer is gone from the
        # trash it is counted (one sweep at a time writes; a reader sees one value or the next)
        self.layers = self.layers.add(
            size=size.bytes, entries=size.entries, cut_short=size.cut_short, seconds=size.seconds
        )


async def _prove_empty(slot: Slot) -> str | None:
    """``None`` once the slot's cgroup holds no process but its keeper's (the cgroup is kept
    for the next lease)."""
    if slot.cgroup is None:
        return None
    slot.cgroup.oom_seen = None  # the next lease's first call reads the count afresh
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
