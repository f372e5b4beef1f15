"""A slot's side of snapshots: freezing a slot's lease, and starting a lease from a snapshot.

``SlotRuntime`` answers ``POST /v1/snapshot`` with ``freeze_lease``, and a ``POST /v1/lease``
naming a snapshot and a ``POST /v1/lease/fork`` with ``start_many``; the files are
``snapshots.SnapshotStore``'s. ``freeze_lease`` raises ``SnapshotRefused`` naming the field and
the reason (the caller turns it into the answer); ``start_many`` answers each lease itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot, lease_request_problem
from trajcore.adapters.slot_server.snapshots import Snapshot, SnapshotRefused, SnapshotStore
from trajcore.domain.errors import UnknownSlot
from trajcore.domain.slot_calls import StaleEpoch
from trajcore.domain.slot_protocol import LeaseAnswer
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref

__all__ = ["FORK_THREADS", "NEEDS_CACHE", "freeze_lease", "snapshot_problem", "start_many"]

NEEDS_CACHE = "snapshots need an image cache: start the slot server with --image-cache DIR"

Problem = Callable[[], "tuple[str, str] | None"]
FORK_THREADS = 8
"""How many worker threads start one fork request's leases (each a part of them, in turn): a
slot's first fork makes its user namespace, which waits on a child process, so a request of many
leases is not one thread's sequence, nor a thread hop per lease."""
LeaseProblem = Callable[[Slot, int], "tuple[str, str] | None"]
_Started = tuple["tuple[str, str] | None", list[int]]
"""A fork's workspace started: its refusal (field, reason) or ``None``, and its clones."""


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
    if slot.image is not None:  # its lease over the snapshot must fit the keeper's request
        below = store.root / ("0" * 32) / "root"  # as long as the snapshot's layer's path
        oversized = lease_request_problem(slot.image.image, (below, *(slot.frozen() or ())))
        if oversized is not None:
            raise SnapshotRefused("snapshot", f"no lease could start from it: {oversized}")
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


async def start_many(
    sandboxes: Sandboxes, store: SnapshotStore | None, leases: Sequence[tuple[int, int]], *,
    environment: str, wanted: str, slot_of: Callable[[int], Slot], problem: LeaseProblem,
    wipe_timeout_s: float,
) -> list[LeaseAnswer]:  # fmt: skip
    """Start each ``(slot, epoch)`` lease from snapshot ``wanted``: its workspace the
    snapshot's (an overlay, or a copy), its root the snapshot's layers over the image. The
    clones and mounts run in at most ``FORK_THREADS`` worker threads, each taking its part of
    the leases in turn (not a thread hop per lease). Each lease is
    answered on its own, in the order of ``leases``: a refusal (an unknown slot, a slot named
    twice, ``problem``, a refused snapshot, a failed clone) fails that lease only and names the
    field and the reason; the others are kept. Each started lease is isolated as one started
    alone (its own slot, epoch, workspace and layer)."""
    started = time.monotonic()
    answers: dict[int, LeaseAnswer] = {}

    def refuse(at: int, field: str, reason: str) -> None:
        index, epoch = leases[at]
        answers[at] = LeaseAnswer(
            slot=index, epoch=epoch, ok=False, error=reason, field=field,
            duration_s=time.monotonic() - started,
        )  # fmt: skip

    common: tuple[str, str] | None = None
    found: Snapshot | None = None
    try:
        if store is None:
            raise SnapshotRefused("slot", NEEDS_CACHE)
        found = store.find(wanted)
        asked = str(parse_environment_ref(environment))
        if asked != found.image.ref:
            raise SnapshotRefused(
                "environment", f"snapshot {wanted} was taken over {found.image.ref}, not {asked}"
            )
        oversized = lease_request_problem(found.image, found.layers)  # the keeper's limit
        common = None if oversized is None else ("environment", oversized)
    except SnapshotRefused as error:
        common = error.field, error.reason
    except TaskEnvironmentError as error:
        common = error.field, error.reason
    ready: list[tuple[int, Slot, int]] = []
    seen: set[int] = set()
    for at, (index, epoch) in enumerate(leases):
        try:
            slot = slot_of(index)
        except UnknownSlot as error:
            refuse(at, "slot", str(error))
            continue
        if index in seen:
            refuse(at, "slot", f"slot {index} is named twice in one request")
            continue
        seen.add(index)
        why = problem(slot, epoch) or common
        if why is None and _holds_anything(slot.workspace.root):
            why = (
                "epoch",
                "the lease's workspace holds files already: start the lease from the snapshot "
                "before anything is written to it",
            )
        if why is not None:
            refuse(at, *why)
            continue
        ready.append((at, slot, epoch))
    if ready:
        assert store is not None
        assert found is not None
        await _start_ready(
            sandboxes, store, found, ready, problem=problem, refuse=refuse,
            wipe_timeout_s=wipe_timeout_s,
        )  # fmt: skip
        for at, slot, epoch in ready:
            if at not in answers:
                assert slot.image is not None
                answers[at] = LeaseAnswer(
                    slot=slot.index, epoch=epoch, ok=True, image_id=slot.image.image.image_id,
                    hit=True, duration_s=time.monotonic() - started, snapshot=wanted,
                )  # fmt: skip
    return [answers[at] for at in range(len(leases))]


