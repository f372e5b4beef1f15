"""Reaching the host's network from a lease with network off (class 9).

The test listens on the host: a TCP socket on 127.0.0.1 and an abstract Unix socket (abstract
names belong to a network namespace). A lease tries to connect to both; the host counts the
connections its listeners accepted, which must be none. Control: the same kit on the host
connects, and the listeners count it.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from tests.security.harness import Server, leased


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
