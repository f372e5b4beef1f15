"""The Slurm pool against a real one-node Slurm cluster (munged, slurmctld, slurmd) on loopback.

The cluster is this module's own (``tests.slurm_testbed``): its config, munge key, ports and
directories live in a temporary directory, and everything is stopped by pid at the end. The
pool runs the real slot server as batch jobs, with real bubblewrap. Faults are Slurm's own:
``scancel`` of a running job, its node set DOWN, a job past its time limit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.slurm_testbed import KILL_WAIT_S, NODE, SLURM_PROBLEM, SlurmCluster
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig, SlurmSandboxPool
from trajcore.domain.errors import AcquireTimeout, ConfigError
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)
from trajcore.testing.sandbox_pool_machine import MachineShape, run_pool_machine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(SLURM_PROBLEM is not None, reason=str(SLURM_PROBLEM)),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

_CLUSTER: list[SlurmCluster] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[SlurmCluster]:
    with SlurmCluster() as started:
        _CLUSTER.append(started)
        yield started
        _CLUSTER.remove(started)


def _cluster() -> SlurmCluster:
    return _CLUSTER[-1]


@asynccontextmanager
async def slurm_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    config = _cluster().pool_config(
        containers=shape.containers,
        slots_per_container=shape.slots_per_container,
        acquire_timeout_s=shape.acquire_timeout_s,
    )
    async with SlurmSandboxPool(config) as pool:
        yield pool


def _server_pid(pool: SlurmSandboxPool, job_id: str) -> int:
    assert pool.run_dir is not None
    ready = json.loads((pool.run_dir / f"{job_id}.ready").read_text().splitlines()[0])
    pid = ready["pid"]
    assert isinstance(pid, int)
    return pid


def _wait_gone(pid: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"slot server {pid} outlived its job"
        time.sleep(0.02)


def scancel_job(pool: SandboxPool, container: str) -> None:
    """``scancel`` the job behind ``container`` and wait until its slot server has ended."""
    assert isinstance(pool, SlurmSandboxPool)
    job_id = pool.job_id(container)
    pid = _server_pid(pool, job_id)
    _cluster().run("scancel", job_id)
    _wait_gone(pid)


class TestSlurmSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02  # two generated sequences under ci; the lockstep test adds more

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return slurm_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return scancel_job


SHAPE = MachineShape(containers=2, slots_per_container=2)


def test_the_fake_and_the_slurm_pool_agree() -> None:
    """The lockstep machine: the fake and Slurm jobs; a crash is ``scancel`` of the job."""

    def crash_either(pool: SandboxPool, container: str) -> None:
        if isinstance(pool, FakeSandboxPool):
            pool.crash_container(container)
        else:
            scancel_job(pool, container)

    shape = PoolShape(containers=2, slots_per_container=2, acquire_timeout_s=30.0)
    run_pool_machine(
        [
            lambda: FakeSandboxPool(containers=2, slots_per_container=2, acquire_timeout_s=30.0),
            lambda: slurm_pool(shape),
        ],
        shape=SHAPE,
        crash=crash_either,
        scale=0.02,
    )


# ============================================================================ faults


def _call(lease: Lease, command: str, timeout_s: float = 60.0) -> SlotCall:
    call = ToolCall(id=f"c{time.monotonic_ns()}", name="bash", arguments={"command": command})
    return SlotCall(lease=lease, call=call, timeout_s=timeout_s)


async def _one(pool: SandboxPool, lease: Lease, command: str) -> ToolResult:
    [result] = await pool.execute(lease.slot.container, [_call(lease, command)])
    return result


async def _in_flight_then(pool: SlurmSandboxPool, lease: Lease, fault: object) -> ToolResult:
    """Start a long call in ``lease``'s slot, apply ``fault`` once it runs, return its result."""
    assert callable(fault)
    results: list[ToolResult] = []

    async def long_call() -> None:
        results.append(await _one(pool, lease, "touch started; sleep 30; echo done"))

    async with anyio.create_task_group() as group:
        group.start_soon(long_call)
        probe = await _one(pool, lease, "true")  # (the server takes calls in turn per slot)
        del probe
        await anyio.sleep(0.5)
        await anyio.to_thread.run_sync(fault)
    return results[0]


async def _wait_until(
    check: object, timeout_s: float, what: str, pool: SandboxPool | None = None
) -> None:
    """Until ``check()`` holds; fails naming ``what`` (and ``pool``'s latest problems) after
    ``timeout_s``."""
    assert callable(check)
    with anyio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110 - the pool's state, polled: no event to wait on
            await anyio.sleep(0.1)
        return
    raise AssertionError(f"{what}: not within {timeout_s} s{_problems(pool)}")


