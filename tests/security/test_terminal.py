"""No process of a slot reaches the terminal its slot server was started from.

A terminal the server held could otherwise become a lease's: it could read what the operator
types, write over their screen or, without the seccomp filter, type into their shell
(``TIOCSTI``). Today no process of a slot can have one: each slot's bubblewrap starts in a session
of its own, bubblewrap's ``--new-session`` makes the keeper lead another, and every command a
lease's agent starts leads one more, none with a controlling terminal. Whoever changes how slots
are grouped into sessions (one session per slot or per server would spare the kernel a
scheduling group per command on a kernel with autogroups; docs/sandbox.md, "Isolation", on
scheduling) must keep this test passing. Here the server is started with a terminal, in both
places a server meets one: as a member of a terminal's session (run from a shell) and as the
session's leader (a container's first process run with ``-t``). In a leased slot, ``/dev/tty``
must not open, and the host reads from ``/proc`` that a process the lease left, and the lease's
agent, have no controlling terminal; the server must still serve afterwards. Control: before the
server starts, the launcher checks that a child of its own, started as the server is, opens the
terminal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    bwrap_missing,
    compiler,
    end,
    kit_processes,
    lease_init_of,
    leased,
    server_root,
    start_server,
    start_sleeper,
    stop_server,
    token,
)
from trajcore.domain.tools import ToolResult
from trajcore.testing.processes import stat_fields

# Makes a new pseudo-terminal the controlling terminal of a new session, checks that a child
# reaches it (the control), then runs the server as that session's leader (``leads``: exec) or
# as a member of it (``member``: a child, SIGTERM passed on).
LAUNCHER = """
import fcntl, os, signal, subprocess, sys, termios
mode, argv = sys.argv[1], sys.argv[2:]
terminal, follower = os.openpty()
os.setsid()
fcntl.ioctl(follower, termios.TIOCSCTTY, 0)
os.close(follower)
subprocess.run([sys.executable, "-c", "import os; os.close(os.open('/dev/tty', os.O_RDWR))"],
               check=True, timeout=30)
if mode == "leads":
    os.set_inheritable(terminal, True)
    os.execv(argv[0], argv)
child = subprocess.Popen(argv)
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
sys.exit(child.wait())
"""
TTY_NR = 4  # stat_fields index of proc(5)'s field 7, the controlling terminal (0: none)


@pytest.mark.parametrize("place", ["member", "leads"])
def test_no_process_of_a_slot_reaches_the_terminal_its_server_was_started_from(
    place: str, kit: Path
) -> None:
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    marker = token()

    async def main() -> tuple[ToolResult, str, str, ToolResult]:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.install_kit(kit)
            sleeper = await start_sleeper(lease, marker)
            left, agent = stat_fields(sleeper), stat_fields(lease_init_of(sleeper))
            assert left is not None, "the lease's process ended early"
            assert agent is not None, "the lease's agent ended early"
            opened = await lease.bash("exec 3<>/dev/tty && echo reached-the-terminal")
            end(kit_processes(marker))
        async with server.client() as client, leased(server, client, 1) as later:
            after = await later.bash("echo still-serving")
        return opened, left[TTY_NR], agent[TTY_NR], after

    with server_root(f"tty-{place}") as root:
        server = start_server(root, prefix=[sys.executable, "-c", LAUNCHER, place])
        try:
            opened, sleeper_tty, agent_tty, after = anyio.run(main)
            assert server.process.poll() is None, "the server ended on giving up its terminal"
        finally:
            stop_server(server)
    assert "reached-the-terminal" not in opened.content, opened
    assert opened.exec is not None
    assert opened.exec.exit_code != 0, opened
    assert sleeper_tty == "0", f"a lease's process has controlling terminal {sleeper_tty}"
    assert agent_tty == "0", f"a lease's agent has controlling terminal {agent_tty}"
    assert after.content == "still-serving\n", after
