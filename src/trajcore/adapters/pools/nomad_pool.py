"""``NomadSandboxPool``: slot servers as allocations of a Nomad job, leased slot by slot.

The pool registers one Nomad job (``trajcore.domain.nomad_job``) whose task group runs the slot
server, ``count`` allocations of it, each serving ``slots_per_container`` slots over TCP with a
bearer token the pool draws at start. It then implements the ``SandboxPool`` port over those
servers exactly as the local pool does over its child processes: the same slot book and leasing
(``SlotLeasing``), the same batch rules (``execute_batch``), the same client
(``SlotServerClient``). What it adds is scheduling, and Nomad does the scheduling.

How containers come and go (the decisions are ``domain.nomad_reconcile``'s, carried out by the
loop this pool shares with the Slurm and cloud pools, ``reconciled``):

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
- Scaling: the domain ``ScaleRules`` turns demand (leased plus waiting) into a target between
  ``min_containers`` and ``max_containers``, with ``scale_down_margin`` and ``cooldown_s``
  (the config's ``scaling``). Up:
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

Task environments (docs/environments.md, "On the Nomad pool"): with the job's
``image_cache_dir`` set, its servers run with an image cache and a lease may name an image. The
image reaches an allocation as a pre-pulled image of the node's engine (``containers-storage:``
on a raw_exec node), a folder or archive on the node (a host volume, a shared file system), or
an artifact of the job that Nomad fetches into every allocation (``oci:/local/environments/
<name>``); a reference under ``/local/`` that no allocation can find is refused before a slot
is leased, and a raw_exec server is sent its own task directory's path
(``NomadJobSettings.task_reference``). The servers of one node share its cache where the job
mounts one (``cache_of``), so the cache's figures count it once.

Whose the job is: the job is the pool's while its task carries the pool's token. A poll that
shows a newer job version or nothing that should run reads the job (``GET /v1/job/{id}``);
when it was stopped, purged or registered again with another token (another pool with the same
job ID) outside the pool, that is noted once, its servers leave service, and the pool neither
scales it nor stops its allocations, nor stops it at its close when another pool holds it.
Leasing stops with it: every lease waiting for a slot, and every new one, fails at once with a
``NomadUnavailable`` (an infrastructure error, ``field`` ``job_id``) that names the job and what
happened to it, instead of waiting out ``acquire_timeout_s``; a start still waiting for its
servers fails the same way. Should the job be the pool's again (registered again with its
token), leasing goes on.

Nomad refusing the pool's ACL token (HTTP 401 or 403, ``NomadUnavailable`` with ``field``
``token`` and the ``status``; the token itself is never in the message) fails the start at
once, from whichever request met it first: registering, listing the allocations, or reading
one of them. Once started, a token refused at two polls in a row (revoked, its policy
changed) stops leasing as a job lost does: every waiting and new lease fails at once with a
``NomadUnavailable`` (``field`` ``token``) that says so, said once in ``problems``; held leases
go on (their slot servers are reached directly), and leasing goes on at the first poll Nomad
answers again.

Every wait is bounded: Nomad requests (``request_timeout_s``), joining (``start_timeout_s``),
resets (``reset_timeout_s``), leases (``timeout_s`` or ``acquire_timeout_s``), shutdown
(``stop_timeout_s``). Errors from Nomad while running are kept (``problems``) and retried on the
next poll; but for a refused token (above) they never fail a lease or a call by themselves.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import re
import secrets
from urllib.parse import urlsplit

import anyio
import attrs

from trajcore.adapters.pools.environment_leasing import lease_over
from trajcore.adapters.pools.leased_pool import DEFAULT_FORK_WAIT_S
from trajcore.adapters.pools.nomad_client import (
    AllocationStub,
    NomadClient,
    NomadUnavailable,
    allocation_address,
    parse_allocation_stubs,
    parse_job,
    placement_failure,
)
from trajcore.adapters.pools.pool_core import Member
from trajcore.adapters.pools.reconciled import (
    ReconciledPool,
    ReconciledSource,
    Run,
    composed_settings,
    part,
)
from trajcore.domain.environment_leases import Snapshot
from trajcore.domain.errors import ConfigError, InvalidInput, SandboxUnavailable
from trajcore.domain.nomad_job import (
    NomadJobSettings,
    NomadJobSpec,
    register_request,
    scale_request,
)
from trajcore.domain.nomad_reconcile import Join, ReconcileConfig
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease
from trajcore.domain.validators import (
    flag,
    non_negative_seconds,
    optional_text,
    positive_seconds,
)

__all__ = ["NomadPoolConfig", "NomadSandboxPool"]

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


@composed_settings
@attrs.frozen(kw_only=True)
class NomadPoolConfig:
    """How the Nomad pool runs its slot servers: the Nomad job as the operator sets it (``job``:
    the driver, image, command, datacenters, resources, restarts, ...), what each slot server
    is told and must show (``server``: its slots, isolation, timeouts), the range its count is
    scaled in (``scaling``) and how the pool drives them. The isolation is the env's, never
    the model's.

    Attributes:
        job: The Nomad job's settings (``NomadJobSettings``).
        server: The slot servers' settings (``SlotServerSettings``; by default 8 slots, and
            120 s for the pool's start and each container's join).
        scaling: The scaling rules' settings (``ScaleSettings``; by default 1 to 10
            containers): the range the container count is scaled in and its damping.
        address: The Nomad agent's API, ``http(s)://host:port``.
        purge_on_start: Purge a job of the same ID before registering.
        purge_on_shutdown: Purge the job when the pool closes (otherwise it is stopped).
        token: Nomad ACL token (``None``: ``$NOMAD_TOKEN`` if set).
        poll_interval_s: How often the job's allocations are listed.
        request_timeout_s: Longest one Nomad API request may take.
        stop_timeout_s: Longest stopping the job at shutdown may take.
        fork_wait_s: How long a lease from a snapshot waits for a free slot of the snapshot's
            allocation before it takes one elsewhere (and runs over the plain image).
    """

    job: NomadJobSettings = part(NomadJobSettings)
    server: SlotServerSettings = part(
        SlotServerSettings, lambda: SlotServerSettings(slots_per_container=8, start_timeout_s=120.0)
    )
    scaling: ScaleSettings = part(ScaleSettings, lambda: ScaleSettings(max_containers=10))
    address: str = attrs.field(default="http://127.0.0.1:4646", validator=_nomad_address)
    purge_on_start: bool = attrs.field(default=False, validator=flag)
    purge_on_shutdown: bool = attrs.field(default=True, validator=flag)
    token: str | None = attrs.field(default=None, validator=optional_text, repr=False)
    poll_interval_s: float = attrs.field(default=1.0, validator=positive_seconds)
    request_timeout_s: float = attrs.field(default=10.0, validator=positive_seconds)
    stop_timeout_s: float = attrs.field(default=30.0, validator=positive_seconds)
    fork_wait_s: float = attrs.field(default=DEFAULT_FORK_WAIT_S, validator=non_negative_seconds)

    def job_spec(self, *, count: int, token: str) -> NomadJobSpec:
        """The job for ``count`` slot servers with bearer ``token``."""
        return NomadJobSpec(job=self.job, server=self.server, count=count, token=token)


# ============================================================================ allocations


class _Whose(enum.Enum):
    """Whose the job of the pool's ID is now, as Nomad answers it."""

    OURS = "is this pool's"
    STOPPED = "was stopped outside this pool (nomad job stop)"
    PURGED = "was purged outside this pool"
    FOREIGN = (
        "was registered again with another slot token: another pool (or a person) with the "
        "same job_id took it over"
    )


