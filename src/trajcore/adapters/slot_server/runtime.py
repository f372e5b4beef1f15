"""The slot runtime: N slots, one sandbox per slot started on first use, and the slot tools.

This is the slot server without its HTTP face. It owns N workspaces under a root directory and
runs ``ExecuteCall`` values in them:

- ``bash`` is one ``/bin/sh -c`` per call, forked by the slot's lease agent inside the slot's
  bubblewrap sandbox; ``bash_stateful`` and ``tmux`` use one persistent tmux session per slot in
  the same sandbox; ``read_file`` and ``write_file`` run here, confined by ``Workspace``.
- A server run as root runs slot ``i``'s sandbox as host uid/gid ``slot_uid_base + i`` (never as
  root; ``slot_ids``), gives it the slot's workspace and stages what the sandbox binds from
  private places as world-readable copies under ``root/runtime``; every lease also gets the
  kernel masks, its own session keyring (and network namespace when network is off), and the
  seccomp filter this server compiled once at start (``seccomp``). Replies over the channel are
  capped (``reply_cap``) and checked; one that is not a reply ends the lease.
- A slot's sandbox (bubblewrap, started on the slot's first command) runs the slot's *keeper*
  (the slot helper, ``slot_helper.c``, shipped with the install or built at start; the server
  does not start without it), which stays for the life of the server. Each lease gets its own
  agent from the keeper: a fork that enters new pid, mount, ipc and uts namespaces, mounts a
  fresh ``/proc``, ``/tmp`` and ``/dev/shm``, drops every capability and then serves the lease's
  calls over its own socket. Starting a lease is therefore one fork, not a new sandbox and a new
  interpreter. Background processes survive between the calls of one lease; reset ends the lease
  (its pid namespace takes every process with it, tmux included; the keeper waits until the kernel
  has reaped them, and the slot's cgroup, when there is one, must hold nothing but the keeper's
  own processes), then wipes the workspace. A reset that cannot prove this reports ``ok=False``
  and marks the slot broken: the pool quarantines it. A keeper that fails or stops answering is
  killed with its whole sandbox and started again on the next lease.
- Without bubblewrap (and without ``require_sandbox``) there is no keeper: each lease starts a
  bare agent (``slot-helper bare``), and reset kills its session (and its cgroup, when there is
  one).
- Calls and resets for one slot take turns in arrival order, decided by the slot's
  ``SlotCalls`` (``domain/slot_calls``), which is fed synchronously as requests arrive, so no
  await can reorder them; different slots run in parallel. ``(epoch, call_id)`` is remembered
  per slot: a repeat gets the first call's result, also while the first is still running. A
  call whose epoch a reset has retired is refused as stale. A reset interrupts the slot's running
  call at once (one still starting the slot's sandbox is refused as stale before it runs). This
  module only carries out the queue's decisions.
- Isolation is the server's: the model's ``allow_network`` or ``require_sandbox`` arguments are
  ignored and its ``timeout`` may only shorten the limit. With ``require_sandbox`` and no usable
  bubblewrap every call fails closed as ``INFRA_ERROR`` naming the reason; without it commands
  run bare and their ``ExecReport`` says ``sandboxed=False``.
- A call's failure is its result, never an exception: unknown tools and bad arguments are
  ``REJECTED`` with ``reason @ $.path``; a sandbox that dies mid-call is ``INFRA_ERROR``.

Modules: ``runtime_config`` (the config), ``channel`` (framing and replies), ``sandboxes``
(keepers, leases, bare agents), ``capabilities`` (the host probe), ``call_turns`` (the calls
carried out in their slots' turns), ``tool_calls`` (the slot tools), ``resets`` (proving a slot
clean). ``RuntimeConfig``, ``check_config``, ``reply_cap``,
``MAX_REQUEST_BYTES`` and ``HELPER_PATH`` are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip  # noqa: F401 - loaded now: the archive runs as the slot, which cannot read /root
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.call_turns import CallTurns
from trajcore.adapters.slot_server.capabilities import probe
from trajcore.adapters.slot_server.disk_budget import DiskWatch, budget_warnings
from trajcore.adapters.slot_server.forks import (
    NEEDS_CACHE,
    freeze_lease,
    snapshot_problem,
    start_many,
)
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_checks import ImageChecks
from trajcore.adapters.slot_server.limits import SlotCgroup, detect_cgroups, remove_parent
from trajcore.adapters.slot_server.native_helper import (
    SHIPPED_SLOT_HELPER,
    NativeBuildError,
    build_slot_helper,
)
from trajcore.adapters.slot_server.resets import Trash, clean_slot, warm_keeper
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.sandboxes import Sandboxes, prepare_cgroups
from trajcore.adapters.slot_server.seccomp import SeccompUnavailable, compile_filter
from trajcore.adapters.slot_server.slot_ids import stage_file, unmapped
from trajcore.adapters.slot_server.slot_listing import slot_info
from trajcore.adapters.slot_server.slot_state import Slot, lease_request_problem
from trajcore.adapters.slot_server.snapshots import SnapshotRefused, SnapshotStore
from trajcore.adapters.slot_server.tool_calls import refused
from trajcore.adapters.slot_server.tree_owners import require_reachable
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.adapters.slot_server.workspace_overlays import WorkspaceOverlays
from trajcore.adapters.slot_uid_locks import (
    SlotUidLockError,
    SlotUidReservation,
    SlotUidsHeld,
    reserve_free,
)
from trajcore.domain.errors import ConfigError, UnknownSlot
from trajcore.domain.isolation import MAX_SLOT_UID
from trajcore.domain.seccomp_rules import SECCOMP_RULES
from trajcore.domain.slot_calls import (
    Closing,
    SlotCalls,
    StaleEpoch,
)
from trajcore.domain.slot_protocol import (
    PROTOCOL_VERSION,
    ArtifactArchive,
    ArtifactFile,
    Capabilities,
    DirectoryListing,
    DropSnapshotAnswer,
    ExecuteCall,
    Health,
    LeaseAnswer,
    ResetResult,
    SlotListing,
    SnapshotAnswer,
)
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref
from trajcore.domain.tools import ToolResult

__all__ = ["SlotRuntime"]


_log = logging.getLogger(__name__)


@attrs.define(eq=False)
class SlotRuntime(CallTurns):
    """N slots and their sandboxes. Create, ``await start()``, use, ``await aclose()``."""

    config: RuntimeConfig
    capabilities: Capabilities = attrs.field(
        init=False,
        factory=lambda: Capabilities(
            bwrap=False, tmux=False, network_isolation=False, cgroups=False
        ),
    )
    sandboxed: bool = attrs.field(init=False, default=False)
    _sandboxes: Sandboxes = attrs.field(init=False)
    _slots: list[Slot] = attrs.field(init=False, factory=list)
    _tasks: set[asyncio.Task[None]] = attrs.field(init=False, factory=set)
    _listeners: dict[asyncio.Future[ToolResult], list[Callable[[], None]]] = attrs.field(
        init=False, factory=dict
    )  # per unanswered call's future: ``execute_now``'s batches waiting on it
    _closed: bool = attrs.field(init=False, default=False)
    _sweeping_snapshots: bool = attrs.field(init=False, default=False)
    images: ImageCache | None = attrs.field(init=False, default=None)
    """The host's image cache (``RuntimeConfig.image_cache``), once started."""
    snapshots: SnapshotStore | None = attrs.field(init=False, default=None)
    """This server's snapshots (with an image cache), once started."""
    trash_left: tuple[str, ...] = attrs.field(init=False, default=())
    """What the snapshots' sweeps could not remove (one line each)."""
    boot: str = attrs.field(init=False, factory=lambda: os.urandom(8).hex())
    """This run of the server (``Health.boot``; in every batch's answer)."""
    _bin: Trash = attrs.field(init=False)  # the trash's sweeps, and the leases' layers measured
    _disk: DiskWatch = attrs.field(init=False)  # each lease's disk budget
    _uids: SlotUidReservation | None = attrs.field(init=False, default=None)  # as root
    _runnable: ImageChecks = attrs.field(init=False, factory=ImageChecks)  # /bin/sh, arch

    @_sandboxes.default
    def _new_sandboxes(self) -> Sandboxes:
        return Sandboxes(config=self.config)

    @_bin.default
    def _new_bin(self) -> Trash:
        return Trash(self.config.root / "trash")

    @_disk.default
    def _new_disk(self) -> DiskWatch:
        return DiskWatch(
            isolation=self.config.isolation, areas=self._disk_area,
            end_lease=self._end_lease,
            retired=lambda slot: slot.calls.retired_epoch,
            interval_s=self.config.disk_check_s,
        )  # fmt: skip

    async def _end_lease(self, slot: Slot) -> None:
        """End the slot's lease (a keeper that cannot end it is killed with its sandbox)."""
        try:
            await self._sandboxes.stop_agent(slot)
        except Exception:
            await self._sandboxes.stop_keeper(slot)
            raise

    def _hold_slot_uids(self, base: int) -> int:
        """Reserve this server's slot uids on the host (``slot_uid_locks``) for its life, unless
        the config says the caller holds them; the first uid held (the next free range when
        another holder has ``base``'s, said in a warning). Raises ``ConfigError``."""
        where = self.config.slot_uid_lock
        if where is None:
            return base
        count = self.config.slots
        try:
            self._uids = reserve_free(base, count, limit=MAX_SLOT_UID, path=where)
        except SlotUidsHeld as error:
            raise ConfigError("slot_uid_base", f"{error}: give this server another") from None
        except SlotUidLockError as error:
            raise ConfigError(
                "slot_uid_lock", f"{error} (--slot-uid-lock: another file, or none)"
            ) from None
        if self._uids.first != base:
            _log.warning(
                "slot uids %d-%d are in use by another slot server or pool on this host; this "
                "server's slots run as uids %d-%d (--slot-uid-base sets the base)",
                base, base + count - 1, self._uids.first, self._uids.first + count - 1,
            )  # fmt: skip
        return self._uids.first

    def _measures_hooks(self) -> bool:
        return self._disk.enabled

    async def _before_hook(self, slot: Slot, call: ExecuteCall) -> None:
        """A hook's call reads the lease after the model's last writes: measure its disk now."""
        await self._disk.before_hook(slot, call.epoch)

    def _disk_area(self, slot: Slot) -> list[Path]:
        """Where slot's lease writes on the server's storage: its workspace (a fork's overlay's
        upper layer instead) and, over an image, its root's upper layer."""
        workspace = slot.workspace.root
        overlays = None if self.snapshots is None else self.snapshots.overlays
        upper = None if overlays is None else overlays.upper(workspace)
        area = [workspace if upper is None else upper]
        if slot.image is not None:
            area.append(self._sandboxes.layer_dir(slot) / "upper")
        return area

    # ------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Create the workspaces and probe what the host can do. Never raises for a missing
        capability (``health()`` reports it); raises ``ConfigError`` when there is no slot
        helper (naming what to install) and ``OSError`` when ``root`` is unusable."""
        try:
            await self._start()
        except BaseException:
            if self._uids is not None:  # a start that failed holds no uids
                self._uids.release()
            raise

    async def _start(self) -> None:
        for warning in budget_warnings(self.config.isolation):
            _log.warning("%s", warning)
        root = self.config.root
        sandboxes = self._sandboxes
        helper, sandboxes.native_origin = await self._slot_helper()  # first: nothing to undo
        (root / "slots").mkdir(parents=True, exist_ok=True)
        (root / "state").mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            sandboxes.uid_base = self._hold_slot_uids(self.config.slot_uid_base)
            uid_map = Path("/proc/self/uid_map").read_text()  # noqa: ASYNC240 - one small read
            problem = unmapped(sandboxes.uid_base, self.config.slots, uid_map)
            if problem is not None:
                raise ConfigError(
                    "slot_uid_base", f"{problem}: choose a base inside this namespace's range"
                )
            require_reachable(root / "slots", "root", sandboxes.uid_base, "their workspaces")
        for path in self.config.isolation.system_paths:
            if os.path.islink(path):  # noqa: ASYNC240 - a handful of lstat calls at start
                sandboxes.symlinks[path] = os.readlink(path)
        if self.config.use_cgroups:
            sandboxes.cgroups = await asyncio.to_thread(
                detect_cgroups, f"trajcore-{os.getpid()}-{root.name}"
            )
        sandboxes.python_binds = await asyncio.to_thread(sandboxes.stage_python)
        try:
            sandboxes.seccomp = await asyncio.to_thread(compile_filter, SECCOMP_RULES)
        except SeccompUnavailable as error:
            sandboxes.seccomp_problem = str(error)
        if sandboxes.uid_base is not None:  # where every slot uid can run it
            helper = await asyncio.to_thread(
                stage_file, helper, sandboxes.runtime_dir() / "slot-helper"
            )
        sandboxes.native = helper
        if self.config.image_cache is not None:  # before the probe: its keeper binds the cache
            await self._start_images()
        self.capabilities = await probe(sandboxes)
        self.sandboxed = sandboxes.sandboxed = self.capabilities.bwrap
        await asyncio.to_thread(self._set_aside_stale)
        for index in range(self.config.slots):
            cgroup = SlotCgroup(sandboxes.cgroups, f"slot-{index}") if sandboxes.cgroups else None
            # The file tools run with the slot's file-system ids (``Workspace.owner``): what
            # they create belongs to the slot, and every permission check is the slot's.
            slot = Slot(
                index=index,
                workspace=Workspace(root / "slots" / str(index), owner=sandboxes.ids(index)),
                state_dir=root / "state" / str(index),
                cgroup=cgroup,
                calls=SlotCalls(remember=self.config.dedup_per_slot),
            )
            sandboxes.own_workspace(slot)
            self._slots.append(slot)
        # Each slot's cgroup is made once, here, off the first call's path, and kept (empty)
        # across resets; a slot whose cgroup cannot be made now tries again when first used.
        cgroups = [slot.cgroup for slot in self._slots if slot.cgroup is not None]
        if cgroups:
            await asyncio.to_thread(prepare_cgroups, cgroups, self.config.isolation)
        self._sweep_trash()  # what the set-aside left, and what an earlier server did not sweep
        if self._disk.enabled:
            watch = asyncio.get_running_loop().create_task(self._disk.run(self._slots))
            self._tasks.add(watch)
            watch.add_done_callback(self._tasks.discard)

    def _set_aside_stale(self) -> None:
        """Move what an earlier server left under the root (its slots' workspaces and state:
        a server restarted over the same ``root``) into the trash, so that no lease of this
        server sees another's files. Raises ``OSError`` when that cannot be done."""
        root = self.config.root
        stale = [entry for kind in ("slots", "state") for entry in (root / kind).iterdir()]
        if not stale:
            return
        self._bin.folder.mkdir(mode=0o700, exist_ok=True)
        with self._bin.setting_aside("stale") as aside:
            aside.mkdir(mode=0o700)
            for entry in stale:
                entry.rename(aside / f"{entry.parent.name}-{entry.name}")

    async def _start_images(self) -> None:
        """Open the image cache, and give the slots a place for their writable layers."""
        cache = self.config.image_cache
        assert cache is not None
        self.images = await asyncio.to_thread(
            ImageCache, cache, max_bytes=self.config.image_cache_bytes,
            environment_dirs=self.config.environment_dirs,
        )  # fmt: skip
        (self.config.root / "layers").mkdir(mode=0o711, exist_ok=True)
        owner = (os.geteuid(), os.getegid()) if self._sandboxes.uid_base is not None else None
        idmaps = await asyncio.to_thread(  # made ahead, off every lease's path
            self._sandboxes.open_idmaps, owner, self.config.slots, cache / "images"
        )
        overlays = await asyncio.to_thread(WorkspaceOverlays.open, self.config.root, owner, idmaps)
        self.snapshots = await asyncio.to_thread(
            SnapshotStore, self.config.root / "snapshots", locks=cache / "locks",
            max_bytes=self.config.snapshot_bytes, owner=owner, overlays=overlays,
        )  # fmt: skip
        if self._sandboxes.uid_base is not None:
            require_reachable(cache / "images", "image_cache", self._sandboxes.uid_base, "images")

    async def _slot_helper(self) -> tuple[Path, str]:
        """The slot helper this server runs, and where it came from. Raises ``ConfigError``
        naming what to install when there is none: there is no other keeper to fall back on."""
        if self.config.slot_helper_path is not None:
            return self.config.slot_helper_path, "given"
        try:
            found = await asyncio.to_thread(build_slot_helper)
        except NativeBuildError as error:
            raise ConfigError(
                "slot_helper",
                f"the slot server needs the compiled slot helper and cannot have it ({error}): "
                f"install a C compiler and the C library's headers (Debian and Ubuntu: gcc and "
                f"libc6-dev; Alpine: gcc and musl-dev; Fedora: gcc and glibc-static), or use a "
                f"wheel or image that ships the slot helper",
            ) from None
        return found, "shipped" if found == SHIPPED_SLOT_HELPER else "built at start"

    async def end_exports(self) -> None:
        """End the engine exports the image cache runs now (their processes by pid, their
        containers, their staging trees: ``ImageCache.close``) within ``reset_timeout_s``, and
        refuse new ones: the server is stopping. What is left is logged. Idempotent."""
        if self.images is not None:
            for left in await asyncio.to_thread(self.images.close, self.config.reset_timeout_s):
                _log.warning("the image cache left %s at its close", left)

    async def aclose(self) -> None:
        """End every sandbox and pending call. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.end_exports()
        for slot in self._slots:
            for ticket in slot.calls.close():
                call, answer = slot.answers.pop(ticket.number)
                self._resolve(answer, refused(call, Closing()))
        for task in list(self._tasks):
            task.cancel()
        for slot in self._slots:
            await self._sandboxes.stop_agent(slot)
            await self._sandboxes.stop_keeper(slot)
            if slot.image is not None:
                slot.image.close()
                slot.image = slot.image_epoch = None
            if slot.snapshot is not None:
                slot.snapshot.close()
                slot.snapshot = None
            if slot.cgroup is not None:  # a busy one is tried again for a moment: off the loop
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(slot.cgroup.remove)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self.snapshots is not None:
            await asyncio.to_thread(self.snapshots.close)
        if self._sandboxes.cgroups is not None:
            await asyncio.to_thread(remove_parent, self._sandboxes.cgroups)
        if self._uids is not None:  # no process of the slots' uids is left
            self._uids.release()

    # ------------------------------------------------------------------------- queries

    def health(self) -> Health:
        """The server's health and capabilities."""
        isolation = self.config.isolation
        held, held_bytes, forks = (
            (0, 0, 0) if self.snapshots is None else self.snapshots.statistics()
        )
        return Health(
            protocol_version=PROTOCOL_VERSION,
            slots=self.config.slots,
            capabilities=self.capabilities,
            sandboxed=self.sandboxed,
            allow_network=isolation.allow_network,
            require_sandbox=isolation.require_sandbox,
            min_timeout_s=isolation.min_timeout_s,
            max_timeout_s=isolation.max_timeout_s,
            broken_slots=tuple(
                slot.index for slot in self._slots if slot.calls.statistics().broken
            ),
            workspaces_set_aside=sum(slot.set_aside for slot in self._slots),
            trash_left=(*self._bin.left, *self.trash_left),
            boot=self.boot,
            snapshots=held,
            snapshot_bytes=held_bytes,
            forks=forks,
            fork_workspaces="" if self.snapshots is None else self.snapshots.fork_workspaces(),
            image_cache=None if self.images is None else self.images.statistics(),
            lease_layers=self._bin.layers,
            hook_process_reserve=self._hook_process_reserve(),
        )

    def _hook_process_reserve(self) -> int:
        """The fewest processes any slot keeps for its hooks' commands (0: a slot keeps none)."""
        limit = self.config.isolation.max_processes
        shares = [self._sandboxes.command_nproc(s, sandboxed=self.sandboxed) for s in self._slots]
        if limit is None or not shares or None in shares:
            return 0
        return limit - max(share for share in shares if share is not None)

    def listing(self) -> SlotListing:
        """Every slot's state."""
        return SlotListing(slots=tuple(slot_info(slot) for slot in self._slots))

    def slot(self, index: int) -> Slot:
        """The slot at ``index``. Raises ``UnknownSlot``."""
        if not 0 <= index < len(self._slots):
            raise UnknownSlot(
                f"slot {index} does not exist; this server has 0..{len(self._slots) - 1}"
            )
        return self._slots[index]

    # ------------------------------------------------------------------------- lease

    async def lease(
        self, index: int, epoch: int, environment: str, snapshot: str | None = None
    ) -> LeaseAnswer:
        """Run the slot's lease ``epoch`` over ``environment``: acquire its image (unpacking
        it into the cache when needed) and hold it until the epoch's reset. Sent before the
        epoch's first call. A refusal (no cache, a bad reference, a missing or refused image,
        an image no command could run over (``image_checks``), a full cache, a stale or
        started epoch) fails this request only, naming the field and the reason. Raises
        ``UnknownSlot`` for a bad index."""
        started = time.monotonic()
        slot = self.slot(index)

        def refused(field: str, reason: str) -> LeaseAnswer:
            return LeaseAnswer(
                slot=index, epoch=epoch, ok=False, error=reason, field=field,
                duration_s=time.monotonic() - started,
            )  # fmt: skip

        problem = self._lease_problem(slot, epoch)
        if problem is not None:
            return refused(*problem)
        if snapshot is not None:
            (answer,) = await self.fork(environment, snapshot, [(index, epoch)])
            return answer
        assert self.images is not None
        try:
            ref = parse_environment_ref(environment)
            recent = self.images.acquire_recent(ref)  # on the loop: no thread's round trip
            if recent is None:  # made or found in a thread, and its tree checked there
                use, unrunnable = await asyncio.to_thread(self._runnable.acquire, self.images, ref)
            else:  # no /bin/sh, another architecture: known for a recent image
                use, unrunnable = recent, self._runnable.problem(recent.image)
        except TaskEnvironmentError as error:
            return refused(error.field, error.reason)
        except Exception as error:  # noqa: BLE001 - a full cache, a late lock, a full disk
            said = f"{type(error).__name__}: {error}"  # the cache's own words may name the image
            named = environment in str(error)
            return refused("environment", said if named else f"image {environment}: {said}")
        problem = self._lease_problem(slot, epoch)  # what changed while the image was made
        unrunnable = unrunnable or lease_request_problem(use.image)  # the keeper's limit
        if problem is not None or unrunnable is not None:
            use.close()
            return refused(*(problem or ("environment", str(unrunnable))))
        slot.image, slot.image_epoch = use, epoch
        await self._warm_environment(slot)
        return LeaseAnswer(
            slot=index, epoch=epoch, ok=True, image_id=use.image.image_id, hit=use.image.hit,
            duration_s=time.monotonic() - started,
        )  # fmt: skip

    async def fork(
        self, environment: str, snapshot: str, leases: Sequence[tuple[int, int]]
    ) -> list[LeaseAnswer]:
        """Start each ``(slot, epoch)`` lease from ``snapshot`` (``forks.start_many``), one
        answer per lease in order; a refusal (an unknown slot too) fails that lease only."""
        answers = await start_many(
            self._sandboxes, self.snapshots, leases, environment=environment, wanted=snapshot,
            slot_of=self.slot, problem=self._lease_problem,
            wipe_timeout_s=self.config.reset_timeout_s,
        )  # fmt: skip
        ok = [self._warm_environment(self.slot(answer.slot)) for answer in answers if answer.ok]
        await asyncio.gather(*ok)  # each ends its slot's idle lease: together, not in turn
        return answers

    # ------------------------------------------------------------------------- snapshots

    async def snapshot(self, index: int, epoch: int) -> SnapshotAnswer:
        """Freeze the slot's lease ``epoch`` (over an image) into a snapshot: its layer over
        the image and its workspace (``forks.freeze_lease``: the lease's processes end, and
        the lease goes on over its snapshot). A refusal (no such lease, a call running, the
        limit, a full disk) names the field and the reason. Raises ``UnknownSlot``."""
        started = time.monotonic()
        slot = self.slot(index)

        def problem() -> tuple[str, str] | None:
            return snapshot_problem(slot, epoch, self.snapshots, closing=self._closed)

        try:
            found = problem()
            if found is not None:
                raise SnapshotRefused(*found)
            assert self.snapshots is not None
            frozen = await freeze_lease(
                self._sandboxes, self.snapshots, slot, problem,
                wipe_timeout_s=self.config.reset_timeout_s,
            )  # fmt: skip
        except SnapshotRefused as error:
            return SnapshotAnswer(
                slot=index, epoch=epoch, ok=False, error=error.reason, field=error.field,
                duration_s=time.monotonic() - started,
            )  # fmt: skip
        await self._warm_environment(slot)  # the lease's next one, over its snapshot
        return SnapshotAnswer(
            slot=index, epoch=epoch, ok=True, snapshot=frozen.snapshot_id,
            image_id=frozen.image.image_id, bytes=frozen.bytes, files=frozen.files,
            duration_s=time.monotonic() - started,
        )  # fmt: skip

    async def drop_snapshot(self, snapshot: str) -> DropSnapshotAnswer:
        """Drop ``snapshot``: no new lease starts from it, and its files go once no lease runs
        over it. A refusal names the field and the reason."""
        if self.snapshots is None:
            return DropSnapshotAnswer(
                snapshot=snapshot, ok=False, error=NEEDS_CACHE, field="snapshot"
            )
        try:
            removed, leases = self.snapshots.drop(snapshot)
        except SnapshotRefused as error:
            return DropSnapshotAnswer(
                snapshot=snapshot, ok=False, error=error.reason, field=error.field
            )
        self._sweep_snapshots()
        return DropSnapshotAnswer(snapshot=snapshot, ok=True, removed=removed, leases=leases)

    def _sweep_snapshots(self) -> None:
        """Remove removed snapshots' files in the background."""
        store = self.snapshots
        if store is None or not store.removing or self._closed or self._sweeping_snapshots:
            return
        self._sweeping_snapshots, store.removing = True, False

        async def sweep() -> None:
            try:
                left = await asyncio.to_thread(store.sweep)
                self.trash_left = (*self.trash_left, *left)
            finally:
                self._sweeping_snapshots = False
            self._sweep_snapshots()  # what was removed meanwhile

        task = asyncio.get_running_loop().create_task(sweep())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_environment(self, slot: Slot) -> None:
        """Start the lease over its environment now, off its first call's path: end a lease
        warmed over the server's root, if a reset warmed one (a few milliseconds), and let the
        keeper build the new one (its overlay and pivot) while the answer travels; the first
        call waits for what is left of it. Needs the slot's keeper (a slot's first lease
        starts it on its first call)."""
        if not self.config.warm_leases or self._closed:
            return
        await self._sandboxes.stop_agent(slot)
        warming = self._sandboxes.warm(slot)
        if warming is not None:
            self._tasks.add(warming)
            warming.add_done_callback(self._tasks.discard)

    def _lease_problem(self, slot: Slot, epoch: int) -> tuple[str, str] | None:
        """Why the slot's lease ``epoch`` cannot take an environment now (field, reason)."""
        if self._closed:
            return "$", "the slot server is closing"
        if self.images is None:
            return (
                "environment",
                "environments need an image cache: start the slot server with --image-cache DIR",
            )
        if not self.sandboxed:
            return "environment", f"environments need a sandbox: {self.capabilities.detail}"
        retired = slot.calls.retired_epoch
        if epoch <= retired:
            return "epoch", StaleEpoch(epoch=epoch, retired=retired).message
        if slot.agent_epoch == epoch:
            return "epoch", f"lease epoch {epoch} has run calls: name its environment first"
        if slot.image is not None:
            return (
                "epoch",
                f"the slot's lease epoch {slot.image_epoch} over {slot.image.image.ref} "
                "is not reset yet",
            )
        return None

    # ------------------------------------------------------------------------- reset

    async def reset(self, index: int, epoch: int, limit_s: float | None = None) -> ResetResult:
        """End the slot's lease ``epoch``: kill its sandbox, wipe its workspace, within
        ``limit_s`` (the pool's; ``None``: the config's ``reset_timeout_s``).

        Returns ``ok=False`` (and marks the slot broken) when the slot could not be proven
        clean. Raises ``UnknownSlot`` for a bad index.
        """
        started = time.monotonic()
        slot = self.slot(index)
        ticket = slot.calls.reset(epoch)
        # a slot whose lease ran over an image most likely takes one again: its next lease is
        # warmed when that lease names it (POST /v1/lease), not over the server's root here
        over_image = slot.image is not None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot.reset_turns[ticket.number] = turn
        self._take_turns(slot)
        error: str | None = "the reset was interrupted"
        limit = self.config.reset_timeout_s if limit_s is None else limit_s
        try:
            async with asyncio.timeout(limit):
                await self._sandboxes.stop_agent(slot)  # interrupts a running call at once
                await turn
                if slot.forking is not None:  # a fork starting the slot: it ends first
                    await asyncio.shield(slot.forking)
                error = await clean_slot(
                    self._sandboxes, slot, wipe_timeout_s=limit / 2, trash=self._bin
                )
        except TimeoutError:
            error = f"reset took longer than {limit} s"
        except Exception as failed:  # noqa: BLE001 - whatever failed, the slot is not leased dirty
            error = f"cannot clean the slot: {type(failed).__name__}: {failed}"
        finally:
            slot.reset_turns.pop(ticket.number, None)
            slot.calls.reset_done(ticket, error)
            self._take_turns(slot)
            self._sweep_trash()
            self._sweep_snapshots()
        if error is None and not self._closed and self.config.warm_leases:
            warming = (warm_keeper if over_image else Sandboxes.warm)(self._sandboxes, slot)
            if warming is not None:
                self._tasks.add(warming)
                warming.add_done_callback(self._tasks.discard)
        return ResetResult(
            slot=index, ok=error is None, error=error, duration_s=time.monotonic() - started
        )

    def _sweep_trash(self) -> None:
        """Empty the trash in the background (measuring the leases' layers first)."""
        if not self._closed:
            self._bin.sweep(self._tasks)

    # ------------------------------------------------------------------------- artifacts

    async def read_artifact(self, index: int, path: str, max_bytes: int) -> ArtifactFile:
        """See ``Workspace.read``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.read, path, max_bytes)

    async def list_artifacts(self, index: int, path: str, max_entries: int) -> DirectoryListing:
        """See ``Workspace.listing``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.listing, path, max_entries)

    async def archive_artifacts(
        self, index: int, path: str, max_bytes: int, max_files: int
    ) -> ArtifactArchive:
        """See ``Workspace.archive``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.archive, path, max_bytes, max_files)
