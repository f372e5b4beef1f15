"""The SandboxPool contract against the unisolated pool (real commands in plain directories),
and what it adds: real commands and files, background processes ended with the lease, symlinks
out refused, everything gone after close."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.domain.errors import StateError
from trajcore.domain.slots import SlotId
from trajcore.domain.tools import ToolOutcome
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.processes import running
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


@asynccontextmanager
async def unisolated_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with UnisolatedSandboxPool(
        containers=shape.containers,
        slots_per_container=shape.slots_per_container,
        acquire_timeout_s=shape.acquire_timeout_s,
    ) as pool:
        yield pool


def crash_unisolated(pool: SandboxPool, container: str) -> None:
    assert isinstance(pool, UnisolatedSandboxPool)
    pool.crash_container(container)


class TestUnisolatedSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.05

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return unisolated_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_unisolated


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_commands_really_run_and_files_are_real() -> None:
    async with UnisolatedSandboxPool(slots_per_container=1) as pool, pool.lease("t") as lease:
        container = lease.slot.container
        (wrote,) = await pool.execute(
            container, [slot_call(lease, "write_file", path="pkg/data.txt", content="3\n4\n")]
        )
        assert wrote.outcome is ToolOutcome.OK
        (summed,) = await pool.execute(
            container,
            [slot_call(lease, "bash", command="awk '{s+=$1} END {print s}' pkg/data.txt; pwd")],
        )
        assert summed.exec is not None
        assert not summed.exec.sandboxed
        total, where = summed.exec.stdout.splitlines()
        assert total == "7"
        assert Path(where) == pool.slot_path(lease.slot).resolve()
        assert (pool.slot_path(lease.slot) / "pkg" / "data.txt").read_text() == "3\n4\n"


async def test_a_symlink_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("canary")
    async with UnisolatedSandboxPool(slots_per_container=1) as pool, pool.lease("t") as lease:
        container = lease.slot.container
        await pool.execute(container, [slot_call(lease, "bash", command=f"ln -s {tmp_path} out")])
        read, write, inside = await pool.execute(
            container,
            [
                slot_call(lease, "read_file", path="out/secret.txt"),
                slot_call(lease, "write_file", path="out/secret.txt", content="x"),
                slot_call(lease, "read_file", path="missing.txt"),
            ],
        )
    # what the model left at the path is the call's failure, as the slot server answers it
    assert (read.outcome, read.error) == (
        ToolOutcome.TOOL_ERROR,
        "cannot read 'out/secret.txt': a symlink leads it out of the workspace",
    )
    assert (write.outcome, write.error) == (
        ToolOutcome.TOOL_ERROR,
        "cannot write 'out/secret.txt': a symlink leads it out of the workspace",
    )
    assert secret.read_text() == "canary"  # the control: the file is there, untouched
    assert inside.outcome is ToolOutcome.TOOL_ERROR


async def test_a_fifo_is_no_file_to_read_or_write() -> None:
    """A FIFO at the path is the call's ``TOOL_ERROR``; neither call waits for a reader or a
    writer that never comes (an open of a FIFO blocks)."""
    async with UnisolatedSandboxPool(slots_per_container=1) as pool, pool.lease("t") as lease:
        os.mkfifo(pool.slot_path(lease.slot) / "answer")
        with anyio.fail_after(10):
            read, write = await pool.execute(
                lease.slot.container,
                [
                    slot_call(lease, "read_file", path="answer"),
                    slot_call(lease, "write_file", path="answer", content="x"),
                ],
            )
    assert (read.outcome, read.error) == (
        ToolOutcome.TOOL_ERROR,
        "cannot read 'answer': not a regular file",
    )
    assert (write.outcome, write.error) == (
        ToolOutcome.TOOL_ERROR,
        "cannot write 'answer': not a regular file",
    )


async def test_background_processes_end_with_the_lease_and_close_removes_everything() -> None:
    async with UnisolatedSandboxPool(slots_per_container=1) as pool:
        root = pool.root
        assert root is not None
        async with pool.lease("t") as lease:
            (started,) = await pool.execute(
                lease.slot.container,
                [slot_call(lease, "bash", command="sleep 300 >/dev/null 2>&1 & echo $!")],
            )
            assert started.exec is not None
            pid = int(started.exec.stdout.strip())
            assert running(pid)  # it outlives the call within the lease
        with anyio.fail_after(10):
            while running(pid):  # noqa: ASYNC110 - polling another process
                await anyio.sleep(0.02)
        assert not (root / lease.slot.container / "0").exists()
        async with pool.lease("u") as second:
            (again,) = await pool.execute(
                second.slot.container,
                [slot_call(second, "bash", command="sleep 300 >/dev/null 2>&1 & echo $!")],
            )
            assert again.exec is not None
            late = int(again.exec.stdout.strip())
            await pool.aclose()
        with anyio.fail_after(10):
            while running(late):  # noqa: ASYNC110 - polling another process
                await anyio.sleep(0.02)
    assert not root.exists()


async def test_persistent_shells_are_refused_with_a_reason() -> None:
    async with UnisolatedSandboxPool(slots_per_container=1) as pool, pool.lease("t") as lease:
        stateful, terminal = await pool.execute(
            lease.slot.container,
            [
                slot_call(lease, "bash_stateful", command="true"),
                slot_call(lease, "tmux", action="send", keys="ls"),
            ],
        )
    for result in (stateful, terminal):
        assert result.outcome is ToolOutcome.REJECTED
        assert result.error is not None
        assert "local pool" in result.error or "@" in result.error


async def test_a_timeout_kills_the_command_group() -> None:
    async with UnisolatedSandboxPool(slots_per_container=1) as pool, pool.lease("t") as lease:
        (timed,) = await pool.execute(
            lease.slot.container,
            [slot_call(lease, "bash", command="sleep 300 & echo $! > child; wait", timeout_s=0.5)],
        )
        assert timed.outcome is ToolOutcome.TIMEOUT
        child = int((pool.slot_path(lease.slot) / "child").read_text())
        with anyio.fail_after(10):
            while running(child):  # noqa: ASYNC110 - polling another process
                await anyio.sleep(0.02)


async def test_the_slot_path_needs_an_open_pool() -> None:
    pool = UnisolatedSandboxPool()
    with pytest.raises(StateError):
        pool.slot_path(SlotId(container="unisolated-0", index=0))


def test_output_over_the_limit_keeps_head_and_tail() -> None:
    async def main() -> None:
        async with (
            UnisolatedSandboxPool(slots_per_container=1, output_limit_bytes=100) as pool,
            pool.lease("t") as lease,
        ):
            (big,) = await pool.execute(
                lease.slot.container,
                [slot_call(lease, "bash", command="printf 'A%.0s' $(seq 500); printf END")],
            )
        assert big.exec is not None
        assert big.exec.stdout.endswith("END")
        assert big.exec.stdout_dropped == 503 - 100

    anyio.run(main)
