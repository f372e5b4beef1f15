"""Forging or inflating the channel between a lease's agent and the slot server (class 4).

A background process left by one call goes after the lease's agent (pid 1 of the lease): it
steals the agent's channel with ``pidfd_getfd`` and writes a forged length-prefixed result, then
tries to become the agent's tracer (``PTRACE_SEIZE``). The next call runs ``echo <random>``: its
result, as the slot server returns it, must be that random text or an infrastructure error,
never the forged one; and the host must see no tracer on the agent (``TracerPid`` in its
``/proc/<pid>/status``). A second attack sends a frame whose header claims 320 MiB, and the whole
body after it: the slot server's peak memory (``VmHWM`` in its ``/proc/<pid>/status``, reset
through ``clear_refs`` first) must not grow by anything like that.

Controls: the slot server cannot be attacked unsandboxed without changing what is measured, so
each control puts a stand-in agent on the host (a process holding one end of a socket pair,
the test or a naive frame reader holding the other) and runs the same kit against it.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    attack_finished,
    end,
    end_and_reap,
    kit_processes,
    lease_init_of,
    leased,
    ptrace_restricted,
    spawn_kit,
    status_of,
    token,
    wait_for,
)
from trajcore.domain.tools import ToolOutcome, ToolResult

CLAIMED_MIB = 320


def agent_of(marker: str) -> int:
    """The host pid of the lease's pid 1 (its agent, the kit's target)."""
    (pid,) = kit_processes(marker)
    return lease_init_of(pid)


def no_ptrace_restriction() -> None:
    if ptrace_restricted():
        pytest.skip("Yama's ptrace_scope keeps the kit from the stand-in agent (not its child)")


def traced(pid: int) -> bool:
    return status_of(pid).get("TracerPid", "0") != "0"


def genuine(result: ToolResult, expected: str) -> bool:
    return result.outcome is ToolOutcome.INFRA_ERROR or result.content == expected


def test_a_background_process_cannot_forge_the_next_result(server: Server, kit: Path) -> None:
    forged = f"FORGED{secrets.token_hex(8)}"
    marker = token()

    async def main() -> tuple[ToolResult, ToolResult, bool, str]:
        async with server.client() as client, leased(server, client, 2) as lease:
            await lease.install_kit(kit)
            await lease.bash(f"(./kit forge 1 {forged} ready-{marker} {marker} >/dev/null 2>&1 &)")
            # a kit stopped mid-attack (killed by a filter) traces nothing
            was_traced = attack_finished(lease.workspace, marker) and traced(agent_of(marker))
            real = f"REAL{secrets.token_hex(8)}"
            first = await lease.bash(f"echo {real}")
            second = await lease.bash(f"echo {real}")
            end(kit_processes(marker))
            return first, second, was_traced, real

    first, second, was_traced, real = anyio.run(main)
    problems = [
        f"call {i}: the forged frame became its result"
        for i, result in enumerate((first, second))
        if forged in result.content
    ]
    problems += [
        f"call {i}: neither the real result nor an infrastructure error: {result}"
        for i, result in enumerate((first, second))
        if forged not in result.content and not genuine(result, f"{real}\n")
    ]
    if was_traced:
        problems.append("a process of the lease became its agent's tracer")
    assert not problems, "; ".join(problems)


def stand_in_agent() -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A host process holding one end of a socket pair (as an agent holds its channel), and
    the other end (as the slot server holds it)."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        pass_fds=[theirs.fileno()],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    theirs.close()
    return process, ours


def read_frame(channel: socket.socket) -> dict[str, object]:
    channel.settimeout(10)
    header = channel.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">I", header)
    found = json.loads(channel.recv(size, socket.MSG_WAITALL))
    assert isinstance(found, dict)
    return found


def test_control_the_kit_forges_a_frame_and_traces_an_unsandboxed_agent(
    kit: Path, tmp_path: Path
) -> None:
    no_ptrace_restriction()
    forged = f"FORGED{secrets.token_hex(8)}"
    marker = token()
    agent, channel = stand_in_agent()
    attacker = spawn_kit(
        kit, ["forge", str(agent.pid), forged, f"ready-{marker}", marker], tmp_path
    )
    try:
        wait_for(tmp_path / f"ready-{marker}")
        assert read_frame(channel)["stdout"] == f"{forged}\n"
        assert traced(agent.pid)
    finally:
        end_and_reap(attacker)
        end_and_reap(agent)
        channel.close()


def peak_kib(pid: int) -> int:
    return int(status_of(pid)["VmHWM"].split()[0])


def reset_peak(pid: int) -> None:
    """Start ``pid``'s peak resident size afresh (``clear_refs`` of the test's own child)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@pytest.mark.slow
def test_an_oversize_frame_does_not_make_the_server_allocate_it(server: Server, kit: Path) -> None:
    marker = token()

    async def main() -> tuple[ToolResult, int, int, str]:
        async with server.client() as client, leased(server, client, 3) as lease:
            await lease.install_kit(kit)
            reset_peak(server.pid)
            before = peak_kib(server.pid)
            await lease.bash(
                f"(./kit oversize 1 {CLAIMED_MIB} ready-{marker} {marker} >/dev/null 2>&1 &)"
            )
            attack_finished(lease.workspace, marker)  # the header is out, or it was stopped
            real = f"REAL{secrets.token_hex(8)}"
            result = await lease.bash(f"echo {real}", timeout_s=30)
            after = peak_kib(server.pid)
            end(kit_processes(marker))
            return result, before, after, real

    result, before, after, real = anyio.run(main)
    grown_mib = (after - before) / 1024
    assert grown_mib < CLAIMED_MIB / 2, f"the server's peak memory grew by {grown_mib:.0f} MiB"
    assert "oversize" not in result.content
    assert genuine(result, f"{real}\n"), result


NAIVE_READER = """
import json, struct, sys, socket
channel = socket.socket(fileno=int(sys.argv[1]))
size = struct.unpack(">I", channel.recv(4, socket.MSG_WAITALL))[0]
body = bytearray()
while len(body) < size:
    chunk = channel.recv(min(size - len(body), 1 << 20))
    if not chunk:
        break
    body += chunk
json.loads(bytes(body))
print("done", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_control_a_naive_reader_allocates_what_the_header_claims(kit: Path, tmp_path: Path) -> None:
    """The stand-in agent's peer is a reader that trusts the header (as the slot server must
    not): the host sees its peak memory pass the claimed size."""
    no_ptrace_restriction()
    marker = token()
    agent, channel = stand_in_agent()
    reader = subprocess.Popen(
        [sys.executable, "-c", NAIVE_READER, str(channel.fileno())],
        pass_fds=[channel.fileno()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    channel.close()
    attacker = spawn_kit(
        kit, ["oversize", str(agent.pid), str(CLAIMED_MIB), f"ready-{marker}", marker], tmp_path
    )
    try:
        assert reader.stdout is not None
        with anyio.from_thread.start_blocking_portal() as portal:
            line = portal.call(_readline_within, reader, 60.0)
        assert line == b"done\n"
        assert peak_kib(reader.pid) / 1024 > CLAIMED_MIB
    finally:
        end_and_reap(attacker)
        end_and_reap(reader)
        end_and_reap(agent)


async def _readline_within(process: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    assert process.stdout is not None
    stream = process.stdout
    with anyio.fail_after(timeout_s):
        return await anyio.to_thread.run_sync(stream.readline, abandon_on_cancel=True)
