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
import math
import re
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import attrs

from trajcore.adapters.sandbox.batches import execute_batch
from trajcore.adapters.sandbox.client import SlotServerClient
from trajcore.adapters.sandbox.leasing import SlotLeasing
from trajcore.adapters.sandbox.nomad_client import NomadClient, NomadUnavailable
from trajcore.domain.errors import (
    ConfigError,
    InvalidInput,
    PoolClosed,
    SandboxUnavailable,
    SlotServerError,
    StateError,
    UnknownSlot,
)
from trajcore.domain.messages import ToolResult
from trajcore.domain.nomad_job import (
    AllocationStub,
    Driver,
    NomadJobSpec,
    allocation_address,
    parse_allocation_stubs,
    register_request,
    scale_request,
)
from trajcore.domain.scale_policy import ScaleConfig, ScalePolicy
from trajcore.domain.slot_server_flags import SlotServerFlags
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall, SlotId, SlotState

__all__ = ["NomadPoolConfig", "NomadSandboxPool", "start_nomad_pool"]

_log = logging.getLogger(__name__)
_ADDRESS = re.compile(r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:\d{1,5})?/?$")
_PROBLEMS_KEPT = 20

# ============================================================================ config


def _int_at_least(minimum: int) -> Callable[[object, attrs.Attribute[int], object], None]:
    def check(_: object, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(attribute.name, f"must be an integer >= {minimum}, got {value!r}")

    return check


def _positive_seconds(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ConfigError(attribute.name, f"must be finite seconds > 0, got {value!r}")


def _optional_seconds(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_seconds(_, attribute, value)


def _nonnegative_seconds(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ConfigError(attribute.name, f"must be finite seconds >= 0, got {value!r}")


def _nomad_address(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or _ADDRESS.fullmatch(value.strip()) is None:
        raise ConfigError(
            attribute.name, f"expected http(s)://host:port of a Nomad agent, got {value!r}"
        )
    port = value.strip().rstrip("/").rpartition(":")[2]
    if port.isdigit() and not 0 < int(port) < 65536:
        raise ConfigError(attribute.name, f"port out of range in {value!r}")


def _flag(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, f"must be true or false, got {value!r}")


def _optional_text(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(attribute.name, f"must be None or non-empty text, got {value!r}")


def _words(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, Sequence):
        return tuple(str(word) for word in value)
    raise ConfigError("command", f"expected words, got {value!r}")


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    if isinstance(value, Sequence):
        return tuple(str(name) for name in value)
    raise ConfigError("datacenters", f"expected names, got {value!r}")


@attrs.frozen(kw_only=True)
class NomadPoolConfig:
    """How the Nomad pool runs its slot servers; the policy is the env's, never the model's.

    Attributes:
        address: The Nomad agent's API, ``http(s)://host:port``.
        job_id: The Nomad job of the slot servers.
        driver: ``docker``, ``exec`` or ``raw_exec``.
        image: The docker image holding trajcore (docker only).
        command: The slot server program and subcommand, as the task runs it.
        slots_per_container: Slots each slot server serves (N).
        min_containers, max_containers: The range the container count is scaled in.
        privileged: Run docker containers privileged (bubblewrap inside docker needs it).
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: none).
        purge_on_start: Purge a job of the same ID before registering.
        purge_on_shutdown: Purge the job when the pool closes (otherwise it is stopped).
        token: Nomad ACL token (``None``: ``$NOMAD_TOKEN`` if set).
        namespace, region: Nomad namespace and region (``None``: the agent's).
        datacenters: Where Nomad may place the slot servers.
        flags: The sandbox policy of every slot server.
        require_tmux: Refuse slot servers without tmux (the persistent shell of
            ``bash_stateful`` and ``tmux`` needs it), as a missing sandbox is refused.
        cpu_mhz, memory_mb: What each allocation reserves (``memory_mb`` ``None``: 512 MB
            plus 256 MB per slot).
        restart_attempts: In-place restarts before an allocation fails and is replaced.
        reschedule_delay_s: Nomad's delay before replacing a failed allocation (at least 5 s).
        scale_down_margin, cooldown_s: The scale policy's damping (``ScaleConfig``).
        start_timeout_s: Longest the pool's start, and one container's join, may take.
        reset_timeout_s: Longest a release's reset may take before the slot is quarantined.
        poll_interval_s: How often the job's allocations are listed.
        request_timeout_s: Longest one Nomad API request may take.
        stop_timeout_s: Longest stopping the job at shutdown may take.
    """

    address: str = attrs.field(default="http://127.0.0.1:4646", validator=_nomad_address)
    job_id: str = "trajcore-slots"
    driver: Driver = "docker"
    image: str = "trajcore/slot-server:latest"
    command: tuple[str, ...] = attrs.field(default=("trajcore", "slot-server"), converter=_words)
    slots_per_container: int = attrs.field(default=8, validator=_int_at_least(1))
    min_containers: int = attrs.field(default=1, validator=_int_at_least(0))
    max_containers: int = attrs.field(default=10, validator=_int_at_least(1))
    privileged: bool = attrs.field(default=False, validator=_flag)
    acquire_timeout_s: float | None = attrs.field(default=600.0, validator=_optional_seconds)
    purge_on_start: bool = attrs.field(default=False, validator=_flag)
    purge_on_shutdown: bool = attrs.field(default=True, validator=_flag)
    token: str | None = attrs.field(default=None, validator=_optional_text, repr=False)
    namespace: str | None = None
    region: str | None = None
    datacenters: tuple[str, ...] = attrs.field(default=("dc1",), converter=_names)
    flags: SlotServerFlags = attrs.field(factory=SlotServerFlags)
    require_tmux: bool = attrs.field(default=False, validator=_flag)
    cpu_mhz: int = attrs.field(default=1000, validator=_int_at_least(1))
    memory_mb: int | None = None
    restart_attempts: int = attrs.field(default=0, validator=_int_at_least(0))
    reschedule_delay_s: float = 5.0
    scale_down_margin: int = attrs.field(default=0, validator=_int_at_least(0))
    cooldown_s: float = attrs.field(default=30.0, validator=_nonnegative_seconds)
    start_timeout_s: float = attrs.field(default=120.0, validator=_positive_seconds)
    reset_timeout_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    poll_interval_s: float = attrs.field(default=1.0, validator=_positive_seconds)
    request_timeout_s: float = attrs.field(default=10.0, validator=_positive_seconds)
    stop_timeout_s: float = attrs.field(default=30.0, validator=_positive_seconds)

    def __attrs_post_init__(self) -> None:
        if self.max_containers < self.min_containers:
            raise ConfigError(
                "max_containers",
                f"must be >= min_containers ({self.min_containers}), got {self.max_containers}",
            )
        if not isinstance(self.flags, SlotServerFlags):
            raise ConfigError("flags", f"expected SlotServerFlags, got {self.flags!r}")
        self.job_spec(count=self.min_containers, token="x" * 16)  # its fields, checked now

    def job_spec(self, *, count: int, token: str) -> NomadJobSpec:
        """The job for ``count`` slot servers with bearer ``token``.

        Raises ``ConfigError`` naming the field at fault (the same names as this config's).
        """
        memory = (
            self.memory_mb if self.memory_mb is not None else 512 + 256 * (self.slots_per_container)
        )
        return NomadJobSpec(
            job_id=self.job_id,
            count=count,
            driver=self.driver,
            image=self.image,
            command=self.command,
            slots_per_container=self.slots_per_container,
            flags=self.flags,
            token=token,
            privileged=self.privileged,
            datacenters=self.datacenters,
            namespace=self.namespace,
            region=self.region,
            cpu_mhz=self.cpu_mhz,
            memory_mb=memory,
            restart_attempts=self.restart_attempts,
            reschedule_delay_s=self.reschedule_delay_s,
            reschedule_max_delay_s=max(60.0, self.reschedule_delay_s),
        )

    def scale_config(self) -> ScaleConfig:
        """The domain scale policy's settings."""
        return ScaleConfig(
            min_containers=self.min_containers,
            max_containers=self.max_containers,
            slots_per_container=self.slots_per_container,
            scale_down_margin=self.scale_down_margin,
            cooldown_s=self.cooldown_s,
        )


# ============================================================================ containers


@attrs.define(eq=False)
class _Leasing(SlotLeasing):
    """``SlotLeasing`` plus the slot book's draining, which scale-down needs."""

    def drain_container(self, name: str) -> None:
        """No new leases in ``name``; its free slots drain now, the others when released."""
        self._book.drain_container(name)

    def drained_containers(self) -> set[str]:
        """Draining containers with no slot leased or resetting."""
        return set(self._book.drained_containers())

    def remove_container(self, name: str) -> None:
        """Forget a drained container (raises ``StateError`` when it is not drained)."""
        self._book.remove_container(name)

    def quarantined(self, name: str, slots: int) -> int:
        """How many of ``name``'s ``slots`` are quarantined."""
        states = (self._book.state(SlotId(container=name, index=i)) for i in range(slots))
        return sum(state is SlotState.QUARANTINED for state in states)


@attrs.define(eq=False)
class _Container:
    """One joined allocation: its slot server's client and where it stands."""

    name: str
    alloc_id: str
    index: int
    restarts: int
    client: SlotServerClient
    lost: bool = False
    draining: bool = False


def _container_name(stub: AllocationStub) -> str:
    name = f"nomad-{stub.index}-{stub.id[:8]}"
    return name if stub.restarts == 0 else f"{name}~{stub.restarts}"


# ============================================================================ the pool


@attrs.define(eq=False)
class NomadSandboxPool:
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

    config: NomadPoolConfig = attrs.field(factory=NomadPoolConfig)
    _leasing: _Leasing = attrs.field(init=False)
    _policy: ScalePolicy = attrs.field(init=False)
    _nomad: NomadClient = attrs.field(init=False)
    _token: str = attrs.field(init=False, repr=False, factory=lambda: secrets.token_urlsafe(32))
    _containers: dict[str, _Container] = attrs.field(init=False, factory=dict)
    _by_alloc: dict[str, _Container] = attrs.field(init=False, factory=dict)
    _joining: set[str] = attrs.field(init=False, factory=set)
    _retired: set[tuple[str, int]] = attrs.field(init=False, factory=set)
    _version: int = attrs.field(init=False, default=0)
    _target: int = attrs.field(init=False, default=0)
    _job_count: int = attrs.field(init=False, default=0)
    _group: anyio.abc.TaskGroup | None = attrs.field(init=False, default=None)
    _scopes: set[anyio.CancelScope] = attrs.field(init=False, factory=set)
    _changed: anyio.Event | None = attrs.field(init=False, default=None)
    _fatal: BaseException | None = attrs.field(init=False, default=None)
    _problems: deque[str] = attrs.field(init=False, factory=lambda: deque(maxlen=_PROBLEMS_KEPT))
    _lost: int = attrs.field(init=False, default=0)
    _joined: int = attrs.field(init=False, default=0)
    _registered: bool = attrs.field(init=False, default=False)
    _closed: bool = attrs.field(init=False, default=False)
    _started: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self._leasing = _Leasing(
            reset=self._reset,
            default_timeout_s=config.acquire_timeout_s,
            reset_timeout_s=config.reset_timeout_s,
        )
        self._policy = ScalePolicy(config.scale_config())
        self._nomad = NomadClient(
            address=config.address,
            token=config.token,
            namespace=config.namespace,
            region=config.region,
            timeout_s=config.request_timeout_s,
        )

    async def __aenter__(self) -> Self:
        if self._started:
            raise StateError("a NomadSandboxPool is entered once")
        self._started = True
        self._changed = anyio.Event()
        config = self.config
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        try:
            await self._nomad.leader()
            if config.purge_on_start and await self._nomad.deregister(config.job_id, purge=True):
                _log.info("purged Nomad job %s before starting", config.job_id)
            await self._register(config.min_containers)
            self._spawn(self._watch)
            await self._wait_started()
        except BaseException as error:  # noqa: BLE001 - undo the start, then re-raise
            self._closed = True
            self._leasing.close()
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
            self._group = None
            await self._shutdown()
            raise _single(error) from None
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()
        group, self._group = self._group, None
        if group is not None:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
        await self._close_clients()

    # ------------------------------------------------------------------------- port

    def lease(
        self, holder: str, *, timeout_s: float | None = None
    ) -> AbstractAsyncContextManager[Lease]:
        """See ``SandboxPool.lease``."""
        return self._leasing.lease(holder, timeout_s=timeout_s)

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """See ``SandboxPool.execute``; the batch rules are ``execute_batch``'s."""
        if self._closed or self._group is None:
            raise PoolClosed("the Nomad sandbox pool is closed")
        found = self._containers.get(container)
        live = found if found is not None and not found.lost else None

        def lose(reason: str) -> None:
            if live is not None:
                self._lose(live, reason)

        return await execute_batch(
            self._leasing, container, calls, None if live is None else live.client, lose
        )

    def statistics(self) -> PoolStatistics:
        """See ``SandboxPool.statistics``."""
        return self._leasing.statistics()

    async def aclose(self) -> None:
        """See ``SandboxPool.aclose``: stops the watch and the job (purged when configured)."""
        if self._closed:
            return
        self._closed = True
        self._leasing.close()
        for scope in list(self._scopes):
            scope.cancel()
        await self._shutdown()

    # ------------------------------------------------------------------------- inspection

    def container_names(self) -> list[str]:
        """The live containers, in the order they joined."""
        return [name for name, c in self._containers.items() if not c.lost]

    def allocation_id(self, container: str) -> str:
        """The Nomad allocation behind ``container``. Raises ``KeyError``."""
        return self._containers[container].alloc_id

    def client(self, container: str) -> SlotServerClient:
        """The client of ``container``'s slot server (artifacts, listings). Raises ``KeyError``."""
        return self._containers[container].client

    @property
    def target(self) -> int:
        """The container count the scale policy wants now."""
        return self._target

    @property
    def job_count(self) -> int:
        """The task group count last set in Nomad."""
        return self._job_count

    @property
    def containers_lost(self) -> int:
        """Containers lost (died, failed, or stopped while holding slots) since the start."""
        return self._lost

    @property
    def containers_joined(self) -> int:
        """Containers that joined since the start (the first ones and every replacement)."""
        return self._joined

    @property
    def problems(self) -> list[str]:
        """The latest problems met (Nomad errors, failed joins, lost containers), oldest first."""
        return list(self._problems)

    def check_valid(self) -> None:
        """The slot book's invariants, and the pool's own (raises ``AssertionError``)."""
        self._leasing.check_valid()
        for alloc_id, container in self._by_alloc.items():
            if (
                container.alloc_id != alloc_id
                or self._containers.get(container.name) is not container
            ):
                raise AssertionError(f"check_valid: container {container.name} is misfiled")
        if not self.config.min_containers <= self._target <= self.config.max_containers:
            raise AssertionError(f"check_valid: target {self._target} is out of bounds")

    # ------------------------------------------------------------------------- start

    async def _register(self, count: int) -> None:
        config = self.config
        spec = config.job_spec(count=count, token=self._token)
        await self._nomad.register(config.job_id, register_request(spec))
        self._registered = True
        job = await self._nomad.read_job(config.job_id)
        version = None if job is None else job.get("Version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise NomadUnavailable(
                f"Nomad lost the job just registered (read back {version!r} as its version)",
                field="job_id",
            )
        self._version = version
        self._target = self._job_count = count

    async def _wait_started(self) -> None:
        config = self.config
        with anyio.move_on_after(config.start_timeout_s):
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if len(self.container_names()) >= config.min_containers:
                    return
                assert self._changed is not None
                await self._changed.wait()
        seen = "; ".join(self.problems[-3:]) or "Nomad placed no running allocation"
        raise SlotServerError(
            f"Nomad job {config.job_id}: {len(self.container_names())} of "
            f"{config.min_containers} slot servers became healthy within "
            f"{config.start_timeout_s} s ({seen})"
        )

    def _spawn(self, work: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run ``work(*args)`` in the pool's task group, cancelled by ``aclose`` (not the
        group's own scope, which the pool's user runs inside)."""
        if self._closed or self._group is None:
            return
        scope = anyio.CancelScope()
        self._scopes.add(scope)

        async def run() -> None:
            try:
                with scope:
                    await work(*args)
            finally:
                self._scopes.discard(scope)

        self._group.start_soon(run)

    def _note(self, problem: str) -> None:
        self._problems.append(problem)
        self._signal()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = anyio.Event()

    # ------------------------------------------------------------------------- watch

    async def _watch(self) -> None:
        """Poll the allocations, join and lose containers, scale; until cancelled."""
        while not self._closed:
            try:
                await self._tick()
            except (NomadUnavailable, InvalidInput) as error:
                _log.warning("Nomad pool %s: %s", self.config.job_id, error)
                self._note(str(error))
            await anyio.sleep(self.config.poll_interval_s)

    async def _tick(self) -> None:
        config = self.config
        listing = await self._nomad.job_allocations(config.job_id)
        stubs = {
            stub.id: stub
            for stub in parse_allocation_stubs(listing)
            if stub.job_version >= self._version
        }
        for container in list(self._by_alloc.values()):
            stub = stubs.get(container.alloc_id)
            if stub is None:
                self._gone(container, "its allocation is no longer listed")
            elif stub.finished:
                self._gone(
                    container,
                    f"its allocation is {stub.client_status} (desired {stub.desired_status})",
                )
            elif stub.restarts != container.restarts:
                self._gone(container, "its slot server restarted in place")
        for stub in stubs.values():
            if (
                stub.running
                and stub.id not in self._by_alloc
                and stub.id not in self._joining
                and (stub.id, stub.restarts) not in self._retired
            ):
                self._joining.add(stub.id)
                self._spawn(self._join, stub)
        await self._scale()

    async def _join(self, stub: AllocationStub) -> None:
        """Connect to ``stub``'s slot server, check it, add its slots; or retire and stop it."""
        config = self.config
        name = _container_name(stub)
        if name in self._containers:  # two allocation IDs that share their first 8 digits
            name = name.replace(stub.id[:8], stub.id, 1)
        client: SlotServerClient | None = None
        try:
            with anyio.fail_after(config.start_timeout_s):
                address = allocation_address(await self._nomad.read_allocation(stub.id))
                client = SlotServerClient.tcp(address, self._token)
                client.reset_timeout_s = config.reset_timeout_s
                health = await client.wait_healthy(config.start_timeout_s)
            if health.slots != config.slots_per_container:
                raise SlotServerError(
                    f"it serves {health.slots} slots, not {config.slots_per_container}"
                )
            if config.flags.require_sandbox and not health.sandboxed:
                raise SandboxUnavailable(
                    f"slot server {name}: a sandbox is required and bubblewrap is unusable "
                    f"there: {health.capabilities.detail}"
                )
            if config.require_tmux and not health.capabilities.tmux:
                raise SandboxUnavailable(
                    f"slot server {name}: a persistent shell is required and tmux is not "
                    "installed there"
                )
        except (TimeoutError, SlotServerError, InvalidInput, NomadUnavailable) as error:
            reason = "not healthy in time" if isinstance(error, TimeoutError) else str(error)
            self._retire(stub, f"allocation {stub.name} ({stub.id}) did not join: {reason}")
            if client is not None:
                await _close_quietly(client)
            return
        except SandboxUnavailable as error:
            self._retire(stub, str(error))
            self._fatal = self._fatal or error
            await _close_quietly(client)
            return
        except BaseException:  # cancelled (the pool closes): leave no connection behind
            await _close_quietly(client)
            raise
        finally:
            self._joining.discard(stub.id)
        if self._closed:
            await _close_quietly(client)
            return
        container = _Container(
            name=name, alloc_id=stub.id, index=stub.index, restarts=stub.restarts, client=client
        )
        self._containers[name] = container
        self._by_alloc[stub.id] = container
        self._leasing.add_container(name, config.slots_per_container)
        self._joined += 1
        if stub.index >= self._target:
            container.draining = True
            self._leasing.drain_container(name)
        _log.info("Nomad pool %s: %s joined (%s)", config.job_id, name, address)
        self._signal()

    def _retire(self, stub: AllocationStub, reason: str) -> None:
        """Never join this run of ``stub`` again; ask Nomad to stop (and replace) it."""
        _log.warning("Nomad pool %s: %s", self.config.job_id, reason)
        self._note(reason)
        self._retired.add((stub.id, stub.restarts))
        self._spawn(self._stop_allocation, stub.id)

    async def _stop_allocation(self, alloc_id: str) -> None:
        try:
            await self._nomad.stop_allocation(alloc_id)
        except NomadUnavailable as error:
            self._note(f"could not stop allocation {alloc_id}: {error}")

    def _lose(self, container: _Container, reason: str) -> None:
        """Take a failing container out of service now and have Nomad replace it."""
        if container.lost:
            return
        container.lost = True
        self._lost += 1
        with contextlib.suppress(UnknownSlot):
            self._leasing.lose_container(container.name)
        message = f"container {container.name} lost: {reason}"
        _log.warning("Nomad pool %s: %s", self.config.job_id, message)
        self._note(message)
        self._retired.add((container.alloc_id, container.restarts))
        self._spawn(self._stop_allocation, container.alloc_id)

    def _gone(self, container: _Container, reason: str) -> None:
        """``container``'s allocation no longer runs: remove it if drained, else lose it."""
        del self._by_alloc[container.alloc_id]
        if not container.lost:
            if container.draining and container.name in self._leasing.drained_containers():
                self._leasing.remove_container(container.name)
                _log.info("Nomad pool %s: %s removed", self.config.job_id, container.name)
            else:
                self._lost += 1
                self._leasing.lose_container(container.name)
                self._note(f"container {container.name} lost: {reason}")
            container.lost = True
        del self._containers[container.name]
        self._spawn(_close_quietly, container.client)
        self._signal()

    # ------------------------------------------------------------------------- scaling

    async def _scale(self) -> None:
        """Follow the scale policy: drain or undrain containers, then set the job's count."""
        stats = self._leasing.statistics()
        decision = self._policy.decide(
            stats.leased + stats.waiting, self._target, anyio.current_time()
        )
        if decision.target != self._target:
            _log.info(
                "Nomad pool %s: %s from %d to %d containers (demand %d slots)",
                self.config.job_id, decision.reason.value, self._target, decision.target,
                stats.leased + stats.waiting,
            )  # fmt: skip
        target = self._target = decision.target
        drained = self._leasing.drained_containers()
        for container in self._containers.values():
            if container.lost:
                continue
            if container.index >= target and not container.draining:
                container.draining = True
                self._leasing.drain_container(container.name)
            elif container.index < target and container.draining and container.name in drained:
                self._undrain(container)
        if self._job_count < target:
            await self._set_count(target)
        elif self._job_count > target:
            drained = self._leasing.drained_containers()
            leaving = [c for c in self._containers.values() if not c.lost and c.index >= target]
            if all(c.name in drained for c in leaving):
                await self._set_count(target)

    def _undrain(self, container: _Container) -> None:
        """A drained container the target wants again: its slots come back free."""
        slots = self.config.slots_per_container
        if self._leasing.quarantined(container.name, slots):
            self._lose(container, "it had quarantined slots when the pool grew again")
            return
        # Its epochs carry on under the same name, so the server's retired epochs stay retired.
        self._leasing.lose_container(container.name)
        self._leasing.add_container(container.name, slots)
        container.draining = False
        self._signal()

    async def _set_count(self, count: int) -> None:
        config = self.config
        await self._nomad.scale(
            config.job_id,
            scale_request(
                config.job_spec(count=count, token=self._token).group,
                count,
                f"trajcore: {count} slot servers for the demand",
            ),
        )
        self._job_count = count

    # ------------------------------------------------------------------------- slots

    async def _reset(self, lease: Lease) -> bool:
        container = self._containers.get(lease.slot.container)
        if container is None or container.lost or self._closed:
            return False
        try:
            outcome = await container.client.reset(lease.slot.index, lease.epoch)
        except SlotServerError as error:
            self._lose(container, f"reset failed: {error}")
            return False
        except (InvalidInput, StateError):
            return False
        return outcome.ok

    # ------------------------------------------------------------------------- shutdown

    async def _shutdown(self) -> None:
        """Stop the job (purged when configured), bounded and shielded; close the clients."""
        config = self.config
        with anyio.CancelScope(shield=True):
            if self._registered:
                self._registered = False
                with anyio.move_on_after(config.stop_timeout_s) as scope:
                    try:
                        await self._nomad.deregister(config.job_id, purge=config.purge_on_shutdown)
                    except NomadUnavailable as error:
                        _log.warning(
                            "Nomad pool %s: could not stop the job: %s", config.job_id, error
                        )
                        self._note(f"could not stop the job: {error}")
                if scope.cancelled_caught:
                    self._note(f"stopping the job took longer than {config.stop_timeout_s} s")
            await self._close_clients()

    async def _close_clients(self) -> None:
        with anyio.CancelScope(shield=True):
            for container in list(self._containers.values()):
                await _close_quietly(container.client)


async def _close_quietly(client: SlotServerClient | None) -> None:
    if client is None:
        return
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await client.aclose()


def _single(error: BaseException) -> BaseException:
    """The one error inside nested exception groups, else ``error`` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@contextlib.asynccontextmanager
async def start_nomad_pool(config: NomadPoolConfig) -> AsyncIterator[NomadSandboxPool]:
    """``async with start_nomad_pool(config) as pool``: a started pool, closed on exit.

    Raises on entry what ``NomadSandboxPool.__aenter__`` raises.
    """
    async with NomadSandboxPool(config) as pool:
        yield pool
