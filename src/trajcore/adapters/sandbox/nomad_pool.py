"""``NomadSandboxPool``: slot servers as allocations of a Nomad job, leased slot by slot.

The pool registers one Nomad job (``trajcore.domain.nomad_job``) whose task group runs the slot
server, ``count`` allocations of it, each serving ``slots_per_container`` slots over TCP with a
bearer token the pool draws at start. It then implements the ``SandboxPool`` port over those
servers exactly as the local pool does over its child processes: the same slot book and leasing
(``SlotLeasing``), the same batch rules (``execute_batch``), the same client
(``SlotServerClient``). What it adds is scheduling, and Nomad does the scheduling.

How containers come and go:

- A watch task polls the job's allocations every ``poll_interval_s``. An allocation that Nomad
  reports ``running`` (and wants running) joins: the pool reads it once for the address of its
  ``slot`` port (``AllocatedResources.Shared.Ports``, else ``.Networks``), connects, waits for the
  server's health (``start_timeout_s``), checks its slot count and, with ``require_sandbox``
  (``require_tmux``), that it is sandboxed (has tmux), and adds its slots to the book under a
  container name of its own (``nomad-<index>-<alloc id prefix>``, with ``~<restarts>`` after an
  in-place restart, because a restarted server has forgotten its slots).
- An allocation that stops, fails, is lost, disappears from the listing or restarts in place is
  gone: its container is *lost* (its slots leave the book, their leases turn stale, later calls
  with them are ``REJECTED``), unless it had drained, in which case it is simply removed. Nomad's
  reschedule policy places a replacement, which joins like any other.
- A slot server that fails a batch or a reset (unreachable, crashed, 5xx, timed out) is lost at
  once, as in the local pool; the pool then asks Nomad to stop its allocation
  (``POST /v1/allocation/{id}/stop``), which makes Nomad place a replacement. An allocation that
  never becomes healthy is stopped the same way. Neither is ever joined again.
- Scaling: the domain ``ScalePolicy`` turns demand (leased plus waiting) into a target between
  ``min_containers`` and ``max_containers``, with ``scale_down_margin`` and ``cooldown_s``. Up:
  the job's count is raised at once (``POST /v1/job/{id}/scale``). Down: Nomad stops the highest
  allocation indices when the count drops, so the pool first drains exactly those containers
  (no new leases; running trajectories finish and their slots reset) and lowers the count only
  once none of them holds a slot. A drained container that the target wants back (demand rose
  again) rejoins with its slots free.

Start and shutdown: entering the pool checks that Nomad answers (``status/leader``), purges an
existing job of the same ID when ``purge_on_start``, registers the job with ``min_containers``
allocations and waits until that many have joined (``start_timeout_s``; ``SlotServerError`` with
what Nomad reported when they do not, ``SandboxUnavailable`` when a sandbox is required and a
server has none). ``aclose`` refuses new leases, stops the watch, closes every client and stops
the job: purged (gone from Nomad at once) with ``purge_on_shutdown``, otherwise stopped but kept
so its allocations and logs stay inspectable until Nomad's garbage collection.

Every wait is bounded: Nomad requests (``request_timeout_s``), joining (``start_timeout_s``),
resets (``reset_timeout_s``), leases (``timeout_s`` or ``acquire_timeout_s``), shutdown
(``stop_timeout_s``). Errors from Nomad while running are kept (``problems``) and retried on the
next poll; they never fail a lease or a call by themselves.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Sequence

import anyio
import attrs

from trajcore.adapters.sandbox.nomad_client import NomadClient, NomadUnavailable
from trajcore.adapters.sandbox.pool_core import (
    Endpoint,
    Member,
    SlotServerPool,
    close_quietly,
)
from trajcore.domain.errors import (
    ConfigError,
    InvalidInput,
    SandboxUnavailable,
    SlotServerError,
)
from trajcore.domain.nomad_job import (
    NomadJobSettings,
    NomadJobSpec,
    allocation_address,
    parse_allocation_stubs,
    register_request,
    scale_request,
)
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
from trajcore.domain.scale_policy import ScaleConfig
from trajcore.domain.validators import (
    flag,
    non_negative_seconds,
    optional_seconds,
    optional_text,
    positive_seconds,
    whole_number,
)

__all__ = ["NomadPoolConfig", "NomadSandboxPool", "start_nomad_pool"]

_log = logging.getLogger(__name__)
_ADDRESS = re.compile(r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:\d{1,5})?/?$")

# ============================================================================ config


def _nomad_address(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or _ADDRESS.fullmatch(value.strip()) is None:
        raise ConfigError(
            attribute.name, f"expected http(s)://host:port of a Nomad agent, got {value!r}"
        )
    port = value.strip().rstrip("/").rpartition(":")[2]
    if port.isdigit() and not 0 < int(port) < 65536:
        raise ConfigError(attribute.name, f"port out of range in {value!r}")


@attrs.frozen(kw_only=True)
class NomadPoolConfig(NomadJobSettings):
    """How the Nomad pool runs its slot servers: the job's settings (``NomadJobSettings``: the
    driver, image, command, slots per container, sandbox policy, resources, restarts, ...) and
    these. The policy is the env's, never the model's.

    Attributes:
        address: The Nomad agent's API, ``http(s)://host:port``.
        min_containers, max_containers: The range the container count is scaled in.
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: none).
        purge_on_start: Purge a job of the same ID before registering.
        purge_on_shutdown: Purge the job when the pool closes (otherwise it is stopped).
        token: Nomad ACL token (``None``: ``$NOMAD_TOKEN`` if set).
        require_tmux: Refuse slot servers without tmux (the persistent shell of
            ``bash_stateful`` and ``tmux`` needs it), as a missing sandbox is refused.
        scale_down_margin, cooldown_s: The scale policy's damping (``ScaleConfig``).
        start_timeout_s: Longest the pool's start, and one container's join, may take.
        reset_timeout_s: Longest a release's reset may take before the slot is quarantined.
        poll_interval_s: How often the job's allocations are listed.
        request_timeout_s: Longest one Nomad API request may take.
        stop_timeout_s: Longest stopping the job at shutdown may take.
    """

    address: str = attrs.field(default="http://127.0.0.1:4646", validator=_nomad_address)
    min_containers: int = attrs.field(default=1, validator=whole_number(0))
    max_containers: int = attrs.field(default=10, validator=whole_number(1))
    acquire_timeout_s: float | None = attrs.field(default=600.0, validator=optional_seconds)
    purge_on_start: bool = attrs.field(default=False, validator=flag)
    purge_on_shutdown: bool = attrs.field(default=True, validator=flag)
    token: str | None = attrs.field(default=None, validator=optional_text, repr=False)
    require_tmux: bool = attrs.field(default=False, validator=flag)
    scale_down_margin: int = attrs.field(default=0, validator=whole_number(0))
    cooldown_s: float = attrs.field(default=30.0, validator=non_negative_seconds)
    start_timeout_s: float = attrs.field(default=120.0, validator=positive_seconds)
    reset_timeout_s: float = attrs.field(default=30.0, validator=positive_seconds)
    poll_interval_s: float = attrs.field(default=1.0, validator=positive_seconds)
    request_timeout_s: float = attrs.field(default=10.0, validator=positive_seconds)
    stop_timeout_s: float = attrs.field(default=30.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        try:
            self.scale_config()
        except ConfigError as error:  # (the scale policy's names are ``scaling.<field>``)
            raise ConfigError(error.field.removeprefix("scaling."), error.reason) from None

    def job_spec(self, *, count: int, token: str) -> NomadJobSpec:
        """The job for ``count`` slot servers with bearer ``token``."""
        return NomadJobSpec.of(self, count=count, token=token)

    def scale_config(self) -> ScaleConfig:
        """The domain scale policy's settings."""
        return ScaleConfig(
            min_containers=self.min_containers,
            max_containers=self.max_containers,
            slots_per_container=self.slots_per_container,
            scale_down_margin=self.scale_down_margin,
            cooldown_s=self.cooldown_s,
        )


