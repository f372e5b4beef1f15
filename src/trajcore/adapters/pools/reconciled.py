"""``ReconciledSource``: the source of the pools whose slot servers a scheduler runs, each of
them joined, drained, lost and replaced by the decisions of ``domain.nomad_reconcile``.

Nomad allocations (``nomad_pool``), Slurm jobs (``slurm_pool``) and cloud sandboxes
(``cloud_pool``) are one control loop over three schedulers. This module is that loop, written
once; a pool says only what differs: how to list its runs (``_tick``, which turns the listing
into ``Allocation`` values with ``_allocation`` and hands them to ``_observe``), where a run's
server listens (``_address``), what its container is called (``_container_name``), and how to
stop a run given up on (``_replace``). What the loop keeps:

- Every ``poll_interval_s`` the source lists its runs; the reconciler gets them with the demand
  (leased plus waiting slots) and the time, and the actions it answers are carried out against
  the pool core (``_apply``): ``Join`` connects in the background, ``Drain`` and ``Undrain``
  go to the slot book, ``Lose`` and ``Remove`` take the member out (``SlotServerPool.gone``),
  ``Replace`` stops the run (the pool's own way), ``SetCount`` comes back to the pool to set.
- A poll that fails (the scheduler's own error, ``self.unavailable``; a malformed answer; no
  answer within ``tick_timeout_s``) is noted in the pool's ``problems`` and retried on the next
  one; it never fails a lease or a call. A scheduler's error that no retry can mend
  (``_hopeless``: Nomad refusing the pool's token) fails the pool's start at once with that
  error (``fail_start``), as does one the source meets itself (its job stopped meanwhile).
- A join connects to the run's server within ``start_timeout_s`` with the pool's bearer token
  and tells the reconciler how it went; a server without a required sandbox (or tmux) fails
  the pool's start (``start`` raises it), any other failure only retires that run.
- A member the core loses (a failed batch or reset) is reported to the reconciler
  (``failed``), which replaces its run.
- The pool's start waits for ``scaling.min_containers`` members within ``start_timeout_s``;
  when they do not come it raises ``SlotServerError`` naming the scheduler, what it says about
  runs it did not start (``_why_not_started``: Nomad's placement failures) and the latest
  problems.
- The pool's close stops every run its own way (``shutdown``) through ``_stop_all``: shielded
  from cancellation, within ``stop_timeout_s``, a scheduler's error or the time running out
  noted in ``problems``.

Sources that start every run themselves, one per server index (Slurm, the cloud), share more,
written once in ``IndexedSource`` (and their pools' view of it in ``IndexedPool``): the run ID
their runs carry, the count they keep, the runs started, ``StartBackoff`` (a server that did
not join is started again on its index only after a delay that doubles from 0.5 s to 60 s),
and stopping every run at the pool's close.

Their settings are composed, never inherited: each pool's config holds the values it is made
of as fields (its slot servers' ``SlotServerSettings`` as ``server``, which the pool core
reads; its ``ScaleSettings`` as ``scaling``, which the reconciler reads; the Nomad job's
settings, the Slurm job's, a cloud provider's sandbox settings), and
``composed_settings`` makes a keyword that belongs to one of those parts a ``ConfigError``
naming the part (``NomadPoolConfig(image=...)`` says ``job=NomadJobSettings(image=...)``);
``part`` declares each such field once: its type, its default and its check.
"""

from __future__ import annotations

import abc
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import ClassVar, Generic, Protocol, TypeVar

import anyio
import attrs
from attrs import AttrsInstance

from trajcore.adapters.pools.leased_pool import DEFAULT_FORK_WAIT_S
from trajcore.adapters.pools.pool_core import (
    Endpoint,
    Member,
    SlotServerPool,
    close_quietly,
)
from trajcore.domain.errors import ConfigError, InvalidInput, SandboxUnavailable, SlotServerError
from trajcore.domain.nomad_reconcile import (
    Action,
    Allocation,
    Discard,
    Drain,
    Join,
    Lose,
    NomadReconciler,
    ReconcileConfig,
    Remove,
    Replace,
    SetCount,
    Undrain,
)
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.validators import instance_of

