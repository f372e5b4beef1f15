"""Memory a lease holds outside its processes' address space (the threat list's "memory").

A slot's memory limit (256 MiB here) is a cgroup's where the server can make one, and rlimits
otherwise. Files in a tmpfs and memory files (``memfd_create``) are memory no process maps, so
no rlimit counts them; these tests fill them from a lease and read, from the host, how much
the lease ends up holding:

- Without cgroups (``--no-cgroups``), ``/tmp`` and ``/dev/shm`` are one tmpfs sized at a
  quarter of the limit: the files a lease writes into both (300 MiB each, more than the limit)
  are read through ``/proc/<pid>/root`` of a process of the lease and must fit that budget.
  Control: an unsized tmpfs (mounted in a mount namespace of the test's own) takes the whole
  300 MiB, and the same read sees it.
- Without cgroups, the budget is carved out of the limit: after filling ``/dev/shm``, a process
  that touches 224 MiB must not get it (``RLIMIT_AS`` is the limit less the budget); the host
  adds the process's resident memory (``VmRSS``) to the tmpfs's use, which must stay within
  the limit. Control: the same on the host under ``prlimit --as`` of the whole limit and an
  unsized tmpfs passes it.
- Without cgroups, a memory file is refused: the host sums the sizes of the memory files the
  attacker holds (``/proc/<pid>/fd`` links to ``/memfd:``), which must fit the budget. Control:
  the same kit on the host under ``prlimit --as`` of the limit holds 300 MiB in one.
- With a memory cgroup (the suite's main server, where the host lets it make one), the pages of
  the lease's tmpfs and memory files are charged to the slot: the host reads the usage of the
  attacker's memory cgroup (``memory.usage_in_bytes`` on v1, ``memory.current`` on v2) before
  and after the lease writes 40 MiB into each. Control: a cgroup the test makes itself sees a
  host process's tmpfs and memory-file pages the same way (skipped where the test cannot make
  one).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    MEMORY_MB,
    Server,
    attack_finished,
    bwrap_missing,
    compiler,
    end,
    end_and_reap,
    kit_process,
    kit_processes,
    leased,
    needs_root,
    server_root,
    start_server,
    start_sleeper,
    status_of,
    stop_server,
    token,
    wait_for,
)
from trajcore.adapters.slot_server.limits import tmpfs_budget
from trajcore.domain.isolation import SlotIsolation

LIMIT = MEMORY_MB << 20
_budget = tmpfs_budget(SlotIsolation(memory_bytes=LIMIT))
assert _budget is not None
BUDGET = _budget.size_bytes
FILL_MB = 300  # more than the slot's whole limit
HOLD_MB = 224  # fits the limit, not the limit less the tmpfs budget
CHARGE_MB = 40  # per tmpfs and memory file, in the cgroup test: both within the budget


@pytest.fixture(scope="module")
def no_cgroup_server() -> Iterator[Server]:
    """A slot server with cgroups off: rlimits and the tmpfs budget bound a slot's memory."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("memory") as root:
        running = start_server(root, "--no-cgroups")
        yield running
        stop_server(running)


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tmpfs_used(folder: Path) -> int:
    """Bytes in use on the filesystem of ``folder``."""
    info = os.statvfs(folder)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def resident(pid: int) -> int:
    """``pid``'s resident memory, in bytes."""
    return int(status_of(pid).get("VmRSS", "0 kB").split()[0]) << 10


def memory_files_held(pid: int) -> int:
    """Bytes in the memory files (``memfd_create``) that ``pid`` holds open."""
    total = 0
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(entry).startswith("/memfd:"):
                total += entry.stat().st_size
    return total


# ------------------------------------------------------------------- the tmpfs, without cgroups


def test_tmp_and_dev_shm_hold_at_most_their_budget_without_cgroups(
    no_cgroup_server: Server, kit: Path
) -> None:
    server = no_cgroup_server
    marker = token()
    fill = f"head -c {FILL_MB}M /dev/zero > /dev/shm/fill; head -c {FILL_MB}M /dev/zero > /tmp/fill"

    async def main() -> tuple[int, int]:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"{fill}; true", timeout_s=60)
            pid = await start_sleeper(lease, marker)
            try:
                root = Path(f"/proc/{pid}/root")
                files = size_of(root / "dev/shm/fill") + size_of(root / "tmp/fill")
                return files, tmpfs_used(root / "tmp")
            finally:
                end([pid])

    files, used = anyio.run(main)
    assert files > BUDGET // 2, "the lease did not fill its tmpfs: the attack did not run"
    assert files <= BUDGET, f"/tmp and /dev/shm hold {files >> 20} MiB: over the budget"
    assert used <= BUDGET
    assert files < LIMIT


