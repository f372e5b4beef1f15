"""One slot's processes against another's (the threat list's "processes").

A process in slot 3 is the canary; the attacker in slot 2 is handed the host pids of that
process and of slot 3's lease agent (the worst case: it learnt them somehow), sends each
``SIGKILL``, and then ``kill -9 -1`` (every process it may signal). The host checks, through
``/proc``, that both of slot 3's processes still run and that slot 3 still answers. Control: the
same kit on the host, given the pid of a host sleeper, kills it and the check sees it gone.
The scheduling policy a lease may take is below.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    attack_finished,
    bwrap_missing,
    compiler,
    end,
    end_and_reap,
    kit_process,
    kit_processes,
    lease_init_of,
    leased,
    needs_root,
    running,
    server_root,
    spawn_kit,
    start_server,
    start_sleeper,
    stop_server,
    token,
    wait_for,
)
from trajcore.domain.tools import ToolResult
from trajcore.testing.processes import stat_fields


def test_a_lease_cannot_signal_another_slots_processes(server: Server, kit: Path) -> None:
    marker = token()

    async def main() -> tuple[bool, bool, ToolResult]:
        async with server.client() as client, leased(server, client, 3) as victim:
            await victim.install_kit(kit)
            sleeper = await start_sleeper(victim, marker)
            agent = lease_init_of(sleeper)
            async with leased(server, client, 2) as attacker:
                await attacker.install_kit(kit)
                await attacker.bash(f"./kit signal {sleeper} {agent}; kill -9 -1")
                await anyio.sleep(0.3)
                survived = running(sleeper), running(agent)
            after = await victim.bash("echo still-here")
            end(kit_processes(marker))
        return survived[0], survived[1], after

    sleeper_alive, agent_alive, after = anyio.run(main)
    assert sleeper_alive, "a lease killed a process of another slot"
    assert agent_alive, "a lease killed another slot's lease agent"
    assert after.content == "still-here\n", after


def test_control_the_kit_kills_a_process_it_can_reach(kit: Path, tmp_path: Path) -> None:
    marker = token()
    victim = spawn_kit(kit, ["sleeper", marker, "30"], tmp_path)
    try:
        attacker = spawn_kit(kit, ["signal", str(victim.pid)], tmp_path)
        attacker.wait(10)
        victim.wait(10)
        assert not running(victim.pid)
    finally:
        end_and_reap(victim)


# ---------------------------------------------------------------------------------- scheduling
#
# Everything in a sandbox runs under SCHED_BATCH (docs/sandbox.md), and a lease must not leave
# it: the kit switches itself to SCHED_OTHER and lowers its nice value to -10, and the host
# reads the policy and nice value it ended with from ``/proc/<pid>/stat``. For the nice value,
# the server is started with a generous ``RLIMIT_NICE`` (as systemd's ``LimitNICE=`` or a
# shell's ``ulimit -e`` would hand it one), which a lease must not inherit; that test skips
# where the test may not raise the limit. Control: the same kit on the host (root, which may
# lower its nice value), started under SCHED_BATCH, ends under SCHED_OTHER at nice -10, and the
# reads see both.

SCHED_OTHER, SCHED_BATCH = 0, 3
NICE_LIMIT = 40  # RLIMIT_NICE 40: a process may lower its nice value down to -20
RAISE_NICE_LIMIT = ["prlimit", f"--nice={NICE_LIMIT}:{NICE_LIMIT}", "--"]


@pytest.fixture(scope="module")
def generous_server() -> Iterator[Server]:
    """A slot server started with ``RLIMIT_NICE`` raised to its most."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    tried = subprocess.run(
        [*RAISE_NICE_LIMIT, "true"], check=False, capture_output=True, text=True, timeout=10
    )
    if tried.returncode != 0:
        pytest.skip(f"this test may not raise RLIMIT_NICE here: {tried.stderr.strip()}")
    with server_root("nice") as root:
        running = start_server(root, prefix=RAISE_NICE_LIMIT)
        yield running
        stop_server(running)


def scheduling_of(pid: int) -> tuple[int, int]:
    """``pid``'s scheduling policy and nice value (fields 41 and 19 of ``/proc/PID/stat``)."""
    fields = stat_fields(pid)
    assert fields is not None, f"process {pid} ended before its scheduling was read"
    return int(fields[38]), int(fields[16])