__all__ = [
    "IndexedPool",
    "IndexedSource",
    "ReconciledPool",
    "ReconciledSettings",
    "ReconciledSource",
    "Run",
    "StartBackoff",
    "composed_settings",
    "part",
]

_log = logging.getLogger(__name__)
_MAX_BACKOFF_S = 60.0


S = TypeVar("S", bound=AttrsInstance)


def _held_by(cls: type) -> dict[str, str]:
    """Each setting of ``cls``'s parts (its attrs fields typed as attrs classes), at any depth,
    and how to give it (``server=SlotServerSettings(isolation=SlotIsolation(allow_network=...))``);
    a nearer part's first."""
    try:
        attrs.resolve_types(cls)
    except NameError:  # annotations only a type checker resolves: no parts seen
        return {}
    parts = [p for p in attrs.fields(cls) if isinstance(p.type, type) and attrs.has(p.type)]
    held_by: dict[str, str] = {}
    for part in parts:
        for field in attrs.fields(part.type):
            name = field.alias or field.name
            held_by.setdefault(name, f"{part.name}={part.type.__name__}({name}=...)")
    for part in parts:
        for name, given in _held_by(part.type).items():
            held_by.setdefault(name, f"{part.name}={part.type.__name__}({given})")
    return held_by


def composed_settings(cls: type[S]) -> type[S]:
    """Class decorator of a settings class composed of settings values (its attrs fields typed
    as attrs classes): a keyword that is no field of ``cls`` but one of a part's (at any depth)
    is refused with a ``ConfigError`` naming it and the part that holds it
    (``job=NomadJobSettings(image=...)``), not Python's bare ``TypeError``. Every other call is
    ``cls``'s own ``__init__``."""
    own = {field.alias or field.name for field in attrs.fields(cls)}
    held_by = _held_by(cls)
    init = cls.__init__

    @functools.wraps(init)
    def checked_init(self: S, *args: object, **kwargs: object) -> None:
        for name in sorted(kwargs.keys() - own):
            if name in held_by:
                raise ConfigError(
                    name, f"is not a setting of {cls.__name__} itself; give it as {held_by[name]}"
                )
        init(self, *args, **kwargs)

    type.__setattr__(cls, "__init__", checked_init)
    return cls


def part(kind: type[S], default: Callable[[], S] | None = None) -> S:
    """The attrs field of a composed config that holds a settings value of type ``kind``: made
    by ``default`` (else ``kind()``) when not given, a ``ConfigError`` naming the field when
    given as anything but a ``kind`` (``server: SlotServerSettings = part(SlotServerSettings,
    lambda: SlotServerSettings(start_timeout_s=60.0))``)."""
    field: S = attrs.field(
        factory=kind if default is None else default, validator=instance_of(kind)
    )
    return field


class ReconciledSettings(Protocol):
    """What the loop reads from a scheduled pool's config: its slot servers' settings
    (``server``, which the pool core reads), its scaling settings (``scaling``), how often the
    scheduler is polled and how long stopping every run may take."""

    @property
    def server(self) -> SlotServerSettings: ...
    @property
    def scaling(self) -> ScaleSettings: ...
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def stop_timeout_s(self) -> float: ...


C_co = TypeVar("C_co", bound=ReconciledSettings, covariant=True)


@attrs.frozen
class Run:
    """The handle of one joined slot server: the scheduler's run of it (a Nomad allocation, a
    Slurm job, a cloud sandbox), by the scheduler's ID, its server index and, for Nomad, the
    in-place restarts it had when it joined."""

    id: str
    index: int
    restarts: int = 0


