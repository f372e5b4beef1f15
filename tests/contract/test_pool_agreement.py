"""The fake pool and the local pool, driven in lockstep, must agree on everything a caller sees.

``trajcore.testing.sandbox_pool_machine`` drives ``FakeSandboxPool`` and ``LocalSandboxPool`` (real
slot servers, real bubblewrap) with the same generated sequence: leases and releases by every
route, queued, cancelled and expiring waiters, batches of file writes and reads, commands, bad
calls and repeated call ids across slots and containers, call timeouts, cancelled batches,
container deaths and closing. Each pool is checked against the port's contract after every step,
and the two must agree on each lease's slot and epoch, on which leases share a container, on every
call's outcome, text and exit code, and on their statistics. A difference means a test written
against the fake could pass while the real pool behaves otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.sandbox.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.sandbox_policy import SlotPolicy
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_machine import MachineShape, run_pool_machine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

SHAPE = MachineShape(containers=2, slots_per_container=2)


def fake_pool() -> FakeSandboxPool:
    return FakeSandboxPool(
        containers=SHAPE.containers,
        slots_per_container=SHAPE.slots_per_container,
        acquire_timeout_s=30.0,
    )


def local_pool() -> LocalSandboxPool:
    config = LocalPoolConfig(
        containers=SHAPE.containers, slots_per_container=SHAPE.slots_per_container,
        reset_timeout_s=10.0, acquire_timeout_s=30.0,
        policy=SlotPolicy(
            require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
        ),
    )  # fmt: skip
    return LocalSandboxPool(config)


def crash(pool: SandboxPool, container: str) -> None:
    """The fake stages a crash for the next batch; a local server's process group is killed."""
    if isinstance(pool, FakeSandboxPool):
        pool.crash_container(container)
    else:
        assert isinstance(pool, LocalSandboxPool)
        os.killpg(pool.server_pid(container), signal.SIGKILL)


def test_the_fake_and_the_local_pool_agree() -> None:
    run_pool_machine([fake_pool, local_pool], shape=SHAPE, crash=crash, scale=0.06)