async def _end_state(cluster: SlurmCluster, job_id: str, config: SlurmPoolConfig) -> str:
    """The state job ``job_id`` ended in, once Slurm has finished ending it: a job whose
    processes were signalled stays COMPLETING until slurmd has killed them (KillWait) and said
    so."""
    await _wait_until(
        lambda: cluster.job_state(job_id) != "COMPLETING",
        KILL_WAIT_S + _tick_s(config),
        f"job {job_id} to complete",
    )
    return cluster.job_state(job_id)


def _problems(pool: SandboxPool | None) -> str:
    if not isinstance(pool, SlurmSandboxPool):
        return ""
    return f" (the pool's latest problems: {pool.problems[-3:]})"


@pytest.mark.anyio
async def test_scancel_of_a_running_job_fails_its_call_in_flight_and_a_new_job_serves(
    cluster: SlurmCluster,
) -> None:
    config = cluster.pool_config(containers=1, slots_per_container=1)
    async with SlurmSandboxPool(config) as pool:
        [first] = pool.container_names()
        job_id = pool.job_id(first)
        async with pool.lease("t") as lease:
            pid = _server_pid(pool, job_id)
            result = await _in_flight_then(pool, lease, lambda: cluster.run("scancel", job_id))
            _wait_gone(pid)
        assert result.outcome is ToolOutcome.INFRA_ERROR, result
        await _wait_until(lambda: pool.container_names() not in ([], [first]), 60, "a new job")
        async with pool.lease("after") as after:
            assert (await _one(pool, after, "echo ok")).content == "ok\n"
        assert pool.job_id(after.slot.container) != job_id
        assert await _end_state(cluster, job_id, config) == "CANCELLED"


@pytest.mark.anyio
async def test_a_suspended_job_is_cancelled_and_its_slots_never_leased_again(
    cluster: SlurmCluster,
) -> None:
    """Gang or suspend preemption: the pool loses the suspended job, cancels it and serves from
    a replacement; resumed, the job must not bring the old lease's workspace back."""
    config = cluster.pool_config(containers=1, slots_per_container=1)
    async with SlurmSandboxPool(config) as pool:
        [first] = pool.container_names()
        job_id = pool.job_id(first)
        async with pool.lease("victim") as lease:
            assert (await _one(pool, lease, "echo secret > note; echo ok")).content == "ok\n"
            cluster.run("scontrol", "suspend", job_id)
            await _wait_until(lambda: first not in pool.container_names(), 30, "the loss", pool)
        cluster.run("scontrol", "resume", job_id, check=False)  # (cancelled already: refused)
        await _wait_until(
            lambda: pool.container_names() not in ([], [first]), 60, "a new job", pool
        )
        assert await _end_state(cluster, job_id, config) == "CANCELLED"
        async with pool.lease("next") as after:
            assert pool.job_id(after.slot.container) != job_id
            assert "secret" not in ((await _one(pool, after, "cat note 2>&1")).content or "")
    # A job cancelled while suspended is killed before its script can remove its directory on
    # the node (docs/deploy.md says so): what it left on this machine is removed here.
    shutil.rmtree(Path(tempfile.gettempdir()) / f"trajcore-slots-{job_id}", ignore_errors=True)


@pytest.mark.anyio
async def test_a_node_set_down_fails_the_calls_in_flight_and_the_pool_recovers(
    cluster: SlurmCluster,
) -> None:
    config = cluster.pool_config(containers=1, slots_per_container=1)
    async with SlurmSandboxPool(config) as pool:
        [first] = pool.container_names()
        job_id = pool.job_id(first)

        def node_down() -> None:
            cluster.run("scontrol", "update", f"nodename={NODE}", "state=down", "reason=test")

        async with pool.lease("t") as lease:
            result = await _in_flight_then(pool, lease, node_down)
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            after = await _one(pool, lease, "true")  # its lease ended with its job's server
            assert after.outcome is ToolOutcome.INFRA_ERROR, after
        assert cluster.job_state(job_id) == "NODE_FAIL"
        # the node comes back (ReturnToService=2) and a replacement job serves
        await _wait_until(lambda: pool.container_names() not in ([], [first]), 90, "a new job")
        async with pool.lease("after") as fresh:
            assert (await _one(pool, fresh, "echo ok")).content == "ok\n"


