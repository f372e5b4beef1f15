"""A slot server that stops removes every cgroup it made, the one of a slot whose lease was
still running a command included.

The kernel releases a killed process from its cgroup a moment after the kill (its pid
namespace is emptied asynchronously), and ``rmdir`` answers ``EBUSY`` until then: the slot it
last leased was left behind in most stops before ``SlotCgroup.remove`` tried a busy one again.
Checked from the host: the server's directories in each v1 hierarchy (or its v2 directory) are
listed while the command runs (the control: they exist, a slot's holding the command), then
must be gone after the stop.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.integration.test_slot_server import call, searchable_dir, start_server, stop_server

ROOT = Path("/sys/fs/cgroup")


def _server_dirs(pattern: str) -> set[Path]:
    """The cgroup directories named ``pattern`` (a glob) beside this process's, in any
    hierarchy."""
    found: set[Path] = set()
    for line in Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        hierarchy = ROOT if controllers == "" else ROOT / controllers.split(",")[0]
        base = hierarchy / own.lstrip("/")
        if base.is_dir():
            found |= set(base.glob(pattern))
    return found


def _holds(folder: Path, pid: int) -> bool:
    return any(
        str(pid) in (child / "cgroup.procs").read_text().split()
        for child in folder.iterdir()
        if child.is_dir()
    )


@pytest.mark.parametrize("run", range(3))
def test_a_stopped_server_leaves_no_cgroup_behind_even_with_a_command_running(run: int) -> None:
    with searchable_dir("cgroup-removal") as folder:
        before = _server_dirs("trajcore-*")  # a folder another server left is not this one's
        server = start_server(folder / "root")
        try:
            made = _server_dirs(f"trajcore-{server.process.pid}-root") - before
            if not made:
                pytest.skip("the server could make no cgroup on this host (no writable hierarchy)")

            async def main() -> bool:
                async with server.client() as client:
                    running = asyncio.ensure_future(
                        client.execute([call(1, "bash", epoch=3 + run, command="exec sleep 30")])
                    )
                    held = False
                    for _ in range(100):  # until the command shows in its slot's cgroup
                        await asyncio.sleep(0.05)
                        sleeping = [
                            int(p)
                            for p in os.listdir("/proc")
                            if p.isdigit() and _comm(int(p)) == "sleep"
                        ]
                        if any(_holds(f, pid) for f in made for pid in sleeping):
                            held = True
                            break
                    running.cancel()
                    await asyncio.gather(running, return_exceptions=True)
                    return held

            assert asyncio.run(main()), "the command never showed in a slot's cgroup"
        finally:
            assert stop_server(server) == 0
        left = [f for f in made if f.exists()]
        assert not left, f"the stopped server left its cgroups behind: {left}"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