@contextlib.contextmanager
def unsized_tmpfs(folder: Path, marker: str, then: list[str]) -> Iterator[int]:
    """A host shell in a mount namespace of its own that mounts a tmpfs (no ``size=``) on
    ``folder``, fills it with ``FILL_MB`` MiB and execs ``then`` (a kit command carrying
    ``marker``); yields the kit's pid."""
    needs_root("mounting a tmpfs, in a mount namespace of the test's own")
    folder.mkdir()
    script = (
        f"mount -t tmpfs none '{folder}' && head -c {FILL_MB}M /dev/zero > '{folder}/fill' && "
        'exec "$@"'
    )
    argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
    process = subprocess.Popen(
        [*argv, *then], cwd=folder.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while process.pid not in kit_processes(marker):
            assert process.poll() is None, "the control's shell ended early"
            assert time.monotonic() < deadline, "the control's kit never started"
            time.sleep(0.05)
        yield process.pid
    finally:
        end_and_reap(process)


def test_control_an_unsized_tmpfs_takes_more_than_the_limit(kit: Path, tmp_path: Path) -> None:
    marker = token()
    folder = tmp_path / "scratch"
    with unsized_tmpfs(folder, marker, [str(kit), "sleeper", marker, "30"]) as pid:
        seen = Path(f"/proc/{pid}/root") / str(folder).lstrip("/")
        assert size_of(seen / "fill") > LIMIT


# ------------------------------------------------- files and a process together, without cgroups


def test_files_and_a_process_together_stay_within_the_limit_without_cgroups(
    no_cgroup_server: Server, kit: Path
) -> None:
    server = no_cgroup_server
    marker = token()

    async def main() -> tuple[int, int]:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"head -c {FILL_MB}M /dev/zero > /dev/shm/fill; true", timeout_s=60)
            hold = f"./kit memhold {marker} ready-{marker} {HOLD_MB}"
            await lease.bash(f"({hold} >/dev/null 2>&1 &)")
            assert attack_finished(lease.workspace, marker, timeout_s=30)
            pid = await kit_process(marker)
            try:
                return resident(pid), tmpfs_used(Path(f"/proc/{pid}/root/dev/shm"))
            finally:
                end([pid])

    held, used = anyio.run(main)
    assert used > BUDGET // 2, "the lease did not fill /dev/shm: the attack did not run"
    assert held + used <= LIMIT, (
        f"a process holds {held >> 20} MiB beside {used >> 20} MiB of files: over the limit"
    )


def test_control_a_process_beside_unsized_files_passes_the_limit(kit: Path, tmp_path: Path) -> None:
    marker = token()
    hold = ["prlimit", f"--as={LIMIT}", "--", str(kit), "memhold", marker, f"ready-{marker}"]
    with unsized_tmpfs(tmp_path / "scratch", marker, [*hold, str(HOLD_MB)]) as pid:
        wait_for(tmp_path / f"ready-{marker}", timeout_s=30)
        used = tmpfs_used(Path(f"/proc/{pid}/root") / str(tmp_path / "scratch").lstrip("/"))
        assert resident(pid) + used > LIMIT


# ------------------------------------------------------------ memory files, without cgroups


def test_a_memory_file_cannot_hold_memory_past_the_budget_without_cgroups(
    no_cgroup_server: Server, kit: Path
) -> None:
    server = no_cgroup_server
    marker = token()

    async def main() -> int:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit memfd {marker} ready-{marker} {FILL_MB} >/dev/null 2>&1 &)")
            assert attack_finished(lease.workspace, marker, timeout_s=30)
            pid = await kit_process(marker)
            try:
                return memory_files_held(pid)
            finally:
                end([pid])

    held = anyio.run(main)
    assert held <= BUDGET, f"a lease holds {held >> 20} MiB in memory files"


