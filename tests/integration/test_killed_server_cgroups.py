"""A slot server killed with SIGKILL leaves no cgroup behind, and neither does one that stops.

A server removes its cgroups when it closes; one killed with SIGKILL (a pool's stop that ran out
of grace, a test's teardown, the OOM killer) cannot. Its cgroups used to stay until another
server started in the same cgroup swept them (``sweep_stale``), which never happens where each
job, unit or container has a cgroup of its own: a host collected thousands of empty
``trajcore-PID-...`` groups, and their parents could no longer be removed. The server now starts
a watcher beside its cgroups that removes them once the server is gone, however it ended.

Checked from the host, in this process's own cgroups: the server's directories exist while it
runs (the control), are gone a few seconds after a SIGKILL with no other server started (a
lease's command running in a slot's group or not), and no watcher outlives its work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.integration.test_slot_server import (
    Server,
    call,
    searchable_dir,
    start_server,
    stop_server,
)

ROOT = Path("/sys/fs/cgroup")


def _server_dirs(pid: int) -> set[Path]:
    """The cgroup directories a server with ``pid`` made beside this process's, in any
    hierarchy (their slots' groups included)."""
    found: set[Path] = set()
    for line in Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        hierarchy = ROOT if controllers == "" else ROOT / controllers.split(",")[0]
        base = hierarchy / own.lstrip("/")
        if base.is_dir():
            for folder in base.glob(f"trajcore-{pid}-*"):
                found |= {folder, *(c for c in folder.iterdir() if c.is_dir())}
    return found


def _watchers(pid: int) -> list[int]:
    """Processes whose command line names the server's cgroups (its watcher)."""
    mark = f"trajcore-{pid}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if mark in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _gone_within(pid: int, seconds: float) -> tuple[set[Path], list[int]]:
    deadline = time.monotonic() + seconds
    while True:
        left, watchers = {f for f in _server_dirs(pid) if f.exists()}, _watchers(pid)
        if (not left and not watchers) or time.monotonic() > deadline:
            return left, watchers
        time.sleep(0.05)


def _sleeping_in(groups: set[Path]) -> bool:
    for group in groups:
        with contextlib.suppress(OSError):
            for word in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{word}/comm").read_text().strip() == "sleep":
                        return True
    return False


def _kill_while_running(server: Server, groups: set[Path]) -> None:
    """SIGKILL the server while a lease of slot 1 runs a command."""

    async def main() -> bool:
        async with server.client() as client:
            running = asyncio.ensure_future(
                client.execute([call(1, "bash", epoch=2, command="exec sleep 30")])
            )
            held = False
            for _ in range(200):  # until the command shows in its slot's cgroup
                await asyncio.sleep(0.05)
                if _sleeping_in(groups):
                    held = True
                    break
            server.process.kill()
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return held

    assert asyncio.run(main()), "the command never showed in a slot's cgroup"


@pytest.mark.parametrize("how", ["sigkill", "sigkill-running", "sigterm"])
def test_a_server_leaves_no_cgroup_and_no_watcher_however_it_ends(how: str) -> None:
    with searchable_dir("killed-cgroups") as folder:
        server = start_server(folder / "root")
        pid = server.process.pid
        try:
            made = _server_dirs(pid)
            if not made:
                pytest.skip("the server could make no cgroup on this host (no writable hierarchy)")
            assert len(made) > 1, f"no slot's group among the server's cgroups: {made}"
            if how == "sigkill":
                server.process.kill()
            elif how == "sigkill-running":
                _kill_while_running(server, made)
        finally:
            assert stop_server(server) == (0 if how == "sigterm" else -9)
        left, watchers = _gone_within(pid, 10)
        for group in sorted(left, key=lambda f: len(f.parts), reverse=True):  # clean up
            with contextlib.suppress(OSError):
                group.rmdir()
        assert not left, f"the {how} server's cgroups were left behind: {sorted(left)}"
        assert not watchers, f"the {how} server's cgroup watcher outlived it: {watchers}"
