"""The local pool with real slot servers and bubblewrap: crashes, mass cancellation, clean close.

Every test checks the processes it leaves: the slot servers run in their own process groups, and
after ``aclose`` no process of those groups, no descendant of this test process and no process
naming the pool's private directory may remain.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import shutil
import signal
from pathlib import Path

import anyio
import attrs
import pytest

from trajcore.adapters.pools.admission import slots_in_use
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.pools.pool_core import Endpoint
from trajcore.adapters.pools.supervision import RestartSettings
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import SlotServerError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.rollout.dispatcher import ToolDispatcher

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")

_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(containers: int = 2, slots: int = 4) -> LocalPoolConfig:
    return LocalPoolConfig(
        containers=containers,
        server=SlotServerSettings(
            slots_per_container=slots, acquire_timeout_s=60.0,
            isolation=SlotIsolation(
                require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
            ),
        ),
    )  # fmt: skip


def bash(lease: Lease, command: str, timeout_s: float = 20.0) -> SlotCall:
    call = ToolCall(id=f"i{next(_ids)}", name="bash", arguments={"command": command})
    return SlotCall(lease=lease, call=call, timeout_s=timeout_s)


def _process_table() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (ppid, pgid, cmdline) of every process still running (zombies left out)."""
    table: dict[int, tuple[int, int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return table


def running_now() -> frozenset[int]:
    """Every process running now: taken at a test's start, what ``leftovers`` must not blame on
    the pool (a slot server that a session-scoped fixture of another suite keeps running below
    this test process, say)."""
    return frozenset(_process_table())


def leftovers(
    groups: set[int], run_dir: Path | None, before: frozenset[int] = frozenset()
) -> list[str]:
    """Processes that outlived the pool: in its servers' groups, below us (and not running
    ``before`` the pool), or naming its dir."""
    table = _process_table()
    me = os.getpid()
    found = []
    for pid, (ppid, pgid, cmdline) in table.items():
        below_me = False
        if pid in before and pgid not in groups:
            continue
        parent = ppid
        for _ in range(64):
            if parent == me:
                below_me = True
                break
            if parent not in table:
                break
            parent = table[parent][0]
        names_dir = run_dir is not None and str(run_dir).encode() in cmdline
        if pgid in groups or below_me or names_dir:
            shown = cmdline.replace(b"\0", b" ")[:120]
            found.append(f"{pid} (pgid {pgid}): {shown!r}")
    return found


async def wait_no_leftovers(
    groups: set[int], run_dir: Path | None, before: frozenset[int] = frozenset()
) -> None:
    with anyio.move_on_after(10):
        while leftovers(groups, run_dir, before):  # noqa: ASYNC110 - polls state that has no event
            await anyio.sleep(0.05)
    assert leftovers(groups, run_dir, before) == []


async def wait_statistics(pool: LocalSandboxPool, free: int) -> PoolStatistics:
    with anyio.move_on_after(30):
        while True:
            stats = pool.statistics()
            if stats.free == free and stats.leased == stats.resetting == stats.waiting == 0:
                return stats
            await anyio.sleep(0.02)
    pytest.fail(f"the pool never settled: {pool.statistics()}")


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_slot_server_killed_mid_batch_is_replaced() -> None:
    before = running_now()
    async with LocalSandboxPool(config(containers=2, slots=2)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with pool.lease("victim") as victim:
            dead = victim.slot.container
            pid = pool.server_pid(dead)
            results: list[ToolResult] = []

            async def batch() -> None:
                calls = [bash(victim, "sleep 30"), bash(victim, "echo after")]
                results.extend(await pool.execute(dead, calls))

            async with anyio.create_task_group() as group:
                group.start_soon(batch)
                with anyio.fail_after(10):  # wait until the command runs in the sandbox
                    while not any(s.busy for s in (await pool.client(dead).list_slots()).slots):  # noqa: ASYNC110 - polls state that has no event
                        await anyio.sleep(0.02)
                os.kill(pid, signal.SIGKILL)
            assert [r.outcome for r in results] == [ToolOutcome.INFRA_ERROR] * 2
            assert all(r.error and dead in r.error for r in results)
            assert dead not in pool.container_names()
            (late,) = await pool.execute(dead, [bash(victim, "true")])
            assert late.outcome is ToolOutcome.INFRA_ERROR  # its lease ended with its server
            assert late.error is not None
            assert f"slot server {dead} was lost" in late.error
        with anyio.fail_after(30):
            while pool.restarts < 1 or len(pool.container_names()) < 2:  # noqa: ASYNC110 - polls state that has no event
                await anyio.sleep(0.02)
        stats = await wait_statistics(pool, free=4)
        assert stats.containers == 2
        pool.check_valid()
        replacement = next(n for n in pool.container_names() if n.startswith(dead))
        groups.add(pool.server_pid(replacement))
        async with anyio.create_task_group() as group:
            for i in range(4):

                async def use(i: int = i) -> None:
                    async with pool.lease(f"after-{i}") as lease:
                        (ok,) = await pool.execute(lease.slot.container, [bash(lease, "echo ok")])
                        assert ok.content == "ok\n"

                group.start_soon(use)
    await wait_no_leftovers(groups, run_dir, before)


@pytest.mark.anyio
async def test_a_replacement_that_never_starts_is_given_up_with_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = running_now()
    settings = config(containers=2, slots=1)
    settings = attrs.evolve(
        settings, restart=RestartSettings(restart_attempts=2, backoff_s=0.01, backoff_max_s=0.01)
    )
    async with LocalSandboxPool(settings) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        dead = pool.container_names()[0]
        launcher = type(pool._processes)  # every later start runs a server that fails
        monkeypatch.setattr(launcher, "_argv", lambda self, index, name: ["/bin/false"])
        with caplog.at_level(logging.WARNING):
            os.kill(pool.server_pid(dead), signal.SIGKILL)
            with anyio.fail_after(30):
                while not any("gave up" in r.getMessage() for r in caplog.records):  # noqa: ASYNC110 - polls the log
                    await anyio.sleep(0.02)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("replacing" in w and "failed" in w for w in warnings) == 2, warnings
        assert any(
            f"gave up replacing {dead} after 2 tries (restart_attempts); 1 slot servers are left"
            in w
            for w in warnings
        ), warnings
        assert pool.restarts == 0
        assert pool.container_names() == [n for n in pool.container_names() if n != dead]
        async with pool.lease("after") as lease:  # the server left still serves
            (ok,) = await pool.execute(lease.slot.container, [bash(lease, "echo ok")])
            assert ok.content == "ok\n"
    await wait_no_leftovers(groups, run_dir, before)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_thousand_trajectories_cancelled_at_random_leave_every_slot_free() -> None:
    rng = random.Random(1234)
    outcomes = {"finished": 0, "cancelled": 0}
    before = running_now()
    async with LocalSandboxPool(config(containers=2, slots=4)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        running = anyio.CapacityLimiter(24)
        async with ToolDispatcher(pool, BatchConfig(window_ms=2.0)) as dispatcher:

            async def trajectory(i: int, patience: float, calls: int) -> None:
                async with running:
                    with anyio.move_on_after(patience) as scope:
                        async with pool.lease(f"t{i}") as lease:
                            for _ in range(calls):
                                (result,) = await dispatcher.run([bash(lease, "true")])
                                assert result.outcome is ToolOutcome.OK, result
                    outcomes["cancelled" if scope.cancelled_caught else "finished"] += 1

            async with anyio.create_task_group() as group:
                for i in range(1000):
                    # A fifth may finish; the rest are cancelled waiting, running or releasing.
                    patience = 30.0 if rng.random() < 0.2 else rng.uniform(0.0, 0.3)
                    group.start_soon(trajectory, i, patience, rng.randint(1, 3))
            largest = dispatcher.statistics().largest_batch
        stats = await wait_statistics(pool, free=8)
        assert stats.quarantined == 0
        assert stats.leases_granted >= outcomes["finished"]
        pool.check_valid()
    assert outcomes["finished"] + outcomes["cancelled"] == 1000
    assert outcomes["cancelled"] > 50
    assert outcomes["finished"] > 50
    assert largest >= 1
    await wait_no_leftovers(groups, run_dir, before)


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_dispatcher_batches_many_trajectories_per_container() -> None:
    async with (
        LocalSandboxPool(config(containers=2, slots=16)) as pool,
        ToolDispatcher(pool, BatchConfig(window_ms=5.0)) as dispatcher,
    ):

        async def trajectory(i: int) -> None:
            async with pool.lease(f"t{i}") as lease:
                for _ in range(5):
                    (result,) = await dispatcher.run([bash(lease, "true")])
                    assert result.outcome is ToolOutcome.OK

        async with anyio.create_task_group() as group:
            for i in range(32):
                group.start_soon(trajectory, i)
        stats = dispatcher.statistics()
    assert stats.calls == 160
    assert stats.largest_batch > 1
    assert stats.batches < stats.calls


@pytest.mark.anyio
@pytest.mark.slow
async def test_close_leaves_no_process_behind_even_with_background_jobs() -> None:
    before = running_now()
    pool = LocalSandboxPool(config(containers=2, slots=2))
    async with pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        assert run_dir is not None
        async with anyio.create_task_group() as group:
            for i in range(4):

                async def start_job(i: int = i) -> None:
                    async with pool.lease(f"t{i}") as lease:
                        (started,) = await pool.execute(
                            lease.slot.container,
                            [bash(lease, "(sleep 1000 &) ; sleep 1000 >/dev/null 2>&1 & echo up")],
                        )
                        assert started.content.startswith("up")
                        await anyio.sleep(5)  # still held (with its jobs) when the pool closes

                group.start_soon(start_job)
            await anyio.sleep(1.0)
            assert leftovers(groups, run_dir, before)  # the servers and their sandboxes are running
            await pool.aclose()
            group.cancel_scope.cancel()
    await wait_no_leftovers(groups, run_dir, before)
    assert not run_dir.exists()


@pytest.mark.anyio
async def test_a_server_a_lease_used_never_joins_and_a_fresh_one_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fresh server's listing shows no use, so it joins; once a lease ran a call in it (what
    a resumed Slurm job or a reconnected Nomad client brings back), ``connect`` refuses it with
    a warning naming the server and the slot."""
    async with LocalSandboxPool(config(containers=1, slots=2)) as pool:
        (name,) = pool.container_names()
        assert slots_in_use(await pool.client(name).list_slots()) == []
        unix_path = pool.client(name).unix_path
        assert unix_path is not None
        async with pool.lease("victim") as lease:
            (result,) = await pool.execute(name, [bash(lease, "echo secret > note")])
            assert result.outcome is ToolOutcome.OK
        with pytest.raises(SlotServerError, match="slot server again was refused: it is not fresh"):
            await pool.connect(Endpoint("unix", unix_path), "again")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("again was refused" in w and "slot 0:" in w for w in warnings), warnings


@pytest.mark.anyio
@pytest.mark.slow
async def test_servers_killed_over_a_long_run_leave_no_workspaces_or_sockets_behind() -> None:
    """A slot server killed mid-lease (an OOM kill) and replaced, three times over: what it kept
    under the pool's directory (its slots' workspaces, the lease's files, its socket) goes with
    it, so a long run's replacements do not pile up until the pool closes."""
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=2)) as pool:
        run_dir = pool.run_dir
        assert run_dir is not None
        groups: set[int] = set()
        for round_ in range(3):
            (name,) = pool.container_names()
            pid = pool.server_pid(name)
            groups.add(pid)
            async with pool.lease(f"writer-{round_}") as lease:
                write = "head -c 200000 /dev/zero > big && mkdir -p a/b && echo x > a/b/c"
                (wrote,) = await pool.execute(name, [bash(lease, write)])
                assert wrote.outcome is ToolOutcome.OK, wrote
                os.kill(pid, signal.SIGKILL)
                with anyio.fail_after(30):
                    while pool.restarts < round_ + 1 or pool.container_names() in ([], [name]):  # noqa: ASYNC110 - polls state that has no event
                        await anyio.sleep(0.02)
        await wait_statistics(pool, free=2)
        (name,) = pool.container_names()
        groups.add(pool.server_pid(name))
        with anyio.move_on_after(10):
            while len(list((run_dir / "slots").iterdir())) > 1:  # noqa: ASYNC110 - polls state that has no event
                await anyio.sleep(0.05)
        assert [p.name for p in (run_dir / "slots").iterdir()] == [name]
        assert len(list(run_dir.glob("*.sock"))) == 1
    await wait_no_leftovers(groups, run_dir, before)