async def _start_ready(
    sandboxes: Sandboxes, store: SnapshotStore, found: Snapshot,
    ready: list[tuple[int, Slot, int]], *, problem: LeaseProblem,
    refuse: Callable[[int, str, str], None], wipe_timeout_s: float,
) -> None:  # fmt: skip
    """Clone or mount ``found``'s workspace for every lease of ``ready`` (``FORK_THREADS``),
    and make each lease's idmapped clones of its layers beside it (its keeper's lease takes
    them: no thread hop of its own when the leases are warmed), then hand each lease its
    snapshot (or refuse it, releasing its holds)."""
    holds = [(store.use(found, fork=True), found.hold_image()) for _ in ready]
    work = [(slot.workspace.root, sandboxes.ids(slot.index)) for _, slot, _ in ready]
    layers = (*found.layers, found.image.rootfs)
    lowers = sandboxes.lowers

    def start_some(part: list[tuple[Path, tuple[int, int] | None]]) -> list[_Started]:
        failed: list[_Started] = []
        for workspace, ids in part:
            try:
                store.start(found, workspace, ids)
            except SnapshotRefused as error:
                failed.append(((error.field, error.reason), []))
                continue
            except Exception as error:  # noqa: BLE001 - that lease fails alone
                why = f"cannot start from it: {type(error).__name__}: {error}"
                failed.append((("snapshot", why), []))
                continue
            clones = [] if lowers is None else lowers.lease_clones_now(ids, layers)
            failed.append((None, clones))
        return failed

    with _forking([slot for _, slot, _ in ready]):
        try:
            threads = min(len(work), FORK_THREADS)
            parts = [work[i::threads] for i in range(threads)]
            made = asyncio.gather(*(asyncio.to_thread(start_some, part) for part in parts))
            try:
                done = await asyncio.shield(made)
            except asyncio.CancelledError:  # nobody takes the clones: closed once they are made
                made.add_done_callback(_close_clones)
                raise
            failures = [done[at % threads][at // threads] for at in range(len(work))]
        except BaseException:
            for use, image in holds:
                use.close()
                image.close()
            raise
        for (at, slot, epoch), (use, image), (failure, clones) in zip(
            ready, holds, failures, strict=True
        ):
            late = failure or problem(slot, epoch)  # what changed during the clone
            if late is not None:
                for fd in clones:
                    os.close(fd)
                if failure is None:
                    await _undo_start(sandboxes, store, slot, wipe_timeout_s)
                use.close()
                image.close()
                refuse(at, *late)
                continue
            slot.image, slot.image_epoch, slot.snapshot = image, epoch, use
            slot.drop_clones()
            if clones:
                slot.clones = layers, clones


@contextlib.contextmanager
def _forking(slots: list[Slot]) -> Iterator[None]:
    """Each slot's ``forking`` set while a fork request starts it (a reset of it waits)."""
    loop = asyncio.get_running_loop()
    for slot in slots:
        slot.forking = loop.create_future()
    try:
        yield
    finally:
        for slot in slots:
            forking, slot.forking = slot.forking, None
            if forking is not None and not forking.done():
                forking.set_result(None)


async def _undo_start(
    sandboxes: Sandboxes, store: SnapshotStore, slot: Slot, wipe_timeout_s: float
) -> None:
    """Take back a fork's start that was refused late: its workspace unmounted and wiped. A
    mounted workspace overlay reached the keeper's namespace by propagation, where the host's
    unmount does not reach it (``clean_slot``): the keeper, and any lease it warmed meanwhile,
    end first, and the slot's next lease starts a fresh one."""
    if store.forked(slot.workspace.root):
        await sandboxes.stop_agent(slot)
        await sandboxes.stop_keeper(slot)
    await asyncio.to_thread(store.unmount, slot.workspace.root, None)
    await asyncio.to_thread(slot.workspace.wipe, timeout_s=wipe_timeout_s)


def _close_clones(made: asyncio.Future[list[list[_Started]]]) -> None:
    if made.cancelled() or made.exception() is not None:
        return
    for part in made.result():
        for _, clones in part:
            for fd in clones:
                os.close(fd)


def _holds_anything(path: Path) -> bool:
    with os.scandir(path) as entries:
        return any(True for _ in entries)
