"""One slot's state in the slot server: its workspace, cgroup, sandbox and the queue of its calls.

``Slot`` is the record every part of the server reads and updates for one slot (the runtime's
call turns and resets, the sandboxes that start its keeper and leases, forks, the listing); it
holds no behaviour of its own beyond the bookkeeping of its next lease (the layers it runs over,
the idmapped clones made ahead, the warming task).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.channel import Agent, Keeper
from trajcore.adapters.slot_server.image_cache import CachedImage, ImageUse
from trajcore.adapters.slot_server.limits import SlotCgroup
from trajcore.adapters.slot_server.snapshots import SnapshotUse
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.slot_calls import SlotCalls
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolResult

__all__ = ["REQUEST_MAX", "Slot", "lease_request", "lease_request_problem", "sandbox_pid"]

REQUEST_MAX = 96 * 1024
"""slot_helper.c's ``REQUEST_MAX``: the keeper refuses whole a request of this many bytes or
more (its buffer keeps one byte for a NUL), so a lease's request must stay below it."""


@attrs.define(eq=False)
class Slot:
    """One slot: its workspace, cgroup and sandbox, and the queue of its calls.

    ``answers`` holds, per accepted call's ticket number, the call and the future its callers
    wait on; ``reset_turns``, per queued reset's ticket number, the future its turn sets.
    ``agent_epoch`` is the lease epoch whose calls started the current (or last) agent: an
    agent lost during an epoch is not replaced silently, since the lease's processes, shell
    and /tmp went with it.
    """

    index: int
    workspace: Workspace
    state_dir: Path
    cgroup: SlotCgroup | None
    calls: SlotCalls[ToolResult] = attrs.field(factory=SlotCalls)
    answers: dict[int, tuple[ExecuteCall, asyncio.Future[ToolResult]]] = attrs.field(factory=dict)
    time_ends: dict[int, float] = attrs.field(factory=dict)
    """Per accepted call that carries its turn's time left (``ExecuteCall.time_left_s``), by
    ticket number: when, by the loop's clock, that time runs out (until its turn comes)."""
    reset_turns: dict[int, asyncio.Future[None]] = attrs.field(factory=dict)
    agent: Agent | None = None
    keeper: Keeper | None = None
    sandbox_start_s: float | None = None
    agent_epoch: int | None = None
    set_aside: int = 0  # workspaces a reset moved to the trash instead of wiping them in place
    readied_lost: int = 0  # readied lease processes found dead or hung by their lease (lease_agent)
    warming: asyncio.Task[None] | None = None  # the next lease, started after a clean reset
    warmed: Agent | None = None  # that lease's agent, until its first call takes it
    image: ImageUse | None = None  # the image the lease ``image_epoch`` runs over, held
    image_epoch: int | None = None
    snapshot: SnapshotUse | None = None  # the snapshot the lease ``image_epoch`` starts from
    agent_root: str | None = None  # the image tree the live agent runs over (None: the server's)
    clones: tuple[tuple[Path, ...], list[int]] | None = None
    """Idmapped clones of the next lease's layers made ahead (a fork's, in its request's worker
    thread), with those layers: that lease takes them (``take_clones``); a reset closes them."""
    disk_written: int | None = None
    """The lease epoch whose ``write_file`` wrote since its disk budget's last measure."""
    disk_over: tuple[int, str] | None = None
    """The lease epoch ended for passing its disk budget, and why (``disk_budget``)."""
    model_ran: int | None = None
    """The lease epoch whose model's call started since a hook's call last measured its disk
    (``DiskWatch.before_hook``): the hooks' own writes (a preparation's uploads) are not
    measured call after call."""
    forking: asyncio.Future[None] | None = None
    """Set while a fork request starts a lease of this slot from a snapshot (its workspace
    mounted in a worker thread): a reset of the slot waits for it to end, so that it cleans
    what the fork made (or what the fork's own refusal left), never the slot beside it."""

    def take_clones(self, layers: tuple[Path, ...]) -> list[int] | None:
        """The clones made ahead for ``layers`` (the caller closes them), or ``None`` (any made
        for other layers are closed)."""
        made, self.clones = self.clones, None
        if made is None:
            return None
        if made[0] == layers:
            return made[1]
        for fd in made[1]:
            os.close(fd)
        return None

    def drop_clones(self) -> None:
        """Close the clones made ahead, if any (their lease will not start)."""
        self.take_clones(())

    def warm_with(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run ``work`` as the slot's ``warming`` task (the slot's next calls wait for it), which
        clears itself when it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self.warming = task

        def done(_: asyncio.Task[None]) -> None:
            if self.warming is task:
                self.warming = None

        task.add_done_callback(done)
        return task

    def layers(self) -> tuple[Path, ...]:
        """The read-only layers of the slot's next lease, top first: its snapshot's frozen
        layers and its image's tree (none: a lease over the server's root)."""
        if self.image is None:
            return ()
        return (*(() if self.snapshot is None else self.snapshot.layers), self.image.image.rootfs)

    def lease_op(self) -> str:
        """The keeper's request for this slot's next lease: ``lease`` (the server's root), or
        ``lease-image`` (``lease-fork`` from a snapshot) NUL its ``layers``, NUL-separated, then,
        where the image's config sets variables, an empty field and its ``Env`` entries,
        NUL-separated (the keeper applies them: docs/sandbox.md)."""
        if self.image is None:
            return "lease"
        return lease_request(self.image.image, self.frozen())

    def frozen(self) -> tuple[Path, ...] | None:
        """The frozen layers of the slot's snapshot, top first (``None``: not a fork)."""
        return None if self.snapshot is None else self.snapshot.layers

    def lease_op_problem(self) -> str | None:
        """Why the keeper would refuse ``lease_op`` (``lease_request_problem``), if it would."""
        return (
            None if self.image is None else lease_request_problem(self.image.image, self.frozen())
        )


def lease_request(image: CachedImage, frozen: tuple[Path, ...] | None = None) -> str:
    """The keeper's request for a lease over ``image`` (``Slot.lease_op``): ``lease-image``, or
    ``lease-fork`` over a snapshot's ``frozen`` layers (top first), stacked on its tree."""
    kind, layers = ("lease-image", ()) if frozen is None else ("lease-fork", frozen)
    env = ("", *image.env) if image.env else ()
    return "\0".join((kind, *map(str, (*layers, image.rootfs)), *env))


def lease_request_problem(image: CachedImage, frozen: tuple[Path, ...] | None = None) -> str | None:
    """Why the keeper would refuse the request of a lease over ``image`` (``lease_request``):
    it is ``REQUEST_MAX`` bytes or more, what makes it so named; ``None`` when it fits."""
    size = len(lease_request(image, frozen).encode("utf-8", "surrogateescape"))
    if size < REQUEST_MAX:
        return None
    env = sum(len(entry.encode("utf-8", "surrogateescape")) + 1 for entry in image.env)
    layers = 1 + len(frozen or ())
    return (
        f"image {image.ref}: a lease over it needs a request of {size} bytes to the slot's "
        f"keeper, over its limit of {REQUEST_MAX - 1} bytes: the image's Env holds "
        f"{len(image.env)} variables ({env} bytes) and the lease runs over {layers} "
        f"layer{'s' if layers != 1 else ''} (their paths {size - env} bytes with the request's "
        "head)"
    )


def sandbox_pid(slot: Slot) -> int | None:
    """The host pid of the slot's outermost sandbox process (its keeper's bubblewrap, or a bare
    agent), while it runs."""
    if slot.keeper is not None:
        return slot.keeper.process.pid
    return slot.agent.pid if slot.agent is not None else None
