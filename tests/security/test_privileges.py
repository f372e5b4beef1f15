"""Root-only secrets and the process limit (class 7).

- ``/etc/shadow`` (root-only on the host; the sandbox binds ``/etc`` read-only and the server's
  command line offers no other bind to put a canary in): a lease copies it into its workspace if
  it can; the host compares the copy with the real file, read on the host. The file's content is
  never printed by a failing test.
- The process limit without cgroups (``--no-cgroups``: the server then bounds processes with
  ``RLIMIT_NPROC`` only, see ``limits.rlimits_for``): a fork loop of 150 must not leave more than
  the configured 64 processes, counted from the host by walking ``/proc`` for the kit's token.
  Control: the same loop on the host under ``prlimit --nproc=64`` as root (which that limit does
  not bind) passes 64, and the count sees it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    MAX_PROCESSES,
    Server,
    attack_finished,
    bwrap_missing,
    compiler,
    end,
    end_and_reap,
    kit_processes,
    leased,
    needs_root,
    server_root,
    start_server,
    stop_server,
    token,
    wait_for,
)

SHADOW = Path("/etc/shadow")
FORKS = 150


def shadow() -> bytes:
    if not SHADOW.exists():
        pytest.skip("this host has no /etc/shadow")
    content = SHADOW.read_bytes()
    if not content:
        pytest.skip("/etc/shadow is empty here: a copy would prove nothing")
    return content


def test_a_lease_cannot_read_etc_shadow(server: Server) -> None:
    secret = shadow()

    async def main() -> bytes:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.bash("cat /etc/shadow > loot.txt 2>/dev/null; true")
            loot = lease.workspace / "loot.txt"
            assert loot.exists(), "the copy was not attempted"
            return loot.read_bytes()

    copied = secret in anyio.run(main)  # a boolean: a failure must not print the file
    assert not copied, "a lease copied /etc/shadow into its workspace"


def test_control_etc_shadow_is_copied_unsandboxed(tmp_path: Path) -> None:
    needs_root("only root reads /etc/shadow")
    secret = shadow()
    subprocess.run(
        ["/bin/sh", "-c", "cat /etc/shadow > loot.txt"], cwd=tmp_path, check=True, timeout=10
    )
    copied = secret in (tmp_path / "loot.txt").read_bytes()
    assert copied


@pytest.fixture(scope="module")
def rlimit_server() -> Iterator[Server]:
    """A slot server with cgroups off: only rlimits bound a slot's processes."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("rlimits") as root:
        running = start_server(root, "--no-cgroups")
        yield running
        stop_server(running)


@pytest.mark.slow
def test_a_fork_loop_stays_within_the_process_limit_without_cgroups(
    rlimit_server: Server, kit: Path
) -> None:
    server = rlimit_server
    marker = token()

    async def main() -> int:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit forkloop {marker} ready-{marker} {FORKS} >/dev/null 2>&1 &)")
            attack_finished(lease.workspace, marker, timeout_s=30)
            counted = len(kit_processes(marker))
            end(kit_processes(marker))
            return counted

    counted = anyio.run(main)
    assert counted <= MAX_PROCESSES, f"{counted} processes in a slot limited to {MAX_PROCESSES}"


@pytest.mark.slow
def test_control_the_count_sees_a_fork_loop_past_the_limit(kit: Path, tmp_path: Path) -> None:
    needs_root("RLIMIT_NPROC binds any other user: the unbounded case shown here is root's")
    marker = token()
    limit = f"--nproc={MAX_PROCESSES}:{MAX_PROCESSES}"
    argv = ["prlimit", limit, "--", str(kit), "forkloop", marker, f"ready-{marker}", str(FORKS)]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(tmp_path / f"ready-{marker}", timeout_s=30)
        assert len(kit_processes(marker)) > MAX_PROCESSES
    finally:
        end_and_reap(process)  # its children die with it (PR_SET_PDEATHSIG)
        deadline = time.monotonic() + 10
        while kit_processes(marker) and time.monotonic() < deadline:
            end(kit_processes(marker))
            time.sleep(0.05)
