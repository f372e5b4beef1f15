"""The fake pool and each real pool, driven in lockstep, must agree on everything a caller sees.

``trajcore.testing.sandbox_pool_machine`` drives ``FakeSandboxPool`` and a real pool (the local
pool's slot-server processes, the container pool's slot-server containers, the Nomad pool over
the fake Nomad API; real bubblewrap in each) with the same generated sequence: leases and
releases by every route, queued, cancelled and expiring waiters, batches of file writes and
reads, commands, bad calls and repeated call ids across slots and containers, call timeouts,
cancelled batches, container deaths and closing. Each pool is checked against the port's contract
after every step, and the two must agree on each lease's slot and epoch, on which leases share a
container, on every call's outcome, text and exit code, and on their statistics. A difference
means a test written against the fake could pass while the real pool behaves otherwise.

The SSH, Slurm, Modal and Daytona pools join the same machine from their own modules, beside
the fixtures they need (``tests/integration/test_ssh_pool.py``, ``test_slurm_pool.py``;
``test_modal_pool.py`` and ``test_daytona_pool.py`` through ``cloud_testbed.agree_with_the_fake``,
over ``FakeCloud`` with real slot servers behind it).
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from tests.contract.test_nomad_sandbox_pool import nomad_pool
from tests.integration.test_container_pool import IMAGE_PROBLEM, container_pool, kill_container
from tests.nomad_testbed import OPENAPI, OPENAPI_PROBLEM, crash_allocation
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import PoolShape
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
        containers=SHAPE.containers,
        server=SlotServerSettings(
            slots_per_container=SHAPE.slots_per_container,
            reset_timeout_s=10.0, acquire_timeout_s=30.0,
            isolation=SlotIsolation(
                require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
            ),
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


def _shape() -> PoolShape:
    return PoolShape(
        containers=SHAPE.containers,
        slots_per_container=SHAPE.slots_per_container,
        acquire_timeout_s=30.0,
    )


@pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM))
def test_the_fake_and_the_container_pool_agree() -> None:
    """The same sequences over slot-server containers; a crash is the engine killing one."""

    def crash_either(pool: SandboxPool, container: str) -> None:
        if isinstance(pool, FakeSandboxPool):
            pool.crash_container(container)
        else:
            kill_container(pool, container)

    run_pool_machine(
        [fake_pool, lambda: container_pool(_shape())], shape=SHAPE, crash=crash_either, scale=0.02
    )


@pytest.mark.skipif(
    OPENAPI is None, reason=f"Nomad's OpenAPI description is needed: {OPENAPI_PROBLEM}"
)
def test_the_fake_and_the_nomad_pool_agree() -> None:
    """The same sequences over allocations of the fake Nomad API; a crash kills an allocation."""

    def crash_either(pool: SandboxPool, container: str) -> None:
        if isinstance(pool, FakeSandboxPool):
            pool.crash_container(container)
        else:
            crash_allocation(pool, container)

    run_pool_machine(
        [fake_pool, lambda: nomad_pool(_shape())], shape=SHAPE, crash=crash_either, scale=0.02
    )