def test_control_a_memory_file_passes_an_address_space_limit(kit: Path, tmp_path: Path) -> None:
    marker = token()
    argv = ["prlimit", f"--as={LIMIT}", "--", str(kit), "memfd", marker, f"ready-{marker}"]
    process = subprocess.Popen(
        [*argv, str(FILL_MB)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(tmp_path / f"ready-{marker}", timeout_s=30)
        assert memory_files_held(process.pid) > LIMIT
    finally:
        end_and_reap(process)


# ------------------------------------------------------------------------ with a memory cgroup


def memory_usage_file(pid: int) -> Path | None:
    """The file that counts the memory of ``pid``'s memory cgroup (v1 or v2), or ``None``."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.usage_in_bytes"
            return found if found.exists() else None
        if controllers == "":
            found = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.current"
            if found.exists():
                return found
    return None


def charge(usage: Path) -> int:
    return int(usage.read_text())


def test_with_a_memory_cgroup_tmpfs_and_memory_file_pages_count_against_the_slot(
    server: Server, kit: Path
) -> None:
    capabilities = server.ready.get("capabilities")
    if not isinstance(capabilities, dict) or capabilities.get("cgroups") is not True:
        pytest.skip("this host gives the slot server no cgroups")
    marker, writer = token(), token()

    async def main() -> tuple[Path, int, int]:
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.install_kit(kit)
            sleeper = await start_sleeper(lease, marker)
            usage = memory_usage_file(sleeper)
            if usage is None:
                end([sleeper])
                pytest.skip("the slot server has no memory cgroup here (pids only)")
            before = charge(usage)
            fill = f"head -c {CHARGE_MB}M /dev/zero > /dev/shm/fill"
            hold = f"./kit memfd {writer} ready-{writer} {CHARGE_MB}"
            await lease.bash(f"{fill}; ({hold} >/dev/null 2>&1 &)", timeout_s=30)
            assert attack_finished(lease.workspace, writer, timeout_s=30)
            try:
                return usage, before, charge(usage)
            finally:
                end(kit_processes(marker) + kit_processes(writer))

    usage, before, after = anyio.run(main)
    assert "slot-" in str(usage), f"the lease's memory cgroup is not its slot's: {usage}"
    assert after - before >= (2 * CHARGE_MB - 8) << 20, (
        f"the slot's cgroup was charged {(after - before) >> 20} MiB for {2 * CHARGE_MB} MiB"
    )


@contextlib.contextmanager
def own_memory_cgroup() -> Iterator[Path]:
    """A memory cgroup the test makes under its own (v1, or v2 where its parent delegates
    memory), removed afterwards; skips where the host does not let it."""
    needs_root("making a cgroup")
    name = f"trajcore-test-{token()}"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            break
        if controllers == "":
            parent = Path("/sys/fs/cgroup") / path.lstrip("/")
            if "memory" in (parent / "cgroup.subtree_control").read_text().split():
                break
    else:
        pytest.skip("no memory cgroup this test may make a child of")
    folder = parent / name
    try:
        folder.mkdir()
    except OSError as error:
        pytest.skip(f"the host does not let a test make a memory cgroup: {error}")
    try:
        yield folder
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                folder.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_control_a_cgroup_sees_tmpfs_and_memory_file_pages(kit: Path, tmp_path: Path) -> None:
    marker = token()
    with own_memory_cgroup() as group:
        usage = group / ("memory.usage_in_bytes" if "memory" in group.parts else "memory.current")
        folder = tmp_path / "scratch"
        folder.mkdir()
        script = (
            f'echo $$ > "{group}/cgroup.procs" && mount -t tmpfs none "{folder}" && '
            f'head -c {CHARGE_MB}M /dev/zero > "{folder}/fill" && exec "$@"'
        )
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
        kit_argv = [str(kit), "memfd", marker, f"ready-{marker}", str(CHARGE_MB)]
        process = subprocess.Popen(
            [*argv, *kit_argv], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for(tmp_path / f"ready-{marker}", timeout_s=30)
            assert charge(usage) >= (2 * CHARGE_MB - 8) << 20
        finally:
            end_and_reap(process)