# The ending tests run one job of a limit in whole minutes (Slurm's unit) and derive every wait
# from the configured limits, never from how fast this machine is:
# - the pool's start_timeout_s ends before the drain could begin (limit - drain_before_s, counted
#   from the job's start in Slurm, which comes after the pool's start began), so the job has
#   joined, or the start has failed saying so, before it drains, however slow the start;
# - the pool sees the drain at its first tick after it is due: within poll_interval_s plus one
#   squeue (command_timeout_s);
# - slurmctld compares running jobs with their limits every 30 s (PERIODIC_TIMEOUT in its
#   source), then signals them and kills what is left after KillWait (the testbed's
#   KILL_WAIT_S).
TIME_LEFT_SLACK_S = 5.0  # squeue's time left is whole seconds; margin before the drain is due
SLURM_LIMIT_CHECK_S = 30.0


def _ending_pool_config(
    cluster: SlurmCluster, *, limit_min: int, drain_before_s: float, slots_per_container: int
) -> SlurmPoolConfig:
    """One job of a ``limit_min`` limit, drained ``drain_before_s`` before it, whose start (and
    any replacement's join) must end before that drain is due."""
    return cluster.pool_config(
        containers=1,
        slots_per_container=slots_per_container,
        time_limit_min=limit_min,
        drain_before_s=drain_before_s,
        start_timeout_s=limit_min * 60 - drain_before_s - TIME_LEFT_SLACK_S,
    )


def _tick_s(config: SlurmPoolConfig) -> float:
    """Longest the pool takes to act on what Slurm says: one poll interval and one command."""
    return config.poll_interval_s + config.command_timeout_s


def _drain_due_s(config: SlurmPoolConfig) -> float:
    """Longest from the pool's start to its drain of the ending job (see above)."""
    return config.job.time_limit_min * 60 - config.drain_before_s + 1 + _tick_s(config)


def _limit_due_s(config: SlurmPoolConfig) -> float:
    """Longest from the drain to the pool's loss of the job Slurm ended at its limit."""
    return config.drain_before_s + 1 + SLURM_LIMIT_CHECK_S + KILL_WAIT_S + _tick_s(config)


@pytest.mark.anyio
async def test_a_job_past_its_time_limit_is_drained_replaced_then_ended(
    cluster: SlurmCluster,
) -> None:
    """A job within ``drain_before_s`` of its limit takes no new lease, though a slot of it is
    free, and a replacement job serves the new lease; the lease still held there works after
    the drain and ends with the job at its limit (never an OK after it)."""
    # 2 minutes: a start and a replacement's join may each take 65 s, the drain leaves 50 s
    config = _ending_pool_config(cluster, limit_min=2, drain_before_s=50.0, slots_per_container=2)
    async with SlurmSandboxPool(config) as pool:
        [first] = pool.container_names()
        job_id = pool.job_id(first)
        async with pool.lease("held") as held:
            assert held.slot.container == first
            assert pool.statistics().draining == 0  # (the start ends before the drain is due)
            await _wait_until(
                lambda: pool.statistics().draining == 1, _drain_due_s(config), "the drain", pool
            )
            # drained: its free slot takes no lease; the held one works until the limit
            assert (await _one(pool, held, "echo still")).content == "still\n"
            replacement_s = config.server.start_timeout_s + _tick_s(config)
            try:
                async with pool.lease("new", timeout_s=replacement_s) as new:
                    assert new.slot.container != first
                    assert (await _one(pool, new, "echo ok")).content == "ok\n"
            except AcquireTimeout as error:
                raise AssertionError(f"{error}{_problems(pool)}") from None
            await _wait_until(
                lambda: first not in pool.container_names(),
                _limit_due_s(config),
                "the limit",
                pool,
            )
            late = await _one(pool, held, "echo late")
            assert late.outcome in (ToolOutcome.REJECTED, ToolOutcome.INFRA_ERROR)
        assert await _end_state(cluster, job_id, config) == "TIMEOUT"


@pytest.mark.anyio
async def test_a_drained_ending_job_with_nothing_held_is_cancelled_early(
    cluster: SlurmCluster,
) -> None:
    # 1 minute: a start and a replacement's join may each take 35 s
    config = _ending_pool_config(cluster, limit_min=1, drain_before_s=20.0, slots_per_container=1)
    async with SlurmSandboxPool(config) as pool:
        [first] = pool.container_names()
        job_id = pool.job_id(first)
        await _wait_until(
            lambda: first not in pool.container_names(), _drain_due_s(config), "the drain", pool
        )
        replacement_s = config.server.start_timeout_s + _tick_s(config)
        await _wait_until(
            lambda: len(pool.container_names()) == 1, replacement_s, "a replacement", pool
        )
        # ended by the pool, before its limit
        assert await _end_state(cluster, job_id, config) == "CANCELLED"


# ============================================================================ scaling, start, close


