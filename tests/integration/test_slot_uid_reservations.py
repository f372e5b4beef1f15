"""Slot servers and pools on one host never share a slot uid (``slot_uid_locks``).

Two envs side by side, or one env's several processes, each start a pool over the default base
of slot uids; before the host-wide reservations every one of them ran its slot 0 as the same
uid. Each test starts real slot servers (real bubblewrap) as root and reads the uids the slots'
commands run as.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from tests.image_source import image_problem
from trajcore.adapters.pools.container_pool import (
    DEFAULT_IMAGE,
    ContainerPoolConfig,
    ContainerSandboxPool,
    find_engine,
)
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.slot_uid_locks import SlotUidsHeld, free_base, lock_file, reserve
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE, MAX_SLOT_UID, SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.tools import ToolOutcome
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.portal_pools import slot_call

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="slots run as their own uids under root only"),
    pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap slots are Linux's"),
]

ISOLATION = SlotIsolation(require_sandbox=True, min_timeout_s=0.2)


def free_area(width: int, first: int = DEFAULT_SLOT_UID_BASE) -> int:
    """The first uid of ``width`` uids from ``first`` (or past it) that nothing on the host holds
    now: another test session's pools, or an env's, hold the default range while they run, and
    each test reads where its own pools' ranges land."""
    return free_base(first, width, limit=MAX_SLOT_UID)


def local(
    containers: int = 1, slots: int = 2, base: int = DEFAULT_SLOT_UID_BASE
) -> LocalPoolConfig:
    isolation = attrs.evolve(ISOLATION, slot_uid_base=base)
    return LocalPoolConfig(
        containers=containers,
        server=SlotServerSettings(
            slots_per_container=slots, isolation=isolation, acquire_timeout_s=60.0
        ),
    )


async def slot_uids(pool: SandboxPool, slots: int) -> list[int]:
    """The uid each of ``slots`` leases held at once runs its commands as."""
    uids: list[int] = []

    async def one(index: int) -> None:
        async with pool.lease(f"uid-{index}", timeout_s=60.0) as lease:
            (result,) = await pool.execute(
                lease.slot.container, [slot_call(lease, "bash", command="id -u", timeout_s=30)]
            )
            assert result.outcome is ToolOutcome.OK, result.content
            uids.append(int(result.content.split()[0]))
            await asyncio.sleep(0.5)  # every lease held at once: each its own slot

    await asyncio.gather(*(one(i) for i in range(slots)))
    return sorted(uids)


def test_pools_started_side_by_side_run_their_slots_as_disjoint_uids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = free_area(12)

    async def main() -> list[list[int]]:
        async with (
            LocalSandboxPool(local(containers=2, slots=2, base=base)) as first,
            LocalSandboxPool(local(containers=1, slots=3, base=base)) as second,
            LocalSandboxPool(local(containers=1, slots=1, base=base)) as third,
        ):
            return [
                await slot_uids(first, 4),
                await slot_uids(second, 3),
                await slot_uids(third, 1),
            ]

    with caplog.at_level(logging.WARNING):
        first, second, third = asyncio.run(main())
    assert first == [base, base + 1, base + 2, base + 3]  # the first pool keeps its base
    assert second == [base + 6, base + 7, base + 8]  # 0-2 and 3-5 meet the first's range
    assert third == [base + 4]  # the first free range of one past the first pool's
    moved = [r.getMessage() for r in caplog.records if "in use by another" in r.getMessage()]
    assert any(f"run as uids {base + 6}-{base + 8}" in message for message in moved), moved


def test_an_explicit_base_held_by_another_moves_and_a_base_past_the_last_uid_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = free_area(4, 1_950_000_000)
    held = reserve(base + 1, 1)  # another holder, say a slot server started by hand

    async def main() -> list[int]:
        async with LocalSandboxPool(local(slots=2, base=base)) as pool:
            return await slot_uids(pool, 2)

    try:
        with caplog.at_level(logging.WARNING):
            assert asyncio.run(main()) == [base + 2, base + 3]
        assert f"slot uids {base}-{base + 1} are in use" in caplog.text
        top = reserve(MAX_SLOT_UID - 3, 4)
        try:
            config = local(slots=4, base=MAX_SLOT_UID - 3)

            async def refused() -> None:
                async with LocalSandboxPool(config):
                    pytest.fail("a pool started with no free uids")

            with pytest.raises(ConfigError) as caught:
                asyncio.run(refused())
            assert caught.value.field == "server.isolation.slot_uid_base"
            assert "no free range of 4" in str(caught.value)
        finally:
            top.release()
    finally:
        held.release()


def start_server(folder: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A slot server run by hand in ``folder`` (its root and Unix socket), ready when this
    returns."""
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "3",
        "--root", str(folder / "root"), "--unix", str(folder / "server.sock"), *extra,
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stderr is not None
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        pytest.fail(f"slot server did not start: {process.stderr.read().decode()}")
    assert json.loads(line).get("ready") is True
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
    process.wait(30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def pool_uids_beside(server_argv: Sequence[str], base: int) -> list[int]:
    """The uids of a local pool's two slots from ``base``, started beside a server run by hand
    (its slots from ``base`` too)."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-uids-"))
    folder.chmod(0o711)  # the slots' uids reach their workspaces below it
    server = start_server(folder, "--slot-uid-base", str(base), *server_argv)
    try:

        async def main() -> list[int]:
            async with LocalSandboxPool(local(slots=2, base=base)) as pool:
                return await slot_uids(pool, 2)

        return asyncio.run(main())
    finally:
        stop(server)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_server_started_by_hand_holds_its_uids_unless_told_its_caller_does() -> None:
    base = free_area(6)
    assert pool_uids_beside([], base) == [base + 4, base + 5]  # the server holds 0-2: 2-3 meet it
    assert pool_uids_beside(["--slot-uid-lock", "none"], base) == [base, base + 1]