_TOKEN_REFUSED_POLLS = 2
"""Polls in a row that meet a refused ACL token before leasing stops (one may be a blip)."""


@attrs.define(eq=False, kw_only=True)
class _NomadAllocations(ReconciledSource[NomadPoolConfig]):
    """The ``ContainerSource`` of the Nomad pool: the allocations of one job.

    Every decision (join, drain, undrain, lose, remove, replace, the job's count) is the
    domain ``NomadReconciler``'s, carried out by the shared loop (``ReconciledSource``); this
    class lists allocations, reads their addresses, stops them and sets the job's count.
    """

    unavailable = NomadUnavailable
    noun = "allocation"
    nothing_started = "Nomad placed no running allocation"

    nomad: NomadClient
    _names: dict[str, str] = attrs.field(init=False, factory=dict)
    _failed: set[str] = attrs.field(init=False, factory=set)
    _version: int = attrs.field(init=False, default=0)
    _owned_version: int = attrs.field(init=False, default=0)
    _whose: _Whose = attrs.field(init=False, default=_Whose.OURS)
    _registered: bool = attrs.field(init=False, default=False)
    _refused_polls: int = attrs.field(init=False, default=0)  # in a row, for the ACL token

    def reconcile_config(self) -> ReconcileConfig:
        return attrs.evolve(
            super().reconcile_config(), restart_attempts=self.config.job.restart_attempts
        )

    @property
    def scheduler(self) -> str:
        return f"Nomad job {self.config.job.job_id}"

    # ------------------------------------------------------------------------- source

    async def _set_up(self, stack: contextlib.AsyncExitStack) -> None:
        config = self.config
        await self.nomad.leader()
        if config.purge_on_start and await self.nomad.deregister(config.job.job_id, purge=True):
            _log.info("purged Nomad job %s before starting", config.job.job_id)
        stack.push_async_callback(self.shutdown)
        await self._register(config.scaling.min_containers)

    async def shutdown(self) -> None:
        """Stop the job (purged when configured), bounded and shielded; a job that another
        pool registered again meanwhile is left to it."""
        if not self._registered:
            return
        self._registered = False
        await self._stop_all(self._stop_job, "stop the job")

    async def _stop_job(self) -> None:
        config = self.config
        if await self._whose_job() is _Whose.FOREIGN:
            self.pool.note(
                f"left Nomad job {config.job.job_id} running: it {_Whose.FOREIGN.value}",
                warn=True,
            )
            return
        await self.nomad.deregister(config.job.job_id, purge=config.purge_on_shutdown)

    # ------------------------------------------------------------------------- Nomad

    async def _register(self, count: int) -> None:
        config = self.config
        spec = config.job_spec(count=count, token=self.token)
        await self.nomad.register(config.job.job_id, register_request(spec))
        self._registered = True
        if await self._whose_job() is not _Whose.OURS:
            raise NomadUnavailable(
                f"Nomad lost the job just registered: it {self._whose.value}", field="job_id"
            )
        self._version = self._owned_version
        self.machine.registered(count)

    async def _whose_job(self) -> _Whose:
        """Whose the job is now (kept in ``_whose``); the latest version known to be the pool's
        in ``_owned_version``."""
        job = self.config.job
        body = await self.nomad.read_job(job.job_id)
        if body is None:
            self._whose = _Whose.PURGED
            return self._whose
        state = parse_job(body, group=job.group, task=job.task, token_env=job.token_env)
        token = (state.token or "").encode("utf-8", "surrogatepass")
        if state.stopped:
            self._whose = _Whose.STOPPED
        elif not secrets.compare_digest(token, self.token.encode()):
            self._whose = _Whose.FOREIGN
        else:
            self._whose = _Whose.OURS
            self._owned_version = max(self._owned_version, state.version)
        return self._whose

    async def _own_allocations(self, stubs: list[AllocationStub]) -> list[AllocationStub]:
        """The allocations of this pool's versions of the job. When the listing shows a newer
        version or nothing that should run, the job is read: one stopped, purged or taken over
        outside the pool is said once (and once more when it is the pool's again), and the
        allocations of versions that are not the pool's are left alone."""
        was = self._whose
        if (
            was is not _Whose.OURS
            or not any(
                stub.desired_status == "run" and stub.job_version <= self._owned_version
                for stub in stubs
            )
            or any(stub.job_version > self._owned_version for stub in stubs)
        ):
            now = await self._whose_job()
            if now is not was:
                self._job_changed_hands(now)
        return [stub for stub in stubs if stub.job_version <= self._owned_version]

    def _job_changed_hands(self, now: _Whose) -> None:
        """Say that the job is now ``now``'s; leasing stops while it is not the pool's (every
        waiting and new lease fails at once with an error naming the job and what happened,
        as does a start still waiting for its servers) and goes on when it is again."""
        job_id = self.config.job.job_id
        if now is _Whose.OURS:
            self.pool.note(f"Nomad job {job_id} {now.value}", warn=True)
            self.pool.leasing.resume()
            return
        self.pool.note(
            f"Nomad job {job_id} {now.value}: its slot servers leave service and the pool no "
            "longer scales or replaces them (start the env again)",
            warn=True,
        )

        def refusal() -> NomadUnavailable:
            return NomadUnavailable(
                f"Nomad job {job_id} {now.value}: no slot of it can be leased (start the env "
                "again)",
                field="job_id",
            )

        self.pool.leasing.suspend(refusal)
        self.fail_start(refusal())

    async def _tick(self) -> None:
        try:
            await self._poll()
        except NomadUnavailable as error:
            if error.field == "token":
                self._token_refused(error)
            raise
        if self._refused_polls:
            self._token_accepted()

    def _token_refused(self, error: NomadUnavailable) -> None:
        """Another poll met a refused ACL token: from ``_TOKEN_REFUSED_POLLS`` in a row on,
        leasing stops with ``error`` (unless it already stopped for the job's sake)."""
        self._refused_polls += 1
        if self._refused_polls < _TOKEN_REFUSED_POLLS or self._whose is not _Whose.OURS:
            return
        job_id = self.config.job.job_id
        reason = (
            f"Nomad job {job_id}: Nomad refused the pool's ACL token at {self._refused_polls} "
            f"polls in a row: no slot can be leased until it accepts it again ({error.reason})"
        )
        if self._refused_polls == _TOKEN_REFUSED_POLLS:
            self.pool.note(f"{reason}; leases held go on", warn=True)

        def refusal() -> NomadUnavailable:
            return NomadUnavailable(reason, field="token", status=error.status)

        self.pool.leasing.suspend(refusal)

    def _token_accepted(self) -> None:
        """A poll went through after refused ones: leasing goes on (if the job is ours)."""
        if self._refused_polls >= _TOKEN_REFUSED_POLLS and self._whose is _Whose.OURS:
            job_id = self.config.job.job_id
            self.pool.note(f"Nomad job {job_id}: Nomad accepts the pool's ACL token again")
            self.pool.leasing.resume()
        self._refused_polls = 0

    async def _poll(self) -> None:
        listing = await self.nomad.job_allocations(self.config.job.job_id)
        stubs = [s for s in parse_allocation_stubs(listing) if s.job_version >= self._version]
        allocations = []
        for stub in await self._own_allocations(stubs):
            self._names[stub.id] = stub.name
            if stub.failure and stub.id not in self._failed:  # why it never ran, said once
                self._failed.add(stub.id)
                self.pool.note(f"allocation {stub.name} ({stub.id}): {stub.failure}")
            allocations.append(
                self._allocation(
                    stub.id,
                    stub.index,
                    stub.client_status,
                    desired_status=stub.desired_status,
                    restarts=stub.restarts,
                )
            )
        counts = self._observe(allocations, anyio.current_time())
        for count in counts if self._whose is _Whose.OURS else ():
            await self._set_count(count)

    async def _set_count(self, count: int) -> None:
        config = self.config
        await self.nomad.scale(
            config.job.job_id,
            scale_request(
                config.job.group,
                count,
                f"trajcore: {count} slot servers for the demand",
            ),
        )
        self.machine.scaled(count)

    def _hopeless(self, error: SandboxUnavailable) -> bool:
        """Nomad refused the pool's ACL token: no retry mends that."""
        return isinstance(error, NomadUnavailable) and error.field == "token"

    async def _why_not_started(self) -> str | None:
        """Why Nomad's latest evaluation of the job could not place its allocations (no node
        in the datacenters, a missing driver, exhausted resources), if it says."""
        job = self.config.job
        try:
            listing = await self.nomad.job_evaluations(job.job_id)
            return placement_failure(listing, job.group) or None
        except (NomadUnavailable, InvalidInput) as error:
            _log.info("Nomad pool %s: no placement failure read: %s", job.job_id, error)
            return None

    def _replace(self, run_id: str, reason: str) -> None:
        _log.warning("Nomad pool %s: %s", self.config.job.job_id, reason)
        self.pool.spawn(self._stop_allocation, run_id)

    async def _stop_allocation(self, alloc_id: str) -> None:
        try:
            await self.nomad.stop_allocation(alloc_id)
        except NomadUnavailable as error:
            self.pool.note(f"could not stop allocation {alloc_id}: {error}")

    # ------------------------------------------------------------------------- joining

    def _container_name(self, join: Join) -> str:
        alloc_id = join.alloc_id
        name = f"nomad-{join.index}-{alloc_id[:8]}"
        if join.restarts:  # a restarted server has forgotten its slots: a name of its own
            name = f"{name}~{join.restarts}"
        if self.pool.member(name) is not None:  # two allocation IDs that share 8 digits
            name = name.replace(alloc_id[:8], alloc_id, 1)
        return name

    async def _address(self, run_id: str) -> str:
        return allocation_address(await self.nomad.read_allocation(run_id))

    def _did_not_join(self, run_id: str, name: str, reason: str) -> str:
        return f"allocation {self._names.get(run_id, name)} ({run_id}) did not join: {reason}"


