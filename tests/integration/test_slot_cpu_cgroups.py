"""A slot's processes are scheduled in the slot's own ``cpu`` cgroup, beside the server's.

With autogroups on (``kernel.sched_autogroup_enabled``), every session of the root ``cpu`` cgroup
is scheduled as a group of its own, whatever its nice value; a lease's command runs in a session
of its own, so in the root cgroup it weighed as much as the whole slot server. On a cgroup v1
host whose ``cpu`` hierarchy the server can write, the server moves itself into ``TAG/server``
and each slot's keeper, leases and commands run in ``TAG/slot-N`` (limits.py, "CPU"). Checked
from the host, through ``cgroup.procs``: a running command (in a session of its own, as every
command is) is in its slot's group and in no other slot's (the control: a slot without a lease
holds no process), the server is in ``server``, the weights are as documented, and the server
removes its groups when it stops.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_slot_server import (
    Server,
    call,
    reset_clean,
    searchable_dir,
    start_server,
    stop_server,
)

CPU = Path("/sys/fs/cgroup/cpu")


def _cpu_path(pid: int) -> str | None:
    """The v1 ``cpu`` cgroup of process ``pid`` (relative to the hierarchy's root), or ``None``."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


def _writable_v1_cpu() -> bool:
    if Path("/sys/fs/cgroup/cgroup.controllers").exists() or not CPU.is_dir():
        return False
    own = _cpu_path(os.getpid())
    return own is not None and os.access(CPU / own.lstrip("/"), os.W_OK)


pytestmark = pytest.mark.skipif(
    not _writable_v1_cpu(),
    reason="the host has no writable cgroup v1 cpu hierarchy: the server makes no cpu cgroups",
)


@pytest.fixture
def server() -> Iterator[Server]:
    with searchable_dir("cpu-cgroups") as folder:
        running = start_server(folder / "root")
        try:
            yield running
        finally:
            stop_server(running)


def _autogroup(pid: int) -> str | None:
    """The autogroup of process ``pid`` (one per session), or ``None`` (a kernel without)."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except OSError:
        return None


def _procs(group: Path) -> set[int]:
    return {int(word) for word in (group / "cgroup.procs").read_text().split()}


def test_a_slots_command_runs_in_its_slots_cpu_cgroup_beside_the_server(server: Server) -> None:
    own = _cpu_path(server.process.pid)
    assert own is not None
    assert own.endswith("/server"), own
    groups = CPU / own.lstrip("/").removesuffix("/server")
    assert (groups / "cpu.shares").read_text().strip() == str(1024 * 5)  # 4 slots and the server
    assert (groups / "server" / "cpu.shares").read_text().strip() == str(1024 * 4)

    async def main() -> tuple[set[int], set[int], int | None]:
        async with server.client() as client:
            running = asyncio.ensure_future(
                client.execute([call(1, "bash", epoch=7, command="exec sleep 3")])
            )
            sleeping: set[int] = set()
            for _ in range(100):  # until the command runs
                await asyncio.sleep(0.05)
                slot = _procs(groups / "slot-1")
                sleeping = {pid for pid in slot if _comm(pid) == "sleep"}
                if sleeping:
                    break
            other = _procs(groups / "slot-2")
            keeper = (await client.list_slots()).slots[1].sandbox_pid
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return sleeping, other, keeper

    sleeping, other, keeper = asyncio.run(main())
    assert len(sleeping) == 1, "the command never showed in its slot's cpu cgroup"
    (command,) = sleeping
    assert keeper is not None
    assert keeper in _procs(groups / "slot-1")
    if _autogroup(keeper) is not None:  # a session of its own: an autogroup of its own
        assert _autogroup(command) != _autogroup(keeper)
    assert other == set()  # the control: a slot without a lease holds no process
    assert stop_server(server) == 0
    assert not groups.exists(), f"the server left its cpu cgroups behind: {groups}"


def test_a_readied_lease_runs_its_calls_at_one_sessions_weight(server: Server) -> None:
    """The slot weighs as 8 sessions only while the server readies its next lease (after a
    reset, before the lease's greeting): the next lease's command runs at one session's."""
    own = _cpu_path(server.process.pid)
    assert own is not None
    shares = CPU / own.lstrip("/").removesuffix("/server") / "slot-1" / "cpu.shares"

    async def main() -> list[str]:
        seen: list[str] = []
        async with server.client() as client:
            for epoch in (11, 12, 13):  # the second and third leases are readied ones
                (result,) = await client.execute([call(1, "bash", epoch=epoch, command="true")])
                assert result.content == "", result
                seen.append(shares.read_text().strip())
                await reset_clean(client, 1, epoch)
        return seen

    assert asyncio.run(main()) == ["1024", "1024", "1024"]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