# ============================================================================ allocations


@attrs.frozen
class _Allocation:
    """The handle of one joined slot server: its Nomad allocation."""

    alloc_id: str
    index: int
    restarts: int


def _container_name(alloc_id: str, index: int, restarts: int) -> str:
    name = f"nomad-{index}-{alloc_id[:8]}"
    return name if restarts == 0 else f"{name}~{restarts}"


def _allocation(member: Member) -> _Allocation:
    assert isinstance(member.handle, _Allocation)
    return member.handle


@attrs.define(eq=False)
class _NomadAllocations:
    """The ``ContainerSource`` of the Nomad pool: the allocations of one job.

    Every decision (join, drain, undrain, lose, remove, replace, the job's count) is the
    domain ``NomadReconciler``'s; this class lists allocations, feeds them in, and carries the
    actions out against Nomad and the pool core.
    """

    config: NomadPoolConfig
    nomad: NomadClient
    token: str = attrs.field(repr=False, factory=lambda: secrets.token_urlsafe(32))
    machine: NomadReconciler = attrs.field(init=False)
    by_alloc: dict[str, Member] = attrs.field(init=False, factory=dict)
    _pool: SlotServerPool | None = attrs.field(init=False, default=None)
    _names: dict[str, str] = attrs.field(init=False, factory=dict)
    _version: int = attrs.field(init=False, default=0)
    _fatal: BaseException | None = attrs.field(init=False, default=None)
    _registered: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self.machine = NomadReconciler(
            ReconcileConfig(
                scale=config.scale_config(),
                restart_attempts=config.restart_attempts,
                join_timeout_s=config.start_timeout_s,
            )
        )

    @property
    def pool(self) -> SlotServerPool:
        assert self._pool is not None
        return self._pool

    # ------------------------------------------------------------------------- source

    async def open(self, pool: SlotServerPool, stack: contextlib.AsyncExitStack) -> None:
        self._pool = pool
        config = self.config
        await self.nomad.leader()
        if config.purge_on_start and await self.nomad.deregister(config.job_id, purge=True):
            _log.info("purged Nomad job %s before starting", config.job_id)
        stack.push_async_callback(self.shutdown)
        await self._register(config.min_containers)

    async def start(self, pool: SlotServerPool) -> None:
        pool.spawn(self._watch)
        config = self.config
        with anyio.move_on_after(config.start_timeout_s):
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if len(pool.container_names()) >= config.min_containers:
                    return
                await pool.changed()
        seen = "; ".join(pool.problems[-3:]) or "Nomad placed no running allocation"
        raise SlotServerError(
            f"Nomad job {config.job_id}: {len(pool.container_names())} of "
            f"{config.min_containers} slot servers became healthy within "
            f"{config.start_timeout_s} s ({seen})"
        )

    def lost(self, member: Member, reason: str) -> None:
        """The core lost ``member`` (a failed batch or reset): the machine replaces it."""
        allocation = _allocation(member)
        self._apply(self.machine.failed(allocation.alloc_id, reason, anyio.current_time()))

    async def shutdown(self) -> None:
        """Stop the job (purged when configured), bounded and shielded."""
        config = self.config
        if not self._registered:
            return
        self._registered = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(config.stop_timeout_s) as scope:
            try:
                await self.nomad.deregister(config.job_id, purge=config.purge_on_shutdown)
            except NomadUnavailable as error:
                _log.warning("Nomad pool %s: could not stop the job: %s", config.job_id, error)
                self.pool.note(f"could not stop the job: {error}")
        if scope.cancelled_caught:
            self.pool.note(f"stopping the job took longer than {config.stop_timeout_s} s")

    def check_valid(self) -> None:
        self.machine.check_valid()
        for alloc_id, member in self.by_alloc.items():
            filed = self.pool.member(member.name) is member
            if _allocation(member).alloc_id != alloc_id or not filed:
                raise AssertionError(f"check_valid: container {member.name} is misfiled")

    # ------------------------------------------------------------------------- Nomad

    async def _register(self, count: int) -> None:
        config = self.config
        spec = config.job_spec(count=count, token=self.token)
        await self.nomad.register(config.job_id, register_request(spec))
        self._registered = True
        job = await self.nomad.read_job(config.job_id)
        version = None if job is None else job.get("Version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise NomadUnavailable(
                f"Nomad lost the job just registered (read back {version!r} as its version)",
                field="job_id",
            )
        self._version = version
        self.machine.registered(count)

    async def _watch(self) -> None:
        """Poll the allocations and carry out the machine's actions; until cancelled."""
        while not self.pool.closed:
            try:
                await self._tick()
            except (NomadUnavailable, InvalidInput) as error:
                _log.warning("Nomad pool %s: %s", self.config.job_id, error)
                self.pool.note(str(error))
            await anyio.sleep(self.config.poll_interval_s)

    async def _tick(self) -> None:
        config = self.config
        listing = await self.nomad.job_allocations(config.job_id)
        stubs = [s for s in parse_allocation_stubs(listing) if s.job_version >= self._version]
        slots = config.slots_per_container
        leasing = self.pool.leasing
        allocations = []
        for stub in stubs:
            self._names[stub.id] = stub.name
            member = self.by_alloc.get(stub.id)
            live = member is not None and not member.lost
            allocations.append(
                Allocation(
                    id=stub.id,
                    index=stub.index,
                    client_status=stub.client_status,
                    desired_status=stub.desired_status,
                    restarts=stub.restarts,
                    held=leasing.held(member.name, slots) if live and member else 0,
                    quarantined=leasing.quarantined(member.name, slots) if live and member else 0,
                )
            )
        stats = self.pool.statistics()
        actions = self.machine.observe(
            allocations, stats.leased + stats.waiting, anyio.current_time()
        )
        for count in self._apply(actions):
            await self._set_count(count)

    async def _set_count(self, count: int) -> None:
        config = self.config
        await self.nomad.scale(
            config.job_id,
            scale_request(
                config.group,
                count,
                f"trajcore: {count} slot servers for the demand",
            ),
        )
        self.machine.scaled(count)

    async def _stop_allocation(self, alloc_id: str) -> None:
        try:
            await self.nomad.stop_allocation(alloc_id)
        except NomadUnavailable as error:
            self.pool.note(f"could not stop allocation {alloc_id}: {error}")

    # ------------------------------------------------------------------------- actions

    def _apply(self, actions: Sequence[Action]) -> list[int]:
        """Carry out ``actions`` against the pool core; returns the counts to set in Nomad."""
        pool = self.pool
        counts: list[int] = []
        for action in actions:
            if isinstance(action, SetCount):
                counts.append(action.count)
            elif isinstance(action, Join):
                pool.spawn(self._join, action)
            elif isinstance(action, Replace):
                _log.warning("Nomad pool %s: %s", self.config.job_id, action.reason)
                pool.note(f"allocation {action.alloc_id} replaced: {action.reason}")
                pool.spawn(self._stop_allocation, action.alloc_id)
            elif isinstance(action, Lose | Remove):
                member = self.by_alloc.pop(action.alloc_id, None)
                if member is not None:
                    pool.gone(member, action.reason)
            elif isinstance(action, Drain | Undrain):
                member = self.by_alloc.get(action.alloc_id)
                if member is not None and not member.lost:
                    if isinstance(action, Drain):
                        pool.drain(member)
                    else:
                        pool.undrain(member)
        return counts

    async def _join(self, join: Join) -> None:
        """Connect to the allocation's slot server and tell the machine how it went."""
        pool = self.pool
        alloc_id = join.alloc_id
        name = _container_name(alloc_id, join.index, join.restarts)
        if pool.member(name) is not None:  # two allocation IDs that share their first 8 digits
            name = name.replace(alloc_id[:8], alloc_id, 1)
        described = f"allocation {self._names.get(alloc_id, name)} ({alloc_id})"
        try:
            with anyio.fail_after(self.config.start_timeout_s):
                address = allocation_address(await self.nomad.read_allocation(alloc_id))
                client = await pool.connect(Endpoint("tcp", address, self.token), name)
        except (TimeoutError, SlotServerError, InvalidInput, NomadUnavailable) as error:
            reason = "not healthy in time" if isinstance(error, TimeoutError) else str(error)
            pool.note(f"{described} did not join: {reason}")
            self._apply(self.machine.join_failed(alloc_id, reason, anyio.current_time()))
            return
        except SandboxUnavailable as error:
            pool.note(str(error))
            self._fatal = self._fatal or error
            self._apply(self.machine.join_failed(alloc_id, str(error), anyio.current_time()))
            pool.signal()
            return
        actions = self.machine.joined(alloc_id, anyio.current_time())
        handle = _Allocation(alloc_id=alloc_id, index=join.index, restarts=join.restarts)
        member = None
        if not any(isinstance(action, Discard) for action in actions):
            member = pool.join(name, client, handle)
        if member is None:  # given up meanwhile, or the pool closed
            await close_quietly(client)
            return
        self.by_alloc[alloc_id] = member
        _log.info("Nomad pool %s: %s joined (%s)", self.config.job_id, name, address)
        self._apply(actions)


