"""A lease cannot fill the host's disk: its writable area has a budget of bytes and of files.

The server here has a budget of 8 MiB and 200 files per lease (``--disk-bytes``,
``--disk-files``); each file one process writes is also capped (``--max-file-bytes``, 2 MiB),
so the attack is the one that cap leaves open: many files, each under it.

- Bytes: a lease writes 1 MiB files, one every 10 ms, up to 400 MiB, then sleeps. The host
  reads the slot's workspace: it must hold far less than 400 MiB once the call is answered,
  and the answer must name the budget (``disk budget of 8388608 bytes (disk_bytes)``), before
  the call's limit. A later call of the same lease fails with the same reason; the reset
  empties the workspace (read from the host) and the next lease of the slot writes again.
- Files: a lease makes 5000 empty files: the answer names ``disk budget of 200 files``.
- Control, alongside: in the same batch as the byte attack, another slot's lease writes a
  1 MiB file and keeps running for 2 s; it ends normally (exit 0) and its next call runs.
- Control for the check itself: the same writer run on the host (a plain subprocess of the
  test, in a temporary directory) writes its whole 40 MiB; so the host-side measure of the
  workspace would see a lease that was not stopped.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    bwrap_missing,
    compiler,
    leased,
    server_root,
    start_server,
    stop_server,
)
from trajcore.domain.tools import ToolOutcome

BUDGET_BYTES = 8 << 20
BUDGET_FILES = 200
# 1 MiB files, one each 10 ms (so the watch, every 0.5 s, sees the lease long before the end)
WRITER = (
    "i=0; while [ $i -lt {count} ]; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); "
    "sleep 0.01; done; sleep 30"
)


@pytest.fixture(scope="module")
def budgeted() -> Iterator[Server]:
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("disk") as root:
        running = start_server(
            root,
            f"--disk-bytes={BUDGET_BYTES}",
            f"--disk-files={BUDGET_FILES}",
            f"--max-file-bytes={2 << 20}",
        )
        yield running
        stop_server(running)


def used_bytes(folder: Path) -> int:
    """What ``folder`` holds on disk, read from the host (allocated blocks, as ``du``)."""
    total = 0
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total


def test_the_writer_fills_a_host_directory_unbudgeted() -> None:
    """Control: outside a slot, nothing stops the writer (40 MiB of it here)."""
    with tempfile.TemporaryDirectory() as folder:
        command = WRITER.format(count=40).replace("; sleep 30", "")
        subprocess.run(["/bin/sh", "-c", command], cwd=folder, check=True, timeout=60)
        assert used_bytes(Path(folder)) >= 40 << 20


def test_a_lease_past_its_byte_budget_is_ended_naming_it(budgeted: Server) -> None:
    anyio.run(_a_lease_past_its_byte_budget_is_ended_naming_it, budgeted)


async def _a_lease_past_its_byte_budget_is_ended_naming_it(budgeted: Server) -> None:
    async with budgeted.client() as client:
        async with leased(budgeted, client, 0) as attacker, leased(budgeted, client, 1) as kept:
            attack = attacker.call("bash", 20.0, command=WRITER.format(count=400))
            control = kept.call(
                "bash", 20.0, command="head -c 1048576 /dev/zero > keep && sleep 2 && ls keep"
            )
            with anyio.fail_after(60):
                ended, alongside = await client.execute([attack, control])
            assert ended.outcome is ToolOutcome.TOOL_ERROR, ended
            assert ended.error is not None
            assert f"disk budget of {BUDGET_BYTES} bytes (disk_bytes) reached" in ended.error
            # stopped near its budget, nowhere near the 400 MiB it would have written
            assert used_bytes(attacker.workspace) < 100 << 20
            assert alongside.outcome is ToolOutcome.OK, alongside
            assert alongside.exec is not None
            assert alongside.exec.exit_code == 0
            # the lease stays ended, saying why; the control slot goes on
            again = await attacker.bash("echo still here")
            assert again.outcome is ToolOutcome.TOOL_ERROR, again
            assert again.error is not None
            assert "disk_bytes" in again.error
            written = await attacker.run("write_file", path="more.txt", content="x")
            assert written.outcome is ToolOutcome.TOOL_ERROR, written
            assert "disk_bytes" in (written.error or "")
            later = await kept.bash("head -c 1048576 /dev/zero > keep2 && echo ok")
            assert later.outcome is ToolOutcome.OK, later
            assert later.content.strip() == "ok"
        # the reset gave the space back, and the next lease of the slot writes again
        assert used_bytes(budgeted.workspace(0)) == 0
        async with leased(budgeted, client, 0) as next_lease:
            fresh = await next_lease.bash("head -c 1048576 /dev/zero > one && echo ok")
            assert fresh.outcome is ToolOutcome.OK, fresh
            assert fresh.content.strip() == "ok"


def test_a_lease_past_its_file_budget_is_ended_naming_it(budgeted: Server) -> None:
    anyio.run(_a_lease_past_its_file_budget_is_ended_naming_it, budgeted)


async def _a_lease_past_its_file_budget_is_ended_naming_it(budgeted: Server) -> None:
    client = budgeted.client()
    async with client, leased(budgeted, client, 2) as attacker:
        command = "mkdir d; i=0; while [ $i -lt 5000 ]; do : > d/f$i; i=$((i+1)); done; sleep 30"
        with anyio.fail_after(60):
            ended = await attacker.bash(command, timeout_s=10.0)
        assert ended.outcome is ToolOutcome.TOOL_ERROR, ended
        assert ended.error is not None
        assert f"disk budget of {BUDGET_FILES} files (disk_files) reached" in ended.error
    assert not any(budgeted.workspace(2).iterdir())


def test_files_written_by_write_file_count_against_the_budget(budgeted: Server) -> None:
    anyio.run(_files_written_by_write_file_count_against_the_budget, budgeted)


async def _files_written_by_write_file_count_against_the_budget(budgeted: Server) -> None:
    """``write_file`` runs in the server, not in the lease: what it writes counts the same."""
    client = budgeted.client()
    async with client, leased(budgeted, client, 3) as lease:
        for index in range(10):  # 10 MiB, each file under the file cap
            written = await lease.run("write_file", path=f"w{index}", content="a" * (1 << 20))
            assert written.outcome is ToolOutcome.OK, written
        result = None
        with anyio.fail_after(30):
            while result is None or result.outcome is ToolOutcome.OK:
                await anyio.sleep(0.2)
                result = await lease.run("write_file", path="small", content="x")
        assert result.outcome is ToolOutcome.TOOL_ERROR, result
        assert "disk_bytes" in (result.error or "")