@attrs.define(eq=False, kw_only=True)
class ReconciledSource(abc.ABC, Generic[C_co]):
    """The ``ContainerSource[Run]`` of a scheduled pool (module doc): the reconciler, the members
    by run ID, and the loop; a subclass supplies the scheduler's side.

    Attributes:
        config: The pool's settings.
        token: The bearer token of every server of the pool.
        machine: The reconciler whose decisions the loop carries out.
        by_run: The joined members by their run's ID.
    """

    unavailable: ClassVar[type[SandboxUnavailable]]
    """The error the scheduler's requests raise (noted and retried, never fatal)."""
    noun: ClassVar[str]
    """What one run is called in messages (``allocation``, ``job``, ``sandbox``)."""
    nothing_started: ClassVar[str]
    """What a failed start says when no problem was noted."""

    config: C_co
    token: str = attrs.field(repr=False, factory=lambda: secrets.token_urlsafe(32))
    machine: NomadReconciler = attrs.field(init=False)
    by_run: dict[str, Member[Run]] = attrs.field(init=False, factory=dict)
    _pool: SlotServerPool[Run] | None = attrs.field(init=False, default=None)
    _fatal: BaseException | None = attrs.field(init=False, default=None)
    _started: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self.machine = NomadReconciler(self.reconcile_config())

    def reconcile_config(self) -> ReconcileConfig:
        """The reconciler's settings (a subclass adds what its scheduler has)."""
        server = self.config.server
        return ReconcileConfig(
            scale=self.config.scaling,
            slots_per_container=server.slots_per_container,
            join_timeout_s=server.start_timeout_s,
        )

    @property
    def pool(self) -> SlotServerPool[Run]:
        assert self._pool is not None
        return self._pool

    # ------------------------------------------------------------------------- the scheduler

    @property
    @abc.abstractmethod
    def scheduler(self) -> str:
        """Who runs the servers (``Nomad job trajcore``), for a failed start and in log lines."""

    @property
    def tick_timeout_s(self) -> float | None:
        """Longest one poll may take (``None``: its requests bound themselves)."""
        return None

    @property
    def no_answer(self) -> str:
        """The problem noted when a poll took longer than ``tick_timeout_s``."""
        return f"{self.scheduler} did not answer in time"

    @abc.abstractmethod
    async def _set_up(self, stack: AsyncExitStack) -> None:
        """Prepare the scheduler (the first runs asked for); push the cleanup on ``stack``."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop every run, bounded and shielded; idempotent (``ContainerSource.shutdown``)."""

    @abc.abstractmethod
    async def _tick(self) -> None:
        """One poll: list the runs, ``_observe`` them, set the counts it returns."""

    @abc.abstractmethod
    def _container_name(self, join: Join) -> str:
        """The container name of the run ``join`` takes up."""

    @abc.abstractmethod
    async def _address(self, run_id: str) -> str:
        """The ``host:port`` (or URL) the run's slot server listens at; may wait for it."""

    @abc.abstractmethod
    def _replace(self, run_id: str, reason: str) -> None:
        """Stop the run given up on (in the background), so that another one takes its place."""

    def _hopeless(self, error: SandboxUnavailable) -> bool:
        """Whether the scheduler's ``error`` (from a poll or a join) is one no retry mends, so
        the pool's start fails with it at once (``False`` by default)."""
        del error
        return False

    def fail_start(self, error: BaseException) -> bool:
        """Fail the pool's start with ``error`` at once, if it has not ended; whether it had
        not (the first such error wins)."""
        if self._started or self._fatal is not None:
            return False
        self._fatal = error
        self.pool.signal()
        return True

    async def _why_not_started(self) -> str | None:
        """What the scheduler says about runs it did not start, for a failed start (``None``:
        nothing); never raises."""
        return None

    def _did_not_join(self, run_id: str, name: str, reason: str) -> str:
        """The problem noted when the run's server did not join."""
        return f"{self.noun} {run_id} did not join: {reason}"

    def _joined(self, run_id: str, name: str, address: str) -> None:
        """The run's server joined as ``name``."""
        _log.info("%s: %s joined (%s)", self.scheduler, name, address)

    # ------------------------------------------------------------------------- source

    async def open(self, pool: SlotServerPool[Run], stack: AsyncExitStack) -> None:
        self._pool = pool
        await self._set_up(stack)

    async def start(self, pool: SlotServerPool[Run]) -> None:
        pool.spawn(self._watch)
        start_timeout_s = self.config.server.start_timeout_s
        wanted = self.config.scaling.min_containers
        with anyio.move_on_after(start_timeout_s):
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if len(pool.container_names()) >= wanted:
                    self._started = True
                    return
                await pool.changed()
        seen = "; ".join(pool.problems[-3:]) or self.nothing_started
        why = await self._why_not_started()
        seen = seen if why is None else f"{why}; {seen}"
        raise SlotServerError(
            f"{self.scheduler}: {len(pool.container_names())} of "
            f"{wanted} slot servers became healthy within "
            f"{start_timeout_s} s ({seen})"
        )

    async def _stop_all(self, stop: Callable[[], Awaitable[object]], what: str) -> None:
        """Carry out ``stop`` (what ends every run of the pool: ``shutdown``'s work) shielded
        from cancellation and within ``stop_timeout_s``. A scheduler's error is logged and noted
        as ``could not <what>``, the time running out as ``could not <what> within N s``."""
        limit = self.config.stop_timeout_s
        with anyio.CancelScope(shield=True), anyio.move_on_after(limit) as scope:
            try:
                await stop()
            except (self.unavailable, InvalidInput) as error:
                _log.warning("%s: could not %s: %s", self.scheduler, what, error)
                self.pool.note(f"could not {what}: {error}")
        if scope.cancelled_caught:
            self.pool.note(f"could not {what} within {limit} s")

    def lost(self, member: Member[Run], reason: str) -> None:
        """The core lost ``member`` (a failed batch or reset): the machine replaces it."""
        self._apply(self.machine.failed(member.handle.id, reason, anyio.current_time()))

    def check_valid(self) -> None:
        """The reconciler's invariants, and every member filed under its run and its name."""
        self.machine.check_valid()
        for run_id, member in self.by_run.items():
            if member.handle.id != run_id or self.pool.member(member.name) is not member:
                raise AssertionError(f"check_valid: container {member.name} is misfiled")

    # ------------------------------------------------------------------------- the loop

    async def _watch(self) -> None:
        """Poll and carry out the machine's actions; until cancelled."""
        while not self.pool.closed:
            try:
                with anyio.fail_after(self.tick_timeout_s):
                    await self._tick()
            except (self.unavailable, InvalidInput, TimeoutError) as error:
                reason = str(error) or self.no_answer
                _log.warning("%s: %s", self.scheduler, reason)
                self.pool.note(reason)
                if isinstance(error, self.unavailable) and self._hopeless(error):
                    self.fail_start(error)
            await anyio.sleep(self.config.poll_interval_s)

    def _allocation(
        self,
        run_id: str,
        index: int,
        client_status: str,
        *,
        desired_status: str = "run",
        restarts: int = 0,
        ending: bool = False,
    ) -> Allocation:
        """The run as the machine sees it, with the slot book's counts of its member."""
        member = self.by_run.get(run_id)
        held = quarantined = 0
        if member is not None and not member.lost:
            slots = self.config.server.slots_per_container
            held = self.pool.leasing.held(member.name, slots)
            quarantined = self.pool.leasing.quarantined(member.name, slots)
        return Allocation(
            id=run_id,
            index=index,
            client_status=client_status,
            desired_status=desired_status,
            restarts=restarts,
            held=held,
            quarantined=quarantined,
            ending=ending,
        )

    def _observe(self, allocations: Sequence[Allocation], now: float) -> list[int]:
        """Hand one poll to the machine and carry out its actions; the counts to set."""
        stats = self.pool.statistics()
        return self._apply(self.machine.observe(allocations, stats.leased + stats.waiting, now))

    def _apply(self, actions: Sequence[Action]) -> list[int]:
        """Carry out ``actions`` against the pool core; returns the counts to set."""
        pool = self.pool
        counts: list[int] = []
        for action in actions:
            if isinstance(action, SetCount):
                counts.append(action.count)
            elif isinstance(action, Join):
                pool.spawn(self._join, action)
            elif isinstance(action, Replace):
                pool.note(f"{self.noun} {action.alloc_id} replaced: {action.reason}")
                self._replace(action.alloc_id, action.reason)
            elif isinstance(action, Lose | Remove):
                member = self.by_run.pop(action.alloc_id, None)
                if member is not None:
                    pool.gone(member, action.reason)
            elif isinstance(action, Drain | Undrain):
                member = self.by_run.get(action.alloc_id)
                if member is not None and not member.lost:
                    if isinstance(action, Drain):
                        pool.drain(member)
                    else:
                        pool.undrain(member)
        return counts

    async def _join(self, join: Join) -> None:
        """Connect to the run's slot server and tell the machine how it went."""
        pool = self.pool
        run_id = join.alloc_id
        name = self._container_name(join)
        try:
            with anyio.fail_after(self.config.server.start_timeout_s):
                address = await self._address(run_id)
                client = await pool.connect(Endpoint("tcp", address, self.token), name)
        except (TimeoutError, SlotServerError, InvalidInput, self.unavailable) as error:
            reason = "not healthy in time" if isinstance(error, TimeoutError) else str(error)
            pool.note(self._did_not_join(run_id, name, reason))
            if isinstance(error, self.unavailable) and self._hopeless(error):
                self.fail_start(error)
            self._apply(self.machine.join_failed(run_id, reason, anyio.current_time()))
            return
        except SandboxUnavailable as error:  # a sandbox (or tmux) is required: the start fails
            pool.note(str(error))
            self._fatal = self._fatal or error
            self._apply(self.machine.join_failed(run_id, str(error), anyio.current_time()))
            pool.signal()
            return
        actions = self.machine.joined(run_id, anyio.current_time())
        member = None
        if not any(isinstance(action, Discard) for action in actions):
            run = Run(id=run_id, index=join.index, restarts=join.restarts)
            member = pool.join(name, client, run)
        if member is None:  # given up meanwhile, or the pool closed
            await close_quietly(client)
            return
        self.by_run[run_id] = member
        self._joined(run_id, name, address)
        self._apply(actions)