@pytest.mark.anyio
async def test_the_pool_scales_jobs_up_with_demand_and_back_down(cluster: SlurmCluster) -> None:
    config = cluster.pool_config(
        containers=1, slots_per_container=1, max_containers=3, bind_host="0.0.0.0"
    )
    async with SlurmSandboxPool(config) as pool:
        assert pool.container_names() != []
        assert pool.server_count == 1
        async with (
            pool.lease("a", timeout_s=60) as a,
            pool.lease("b", timeout_s=60) as b,
            pool.lease("c", timeout_s=60) as c,
        ):
            assert len({a.slot.container, b.slot.container, c.slot.container}) == 3
            assert pool.server_count == 3
            assert pool.servers_started >= 3
            for lease in (a, b, c):
                assert (await _one(pool, lease, "echo up")).content == "up\n"
        await _wait_until(lambda: len(pool.container_names()) == 1, 60, "the scale-down")
        assert pool.server_count == 1
        live = cluster.run("squeue", "--noheader", "--states=PENDING,RUNNING", "--format=%i")
        assert len(live.split()) == 1


@pytest.mark.anyio
async def test_jobs_of_the_name_left_by_a_crashed_pool_are_cancelled_and_a_live_pools_kept(
    cluster: SlurmCluster,
) -> None:
    """Another run's jobs are strays only when that run's heartbeat beside ours is stale: a
    crashed pool's are cancelled once this pool has polled for stray_after_s, a live pool's of
    the same name are left alone."""
    shared = cluster.dir / "shared"
    shared.mkdir(exist_ok=True)
    for run, age_s in (("dead0", 3600.0), ("alive0", 0.0)):
        run_dir = shared / f"trajcore-test-{run}-x"
        run_dir.mkdir()
        (run_dir / "heartbeat").touch()
        os.utime(run_dir / "heartbeat", (time.time() - age_s,) * 2)

    def submit(*words: str) -> str:
        return cluster.run(
            "sbatch", "--parsable", "--mem=64", "--output=/dev/null", *words, "--wrap=sleep 300"
        ).strip()  # fmt: skip

    stray = submit("--job-name=trajcore-test", "--comment=trajcore:dead0:0")
    alive = submit("--job-name=trajcore-test", "--comment=trajcore:alive0:0")
    other = submit("--job-name=someone-else")
    alive_beat = shared / "trajcore-test-alive0-x" / "heartbeat"

    async def alive_pool() -> None:  # the live pool of run alive0 touches its heartbeat
        while True:
            alive_beat.touch()
            await anyio.sleep(0.2)

    try:
        async with anyio.create_task_group() as beating:
            beating.start_soon(alive_pool)
            async with SlurmSandboxPool(cluster.pool_config(stray_after_s=2.0)) as pool:
                await _wait_until(
                    lambda: cluster.job_state(stray) in ("CANCELLED", "COMPLETING"),
                    30,
                    "the stray",
                    pool,
                )
                assert pool.job_id(pool.container_names()[0]) not in (stray, alive)
                assert any("run dead0 are cancelled" in p for p in pool.problems), pool.problems
            beating.cancel_scope.cancel()
        for kept in (alive, other):  # the close cancelled only its own run's jobs
            assert cluster.job_state(kept) in ("PENDING", "RUNNING")
    finally:
        cluster.run("scancel", alive, other)
        for run in ("dead0", "alive0"):
            shutil.rmtree(shared / f"trajcore-test-{run}-x")


@pytest.mark.anyio
async def test_a_partition_sbatch_refuses_fails_the_start_at_once_naming_it(
    cluster: SlurmCluster,
) -> None:
    config = cluster.pool_config(partition="no-such-partition")
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        async with SlurmSandboxPool(config):
            pass
    assert time.monotonic() - started < config.server.start_timeout_s / 2
    assert caught.value.field == "slurm_partition"
    assert "no-such-partition" in caught.value.reason


@pytest.mark.anyio
async def test_close_cancels_every_job_and_removes_the_run_directory(
    cluster: SlurmCluster,
) -> None:
    async with SlurmSandboxPool(cluster.pool_config(containers=2)) as pool:
        run_dir = pool.run_dir
        assert run_dir is not None
        assert oct(os.stat(run_dir / "token").st_mode & 0o777) == "0o600"
        pids = [_server_pid(pool, pool.job_id(name)) for name in pool.container_names()]
    for pid in pids:
        _wait_gone(pid, 5)
    assert not run_dir.exists()
    live = cluster.run("squeue", "--noheader", "--name=trajcore-test",
                       "--states=PENDING,RUNNING,COMPLETING")  # fmt: skip
    assert live.strip() == ""
