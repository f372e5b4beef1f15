"""Tool calls through the SSH pool beside the local pool, measured in the same run.

A loopback sshd (``trajcore.testing.loopback_sshd``: its own config, keys and port in a
temporary directory) plays the remote host; the SSH pool reaches its slot servers through
forwarded Unix sockets. The local pool runs the same servers as child processes. With 1 and 64
concurrent trajectories, each in its own leased slot (4 servers of 16 slots in both pools), every
trajectory runs ``true`` through the ``bash`` tool in a loop for ``--seconds``; the figure is
calls per second, printed with the SSH pool's ratio to the local pool's. Also: the SSH pool's
start time (start check and 4 servers healthy) beside the local pool's.

Target from the SSH issue: at 64, the SSH pool reaches at least 0.8 of the local pool's
throughput. Run: ``.venv/bin/python bench/ssh.py [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

import anyio

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.pools.pool_core import SlotServerPool
from trajcore.adapters.pools.ssh_pool import SshPoolConfig, SshSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.testing.loopback_sshd import loopback_sshd, sshd_problem

SERVERS = 4
SLOTS = 16
ISOLATION = SlotIsolation(require_sandbox=True, max_processes=64, memory_bytes=512 << 20)
_ids = itertools.count()
H = TypeVar("H")  # the pool's handle of one server


async def _throughput(pool: SlotServerPool[H], trajectories: int, seconds: float) -> float:
    done = 0

    async def trajectory(index: int) -> None:
        nonlocal done
        async with pool.lease(f"bench-{index}") as lease:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                call = ToolCall(id=f"b{next(_ids)}", name="bash", arguments={"command": "true"})
                (result,) = await pool.execute(
                    lease.slot.container, [SlotCall(lease=lease, call=call, timeout_s=10.0)]
                )
                if result.outcome is not ToolOutcome.OK:
                    raise RuntimeError(f"a call failed: {result}")
                done += 1

    start = time.monotonic()
    async with anyio.create_task_group() as group:
        for index in range(trajectories):
            group.start_soon(trajectory, index)
    return done / (time.monotonic() - start)


async def _measure(
    pool: AbstractAsyncContextManager[SlotServerPool[H]], seconds: float
) -> dict[str, float]:
    started = time.monotonic()
    async with pool as opened:
        figures = {"start_s": time.monotonic() - started}
        await _throughput(opened, 1, 0.5)  # warm every path once
        for trajectories in (1, 64):
            figures[f"calls_per_s_{trajectories}"] = await _throughput(
                opened, trajectories, seconds
            )
    return figures


async def main(seconds: float) -> int:
    problem = sshd_problem()
    if problem is not None:
        print(f"bench/ssh.py: skipped: {problem}")
        return 0
    local = LocalSandboxPool(
        LocalPoolConfig(
            containers=SERVERS,
            server=SlotServerSettings(slots_per_container=SLOTS, isolation=ISOLATION),
        )
    )
    local_figures = await _measure(local, seconds)
    with tempfile.TemporaryDirectory() as directory, loopback_sshd(Path(directory)) as sshd:
        host = sshd.host(servers=SERVERS, slots=SLOTS)
        ssh = SshSandboxPool(
            SshPoolConfig(
                hosts=[host], ssh=sshd.settings(), server=SlotServerSettings(isolation=ISOLATION)
            )
        )
        ssh_figures = await _measure(ssh, seconds)
    print(f"{'':24} {'local':>10} {'ssh':>10} {'ssh/local':>10}")
    for key in ("calls_per_s_1", "calls_per_s_64", "start_s"):
        ratio = ssh_figures[key] / local_figures[key]
        print(f"{key:24} {local_figures[key]:10.1f} {ssh_figures[key]:10.1f} {ratio:10.2f}")
    ratio_64 = ssh_figures["calls_per_s_64"] / local_figures["calls_per_s_64"]
    verdict = "met" if ratio_64 >= 0.8 else "NOT met"
    print(f"target at 64 trajectories: ssh/local >= 0.80: {ratio_64:.2f} ({verdict})")
    print(json.dumps({"local": local_figures, "ssh": ssh_figures}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    sys.exit(anyio.run(main, parser.parse_args().seconds))