class ReconciledPool(SlotServerPool[Run]):
    """A ``SlotServerPool`` over a ``ReconciledSource``, with the scheduler's view of it."""

    def __init__(
        self,
        source: ReconciledSource[ReconciledSettings],
        *,
        label: str,
        fork_wait_s: float = DEFAULT_FORK_WAIT_S,
    ) -> None:
        self._runs = source
        super().__init__(source, source.config.server, label=label, fork_wait_s=fork_wait_s)

    def run_id(self, container: str) -> str:
        """The scheduler's ID of the run behind ``container``. Raises ``KeyError``."""
        member = self.member(container)
        if member is None:
            raise KeyError(container)
        return member.handle.id

    @property
    def target(self) -> int:
        """The server count the scaling rules want now."""
        return self._runs.machine.target

    def check_valid(self) -> None:
        """The slot book's invariants and the pool's own (raises ``AssertionError``)."""
        super().check_valid()
        self._runs.check_valid()


@attrs.define
class StartBackoff:
    """When a source that starts its own runs may start one again on a server index: at once
    after a run that joined, else after a delay that doubles from 0.5 s to 60 s with each start
    on that index that did not join."""

    _last: dict[int, tuple[str | None, float]] = attrs.field(init=False, factory=dict)
    _failures: dict[int, int] = attrs.field(init=False, factory=dict)
    _joined: set[str] = attrs.field(init=False, factory=set)

    def due(self, index: int, now: float) -> bool:
        """Whether a run may be started on ``index`` at ``now`` (counting the last one's
        failure when it did not join)."""
        last = self._last.get(index)
        if last is not None:
            run_id, when = last
            failures = 0 if run_id in self._joined else self._failures.get(index, 0) + 1
            if failures and now < when + min(0.5 * 2 ** (failures - 1), _MAX_BACKOFF_S):
                return False
            self._failures[index] = failures
        return True

    def started(self, index: int, run_id: str | None, now: float) -> None:
        """A run was started on ``index`` at ``now`` (``run_id`` ``None``: it was refused)."""
        self._last[index] = (run_id, now)

    def joined(self, run_id: str) -> None:
        """The server of ``run_id`` joined."""
        self._joined.add(run_id)

    def failures(self, index: int) -> int:
        """Starts on ``index`` in a row that did not join, as last counted."""
        return self._failures.get(index, 0)


