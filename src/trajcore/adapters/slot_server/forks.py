"""A slot's side of snapshots: freezing a slot's lease, and starting a lease from a snapshot.

``SlotRuntime`` answers ``POST /v1/snapshot`` with ``freeze_lease`` and a ``POST /v1/lease``
naming a snapshot with ``start_from``; the files are ``snapshots.SnapshotStore``'s. Both raise
``SnapshotRefused`` naming the field and the reason; the caller turns it into the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.sandboxes import Sandboxes, Slot
from trajcore.adapters.slot_server.snapshots import Snapshot, SnapshotRefused, SnapshotStore
from trajcore.domain.slot_calls import StaleEpoch
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref

__all__ = ["NEEDS_CACHE", "freeze_lease", "snapshot_problem", "start_from"]

NEEDS_CACHE = "snapshots need an image cache: start the slot server with --image-cache DIR"

Problem = Callable[[], "tuple[str, str] | None"]


def snapshot_problem(
    slot: Slot, epoch: int, store: SnapshotStore | None, *, closing: bool
) -> tuple[str, str] | None:
    """Why the slot's lease ``epoch`` cannot be snapshotted now (field, reason)."""
    if closing:
        return "$", "the slot server is closing"
    if store is None:
        return "slot", NEEDS_CACHE
    retired = slot.calls.retired_epoch
    if epoch <= retired:
        return "epoch", StaleEpoch(epoch=epoch, retired=retired).message
    if slot.image is None or slot.image_epoch != epoch:
        return (
            "epoch",
            f"the slot's lease epoch {epoch} runs over the server's own root: a snapshot "
            "freezes a lease over an image (name its environment with POST /v1/lease first), "
            "whose writable layer it keeps",
        )
    if slot.calls.statistics().busy:
        return "slot", "a call is running in the lease: take a snapshot between calls"
    return None


async def freeze_lease(
    sandboxes: Sandboxes, store: SnapshotStore, slot: Slot, problem: Problem,
    *, wipe_timeout_s: float,
) -> Snapshot:  # fmt: skip
    """Freeze the slot's lease (``problem()`` found none): end its processes (a snapshot holds
    files, not processes), move its layer into a new snapshot, and its workspace too where
    forks' workspaces are overlays (``SnapshotStore.freeze``; else a copy). The lease goes on
    over the snapshot, as every lease started from it does: its next call starts a fresh
    lease over it, whose workspace is then an overlay over the snapshot's (its reset is a
    fork's). The slot's calls wait for the freezing (as for a warming lease). Raises
    ``SnapshotRefused``; the lease's files are then as they were."""
    await sandboxes.stop_agent(slot)
    found = problem()  # what changed while the lease ended
    if found is not None:
        raise SnapshotRefused(*found)
    slot.agent_epoch = None  # not a lease lost mid-epoch: its next call starts a new one
    use = slot.image
    assert use is not None
    parent = None if slot.snapshot is None else slot.snapshot.snapshot
    made: list[Snapshot] = []
    layer = sandboxes.layer_dir(slot)

    def freeze_files() -> Snapshot:
        frozen = store.freeze(
            upper=layer / "upper", workspace=slot.workspace.root, image=use.image,
            parent=parent, ids=sandboxes.ids(slot.index),
        )  # fmt: skip
        with contextlib.suppress(OSError):  # the ended overlay's; the next lease makes its own
            remove_tree(layer / "work", timeout_s=wipe_timeout_s)
        return frozen

    async def freeze() -> None:  # all of it before the slot's waiting calls go on
        frozen = await asyncio.to_thread(freeze_files)
        store.admit(frozen, parent)
        before, slot.snapshot = slot.snapshot, store.use(frozen, fork=False)
        if before is not None:
            before.close()  # the new snapshot holds its parent
        made.append(frozen)

    freezing = slot.warm_with(freeze())
    try:
        await freezing
    except SnapshotRefused:
        raise
    except Exception as error:  # noqa: BLE001 - every request gets an answer
        raise SnapshotRefused(
            "snapshot", f"cannot freeze the lease: {type(error).__name__}: {error}"
        ) from None
    (frozen,) = made
    return frozen


async def start_from(
    sandboxes: Sandboxes, store: SnapshotStore, slot: Slot, *, epoch: int, environment: str,
    wanted: str, problem: Problem, wipe_timeout_s: float,
) -> None:  # fmt: skip
    """Make the slot's lease ``epoch`` start from snapshot ``wanted``: its workspace a copy of
    the snapshot's, its root the snapshot's layers over the image (``problem()`` found none
    before). Raises ``SnapshotRefused``."""
    found = store.find(wanted)
    try:
        asked = str(parse_environment_ref(environment))
    except TaskEnvironmentError as error:
        raise SnapshotRefused(error.field, error.reason) from None
    if asked != found.image.ref:
        raise SnapshotRefused(
            "environment", f"snapshot {wanted} was taken over {found.image.ref}, not {asked}"
        )
    if _holds_anything(slot.workspace.root):
        raise SnapshotRefused(
            "epoch",
            "the lease's workspace holds files already: start the lease from the snapshot "
            "before anything is written to it",
        )
    use, image = store.use(found, fork=True), found.hold_image()
    try:
        ids = sandboxes.ids(slot.index)
        await asyncio.to_thread(store.start, found, slot.workspace.root, ids)
        late = problem()  # what changed during the copy
        if late is not None:
            await asyncio.to_thread(store.unmount, slot.workspace.root, None)
            await asyncio.to_thread(slot.workspace.wipe, timeout_s=wipe_timeout_s)
            raise SnapshotRefused(*late)
    except BaseException:
        use.close()
        image.close()
        raise
    slot.image, slot.image_epoch, slot.snapshot = image, epoch, use


def _holds_anything(path: Path) -> bool:
    with os.scandir(path) as entries:
        return any(True for _ in entries)
