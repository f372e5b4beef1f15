"""A slot's keeper, started by a server run as root, runs as the slot's own uid and gid with no
supplementary group, read from the host in ``/proc/PID/status``; the server itself waits for its
children by pidfd, with no thread per child.

The server starts each keeper through the slot helper's ``--ids`` (docs/sandbox.md, "The slot
helper and its protocol"), so that the start is a vfork of the server rather than a fork; the
ids are dropped in the child. Control: the server's own status, read the same way, is root's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from tests.security.harness import (
    Server,
    argv_of,
    bwrap_missing,
    compiler,
    host_pids,
    leased,
    server_root,
    start_server,
    status_of,
    stop_server,
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if os.geteuid() != 0:
        pytest.skip("a server runs slots as their own uids only as root")
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no keeper")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("keeper-ids") as root:
        running = start_server(root)
        yield running
        stop_server(running)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid``, from the host's ``/proc``."""
    children: dict[int, list[int]] = {}
    for each in host_pids():
        parent = status_of(each).get("PPid")
        if parent is not None:
            children.setdefault(int(parent), []).append(each)
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def keeper_processes(server: Server) -> list[int]:
    """The server's sandbox processes that hold a keeper (``slot-helper keep``), and the
    bubblewrap above each; not the helpers of its idmapped mounts (``slot-helper userns``)."""
    return [
        pid
        for pid in descendants(server.pid)
        if (argv := argv_of(pid)) is not None and "userns" not in argv[1:2]
    ]


def test_a_keeper_runs_as_its_slots_ids_with_no_supplementary_group(server: Server) -> None:
    async def lease_once() -> None:
        async with server.client() as client, leased(server, client, 0) as lease:
            result = await lease.bash("true")
            assert result.exec is not None, result
            assert result.exec.exit_code == 0, result

    anyio.run(lease_once)
    owner = server.workspace(0).stat()  # the slot's ids own its workspace
    assert owner.st_uid != 0
    pids = keeper_processes(server)
    keepers = [pid for pid in pids if "keep" in (argv_of(pid) or [])]
    assert keepers, f"no keeper below the server: {[argv_of(pid) for pid in pids]}"
    checked = 0
    for pid in pids:
        status = status_of(pid)
        if not status:
            continue  # ended meanwhile
        if status["Uid"].split()[0] != str(owner.st_uid):
            continue  # another slot's, or a lease's own uid inside its namespace
        assert status["Uid"].split() == [str(owner.st_uid)] * 4, (pid, argv_of(pid))
        assert status["Gid"].split() == [str(owner.st_gid)] * 4, (pid, argv_of(pid))
        assert status["Groups"] == "", (pid, argv_of(pid))
        checked += 1
    assert checked >= 1
    for pid in keepers:  # every keeper runs as some slot's uid, never root
        status = status_of(pid)
        assert status["Uid"].split()[0] != "0", argv_of(pid)
        assert status["Groups"] == "", argv_of(pid)


def test_control_the_server_itself_reads_as_root(server: Server) -> None:
    status = status_of(server.pid)
    assert status["Uid"].split() == ["0"] * 4


def test_the_entrypoint_waits_for_children_without_a_thread_each() -> None:
    """In a fresh interpreter set up as the server sets itself up, a running child adds no
    thread (asyncio's default watcher on 3.11 starts one per child). Control: without the set
    up, the same child does."""
    script = (
        "import asyncio, sys, threading\n"
        "from trajcore.entrypoints.slot_server import wait_for_children_by_pidfd\n"
        "if sys.argv[1] == 'pidfd': assert wait_for_children_by_pidfd()\n"
        "async def main():\n"
        "    child = await asyncio.create_subprocess_exec('/bin/sleep', '0.3')\n"
        "    print(threading.active_count())\n"
        "    await child.wait()\n"
        "    assert child.returncode == 0, child.returncode\n"
        "asyncio.run(main())\n"
    )

    def threads(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, timeout=60, check=True
        )
        return int(done.stdout)

    if sys.version_info >= (3, 12):
        pytest.skip("asyncio itself waits by pidfd from 3.12")
    assert threads("pidfd") == 1
    assert threads("default") == 2