@attrs.define(eq=False, kw_only=True)
class IndexedSource(ReconciledSource[C_co]):
    """The source of a pool that starts every run itself, one per server index (Slurm jobs,
    cloud sandboxes): what it shares beside the loop. Its runs carry the pool's run ID; it keeps
    the count the reconciler set, starts an index again only when ``StartBackoff`` says so
    (``_backoff``; a joined server resets it) and stops every run at the pool's close
    (``_stop_runs``, shielded and bounded, which ``stopping`` describes).

    Attributes:
        run: This pool's run ID, which each of its runs carries.
        count: The server count the pool keeps.
        started: Runs started since the start (the first ones, scale-ups and replacements).
    """

    stopping: ClassVar[str]
    """What stopping every run is called in problems (``cancel the jobs``)."""

    run: str = attrs.field(factory=lambda: secrets.token_hex(6))
    count: int = attrs.field(init=False, default=0)
    started: int = attrs.field(init=False, default=0)
    _backoff: StartBackoff = attrs.field(init=False, factory=StartBackoff)
    _open: bool = attrs.field(init=False, default=False)

    def _opened(self, stack: AsyncExitStack) -> None:
        """The scheduler is ready: every run stops at the pool's close, and the count starts at
        ``scaling.min_containers``."""
        self._open = True
        stack.push_async_callback(self.shutdown)
        self.count = self.config.scaling.min_containers
        self.machine.registered(self.count)

    async def shutdown(self) -> None:
        """Stop every run of the pool (``_stop_runs``), bounded and shielded; idempotent."""
        if not self._open:
            return
        self._open = False
        await self._stop_all(self._stop_runs, self.stopping)

    @abc.abstractmethod
    async def _stop_runs(self) -> None:
        """End every run of the pool and wait until the scheduler shows none."""

    def _observed(self, allocations: Sequence[Allocation], now: float) -> None:
        """Hand one poll to the reconciler and keep the counts it sets."""
        for count in self._observe(allocations, now):
            self.count = count
            self.machine.scaled(count)

    def _joined(self, run_id: str, name: str, address: str) -> None:
        self._backoff.joined(run_id)
        super()._joined(run_id, name, address)


class IndexedPool(ReconciledPool):
    """A ``ReconciledPool`` over an ``IndexedSource``: the Slurm and the cloud pools."""

    def __init__(self, source: IndexedSource[ReconciledSettings], *, label: str) -> None:
        self._indexed = source
        super().__init__(source, label=label)

    @property
    def run(self) -> str:
        """This pool's run ID (its jobs' and sandboxes' own label)."""
        return self._indexed.run

    @property
    def server_count(self) -> int:
        """The server count the pool keeps (jobs queued or running, sandboxes)."""
        return self._indexed.count

    @property
    def servers_started(self) -> int:
        """Runs started since the start (the first ones, scale-ups and replacements)."""
        return self._indexed.started
