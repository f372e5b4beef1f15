"""``SlurmSandboxPool``: slot servers as Slurm batch jobs, leased slot by slot.

Each slot server is one batch job (``trajcore.domain.slurm_jobs``): ``sbatch`` submits it with
the resources a server needs (CPUs, memory, time limit, partition, account, QoS, constraint),
the job runs the server on its node listening on TCP with a bearer token, and the pool speaks
the same protocol to it as every other pool (the pool core, ``pool_core``).

Why the command line and not ``slurmrestd``: every Slurm site has ``sbatch``, ``squeue``,
``scancel`` and ``scontrol`` on its login nodes, authenticated as the user by munge with no
setup, whereas ``slurmrestd`` is an optional daemon that needs JWT or a local socket, and whose
API version changes with each release (22.05 speaks v0.0.38). The commands' text answers are
read with fixed formats (``squeue --format``) and parsed by pure functions.

How a job reports its address (discovery): through a file in the pool's run directory, which
must be on a file system the submitting host and the nodes share (``shared_dir``; every Slurm
cluster has one, the home or scratch file system its job logs go to). The job's script writes
the server's ready line (its port) there, whole, and the pool reads it; the node's address is
``NodeAddr`` of its batch host (``scontrol show node``), how Slurm itself reaches the node.
A file needs no inbound port on the submitting host (login nodes rarely accept connections
from compute nodes); the pool connects out to the node's port, as Slurm does.

How the pool follows its jobs: every ``poll_interval_s`` it lists the jobs of its name
(``squeue``) and hands them to the Nomad pool's reconciler (``domain.nomad_reconcile``), with
each job as an allocation: its server index, its state as a client status (``JOB_STATES``),
``ending`` when its time limit is within ``drain_before_s``. The reconciler's decisions are
carried out by the loop the Nomad and cloud pools share (``reconciled``: join, drain, lose,
remove, the count; replace is ``scancel`` here);
what Nomad's scheduler does for a count, ``plan_jobs`` does here: one live job per index below
the count (a new one for an index whose job ended, failed, was cancelled or nears its time
limit), extra and stray jobs cancelled. A job whose server failed to start is submitted again
after a growing delay (0.5 s doubling to 60 s), and so is one ``sbatch`` refused. When
``sbatch`` refuses the pool's very first job with words that name a setting no job will pass
(an unknown partition, account or QOS, a node configuration no node has), the start fails at
once with a ``ConfigError`` naming the setting (``sbatch_refusal``) instead of waiting out
``start_timeout_s``; any other refusal (a timeout, ``Resource temporarily unavailable``, a
limit on submitted jobs) is noted and retried.

Faults: a job cancelled, preempted, past its time limit, or on a node that fails ends its
server; the calls in flight get no answer and end as ``INFRA_ERROR`` (never scored), its leases
turn stale, and a replacement job is submitted. Jobs carry ``--no-requeue``: a requeued server
would have forgotten its slots.

Start and close: the pool draws a run ID and a token and waits for ``min_containers``
servers. ``aclose`` cancels its run's jobs, waits for them to leave the queue
(``stop_timeout_s``) and removes its run directory. Two pools of one name (a training run and
an eval run) leave each other's jobs alone: every poll first touches ``heartbeat`` in its run
directory (whether or not Slurm then answers), and another run's jobs are cancelled as strays
only when that run's directory beside this one (``<shared_dir>/<job_name>-<run>-*``) holds a
heartbeat older than ``stray_after_s`` while this pool itself has polled well (heartbeat
touched, queue listed) without a break for ``stray_after_s``: a pool that crashed, not one that
could not poll through an outage. A run whose directory is not found here is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import attrs

from trajcore.adapters.pools.reconciled import (
    IndexedPool,
    IndexedSource,
    composed_settings,
    part,
)
from trajcore.adapters.pools.server_processes import run_command
from trajcore.domain.errors import ConfigError, InvalidInput, SandboxUnavailable, SlotServerError
from trajcore.domain.isolation import check_slot_uid_range
from trajcore.domain.nomad_reconcile import Join
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.slurm_jobs import (
    SlurmJob,
    SlurmJobSettings,
    dead_runs,
    job_script,
    parse_node_address,
    parse_ready,
    parse_squeue,
    plan_jobs,
    sbatch_argv,
    sbatch_refusal,
    scancel_argv,
    squeue_argv,
    watch_start,
)
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.domain.validators import (
    flag,
    non_negative_seconds,
    positive_seconds,
)

__all__ = [
    "SlurmPoolConfig",
    "SlurmRefused",
    "SlurmSandboxPool",
    "SlurmUnavailable",
    "start_slurm_pool",
]

_log = logging.getLogger(__name__)

HEARTBEAT = "heartbeat"
"""The file in a run directory its pool touches on every poll."""


class SlurmUnavailable(SandboxUnavailable):
    """A Slurm command failed, timed out or is not installed (the message names it)."""


class SlurmRefused(SlurmUnavailable):
    """A Slurm command ran and refused (exited non-zero); ``detail`` is what it printed."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _optional_dir(value: object) -> Path | None:
    return None if value is None else Path(str(value))


