"""``SupervisedSource``: K slot servers this machine starts itself, each replaced when it dies.

The ``ContainerSource`` of the pools that start their servers directly (child processes, local
containers) rather than asking a scheduler. What differs between those is how one server starts
and stops, a ``Launcher``; the supervision is the same:

- ``start`` launches the K servers in parallel and joins each once it is healthy; one that does
  not start within ``start_timeout_s`` fails the pool's start (``SlotServerError`` with the end
  of its log), and nothing is left running. Several that fail together (a bad image or
  flag fails them all) are one ``SlotServerError`` naming each reason, not an exception group.
- Each joined server has a supervisor task that waits for it to end. Unless the pool is closing,
  an ended server is gone from the pool (its leases turn stale) and, with ``restart_crashed``,
  a replacement starts under the next name (``local-0``, ``local-0~1``, ...), tried
  ``restart_attempts`` times with a backoff that doubles from ``backoff_s`` to
  ``backoff_max_s``: one value, ``RestartSettings``, held by each such pool's config as its
  ``restart`` (``SupervisedPoolConfig``: 3 tries from 0.1 s; ``SshPoolConfig``: 8 from 0.5 s).
  Each failed try is a warning, and so is giving up after the last (naming how many servers
  are left); the pool goes on with those.
- A server the pool loses (a failed batch or reset) is killed at once; its supervisor then sees
  it end and replaces it the same way.
- ``shutdown`` stops every server it ever launched and has not stopped, in parallel, bounded by
  the launcher's own stop timeout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import anyio
import attrs

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.leased_pool import DEFAULT_FORK_WAIT_S
from trajcore.adapters.pools.pool_core import (
    Endpoint,
    Member,
    SlotServerPool,
    close_quietly,
    single_error,
)
from trajcore.adapters.pools.reconciled import composed_settings, part
from trajcore.adapters.slot_uid_locks import (
    LOCK_FILE_ENV,
    SlotUidLockError,
    SlotUidReservation,
    SlotUidsHeld,
    reserve_free,
)
from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, SandboxUnavailable, SlotServerError
from trajcore.domain.isolation import MAX_SLOT_UID, SlotIsolation, check_slot_uid_range
from trajcore.domain.slot_server_settings import SlotServerSettings

__all__ = [
    "Launcher",
    "RestartSettings",
    "SupervisedPool",
    "SupervisedPoolConfig",
    "SupervisedSource",
    "environment_folders",
    "hold_slot_uids",
]

H = TypeVar("H")
C = TypeVar("C", bound="SupervisedPoolConfig")
_log = logging.getLogger(__name__)


def _cache_path(value: object) -> Path | None:
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    if not str(value).strip() or not path.is_absolute():
        raise ConfigError("image_cache_dir", f"must be an absolute path, got {str(value)!r}")
    return path


def environment_folders(value: object) -> tuple[Path, ...]:
    """``environment_dirs`` from paths or comma-separated text: absolute, no ``:`` or ``,``."""
    if value is None:
        return ()
    words = value.split(",") if isinstance(value, str) else value
    if not isinstance(words, list | tuple):
        raise ConfigError("environment_dirs", f"expected paths, got {type(value).__name__}")
    folders = tuple(Path(str(word).strip()) for word in words if str(word).strip())
    for folder in folders:
        if not folder.is_absolute() or ":" in str(folder) or "," in str(folder):
            raise ConfigError(
                "environment_dirs", f"{str(folder)!r} must be an absolute path without ':' or ','"
            )
    return folders


@attrs.frozen(kw_only=True)
class RestartSettings:
    """How a pool that starts its own slot servers replaces one that ended or failed (module
    doc). Each pool's config holds it as its ``restart`` and states its own default once.

    Attributes:
        restart_crashed: Replace a server that ended or failed.
        restart_attempts: Starts tried in a row before a failed server is given up.
        backoff_s: The wait after a failed replacement start, doubled after each one...
        backoff_max_s: ...up to this.
    """

    restart_crashed: bool = attrs.field(default=True, validator=validators.flag)
    restart_attempts: int = attrs.field(default=3, validator=validators.positive_int)
    backoff_s: float = attrs.field(default=0.1, validator=validators.positive_seconds)
    backoff_max_s: float = attrs.field(default=2.0, validator=validators.positive_seconds)


@composed_settings
@attrs.frozen(kw_only=True)
class SupervisedPoolConfig:
    """The settings of every pool of K slot servers this machine starts itself.

    What each server is told and must show is one value, ``server``; each pool's config adds
    how its servers run.

    Attributes:
        server: The slot servers' settings (``SlotServerSettings``: slots, isolation, tmux,
            start, reset and lease timeouts). The isolation is the env's, never the model's.
            Server ``k`` runs its slot ``i`` (when run as root) as host uid/gid
            ``server.isolation.slot_uid_base + k * server.slots_per_container + i``: every slot
            of the pool has its own uid; another pool on the same host needs a base outside
            this range.
        containers: Slot servers to run (K).
        restart: How a server that died or failed is replaced (``RestartSettings``: by
            default 3 tries, from 0.1 s apart).
        stop_timeout_s: Grace between a server's stop signal and its kill.
        image_cache_dir: The host's image cache, shared by every server of the pool (and of
            any pool on the host): leases may then run over task environments
            (docs/environments.md). ``None`` (the default): no cache, and a lease that names an
            environment is refused saying to set this.
        image_cache_bytes: The cache's size limit (least recently used images leave first).
        environment_dirs: The folders a ``directory:`` environment's tree may come from (the
            folder or below it; the servers' ``--environment-dir``): a dataset row is data
            and must not choose a host path, so with none listed (the default) every
            ``directory:`` reference is refused. The slot owns a listed tree's root-owned
            files in its lease (as an image's), so list only trees meant for leases; ``/`` or
            a folder that holds the servers' roots or the image cache is refused at start.
            Needs ``image_cache_dir``.
        fork_wait_s: How long a lease from a snapshot waits for a free slot of the snapshot's
            server before it takes one elsewhere (and runs over the plain image).
    """

    server: SlotServerSettings = part(SlotServerSettings)
    containers: int = attrs.field(default=2, validator=validators.positive_int)
    restart: RestartSettings = part(RestartSettings)
    stop_timeout_s: float = attrs.field(default=5.0, validator=validators.positive_seconds)
    image_cache_dir: Path | None = attrs.field(default=None, converter=_cache_path)
    image_cache_bytes: int = attrs.field(default=32 << 30, validator=validators.positive_int)
    environment_dirs: tuple[Path, ...] = attrs.field(default=(), converter=environment_folders)
    fork_wait_s: float = attrs.field(
        default=DEFAULT_FORK_WAIT_S, validator=validators.non_negative_seconds
    )

    def __attrs_post_init__(self) -> None:
        if self.environment_dirs and self.image_cache_dir is None:
            raise ConfigError("environment_dirs", "task environments need image_cache_dir")
        check_slot_uid_range(
            "server.isolation.slot_uid_base",
            self.server.isolation.slot_uid_base,
            self.containers * self.server.slots_per_container,
        )

    def server_isolation(self, index: int = 0) -> SlotIsolation:
        """The isolation of server ``index``: the pool's, with that server's range of slot uids."""
        isolation = self.server.isolation
        base = isolation.slot_uid_base + index * self.server.slots_per_container
        return attrs.evolve(isolation, slot_uid_base=base)

    def image_cache_argv(self, cache: Path | None = None) -> list[str]:
        """The slot server's image-cache flags (none without ``image_cache_dir``); ``cache``:
        where the server sees the cache, when not at ``image_cache_dir`` (in a container)."""
        if self.image_cache_dir is None:
            return []
        where = self.image_cache_dir if cache is None else cache
        folders = [arg for d in self.environment_dirs for arg in ("--environment-dir", str(d))]
        return [
            "--image-cache", str(where), "--image-cache-bytes", str(self.image_cache_bytes),
            *folders,
        ]  # fmt: skip


def hold_slot_uids(config: C, stack: AsyncExitStack) -> tuple[C, SlotUidReservation | None]:
    """Reserve the slot uids of every server ``config`` starts on this host (``slot_uid_locks``)
    until ``stack`` closes, before any server starts; the servers are told the pool holds them
    (``--slot-uid-lock none``). A pool not run as root runs every slot as itself: nothing to
    hold (``None``). A range another holder has moves to the next free one, said in a warning
    and returned in the config. A pool whose servers are its child processes passes them the
    reservation's descriptor (``fileno``), so that the range stays held while one of them
    lives, should the pool's process end first.

    Raises:
        ConfigError: No free range, or the reservation file cannot be used.
    """
    if os.geteuid() != 0:
        return config, None  # every slot runs as this user (the local pool), or see below
    isolation = config.server.isolation
    count = config.containers * config.server.slots_per_container
    try:
        reservation = reserve_free(isolation.slot_uid_base, count, limit=MAX_SLOT_UID)
    except SlotUidsHeld as error:
        raise ConfigError("server.isolation.slot_uid_base", f"{error}: give another") from None
    except SlotUidLockError as error:
        raise ConfigError(LOCK_FILE_ENV, f"slot uids cannot be reserved: {error}") from None
    stack.callback(reservation.release)
    base = reservation.first
    if base == isolation.slot_uid_base:
        return config, reservation
    _log.warning(
        "slot uids %d-%d are in use by another slot server or pool on this host; this pool's "
        "slots run as uids %d-%d (server.isolation.slot_uid_base, an env's slot_uid_base, "
        "sets the base)",
        isolation.slot_uid_base, isolation.slot_uid_base + count - 1, base, base + count - 1,
    )  # fmt: skip
    moved = attrs.evolve(isolation, slot_uid_base=base)
    return attrs.evolve(config, server=attrs.evolve(config.server, isolation=moved)), reservation


class Launcher(Protocol[H]):
    """Starts and stops one slot server at a time; ``H`` is its handle of a running server."""

    async def open(self, stack: AsyncExitStack) -> None:
        """Acquire what every server needs (a directory, a token); cleanup goes on ``stack``."""
        ...

    async def launch(self, index: int, name: str) -> tuple[Endpoint, H]:
        """Start server ``index`` as ``name``; return once it says where it listens.

        Leaves nothing running when it raises (``SlotServerError``, ``OSError``, cancelled).
        """
        ...

    async def wait(self, handle: H) -> None:
        """Return once the server of ``handle`` has ended."""
        ...

    async def kill(self, handle: H) -> None:
        """End the server now (it failed), without grace; ``wait`` then returns."""
        ...

    async def stop(self, handle: H) -> None:
        """Stop the server gracefully, then forcibly; bounded. Called shielded."""
        ...

    async def describe(self, handle: H) -> str:
        """What the server said last (the end of its log), for error messages."""
        ...


@attrs.define(eq=False)
class SupervisedSource(Generic[H]):
    """``containers`` servers from ``launcher``, supervised; see the module docstring.

    Attributes:
        launcher: Starts and stops one server.
        prefix: The pool's container names: ``{prefix}-{index}``, then ``~{generation}``.
        containers: How many servers run (K).
        restart: How a server that ended or failed is replaced.
        slots: Server ``index``'s slot count (``None``: the pool's ``slots_per_container``).
    """

    launcher: Launcher[H]
    prefix: str
    containers: int
    restart: RestartSettings = attrs.field(factory=RestartSettings)
    slots: Callable[[int], int] | None = None
    launched: dict[str, H] = attrs.field(init=False, factory=dict)
    _stopped: set[str] = attrs.field(init=False, factory=set)
    _generations: dict[int, int] = attrs.field(init=False, factory=dict)
    restarts: int = attrs.field(init=False, default=0)
    _pool: SlotServerPool[H] | None = attrs.field(init=False, default=None)

    # ------------------------------------------------------------------------- source

    async def open(self, pool: SlotServerPool[H], stack: AsyncExitStack) -> None:
        self._pool = pool
        await self.launcher.open(stack)

    async def start(self, pool: SlotServerPool[H]) -> None:
        """Start the K servers; when several fail together (one bad image or flag fails them
        all), one error of their kind names how many and why, not an exception group."""
        try:
            async with anyio.create_task_group() as starting:
                for index in range(self.containers):
                    starting.start_soon(self._start, pool, index)
        except BaseExceptionGroup as group:
            raise _one_start_error(group, self.containers) from None

    def lost(self, member: Member[H], reason: str) -> None:
        if member.name not in self._stopped and self._pool is not None:
            self._pool.spawn(self.launcher.kill, member.handle)

    async def shutdown(self) -> None:
        stopping = [name for name in self.launched if name not in self._stopped]
        self._stopped.update(stopping)
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for name in stopping:
                    group.start_soon(self.launcher.stop, self.launched[name])

    # ------------------------------------------------------------------------- servers

    def _name(self, index: int) -> str:
        generation = self._generations.get(index, 0)
        base = f"{self.prefix}-{index}"
        return base if generation == 0 else f"{base}~{generation}"

    async def _start(self, pool: SlotServerPool[H], index: int) -> None:
        """Launch server ``index`` (current generation), connect, join, supervise."""
        name = self._name(index)
        start_timeout_s = pool.rules.start_timeout_s
        handle: H | None = None
        try:
            with anyio.fail_after(start_timeout_s):
                endpoint, handle = await self.launcher.launch(index, name)
                self.launched[name] = handle
                client = await self._connect(pool, endpoint, name, handle, index)
        except BaseException as error:
            detail = ""
            if handle is not None:
                self._stopped.add(name)
                if isinstance(error, TimeoutError):
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        detail = f": {await self.launcher.describe(handle)}"
                await self._stop(handle)
            if isinstance(error, TimeoutError):
                raise SlotServerError(
                    f"slot server {name} was not healthy within {start_timeout_s} s{detail}"
                ) from None
            raise
        member = pool.join(name, client, handle, slots=self._slot_count(index))
        if member is None:  # closed while it started: stop it with the rest
            self._stopped.add(name)
            await close_quietly(client)
            await self._stop(handle)
            return
        pool.spawn(self._supervise, pool, index, member)

    def _slot_count(self, index: int) -> int | None:
        return None if self.slots is None else self.slots(index)

    async def _connect(
        self, pool: SlotServerPool[H], endpoint: Endpoint, name: str, handle: H, index: int
    ) -> SlotServerClient:
        """``pool.connect``, unless the server ends first (``SlotServerError`` with its log)."""
        connected: list[SlotServerClient] = []
        slots = self._slot_count(index)

        async def connect(scope: anyio.CancelScope) -> None:
            connected.append(await pool.connect(endpoint, name, slots=slots))
            scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(connect, group.cancel_scope)
                await self.launcher.wait(handle)
                group.cancel_scope.cancel()
        except BaseExceptionGroup as errors:
            raise single_error(errors) from None
        if connected:
            return connected[0]
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            detail = await self.launcher.describe(handle)
        raise SlotServerError(f"slot server {name} ended before it was healthy: {detail}")

    async def _stop(self, handle: H) -> None:
        with anyio.CancelScope(shield=True):
            await self.launcher.stop(handle)

    async def _supervise(self, pool: SlotServerPool[H], index: int, member: Member[H]) -> None:
        """Wait for ``member``'s server to end; unless the pool is closing, replace it."""
        handle = member.handle
        await self.launcher.wait(handle)
        if pool.closed or member.name in self._stopped:
            return
        pool.gone(member, "its slot server exited")
        self._stopped.add(member.name)
        await self._stop(handle)  # what the ended server left (a container, its group)
        restart = self.restart
        if not restart.restart_crashed:
            return
        for attempt in range(restart.restart_attempts):
            if _closed(pool):  # (a call: the pool may have closed while this waited)
                return
            self._generations[index] = self._generations.get(index, 0) + 1
            try:
                await self._start(pool, index)
            except (SlotServerError, SandboxUnavailable, OSError) as error:
                pool.note(f"replacing {self._name(index)} failed: {error}", warn=True)
                await anyio.sleep(min(restart.backoff_s * 2**attempt, restart.backoff_max_s))
                continue
            self.restarts += 1
            return
        if not _closed(pool):
            left = sum(not m.lost for m in pool.members())
            pool.note(
                f"gave up replacing {member.name} after {restart.restart_attempts} tries "
                f"(restart_attempts); {left} slot servers are left",
                warn=True,
            )


