"""State that crosses from the host, another slot or an earlier lease into a lease (class 3).

- Keys: a key the test adds to its own session keyring (which the slot server inherits, as it
  inherits whatever starts it) must not be readable in a lease; a key a lease adds must not be
  readable by the next lease of its slot or by another slot. The check is whether the key's
  random payload shows up in the reading lease's workspace, read as a host directory.
- Network namespace state: ``net.ipv4.ip_default_ttl`` set by one lease must not be what the next
  lease of the slot sees; the host reads it from inside the later lease's network namespace.
- Files and processes: a reset must end every process (host ``/proc``) and leave no file of the
  lease in the next one's ``/tmp``, ``/dev/shm`` or workspace (read by the host through
  ``/proc/<pid>/root`` of a process of the next lease).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Lease,
    Server,
    add_session_key,
    attack_finished,
    end,
    end_and_reap,
    find_session_key,
    kit_process,
    kit_processes,
    leased,
    needs_root,
    remove_key,
    spawn_kit,
    start_sleeper,
    token,
    wait_for,
)


def needs_keyring(session_keyring: int | None) -> None:
    if session_keyring is None:
        pytest.skip("keyring system calls are only wired up here for x86_64 and aarch64")


async def dump_keys(lease: Lease, kit: Path) -> bytes:
    """What a lease can read from every keyring it reaches, as the host finds it in the
    workspace (the payloads are random: they can only be there if the lease read them)."""
    await lease.install_kit(kit)
    await lease.bash("./kit keys-dump loot.txt")
    loot = lease.workspace / "loot.txt"
    assert loot.exists(), "the key dump did not run"
    return loot.read_bytes()


def test_a_host_key_is_not_readable_in_a_lease(
    server: Server, kit: Path, session_keyring: int | None
) -> None:
    needs_keyring(session_keyring)
    payload = secrets.token_hex(16)
    serial = add_session_key(f"trajcore-canary-{token()}", payload.encode())

    async def main() -> bytes:
        async with server.client() as client, leased(server, client, 2) as lease:
            return await dump_keys(lease, kit)

    try:
        loot = anyio.run(main)
    finally:
        remove_key(serial)
    assert payload.encode() not in loot, "a lease read a key of the host's session keyring"


def test_control_a_host_key_is_readable_unsandboxed(
    kit: Path, tmp_path: Path, session_keyring: int | None
) -> None:
    needs_keyring(session_keyring)
    payload = secrets.token_hex(16)
    serial = add_session_key(f"trajcore-canary-{token()}", payload.encode())
    try:
        subprocess.run([str(kit), "keys-dump", "loot.txt"], cwd=tmp_path, check=True, timeout=10)
    finally:
        remove_key(serial)
    assert payload.encode() in (tmp_path / "loot.txt").read_bytes()


def test_a_key_added_by_a_lease_reaches_neither_the_next_lease_nor_another_slot(
    server: Server, kit: Path, session_keyring: int | None
) -> None:
    needs_keyring(session_keyring)
    payload = secrets.token_hex(16)
    description = f"trajcore-lease-key-{token()}"

    async def main() -> tuple[bytes, bytes]:
        async with server.client() as client:
            async with leased(server, client, 3) as first:
                await first.install_kit(kit)
                await first.bash(f"./kit keys-add {description} {payload}")
                async with leased(server, client, 2) as neighbour:
                    beside = await dump_keys(neighbour, kit)
            async with leased(server, client, 3) as second:
                after = await dump_keys(second, kit)
        return beside, after

    try:
        beside, after = anyio.run(main)
    finally:
        # whatever the lease put into the keyring it shares with this process (the user
        # keyring's copy, if any, expires in two minutes)
        found = find_session_key(f"{description}-0")
        if found is not None:
            remove_key(found)
    assert payload.encode() not in beside, "another slot read a key a lease added"
    assert payload.encode() not in after, "the next lease of the slot read a key a lease added"


def test_control_a_key_added_by_one_process_is_read_by_the_next(
    kit: Path, tmp_path: Path, session_keyring: int | None
) -> None:
    """Two unsandboxed processes sharing a session keyring (the test's own; the user keyring is
    left alone, as it is shared by every process of the user)."""
    needs_keyring(session_keyring)
    payload = secrets.token_hex(16)
    description = f"trajcore-control-key-{token()}"
    try:
        subprocess.run(
            [str(kit), "keys-add", description, payload, "session-only"], check=True, timeout=10
        )
        subprocess.run([str(kit), "keys-dump", "loot.txt"], cwd=tmp_path, check=True, timeout=10)
    finally:
        found = find_session_key(f"{description}-0")
        if found is not None:
            remove_key(found)
    assert payload.encode() in (tmp_path / "loot.txt").read_bytes()


# ----------------------------------------------------------------------------- network state


def ttl_seen_by(kit: Path, pid: int) -> int:
    """``net.ipv4.ip_default_ttl`` in ``pid``'s network namespace, read by a host process that
    enters it (reading only)."""
    out = subprocess.run(
        [str(kit), "readttl", str(pid)], capture_output=True, check=True, timeout=10
    )
    return int(out.stdout)


def test_a_network_setting_made_by_a_lease_is_not_seen_by_the_next(
    server: Server, kit: Path
) -> None:
    needs_root("the host reads the lease's setting by entering its network namespace")
    value = secrets.choice([v for v in range(70, 250) if v != 128])
    host_net = os.readlink("/proc/self/ns/net")

    async def main() -> int:
        async with server.client() as client:
            async with leased(server, client, 1) as first:
                await first.install_kit(kit)
                guard = token()
                pid = await start_sleeper(first, guard)
                # never let a sandbox write a sysctl of the host's own network namespace
                if os.readlink(f"/proc/{pid}/ns/net") == host_net:
                    end([pid])
                    pytest.fail("a lease runs in the host's network namespace with network off")
                end([pid])
                marker = token()
                await first.bash(
                    f"(./kit setttl {value} ready-{marker} here {marker} >/dev/null 2>&1 &)"
                )
                attack_finished(first.workspace, marker)
            async with leased(server, client, 1) as second:
                await second.install_kit(kit)
                marker = token()
                pid = await start_sleeper(second, marker)
                try:
                    return ttl_seen_by(kit, pid)
                finally:
                    end([pid])

    assert anyio.run(main) != value, "the next lease saw the ttl the previous lease set"


def test_control_a_network_setting_is_seen_in_its_namespace(kit: Path, tmp_path: Path) -> None:
    """Unsandboxed, the kit first enters a private network namespace (it refuses to write
    otherwise: the host's settings are never written), sets the ttl there, and the host's reader
    sees it in that namespace, and not in its own."""
    needs_root("a private network namespace and entering it need CAP_SYS_ADMIN")
    value = secrets.choice([v for v in range(70, 250) if v != 128])
    before = ttl_seen_by(kit, os.getpid())
    marker = token()
    process = spawn_kit(kit, ["setttl", str(value), f"ready-{marker}", "private", marker], tmp_path)
    try:
        wait_for(tmp_path / f"ready-{marker}")
        assert ttl_seen_by(kit, process.pid) == value
    finally:
        end_and_reap(process)
    assert ttl_seen_by(kit, os.getpid()) == before


# ----------------------------------------------------------------------------- files, processes


def files_holding(root: Path, payload: bytes) -> list[str]:
    """Files under ``root`` (not following links) whose content holds ``payload``."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                if path.is_file() and not path.is_symlink() and payload in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


def test_nothing_of_a_lease_survives_its_reset(server: Server, kit: Path) -> None:
    payload = secrets.token_hex(16)
    marker = token()
    plant = (
        f"echo {payload} > /tmp/left; echo {payload} > /dev/shm/left; echo {payload} > left; "
        f"(setsid ./kit sleeper {marker} 60 >/dev/null 2>&1 &)"
    )

    async def main() -> tuple[list[int], list[str], list[str]]:
        async with server.client() as client:
            async with leased(server, client, 0) as first:
                await first.install_kit(kit)
                await first.bash(plant)
                pid = await kit_process(marker)
                # the plant worked: the host sees the payload in the lease's own /tmp
                assert files_holding(Path(f"/proc/{pid}/root/tmp"), payload.encode())
            survivors = kit_processes(marker)
            workspace = sorted(p.name for p in first.workspace.iterdir())
            async with leased(server, client, 0) as second:
                await second.install_kit(kit)
                pid = await start_sleeper(second, token())
                try:
                    root = Path(f"/proc/{pid}/root")
                    leaks = files_holding(root / "tmp", payload.encode())
                    leaks += files_holding(root / "dev/shm", payload.encode())
                    leaks += files_holding(second.workspace, payload.encode())
                finally:
                    end([pid])
        return survivors, workspace, leaks

    try:
        survivors, workspace, leaks = anyio.run(main)
    finally:
        end(kit_processes(marker))
    assert survivors == [], "a process of the lease outlived its reset"
    assert workspace == [], f"the reset left {workspace} in the workspace"
    assert leaks == [], f"the next lease found {leaks}"


def test_control_the_checks_see_a_surviving_process_and_its_files(
    kit: Path, tmp_path: Path
) -> None:
    payload = secrets.token_hex(16)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "left").write_text(payload)
    marker = token()
    process = spawn_kit(kit, ["sleeper", marker, "30"], tmp_path)
    try:
        deadline = time.monotonic() + 10
        while not kit_processes(marker):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert kit_processes(marker) == [process.pid]
        seen = Path(f"/proc/{process.pid}/root") / str(tmp_path).lstrip("/") / "tmp"
        assert files_holding(seen, payload.encode())
    finally:
        end_and_reap(process)
