"""One slot's processes against another's (the threat list's "processes").

A process in slot 3 is the canary; the attacker in slot 2 is handed the host pids of that
process and of slot 3's lease agent (the worst case: it learnt them somehow), sends each
``SIGKILL``, and then ``kill -9 -1`` (every process it may signal). The host checks, through
``/proc``, that both of slot 3's processes still run and that slot 3 still answers. Control: the
same kit on the host, given the pid of a host sleeper, kills it and the check sees it gone.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.security.harness import (
    Server,
    end,
    end_and_reap,
    kit_processes,
    lease_init_of,
    leased,
    running,
    spawn_kit,
    start_sleeper,
    token,
)
from trajcore.domain.tools import ToolResult


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