def scheduling_after_the_attack(server: Server, kit: Path) -> tuple[int, int]:
    """The policy and nice value a lease's kit ends with after trying to better both."""
    marker = token()

    async def main() -> tuple[int, int]:
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit scheduler {marker} ready-{marker} >/dev/null 2>&1 &)")
            assert attack_finished(lease.workspace, marker)
            pid = await kit_process(marker)
            try:
                return scheduling_of(pid)
            finally:
                end([pid])

    return anyio.run(main)


def test_a_lease_cannot_leave_batch_scheduling(server: Server, kit: Path) -> None:
    policy, _ = scheduling_after_the_attack(server, kit)
    assert policy == SCHED_BATCH, f"a lease left SCHED_BATCH for policy {policy}"


def test_a_lease_cannot_lower_its_nice_value_whatever_its_servers_limit(
    generous_server: Server, kit: Path
) -> None:
    policy, nice = scheduling_after_the_attack(generous_server, kit)
    assert nice >= 0, f"a lease lowered its nice value to {nice}"
    assert policy == SCHED_BATCH


def test_control_the_kit_leaves_batch_scheduling_on_the_host(kit: Path, tmp_path: Path) -> None:
    needs_root("lowering a nice value below 0 without a raised RLIMIT_NICE")
    marker = token()
    argv = ["chrt", "--batch", "0", str(kit), "scheduler", marker, f"ready-{marker}"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(tmp_path / f"ready-{marker}")
        assert scheduling_of(process.pid) == (SCHED_OTHER, -10)
    finally:
        end_and_reap(process)


# ---------------------------------------------------------------------------------- core files
#
# A crash writes a core file as large as the process's memory, which no file size limit bounds:
# a policy that crashes on purpose could fill the host's disk through its workspace. Every
# process of a slot gets ``RLIMIT_CORE`` 0 (soft and hard), whatever the server was started
# with: the server below is started with it unlimited (as ``ulimit -c unlimited`` hands it
# down), a lease raises its own soft limit as far as it may and crashes with SIGSEGV, and the
# host looks for a core file in the lease's workspace. Control: the same crash on the host,
# under the same unlimited limit, leaves one. Both need the kernel's ``core_pattern`` to name a
# file in the crashing process's folder; a host that pipes dumps to a program skips (the kernel
# does not apply the limit to pipes: docs/sandbox.md).

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
UNLIMITED_CORES = ["prlimit", "--core=unlimited:unlimited", "--"]
CRASH = "ulimit -c unlimited 2>/dev/null; ulimit -S -c unlimited 2>/dev/null; kill -SEGV $$"


def core_files_land_in_the_crashing_folder() -> None:
    try:
        pattern = CORE_PATTERN.read_text().strip()
    except OSError as error:
        pytest.skip(f"the kernel's core_pattern cannot be read here: {error}")
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core_pattern {pattern!r} does not write into the crashing process's folder")


def core_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("core"))


@pytest.fixture(scope="module")
def unlimited_core_server() -> Iterator[Server]:
    """A slot server started with ``RLIMIT_CORE`` unlimited."""
    core_files_land_in_the_crashing_folder()
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("core") as root:
        running_server = start_server(root, prefix=UNLIMITED_CORES)
        yield running_server
        stop_server(running_server)


def test_a_crashing_lease_leaves_no_core_file_whatever_its_servers_limit(
    unlimited_core_server: Server,
) -> None:
    async def main() -> tuple[list[str], str]:
        async with (
            unlimited_core_server.client() as client,
            leased(unlimited_core_server, client, 1) as lease,
        ):
            crashed = await lease.bash(f"sh -c '{CRASH}'; echo exit=$?")
            return core_files(lease.workspace), crashed.content

    found, said = anyio.run(main)
    assert "exit=139" in said, f"the crash did not happen as planned: {said!r}"
    assert found == [], f"a crashing lease wrote {found} into its workspace"


def test_control_the_same_crash_on_the_host_leaves_a_core_file(tmp_path: Path) -> None:
    core_files_land_in_the_crashing_folder()
    folder = tmp_path / "crash"
    folder.mkdir()
    done = subprocess.run(
        [*UNLIMITED_CORES, "sh", "-c", CRASH], cwd=folder, check=False, timeout=30
    )
    assert done.returncode == -11
    assert core_files(folder) != [], "the host's crash wrote no core file: the check sees nothing"