def test_a_server_whose_reservation_file_a_stranger_owns_refuses_to_start(
    tmp_path: Path,
) -> None:
    where = tmp_path / "run" / "slot-uids"
    where.parent.mkdir(mode=0o755)
    where.touch(mode=0o600)
    os.chown(where, 12345, 12345)
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
        "--root", str(tmp_path / "root"), "--unix", str(tmp_path / "s.sock"),
        "--slot-uid-lock", str(where),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "slot_uid_lock" in done.stderr, done.stderr
    assert "it belongs to uid 12345" in done.stderr, done.stderr


ENGINE = find_engine()
IMAGE = os.environ.get("TRAJCORE_IMAGE") or DEFAULT_IMAGE
IMAGE_PROBLEM = image_problem(ENGINE, IMAGE)


@pytest.mark.slow
@pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM))
def test_container_pools_hold_their_uids_on_the_host(tmp_path: Path) -> None:
    """A rootful engine runs a container's uids as the host's: the pool holds its range on
    the host, where a local pool beside it sees it."""

    base = free_area(5)

    def config(prefix: str) -> ContainerPoolConfig:
        return ContainerPoolConfig(
            containers=1,
            image=IMAGE,
            name_prefix=f"test-uids-{prefix}-{os.getpid()}",
            server=SlotServerSettings(
                slots_per_container=2,
                isolation=attrs.evolve(ISOLATION, slot_uid_base=base),
                acquire_timeout_s=60.0,
            ),
        )

    async def main() -> tuple[list[int], list[int], list[int]]:
        async with (
            ContainerSandboxPool(config("a")) as first,
            ContainerSandboxPool(config("b")) as second,
            LocalSandboxPool(local(slots=1, base=base)) as third,
        ):
            return (
                await slot_uids(first, 2),
                await slot_uids(second, 2),
                await slot_uids(third, 1),
            )

    first, second, third = asyncio.run(main())
    assert (first, second, third) == ([base, base + 1], [base + 2, base + 3], [base + 4])


def open_files(pid: int) -> list[str]:
    """What ``pid``'s descriptors name (read from outside, through ``/proc``)."""
    names = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            names.append(os.readlink(fd))
    return names


def test_the_local_pools_servers_keep_its_reservation_and_their_slots_never_see_it() -> None:
    where = str(lock_file())

    async def main() -> tuple[list[list[str]], str]:
        async with LocalSandboxPool(local(containers=2, slots=1)) as pool:
            servers = [open_files(pool.server_pid(name)) for name in pool.container_names()]
            async with pool.lease("fds", timeout_s=60.0) as lease:
                listing = "for f in /proc/self/fd/* /proc/1/fd/*; do readlink $f; done; true"
                (result,) = await pool.execute(
                    lease.slot.container, [slot_call(lease, "bash", command=listing)]
                )
            return servers, result.content

    servers, inside = asyncio.run(main())
    assert all(where in names for names in servers), servers  # held while any server runs
    assert "slot-uids" not in inside, inside  # no slot can lock another pool's range
    assert "/proc/self/fd" not in inside  # the listing read the descriptors (control below)
    assert "pipe:" in inside or "/dev/null" in inside, inside


ENV_PROCESS = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from tests.integration.test_slot_uid_reservations import local, slot_uids
from trajcore.adapters.pools.local_pool import LocalSandboxPool

async def main():
    async with LocalSandboxPool(local(slots=2)) as pool:
        print(await slot_uids(pool, 2), flush=True)
        time.sleep(300)

asyncio.run(main())
"""


def test_a_killed_env_leaves_its_range_held_while_its_servers_live() -> None:
    """The env process dies (SIGKILL) before its servers: until its guard has ended them, the
    servers' slots still run as the range's uids, so no new pool may take it."""
    repo = Path(__file__).resolve().parents[2]
    env = subprocess.Popen(
        [sys.executable, "-c", ENV_PROCESS, str(repo)], stdout=subprocess.PIPE, text=True
    )
    guard: int | None = None
    try:
        assert env.stdout is not None
        uids = json.loads(env.stdout.readline())
        first = uids[0]
        children = Path(f"/proc/{env.pid}/task/{env.pid}/children").read_text().split()
        guards = [int(p) for p in children if b"guard_directory" in _cmdline(int(p))]
        servers = [int(p) for p in children if b"slot_server" in _cmdline(int(p))]
        assert len(guards) == 1, children
        assert servers, children
        guard = guards[0]
        os.kill(guard, signal.SIGSTOP)  # its servers outlive the env until it goes on
        os.kill(env.pid, signal.SIGKILL)
        env.wait(10)
        with pytest.raises(SlotUidsHeld):
            reserve(first, 2)
        os.kill(guard, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in servers):
            assert time.monotonic() < deadline, "the guard did not end the servers"
            time.sleep(0.1)
        reserve(first, 2).release()  # free once the last server holding it ended
    finally:
        if guard is not None and Path(f"/proc/{guard}").exists():
            os.kill(guard, signal.SIGCONT)
        if env.poll() is None:
            os.kill(env.pid, signal.SIGKILL)
            env.wait(10)
        if env.stdout is not None:
            env.stdout.close()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