# ============================================================================ the pool


class NomadSandboxPool(ReconciledPool):
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
            namespace=config.job.namespace,
            region=config.job.region,
            timeout_s=config.request_timeout_s,
        )
        self._allocations = _NomadAllocations(config=config, nomad=nomad)
        super().__init__(self._allocations, label="Nomad", fork_wait_s=config.fork_wait_s)

    # ------------------------------------------------------------------------- environments

    def environment_refusal(self) -> tuple[str, str] | None:
        """``None`` when the job's servers run with an image cache; else the setting to set."""
        if self.config.job.image_cache_dir is not None:
            return None
        return (
            "image_cache_dir",
            "the Nomad pool's slot servers have no image cache: set "
            "NomadJobSettings.image_cache_dir (the env's --env.image_cache_dir; under trajcore "
            "run, --set image_cache_dir=DIR) to run leases over task environments",
        )

    def reference_refusal(self, environment: str) -> tuple[str, str] | None:
        """A reference under ``/local/`` the job's allocations cannot find
        (``NomadJobSettings.reference_refusal``)."""
        return self.config.job.reference_refusal(environment)

    async def enter_environment(
        self, lease: Lease, environment: str, snapshot: Snapshot | None
    ) -> bool:
        """As every pool of slot servers, with the reference as the lease's allocation reads
        it (``NomadJobSettings.task_reference``: a raw_exec task's own directory)."""
        client = self._environment_client(lease, environment)
        sent = self.config.job.task_reference(environment, self.allocation_id(lease.slot.container))
        return await lease_over(client, lease, environment, snapshot, self._environments, sent=sent)

    def cache_of(self, member: Member[Run]) -> str:
        """The node's cache (by its address) where the node's allocations share one: a
        raw_exec path or a host volume; else the allocation's own."""
        job = self.config.job
        if job.driver == "raw_exec" or job.image_cache_volume is not None:
            return urlsplit(member.client.base_url).hostname or member.name
        return member.name

    def allocation_id(self, container: str) -> str:
        """The Nomad allocation behind ``container``. Raises ``KeyError``."""
        return self.run_id(container)

    @property
    def job_count(self) -> int:
        """The task group count last set in Nomad."""
        return self._allocations.machine.job_count or 0