@composed_settings
@attrs.frozen(kw_only=True)
class SlurmPoolConfig:
    """How the Slurm pool runs its slot servers: each server's batch job as the operator sets
    it (``job``), what each slot server is told and must show (``server``), the range their
    count is scaled in (``scaling``) and how the pool drives them.

    Attributes:
        job: Each server's batch job (``SlurmJobSettings``).
        server: The slot servers' settings (``SlotServerSettings``; by default 8 slots, and
            300 s for the pool's start and each running job's join). Slot uids: a block per
            job.
        scaling: The scaling rules' settings (``ScaleSettings``; by default 1 to 10
            servers): the range the server count is scaled in and its damping.
        shared_dir: A directory the submitting host and every node share; the pool makes its
            run directory (token, script, ready files, job logs) inside (``None``: the system's
            temporary directory, right only when the cluster is this one machine).
        drain_before_s: A job this close to its time limit is drained and replaced (by
            default a quarter of the time limit, at most 300 s; ``default_drain_s``).
        poll_interval_s: How often the queue is listed (and the run's heartbeat touched).
        stray_after_s: Another run of the job name whose heartbeat is older than this is dead:
            its jobs are cancelled as strays (a pool that crashed left them), once this pool has
            itself polled well for this long without a break.
        command_timeout_s: Longest one Slurm command may take.
        stop_timeout_s: Longest the close waits for the jobs to leave the queue.
        confirm_batches: Confirm every answered batch with the server's health (see
            ``SlurmSandboxPool.execute``); off saves a round trip per batch and lets a call cut
            short by its job's end be answered.
        confirm_timeout_s: Longest that confirmation may take.
    """

    job: SlurmJobSettings = part(SlurmJobSettings)
    server: SlotServerSettings = part(
        SlotServerSettings, lambda: SlotServerSettings(slots_per_container=8, start_timeout_s=300.0)
    )
    scaling: ScaleSettings = part(ScaleSettings, lambda: ScaleSettings(max_containers=10))
    shared_dir: Path | None = attrs.field(default=None, converter=_optional_dir)
    drain_before_s: float = attrs.field(
        default=attrs.Factory(lambda self: default_drain_s(self.job), takes_self=True),
        validator=non_negative_seconds,
    )
    poll_interval_s: float = attrs.field(default=1.0, validator=positive_seconds)
    stray_after_s: float = attrs.field(default=600.0, validator=positive_seconds)
    command_timeout_s: float = attrs.field(default=30.0, validator=positive_seconds)
    stop_timeout_s: float = attrs.field(default=30.0, validator=positive_seconds)
    confirm_batches: bool = attrs.field(default=True, validator=flag)
    confirm_timeout_s: float = attrs.field(default=5.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        if self.drain_before_s >= self.job.time_limit_min * 60:
            raise ConfigError(
                "drain_before_s",
                f"must be below the time limit ({self.job.time_limit_min} min), "
                f"got {self.drain_before_s} s",
            )
        # two blocks of slot uids per server: a job and the one replacing it may share a node
        check_slot_uid_range(
            "server.isolation.slot_uid_base",
            self.server.isolation.slot_uid_base,
            2 * self.scaling.max_containers * self.server.slots_per_container,
        )


def default_drain_s(job: SlurmJobSettings) -> float:
    """How long before its time limit a job drains unless told: a quarter of the limit, at
    most 300 s (so a short limit, ``time_limit_min`` 5 or less, still leaves it time to serve)."""
    return min(300.0, job.time_limit_min * 60 / 4)


async def run_slurm(argv: Sequence[str], timeout_s: float) -> str:
    """Run one Slurm command; its standard output. Raises ``SlurmUnavailable`` naming the
    command when it is missing, fails or takes longer than ``timeout_s``."""
    if shutil.which(argv[0]) is None:
        raise SlurmUnavailable(f"{argv[0]} is not installed (Slurm's client commands are needed)")
    try:
        with anyio.fail_after(timeout_s):
            done = await run_command(argv)
    except TimeoutError:
        raise SlurmUnavailable(f"{argv[0]} took longer than {timeout_s} s") from None
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()[-500:]
        raise SlurmRefused(f"{argv[0]} failed ({done.returncode}): {detail}", detail)
    return done.stdout.decode("utf-8", "replace")


@attrs.define(eq=False, kw_only=True)
class _SlurmJobs(IndexedSource[SlurmPoolConfig]):
    """The ``ContainerSource`` of the Slurm pool: the batch jobs of one run. The shared loop
    (``ReconciledSource``) decides; this class lists, submits and cancels the jobs."""

    unavailable = SlurmUnavailable
    noun = "job"
    nothing_started = "no job started"
    stopping = "cancel the jobs"

    run_dir: Path | None = attrs.field(init=False, default=None)
    _stopping: set[str] = attrs.field(init=False, factory=set)
    _blocks: dict[str, int] = attrs.field(init=False, factory=dict)
    _nodes: dict[str, str] = attrs.field(init=False, factory=dict)
    _dead: frozenset[str] = attrs.field(init=False, default=frozenset())
    _watched_since: float | None = attrs.field(init=False, default=None)
    _last_poll: float | None = attrs.field(init=False, default=None)
    _beat_failed: bool = attrs.field(init=False, default=False)

    @property
    def scheduler(self) -> str:
        return f"Slurm jobs {self.config.job.job_name}"

    async def _slurm(self, argv: Sequence[str]) -> str:
        return await run_slurm(argv, self.config.command_timeout_s)

    # ------------------------------------------------------------------------- source

    async def _set_up(self, stack: contextlib.AsyncExitStack) -> None:
        config = self.config
        await self._slurm(squeue_argv(config.job.job_name))  # Slurm answers, or the start fails
        shared = config.shared_dir
        if shared is not None and not shared.is_dir():
            raise ConfigError("shared_dir", f"{shared} is not a directory")
        run_dir = Path(tempfile.mkdtemp(prefix=f"{config.job.job_name}-{self.run}-", dir=shared))
        self.run_dir = run_dir
        stack.callback(shutil.rmtree, run_dir, True)
        token_file = run_dir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(self.token, encoding="utf-8")
        script = run_dir / "slot-server.sh"
        script.write_text(job_script(config.job), encoding="utf-8")
        script.chmod(0o700)
        (run_dir / HEARTBEAT).touch()
        self._opened(stack)

    async def _stop_runs(self) -> None:
        """Cancel the run's jobs and wait for them to leave the queue."""
        cancelled: set[str] = set()
        while True:  # (polling: Slurm has no event to wait on)
            ours = [job for job in await self._list() if job.run == self.run]
            live = [job.job_id for job in ours if job.live and job.job_id not in cancelled]
            if live:
                await self._slurm(scancel_argv(live))
                cancelled.update(live)
            if not any(job.live or job.state == "COMPLETING" for job in ours):
                return
            await anyio.sleep(0.2)

    def _beat(self) -> bool:
        """Touch this run's heartbeat; whether it could be. A failure (the run directory gone,
        the shared file system down) is noted with a warning when it starts (once until the
        heartbeat is touched again) and never raised: the pool goes on polling."""
        assert self.run_dir is not None
        try:
            (self.run_dir / HEARTBEAT).touch()
        except OSError as error:
            if not self._beat_failed:
                self.pool.note(
                    f"could not touch the run's heartbeat {self.run_dir / HEARTBEAT}: {error}",
                    warn=True,
                )
            self._beat_failed = True
            return False
        self._beat_failed = False
        return True

    def _watched_s(self, beat: bool, now: float) -> float:
        """How long this pool has polled well without a break (heartbeat touched and queue
        listed, polls at most ``stray_after_s / 2`` apart), counting the poll at ``now``."""
        if not beat:
            self._watched_since = None
            return 0.0
        self._watched_since = watch_start(
            self._watched_since, self._last_poll, now, max_gap_s=self.config.stray_after_s / 2
        )
        self._last_poll = now
        return now - self._watched_since

    def _heartbeat_ages(self, jobs: Sequence[SlurmJob]) -> dict[str, float]:
        """The age of every other listed run's heartbeat found in a run directory beside this
        one."""
        assert self.run_dir is not None
        now = time.time()
        ages: dict[str, float] = {}
        for run in {job.run for job in jobs if job.run not in {None, self.run}}:
            pattern = f"{self.config.job.job_name}-{run}-*/{HEARTBEAT}"
            for beat in self.run_dir.parent.glob(pattern):
                with contextlib.suppress(OSError):
                    age = now - beat.stat().st_mtime
                    ages[str(run)] = min(age, ages.get(str(run), math.inf))
        return ages

    # ------------------------------------------------------------------------- the queue

    async def _list(self) -> list[SlurmJob]:
        return parse_squeue(await self._slurm(squeue_argv(self.config.job.job_name)))

    async def _tick(self) -> None:
        config = self.config
        beat = self._beat()  # first: a poll Slurm does not answer still shows this run alive
        try:
            jobs = await self._list()
        except (SlurmUnavailable, InvalidInput):
            self._watched_since = None  # no queue seen: another run's heartbeat proves nothing
            raise
        ours = [job for job in jobs if job.run == self.run]
        listed = {job.job_id for job in ours if job.live}
        for job_id in [j for j in self._blocks if j not in listed]:
            del self._blocks[job_id]  # ended: its uids are free again
        allocations = [
            self._allocation(
                job.job_id,
                job.index,
                job.client_status,
                desired_status="stop" if job.job_id in self._stopping else "run",
                ending=job.time_left_s is not None and job.time_left_s <= config.drain_before_s,
            )
            for job in ours
        ]
        now = anyio.current_time()
        self._observed(allocations, now)
        dead = dead_runs(
            jobs,
            run=self.run,
            heartbeat_ages=self._heartbeat_ages(jobs),
            stale_after_s=config.stray_after_s,
            watched_s=self._watched_s(beat, now),
        )
        for run in sorted(dead - self._dead):
            self.pool.note(
                f"the jobs of run {run} are cancelled: its pool's heartbeat is older than "
                f"stray_after_s ({config.stray_after_s} s)",
                warn=True,
            )
        self._dead |= dead
        plan = plan_jobs(
            jobs,
            run=self.run,
            count=self.count,
            stopping=frozenset(self._stopping),
            ending_s=config.drain_before_s,
            dead_runs=dead,
        )
        if plan.cancel:
            self._stopping.update(plan.cancel)
            await self._slurm(scancel_argv(plan.cancel))
        for index in plan.submit:
            await self._submit(index, now)

    async def _submit(self, index: int, now: float) -> None:
        if not self._backoff.due(index, now):
            return
        used = set(self._blocks.values())
        block = next(
            (b for b in range(2 * self.config.scaling.max_containers) if b not in used), None
        )
        if block is None:
            return  # every uid block is held by a job still in the queue
        assert self.run_dir is not None
        config, server = self.config, self.config.server
        argv = sbatch_argv(
            config.job,
            server=config.server,
            script=str(self.run_dir / "slot-server.sh"),
            run_dir=str(self.run_dir),
            run=self.run,
            index=index,
            uid_base=server.isolation.slot_uid_base + block * server.slots_per_container,
            token_file=str(self.run_dir / "token"),
        )
        try:
            answer = await self._slurm(argv)
        except SlurmRefused as error:
            refusal = sbatch_refusal(error.detail)
            if refusal is not None and not self.started:
                # a known refusal of the settings and no job of them ever taken: none will be
                self._fatal = self._fatal or refusal
                self.pool.signal()
            self._backoff.started(index, None, now)  # any other: retried after a delay
            raise
        job_id = answer.strip().split(";")[0]
        if not job_id:
            raise SlurmUnavailable("sbatch printed no job ID")
        self._blocks[job_id] = block
        self._backoff.started(index, job_id, now)
        self.started += 1
        _log.info(
            "Slurm pool %s: server %d submitted as job %s", config.job.job_name, index, job_id
        )

    def _replace(self, run_id: str, reason: str) -> None:
        self._stopping.add(run_id)
        self.pool.spawn(self._cancel, run_id)

    async def _cancel(self, job_id: str) -> None:
        self._stopping.add(job_id)
        try:
            await self._slurm(scancel_argv([job_id]))
        except SlurmUnavailable as error:
            self.pool.note(f"could not cancel job {job_id}: {error}")

    # ------------------------------------------------------------------------- joining

    def _container_name(self, join: Join) -> str:
        return f"slurm-{join.index}-{join.alloc_id}"

    async def _address(self, job_id: str) -> str:
        """The ``host:port`` job ``job_id`` reported; waits for its ready line."""
        assert self.run_dir is not None
        ready = self.run_dir / f"{job_id}.ready"
        while True:
            try:
                port = parse_ready(ready.read_text(encoding="utf-8"))
            except FileNotFoundError:
                port = None
            if port is not None:
                break
            await anyio.sleep(0.05)
        host = self.config.job.bind_host
        if host in {"0.0.0.0", "::"}:  # noqa: S104 - what it listens on, not where it is
            host = await self._node_address(job_id)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def _node_address(self, job_id: str) -> str:
        node = next((j.node for j in await self._list() if j.job_id == job_id), None)
        if node is None:
            raise InvalidInput("squeue", f"job {job_id} has no batch host")
        if node not in self._nodes:
            show = await self._slurm(["scontrol", "show", "node", "--oneliner", node])
            self._nodes[node] = parse_node_address(show)
        return self._nodes[node]

    def _log_tail(self, job_id: str) -> str:
        assert self.run_dir is not None
        try:
            text = (self.run_dir / f"{job_id}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text.strip()[-300:]

    def _did_not_join(self, run_id: str, name: str, reason: str) -> str:
        tail = self._log_tail(run_id)
        return f"job {run_id} did not join: {reason}" + (f" ({tail})" if tail else "")


class SlurmSandboxPool(IndexedPool):
    """The SandboxPool port over slot servers run as Slurm jobs. ``async with
    SlurmSandboxPool(config)``.

    Entering checks that Slurm answers (``SlurmUnavailable`` otherwise) and waits for
    ``min_containers`` servers (``SlotServerError`` when they are not healthy within
    ``start_timeout_s``, ``SandboxUnavailable`` when a sandbox is required and missing);
    nothing of its run is left queued then. While it runs, it cancels what a crashed pool of
    the same name left (once that pool's heartbeat is stale and this pool has polled well for
    ``stray_after_s``). Leaving closes it (``aclose``).

    Attributes:
        config: The pool's settings.
    """

    def __init__(self, config: SlurmPoolConfig | None = None) -> None:
        self.config = config = config or SlurmPoolConfig()
        self._jobs = _SlurmJobs(config=config)
        super().__init__(self._jobs, label="Slurm")

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """See ``SandboxPool.execute``. An answered batch is confirmed by the server's health
        before it is returned: Slurm ends a job by signalling every process in it, the slot's
        own commands too, so a call a job's end cut short can be answered before the server
        dies. When health then fails, the server was ending: the answered calls become
        ``INFRA_ERROR`` (never scored) and the container is lost."""
        results = await super().execute(container, calls)
        member = self.member(container)
        ran = [i for i, r in enumerate(results) if r.outcome is not ToolOutcome.REJECTED]
        if member is None or member.lost or not ran or not self.config.confirm_batches:
            return results
        try:
            with anyio.fail_after(self.config.confirm_timeout_s):
                await member.client.health()
        except (TimeoutError, SlotServerError, InvalidInput) as error:
            reason = f"slot server {container} ended with the batch in flight: {error}"
            self.lose(member, reason)
            for i in ran:
                results[i] = ToolResult.failure(calls[i].call, ToolOutcome.INFRA_ERROR, reason)
        return results

    def job_id(self, container: str) -> str:
        """The Slurm job behind ``container``. Raises ``KeyError``."""
        return self.run_id(container)

    @property
    def run_dir(self) -> Path | None:
        """The pool's run directory on the shared file system while it runs."""
        return self._jobs.run_dir


@contextlib.asynccontextmanager
async def start_slurm_pool(config: SlurmPoolConfig) -> AsyncIterator[SlurmSandboxPool]:
    """``async with start_slurm_pool(config) as pool``: a started pool, closed on exit."""
    async with SlurmSandboxPool(config) as pool:
        yield pool
