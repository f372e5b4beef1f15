"""Reaching the host's network from a lease with network off (class 9).

The test listens on the host: a TCP socket on 127.0.0.1 and an abstract Unix socket (abstract
names belong to a network namespace). A lease tries to connect to both; the host counts the
connections its listeners accepted, which must be none. Control: the same kit on the host
connects, and the listeners count it. The socket families a lease may open at all are below.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    attack_finished,
    end,
    end_and_reap,
    kit_process,
    leased,
    needs_root,
    spawn_kit,
    token,
    wait_for,
)


@contextmanager
def listeners() -> Iterator[tuple[socket.socket, socket.socket, int, str]]:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    name = f"trajcore-canary-{secrets.token_hex(8)}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + name)
    unix.listen(8)
    try:
        yield tcp, unix, tcp.getsockname()[1], name
    finally:
        tcp.close()
        unix.close()


def accepted(listener: socket.socket, settle_s: float = 0.3) -> int:
    """Connections waiting on ``listener`` (accepted and closed here)."""
    time.sleep(settle_s)
    listener.setblocking(False)
    count = 0
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


def test_a_lease_cannot_connect_to_the_host(server: Server, kit: Path) -> None:
    with listeners() as (tcp, unix, port, name):

        async def main() -> None:
            async with server.client() as client, leased(server, client, 3) as lease:
                await lease.install_kit(kit)
                await lease.bash(f"./kit connect 127.0.0.1 {port}; ./kit connect @{name}")

        anyio.run(main)
        assert accepted(tcp) == 0, "a lease reached a TCP listener on the host's loopback"
        assert accepted(unix) == 0, "a lease reached an abstract Unix socket of the host"


def test_control_the_listeners_count_a_host_connection(kit: Path) -> None:
    with listeners() as (tcp, unix, port, name):
        subprocess.run([str(kit), "connect", "127.0.0.1", str(port)], check=True, timeout=10)
        subprocess.run([str(kit), "connect", f"@{name}"], check=True, timeout=10)
        assert accepted(tcp) == 1
        assert accepted(unix) == 1


# ------------------------------------------------------------------------------ socket families
#
# A lease with network off may open sockets of the families its own namespaces confine (Unix,
# IPv4 and IPv6 on its own loopback, netlink of its own network namespace) and no other: vsock
# is not namespaced at all (a lease's bind takes the host's port, and on a VM host a connection
# reaches the hypervisor), packet sockets and the rest reach past the lease. The kit opens a
# socket of every family and type the kernel grants and holds them, and binds a vsock port; the
# host takes each held socket with ``pidfd_getfd`` and asks its family (``SO_DOMAIN``), and
# tries to bind the same vsock port itself. Control: the same kit on the host holds a vsock
# socket (and, as root, a packet socket), and the port is taken.

CONFINED_FAMILIES = {socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK}
_SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}


def held_families(pid: int) -> set[int]:
    """The family of every socket ``pid`` holds, each read through a copy of its descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = _SYS_PIDFD_GETFD[platform.machine()]
    families = set()
    pidfd = os.pidfd_open(pid)
    try:
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if not os.readlink(entry).startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = int(libc.syscall(number, pidfd, int(entry.name), 0))
            if fd < 0:
                error = ctypes.get_errno()
                raise OSError(error, f"pidfd_getfd: {os.strerror(error)}")
            try:
                family, size = ctypes.c_int(), ctypes.c_uint(ctypes.sizeof(ctypes.c_int))
                asked = libc.getsockopt(
                    fd,
                    socket.SOL_SOCKET,
                    socket.SO_DOMAIN,
                    ctypes.byref(family),
                    ctypes.byref(size),
                )
                if asked != 0:
                    raise OSError(ctypes.get_errno(), "getsockopt(SO_DOMAIN)")
                families.add(family.value)
            finally:
                os.close(fd)
    finally:
        os.close(pidfd)
    return families


def vsock_port_free(port: int) -> bool:
    """Whether this host can bind ``port`` on any vsock CID (a listener elsewhere takes it)."""
    probe = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        probe.bind((socket.VMADDR_CID_ANY, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return False
        raise
    finally:
        probe.close()
    return True


def host_vsock() -> None:
    """Skip where this host has no vsock transport: then no lease reaches one either."""
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
    except (AttributeError, OSError) as error:
        pytest.skip(f"this host has no vsock ({error}): the control could not show the attack")


def free_vsock_port() -> int:
    for _ in range(20):
        port = secrets.randbelow(50_000) + 10_000
        if vsock_port_free(port):
            return port
    pytest.fail("no free vsock port found")


def test_a_lease_opens_only_sockets_its_namespaces_confine(server: Server, kit: Path) -> None:
    needs_root("reading another uid's sockets through pidfd_getfd")
    host_vsock()
    marker = token()
    port = free_vsock_port()

    async def main() -> tuple[set[int], bool]:
        async with server.client() as client, leased(server, client, 3) as lease:
            await lease.install_kit(kit)
            attack = f"./kit sockets {marker} ready-{marker} {port}"
            await lease.bash(f"({attack} >/dev/null 2>&1 &)")
            assert attack_finished(lease.workspace, marker)
            pid = await kit_process(marker)
            try:
                return held_families(pid), vsock_port_free(port)
            finally:
                end([pid])

    families, port_free = anyio.run(main)
    assert families <= CONFINED_FAMILIES, f"a lease holds sockets of families {families}"
    assert port_free, "a lease took a vsock port from the host"
    # the scan saw the lease's sockets: every confined family still works
    assert families == CONFINED_FAMILIES


def test_control_the_kit_holds_a_vsock_socket_and_port_on_the_host(
    kit: Path, tmp_path: Path
) -> None:
    needs_root("reading the kit's sockets through pidfd_getfd, as the lease test does")
    host_vsock()
    marker = token()
    port = free_vsock_port()
    process = spawn_kit(kit, ["sockets", marker, f"ready-{marker}", str(port)], tmp_path)
    try:
        wait_for(tmp_path / f"ready-{marker}")
        families = held_families(process.pid)
        assert socket.AF_VSOCK in families
        assert socket.AF_PACKET in families  # root holds CAP_NET_RAW here
        assert not vsock_port_free(port)
    finally:
        end_and_reap(process)