# ============================================================================ the pool


class NomadSandboxPool(SlotServerPool):
    """The SandboxPool port over slot servers run by Nomad. ``async with NomadSandboxPool(c)``.

    Entering registers the job and waits for ``min_containers`` slot servers (see the module
    doc); it raises ``NomadUnavailable`` (a ``SandboxUnavailable`` naming ``address`` or
    ``token``) when Nomad cannot be used, ``SlotServerError`` when the servers do not become
    healthy in time, ``SandboxUnavailable`` when ``require_sandbox`` and a server has no
    sandbox; nothing is left registered then (unless ``purge_on_shutdown`` is off, in which case
    the job is stopped). Leaving closes it (``aclose``).

    Attributes:
        config: The pool's settings.
    """

    def __init__(self, config: NomadPoolConfig | None = None) -> None:
        self.config = config = config or NomadPoolConfig()
        nomad = NomadClient(
            address=config.address,
            token=config.token,
            namespace=config.namespace,
            region=config.region,
            timeout_s=config.request_timeout_s,
        )
        self._allocations = _NomadAllocations(config, nomad)
        super().__init__(self._allocations, config, label="Nomad")

    def allocation_id(self, container: str) -> str:
        """The Nomad allocation behind ``container``. Raises ``KeyError``."""
        member = self.member(container)
        if member is None:
            raise KeyError(container)
        return _allocation(member).alloc_id

    @property
    def target(self) -> int:
        """The container count the scale policy wants now."""
        return self._allocations.machine.target

    @property
    def job_count(self) -> int:
        """The task group count last set in Nomad."""
        return self._allocations.machine.job_count or 0

    def check_valid(self) -> None:
        """The slot book's invariants, and the pool's own (raises ``AssertionError``)."""
        super().check_valid()
        self._allocations.check_valid()


@contextlib.asynccontextmanager
async def start_nomad_pool(config: NomadPoolConfig) -> AsyncIterator[NomadSandboxPool]:
    """``async with start_nomad_pool(config) as pool``: a started pool, closed on exit.

    Raises on entry what ``NomadSandboxPool.__aenter__`` raises.
    """
    async with NomadSandboxPool(config) as pool:
        yield pool