def _one_start_error(group: BaseExceptionGroup[BaseException], containers: int) -> BaseException:
    """The start's failures as one error: the first's kind (``SlotServerError`` or
    ``SandboxUnavailable``, when every failure is one of those), saying how many of the
    ``containers`` failed and each distinct reason; else the group itself (a cancellation)."""
    failures: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop(0)
        if isinstance(error, BaseExceptionGroup):
            pending[:0] = error.exceptions
        else:
            failures.append(error)
    kinds = (SlotServerError, SandboxUnavailable)
    if not failures or not all(isinstance(error, kinds) for error in failures):
        return group
    if len(failures) == 1:
        return failures[0]
    reasons = list(dict.fromkeys(str(error) for error in failures))
    first = failures[0]
    kind = SandboxUnavailable if isinstance(first, SandboxUnavailable) else SlotServerError
    return kind(
        f"{len(failures)} of the {containers} slot servers failed to start, so the pool did "
        "not: " + "; ".join(reasons)
    )


def _closed(pool: SlotServerPool[H]) -> bool:
    return pool.closed


class SupervisedPool(SlotServerPool[H]):
    """The pool core over a ``SupervisedSource`` of ``launcher``'s servers."""

    def __init__(self, launcher: Launcher[H], config: SupervisedPoolConfig, *, label: str) -> None:
        self._supervised: SupervisedSource[H] = SupervisedSource(
            launcher,
            prefix=label,
            containers=config.containers,
            restart=config.restart,
        )
        super().__init__(
            self._supervised, config.server, label=label, fork_wait_s=config.fork_wait_s
        )
        self._image_cache = config.image_cache_dir
        self._config_name = type(config).__name__

    def cache_of(self, member: Member[H]) -> str:
        """Every server of the pool reads the host's one cache (``image_cache_dir``)."""
        return str(self._image_cache) if self._image_cache is not None else member.name

    def environment_refusal(self) -> tuple[str, str] | None:
        """``None`` when the servers run with an image cache; else the setting to set."""
        if self._image_cache is not None:
            return None
        return (
            "image_cache_dir",
            f"the {self._label} pool's slot servers have no image cache: set "
            f"{self._config_name}.image_cache_dir (the env's --env.image_cache_dir; under "
            "trajcore run, --set image_cache_dir=DIR) to run leases over task environments",
        )

    @property
    def restarts(self) -> int:
        """Servers started to replace lost ones."""
        return self._supervised.restarts
