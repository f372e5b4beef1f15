"""Host kernel settings and capabilities from inside a lease (attack classes 1 and 2).

The attacker opens host-wide kernel settings for writing and holds them open (it never writes
one); the host reads the attacker's ``/proc/<pid>/fd`` links and ``fdinfo`` flags to see whether
it holds a procfs setting open for writing. The capability attack drops every capability and
calls ``unshare(CLONE_NEWUSER | CLONE_NEWNET)``; the host reads ``CapEff`` from the attacker's
``/proc/<pid>/status``.
"""

from __future__ import annotations

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
    kit_processes,
    leased,
    needs_root,
    open_files,
    server_root,
    spawn_kit,
    start_server,
    status_of,
    stop_server,
    token,
    wait_for,
)

# (the path opened, the tail its descriptor's link shows: the lease's own /proc is another
# mount, so the host may see the link relative to it)
SETTINGS = {
    "core_pattern": ("/proc/sys/kernel/core_pattern", "sys/kernel/core_pattern"),
    "drop_caches": ("/proc/sys/vm/drop_caches", "sys/vm/drop_caches"),
    "sysrq_trigger": ("/proc/sysrq-trigger", "sysrq-trigger"),
    "irq_affinity": ("/proc/irq/default_smp_affinity", "irq/default_smp_affinity"),
}


def held_for_writing(pid: int, tail: str) -> bool:
    """Whether ``pid`` holds a procfs file ending in ``tail`` open for writing."""
    return any(
        f.writable and f.fstype == "proc" and f.target.endswith(tail) for f in open_files(pid)
    )


# with allow_network the lease shares the host's network namespace: its settings are the host's
NETWORK_SETTING = ("/proc/sys/net/ipv4/ip_default_ttl", "sys/net/ipv4/ip_default_ttl")
CONTROLLED = {**SETTINGS, "net_default_ttl": NETWORK_SETTING}


def host_has(path: str) -> None:
    if not Path(path).exists():
        pytest.skip(f"this kernel has no {path}: nothing to attack or to control")


def holder_pid(marker: str) -> int:
    (pid,) = kit_processes(marker)
    return pid


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_host_kernel_settings_cannot_be_opened_for_writing(
    server: Server, kit: Path, setting: str
) -> None:
    path, tail = SETTINGS[setting]
    host_has(path)
    marker = token()

    async def main() -> bool:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit hold {marker} ready-{marker} {path} >/dev/null 2>&1 &)")
            if not attack_finished(lease.workspace, marker):
                return False  # stopped mid-attack: nothing is held
            pid = holder_pid(marker)
            try:
                return held_for_writing(pid, tail)
            finally:
                end([pid])

    assert not anyio.run(main), f"a lease holds {path} open for writing"


@pytest.mark.parametrize("setting", list(CONTROLLED))
def test_control_the_check_sees_a_setting_held_for_writing(
    kit: Path, tmp_path: Path, setting: str
) -> None:
    """The same kit, unsandboxed as the server's user: it opens the setting for writing (and
    writes nothing), and the host check sees it."""
    needs_root("only root may open a host kernel setting for writing")
    path, tail = CONTROLLED[setting]
    host_has(path)
    marker = token()
    process = spawn_kit(kit, ["hold", marker, f"ready-{marker}", path], tmp_path)
    try:
        wait_for(tmp_path / f"ready-{marker}")
        assert held_for_writing(process.pid, tail)
    finally:
        end_and_reap(process)


@pytest.fixture(scope="module")
def network_server() -> Iterator[Server]:
    """A slot server whose slots share the host's network (``--allow-network``)."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("network") as root:
        running = start_server(root, "--allow-network")
        yield running
        stop_server(running)


def test_with_network_allowed_host_network_settings_cannot_be_opened_for_writing(
    network_server: Server, kit: Path
) -> None:
    server = network_server
    path, tail = NETWORK_SETTING
    marker = token()

    async def main() -> bool:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit hold {marker} ready-{marker} {path} >/dev/null 2>&1 &)")
            if not attack_finished(lease.workspace, marker):
                return False
            pid = holder_pid(marker)
            try:
                return held_for_writing(pid, tail)
            finally:
                end([pid])

    assert not anyio.run(main), f"a lease with network allowed holds {path} open for writing"


def regained(pid: int) -> bool:
    status = status_of(pid)
    return int(status["CapEff"], 16) != 0 or int(status["CapPrm"], 16) != 0


def test_a_lease_cannot_regain_capabilities_in_a_new_user_namespace(
    server: Server, kit: Path
) -> None:
    marker = token()

    async def main() -> tuple[bool, dict[str, str]]:
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit regain {marker} ready-{marker} >/dev/null 2>&1 &)")
            if not attack_finished(lease.workspace, marker):
                return False, {}  # stopped mid-attack: it holds nothing
            pid = holder_pid(marker)
            try:
                return regained(pid), status_of(pid)
            finally:
                end([pid])

    caps, status = anyio.run(main)
    assert not caps, f"CapEff {status.get('CapEff')} CapPrm {status.get('CapPrm')} after unshare"


def test_control_the_check_sees_regained_capabilities(kit: Path, tmp_path: Path) -> None:
    """Unsandboxed, the kit drops every capability and gets them all back in a new user
    namespace: the host reads a non-zero ``CapEff``."""
    marker = token()
    process = spawn_kit(kit, ["regain", marker, f"ready-{marker}"], tmp_path)
    try:
        wait_for(tmp_path / f"ready-{marker}")
        assert regained(process.pid)
    finally:
        end_and_reap(process)
