"""Time to first lease for a Slurm pool of 4 slot servers, beside the local pool's.

Starts a one-node Slurm cluster on loopback (``tests.slurm_testbed``: munged, slurmctld and
slurmd of this machine, its own config in a temporary directory), then, ``--runs`` times each:

- Slurm: ``SlurmSandboxPool`` with 4 servers of 4 slots (min = max = 4), from entering the pool
  (the ``sbatch`` of 4 jobs) to the first command answered in a leased slot, and to all 4
  servers joined;
- the limit, measured in the same run: ``LocalSandboxPool`` with the same 4 servers of 4 slots
  as child processes, the same two figures.

The difference is what Slurm adds: submission, scheduling, the job's start on its node, the
ready file's discovery. Also: the scale-up time of a Slurm pool from 1 to 4 servers (min 1,
max 4) when 4 leases are asked at once. Run (as root, with Slurm and munge installed):
``PYTHONPATH=. .venv/bin/python bench/slurm.py [--runs 3]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TypeVar

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.slurm_testbed import SLURM_PROBLEM, SlurmCluster

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.pools.pool_core import SlotServerPool
from trajcore.adapters.pools.slurm_pool import SlurmSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall

SERVERS = 4
SLOTS = 4
H = TypeVar("H")  # the pool's handle of one server


def _isolation() -> SlotIsolation:
    return SlotIsolation(require_sandbox=shutil.which("bwrap") is not None, max_processes=64)


async def _first_lease(pool: SlotServerPool[H], started: float) -> tuple[float, float]:
    async with pool.lease("bench", timeout_s=120) as lease:
        call = ToolCall(id="c", name="bash", arguments={"command": "true"})
        [result] = await pool.execute(lease.slot.container, [SlotCall(lease=lease, call=call,
                                                                      timeout_s=30)])  # fmt: skip
        first = time.monotonic() - started
        assert result.exec is not None
        assert result.exec.exit_code == 0, result
    with anyio.fail_after(120):
        while len(pool.container_names()) < SERVERS:  # noqa: ASYNC110 - polled pool state
            await anyio.sleep(0.01)
    return first, time.monotonic() - started


async def _slurm(cluster: SlurmCluster) -> tuple[float, float]:
    config = cluster.pool_config(
        containers=1, slots_per_container=SLOTS, min_containers=SERVERS,
        max_containers=SERVERS, isolation=_isolation(), poll_interval_s=0.2,
    )  # fmt: skip
    started = time.monotonic()
    async with SlurmSandboxPool(config) as pool:
        return await _first_lease(pool, started)


async def _local() -> tuple[float, float]:
    config = LocalPoolConfig(
        containers=SERVERS,
        server=SlotServerSettings(slots_per_container=SLOTS, isolation=_isolation()),
    )
    started = time.monotonic()
    async with LocalSandboxPool(config) as pool:
        return await _first_lease(pool, started)


async def _scale_up(cluster: SlurmCluster) -> float:
    config = cluster.pool_config(
        containers=1, slots_per_container=1, max_containers=SERVERS, isolation=_isolation()
    )
    async with SlurmSandboxPool(config) as pool, AsyncExitStack() as stack:
        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for i in range(SERVERS):
                group.start_soon(stack.enter_async_context, pool.lease(f"t{i}", timeout_s=120))
        return time.monotonic() - started


def _row(name: str, figures: list[tuple[float, float]]) -> str:
    first = statistics.median(f for f, _ in figures)
    every = statistics.median(a for _, a in figures)
    return f"{name:<34} first lease {first:6.2f} s   all {SERVERS} joined {every:6.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if SLURM_PROBLEM is not None:
        print(f"bench/slurm.py: not run: {SLURM_PROBLEM}")
        return
    with SlurmCluster() as cluster:
        slurm = [anyio.run(_slurm, cluster) for _ in range(args.runs)]
        local = [anyio.run(_local) for _ in range(args.runs)]
        scale = [anyio.run(_scale_up, cluster) for _ in range(args.runs)]
    print(f"pool of {SERVERS} slot servers x {SLOTS} slots, median of {args.runs} runs")
    print(_row("Slurm (sbatch, one-node cluster)", slurm))
    print(_row("limit: local pool (child processes)", local))
    print(f"Slurm scale-up 1 -> {SERVERS} servers for {SERVERS} leases: "
          f"{statistics.median(scale):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
