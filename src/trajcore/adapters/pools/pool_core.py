"""``SlotServerPool``: the ``SandboxPool`` port over slot servers that a ``ContainerSource`` runs.

Every real pool is the same machine around a different way of running slot servers. This module
is that machine; the ways are sources: child processes (``local_pool``), containers of a local
engine (``container_pool``), allocations of a Nomad job (``nomad_pool``).

What the core does, once for every source:

- Leasing is the domain slot book's, driven by ``SlotLeasing`` (the port methods over it are
  ``leased_pool.LeasedPool``'s, which the fake pool shares); batches follow ``execute_batch``;
  a released slot is reset through the slot server of its container.
- A source connects to a slot server it started (``connect``: health within ``start_timeout_s``,
  the slot count, a sandbox and tmux when required, fresh slots) and hands it to the core
  (``join``): its slots enter the book under the source's container name.
- A server that fails a batch or a reset is *lost* at once (``lose``): its slots leave the book
  (their leases turn stale) and the source is told (``ContainerSource.lost``) so it can stop the
  server and start a replacement. A server the source sees end on its own is ``gone``: lost the
  same way, or simply removed when it had been drained empty.
- The service's lifetime is one ``contextlib.AsyncExitStack``: the source's resources (private
  directories, a registered job), the source's shutdown, the pool's task group and the clients
  are entered in order on start and left in reverse on ``aclose`` or on a failed start, so a
  start that fails half-way leaves nothing behind.
- Work the source runs in the background (supervisors, a watch) runs in the pool's task group
  under a cancel scope of its own (``spawn``), which ``aclose`` cancels; the group's own scope
  also wraps the pool's user, and is never cancelled while the user runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Generic, Literal, Protocol, Self, TypeVar

import anyio
import anyio.abc
import attrs

from trajcore.adapters.pools.admission import check_fresh
from trajcore.adapters.pools.batches import execute_batch
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.environment_leasing import (
    EnvironmentCounters,
    drop,
    freeze,
    lease_over,
    refresh_figures,
)
from trajcore.adapters.pools.leased_pool import DEFAULT_FORK_WAIT_S, LeasedPool
from trajcore.adapters.pools.leasing import SlotLeasing
from trajcore.domain.environment_leases import EnvironmentUnavailable, Snapshot
from trajcore.domain.errors import (
    InvalidInput,
    PoolClosed,
    SandboxUnavailable,
    SlotServerError,
    StateError,
    UnknownSlot,
)
from trajcore.domain.slot_protocol import ResetResult
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolResult

__all__ = [
    "ContainerSource",
    "Endpoint",
    "JoinRules",
    "Member",
    "SlotServerPool",
    "close_quietly",
    "join_rules",
    "single_error",
]

_log = logging.getLogger(__name__)
_PROBLEMS_KEPT = 20
H = TypeVar("H")  # a source's handle of one running server


@attrs.frozen
class Endpoint:
    """Where a slot server listens: a Unix socket path, or ``host:port`` with a bearer token."""

    transport: Literal["unix", "tcp"]
    address: str
    token: str | None = attrs.field(default=None, repr=False)

    def client(self) -> SlotServerClient:
        """A new client of the server at this endpoint."""
        if self.transport == "unix":
            return SlotServerClient.unix(self.address)
        return SlotServerClient.tcp(self.address, self.token)


@attrs.frozen(kw_only=True)
class JoinRules:
    """What a slot server must show before its slots are leased.

    Attributes:
        slots_per_container: The slot count each server must serve.
        require_sandbox: Refuse a server without a usable sandbox (bubblewrap).
        require_tmux: Refuse a server without tmux (the persistent shell needs it).
        start_timeout_s: Longest a server may take to answer health.
        reset_timeout_s: Longest a release's reset may take before the slot is quarantined.
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: none).
        max_processes: The slots' process limit: with one of 4 or more, a server that keeps
            no processes for the env's hooks (``Health.hook_process_reserve``) is said once.
    """

    slots_per_container: int
    require_sandbox: bool = False
    require_tmux: bool = False
    start_timeout_s: float = 30.0
    reset_timeout_s: float = 30.0
    acquire_timeout_s: float | None = 600.0
    max_processes: int | None = None


def join_rules(config: SlotServerSettings) -> JoinRules:
    """The ``JoinRules`` of a pool's slot server settings (a sandbox is required when their
    isolation says so)."""
    return JoinRules(
        slots_per_container=config.slots_per_container,
        require_sandbox=config.isolation.require_sandbox,
        require_tmux=config.require_tmux,
        start_timeout_s=config.start_timeout_s,
        reset_timeout_s=config.reset_timeout_s,
        acquire_timeout_s=config.acquire_timeout_s,
        max_processes=config.isolation.max_processes,
    )


@attrs.define(eq=False)
class Member(Generic[H]):
    """One slot server in the pool: its container name, client, the source's handle ``H`` of
    it, and its slot count (0: the pool's ``slots_per_container``)."""

    name: str
    client: SlotServerClient
    handle: H
    lost: bool = False
    draining: bool = False
    slots: int = 0


class ContainerSource(Protocol[H]):
    """Runs the slot servers of one pool (each known by its handle ``H``): starts them, watches
    them, stops them.

    The core calls ``open`` once when the pool starts (resources whose cleanup goes on
    ``stack``), then ``start`` (the first servers joined, background work spawned), ``lost``
    whenever it takes a server out of service, and ``shutdown`` (idempotent, bounded, shielded)
    when the pool closes.
    """

    async def open(self, pool: SlotServerPool[H], stack: AsyncExitStack) -> None:
        """Acquire what the servers need; push the matching cleanup on ``stack``."""
        ...

    async def start(self, pool: SlotServerPool[H]) -> None:
        """Bring the first servers up and ``join`` them; raise when the pool cannot serve."""
        ...

    def lost(self, member: Member[H], reason: str) -> None:
        """The core took ``member`` out of service (a failed batch or reset): stop it now."""
        ...

    async def shutdown(self) -> None:
        """Stop every server, bounded; called at least once on close, again after the tasks."""
        ...


def single_error(error: BaseException) -> BaseException:
    """The one error inside nested exception groups, else ``error`` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def close_quietly(client: SlotServerClient | None) -> None:
    """Close ``client`` (if any), shielded, ignoring its errors."""
    if client is None:
        return
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await client.aclose()


class SlotServerPool(LeasedPool, Generic[H]):
    """The SandboxPool port over the slot servers of ``source`` (``H``: its handle of one).
    ``async with pool``.

    Entering opens the source and starts it; it raises what the source raises
    (``SlotServerError``, ``SandboxUnavailable``, ...) after undoing everything. Leaving closes
    the pool (``aclose``) and releases the rest of the service.
    """

    def __init__(
        self,
        source: ContainerSource[H],
        settings: SlotServerSettings,
        *,
        label: str,
        fork_wait_s: float = DEFAULT_FORK_WAIT_S,
    ) -> None:
        rules = join_rules(settings)
        self._source = source
        self.rules = rules  # what a server must show to join
        self._label = label
        self._leasing = SlotLeasing(
            reset=self._reset,
            default_timeout_s=rules.acquire_timeout_s,
            reset_timeout_s=rules.reset_timeout_s,
        )
        self._environments = EnvironmentCounters()
        self.fork_wait_s = fork_wait_s
        self.leasing = self._leasing  # (sources that scale drain containers through it)
        self._members: dict[str, Member[H]] = {}
        self._orphans: list[SlotServerClient] = []  # clients of gone members, closed at the end
        self._stack = AsyncExitStack()
        self._group: anyio.abc.TaskGroup | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._changed = anyio.Event()
        self._problems: deque[str] = deque(maxlen=_PROBLEMS_KEPT)
        self._lost = 0
        self._joined = 0
        self._closed = False
        self._said_no_reserve = False
        self._started = False

    # ------------------------------------------------------------------------- lifetime

    async def __aenter__(self) -> Self:
        if self._started:
            raise StateError(f"a {type(self).__name__} is entered once")
        self._started = True
        stack = self._stack
        try:
            stack.push_async_callback(self._close_clients)
            await self._source.open(self, stack)
            stack.push_async_callback(self._shielded, self._source.shutdown)
            self._group = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._group.cancel_scope.cancel)
            stack.push_async_callback(self.aclose)
            await self._source.start(self)
            if self.environment_refusal() is None:  # its servers' figures, kept fresh
                self.spawn(self._watch_figures)
        except BaseException as error:  # noqa: BLE001 - undo the start, then re-raise
            await stack.aclose()  # (each cleanup shields itself; the group exits unshielded)
            self._group = None
            raise single_error(error) from None
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._stack.aclose()
        self._group = None

    async def aclose(self) -> None:
        """See ``SandboxPool.aclose``: refuses leases, cancels the background work, stops
        every server (bounded, shielded). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._leasing.close()
        for scope in list(self._scopes):
            scope.cancel()
        await self._shielded(self._source.shutdown)

    @staticmethod
    async def _shielded(work: Callable[[], Awaitable[None]]) -> None:
        with anyio.CancelScope(shield=True):
            await work()

    async def _close_clients(self) -> None:
        for client in [*self._orphans, *(m.client for m in self._members.values())]:
            await close_quietly(client)

    # ------------------------------------------------------------------------- port

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """See ``SandboxPool.execute``; the batch rules are ``execute_batch``'s."""
        if self._closed or self._group is None:
            raise PoolClosed(f"the {self._label} sandbox pool is closed")
        found = self._members.get(container)
        live = found if found is not None and not found.lost else None

        def lose(reason: str) -> None:
            if live is not None:
                self.lose(live, reason)

        return await execute_batch(
            self._leasing, container, calls, None if live is None else live.client, lose
        )

    # ------------------------------------------------------------------------- inspection

    def container_names(self) -> list[str]:
        """The live containers, in the order they joined."""
        return [name for name, member in self._members.items() if not member.lost]

    def client(self, container: str) -> SlotServerClient:
        """The client of ``container``'s slot server (artifacts, listings). Raises ``KeyError``."""
        return self._members[container].client

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
        """The latest problems met (failed starts, lost containers, ...), oldest first."""
        return list(self._problems)

    def check_valid(self) -> None:
        """The slot book's invariants (raises ``AssertionError`` naming the first broken)."""
        self._leasing.check_valid()

    # ------------------------------------------------------------------------- for sources

    @property
    def closed(self) -> bool:
        """Whether the pool is closing or closed."""
        return self._closed

    def members(self) -> list[Member[H]]:
        """Every member not yet gone, lost ones included, in the order they joined."""
        return list(self._members.values())

    def member(self, container: str) -> Member[H] | None:
        """The member named ``container``, if it has not gone."""
        return self._members.get(container)

    def spawn(self, work: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run ``work(*args)`` in the pool's task group until it ends or ``aclose`` cancels it;
        nothing when the pool is closed."""
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

    def note(self, problem: str, *, warn: bool = False) -> None:
        """Keep ``problem`` in ``problems`` (``warn``: log it too) and wake whoever waits."""
        if warn:
            _log.warning("%s pool: %s", self._label, problem)
        self._problems.append(problem)
        self.signal()

    def signal(self) -> None:
        """Wake whoever waits for a change (``changed``)."""
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self) -> None:
        """Wait until a member joins, leaves or a problem is noted."""
        await self._changed.wait()

    async def connect(
        self, endpoint: Endpoint, name: str, *, slots: int | None = None
    ) -> SlotServerClient:
        """A client of the server at ``endpoint``, healthy, fresh (``admission``) and fit to
        join as ``name`` with ``slots`` slots (``None``: ``slots_per_container``).

        Raises ``TimeoutError`` (not healthy within ``start_timeout_s``), ``SlotServerError``
        (wrong slot count, a lease used it, a failed request) or ``SandboxUnavailable`` (a
        sandbox or tmux is required and missing); the client is closed then.
        """
        rules = self.rules
        expected = rules.slots_per_container if slots is None else slots
        client = endpoint.client()
        client.reset_timeout_s = rules.reset_timeout_s
        try:
            with anyio.fail_after(rules.start_timeout_s):
                health = await client.wait_healthy(rules.start_timeout_s)
            if health.slots != expected:
                raise SlotServerError(
                    f"slot server {name} serves {health.slots} slots, not {expected}"
                )
            if rules.require_sandbox and not health.sandboxed:
                raise SandboxUnavailable(
                    f"slot server {name}: a sandbox is required and bubblewrap is unusable "
                    f"there: {health.capabilities.detail}"
                )
            if rules.require_tmux and not health.capabilities.tmux:
                raise SandboxUnavailable(
                    f"slot server {name}: a persistent shell is required and tmux is not "
                    "installed there"
                )
            self._say_no_reserve(name, health.hook_process_reserve)
            await check_fresh(client, name)
        except BaseException:
            await close_quietly(client)
            raise
        return client

    def _say_no_reserve(self, name: str, reserve: int) -> None:
        """Warn, once a pool, of a server whose slots keep no processes for the hooks."""
        limit = self.rules.max_processes
        if reserve or limit is None or limit < 4 or self._said_no_reserve:
            return
        self._said_no_reserve = True
        _log.warning(
            "%s pool: slot server %s keeps none of a slot's %d processes for the env's hooks "
            "(a server that predates the reserve, or slots whose process count is not their "
            "own): a score hook's check can fail to start while the model's processes hold "
            "them all (docs/sandbox.md, \"Processes at verification time\")",
            self._label, name, limit,
        )  # fmt: skip

    def join(
        self,
        name: str,
        client: SlotServerClient,
        handle: H,
        *,
        draining: bool = False,
        slots: int | None = None,
    ) -> Member[H] | None:
        """Put the connected server ``name`` in service with ``slots`` slots (``None``:
        ``slots_per_container``); ``None`` when the pool closed meanwhile (the caller then stops
        the server and closes ``client``).

        Raises ``StateError`` when ``name`` is in use.
        """
        if self._closed:
            return None
        if name in self._members:
            raise StateError(f"container name {name!r} is in use")
        count = self.rules.slots_per_container if slots is None else slots
        member = Member(name=name, client=client, handle=handle, draining=draining, slots=count)
        self._members[name] = member
        self._leasing.add_container(name, count)
        if draining:
            self._leasing.drain_container(name)
        self._joined += 1
        self.signal()
        return member

    def lose(self, member: Member[H], reason: str) -> None:
        """Take a failing ``member`` out of service now (its leases turn stale) and tell the
        source, which stops it. Idempotent."""
        if member.lost:
            return
        member.lost = True
        self._lost += 1
        self._environments.servers.leave(member.name)
        with contextlib.suppress(UnknownSlot):
            self._leasing.lose_container(member.name)
        self.note(f"container {member.name} lost: {reason}", warn=True)
        self._source.lost(member, reason)

    def gone(self, member: Member[H], reason: str) -> None:
        """``member``'s server no longer runs: removed when it had drained, else lost (without
        telling the source, which saw it end). Its client closes in the background."""
        if self._members.get(member.name) is not member:
            return
        if not member.lost:
            drained = member.draining and member.name in self._leasing.drained_containers()
            if drained:
                self._leasing.remove_container(member.name)
                _log.info("%s pool: %s removed", self._label, member.name)
            else:
                self._lost += 1
                with contextlib.suppress(UnknownSlot):
                    self._leasing.lose_container(member.name)
                self._problems.append(f"container {member.name} lost: {reason}")
            member.lost = True
        self._environments.servers.leave(member.name)
        del self._members[member.name]
        if self._group is not None and not self._closed:
            self._group.start_soon(close_quietly, member.client)
        else:
            self._orphans.append(member.client)
        self.signal()

    def drain(self, member: Member[H]) -> None:
        """No new leases in ``member``; its slots drain as they are released."""
        if not member.draining:
            member.draining = True
            self._leasing.drain_container(member.name)

    def undrain(self, member: Member[H]) -> None:
        """A drained ``member`` is wanted again: its slots come back free (a member with a
        quarantined slot is lost instead)."""
        slots = member.slots or self.rules.slots_per_container
        if self._leasing.quarantined(member.name, slots):
            self.lose(member, "it had quarantined slots when the pool grew again")
            return
        # Its epochs carry on under the same name, so the server's retired epochs stay retired.
        self._leasing.lose_container(member.name)
        self._leasing.add_container(member.name, slots)
        member.draining = False
        self.signal()

    # ------------------------------------------------------------------------- environments

    def environment_refusal(self) -> tuple[str, str] | None:
        """The pools of slot servers run no task environments unless their kind says how
        (``SupervisedPool``: the local and container pools, with an image cache)."""
        return (
            "environment",
            f"the {self._label} pool does not run task environments yet (the local, "
            "container and Nomad pools do, with image_cache_dir set)",
        )

    async def enter_environment(
        self, lease: Lease, environment: str, snapshot: Snapshot | None
    ) -> bool:
        """Ask ``lease``'s slot server to run the lease over ``environment``, from
        ``snapshot`` where it can (``environment_leasing.lease_over``)."""
        client = self._environment_client(lease, environment)
        return await lease_over(client, lease, environment, snapshot, self._environments)

    async def snapshot(self, lease: Lease, environment: str) -> Snapshot:
        """See ``EnvironmentPool.snapshot`` (``environment_leasing.freeze``)."""
        client = self._environment_client(lease, environment)
        return await freeze(client, lease, environment, self._environments, self._label)

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        """See ``EnvironmentPool.drop_snapshot`` (bounded, shielded)."""
        member = self._members.get(snapshot.container)
        if member is not None and not member.lost:
            await drop(member.client, snapshot, self._label)

    figures_interval_s: float = 10.0
    """How often the servers' health is read for ``environment_statistics``' figures."""

    async def refresh_environment_figures(self) -> None:
        """Read every live server's health now for ``environment_statistics``' figures (each
        request bounded by the client's limit; one that fails is skipped)."""
        await refresh_figures(
            [(m.name, self.cache_of(m), m.client) for m in self._members.values() if not m.lost],
            self._environments.servers,
            lambda name: (m := self._members.get(name)) is not None and not m.lost,
        )

    async def _watch_figures(self) -> None:
        while not self._closed:
            await self.refresh_environment_figures()
            await anyio.sleep(self.figures_interval_s)

    def cache_of(self, member: Member[H]) -> str:
        """The key of the image cache ``member``'s server reads (by default, its own)."""
        return member.name

    def _environment_client(self, lease: Lease, environment: str) -> SlotServerClient:
        member = self._members.get(lease.slot.container)
        if member is None or member.lost:
            raise EnvironmentUnavailable(
                environment, f"slot server {lease.slot.container} left the pool"
            )
        return member.client

    # ------------------------------------------------------------------------- slots

    async def _reset(self, lease: Lease) -> bool:
        member = self._members.get(lease.slot.container)
        if member is None or member.lost or self._closed:
            return False
        try:
            outcome = await member.client.reset(lease.slot.index, lease.epoch)
        except SlotServerError as error:
            self.lose(member, f"reset failed: {error}")
            return False
        except (InvalidInput, StateError) as error:
            outcome = ResetResult(slot=lease.slot.index, ok=False, error=f"refused: {error}")
        if not outcome.ok:  # quarantined (``SlotLeasing``), never silently
            self.note(f"slot {lease.slot} quarantined: {outcome.error}", warn=True)
        return outcome.ok
