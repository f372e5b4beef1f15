"""The same attacks through the ``SandboxPool`` port of ``LocalSandboxPool``, as an env uses it.

A trajectory leases a slot from a local pool (``require_sandbox=True``, network off) and, in its
lease, reads every key its keyrings reach and holds ``/proc/sys/kernel/core_pattern`` open for
writing. The host checks the workspace (under the pool's root, a host directory) for the random
payload of a key the test put into its own session keyring, which the pool's servers inherit,
and the attacker's ``/proc/<pid>/fd`` for a kernel setting held for writing. The controls are
``test_control_a_host_key_is_readable_unsandboxed`` (test_cross_lease) and
``test_control_the_check_sees_a_setting_held_for_writing`` (test_kernel_interfaces): the same
kit and the same checks, unsandboxed.
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    add_session_key,
    attack_finished,
    bwrap_missing,
    compiler,
    end,
    kit_processes,
    open_files,
    remove_key,
    server_root,
    token,
)
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolResult

CORE_PATTERN = "/proc/sys/kernel/core_pattern"


async def run(pool: LocalSandboxPool, lease: Lease, tool: str, **arguments: JSON) -> ToolResult:
    call = ToolCall(id=f"pool-{secrets.token_hex(6)}", name=tool, arguments=arguments)
    (result,) = await pool.execute(
        lease.slot.container, [SlotCall(lease=lease, call=call, timeout_s=15.0)]
    )
    return result


def kit_text(kit: Path) -> str:
    return base64.b64encode(kit.read_bytes()).decode()


@pytest.mark.slow
def test_a_pool_lease_reaches_neither_host_keys_nor_host_settings(
    kit: Path, session_keyring: int | None
) -> None:
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    if session_keyring is None:
        pytest.skip("keyring system calls are only wired up here for x86_64 and aarch64")
    payload = secrets.token_hex(16)
    serial = add_session_key(f"trajcore-canary-{token()}", payload.encode())
    marker = token()

    async def main(root: Path) -> tuple[bytes, bool]:
        isolation = SlotIsolation(
            require_sandbox=True, max_processes=64,
            memory_bytes=256 << 20, min_timeout_s=0.2,
        )  # fmt: skip
        config = LocalPoolConfig(
            containers=1,
            root=root,
            server=SlotServerSettings(slots_per_container=1, isolation=isolation),
        )
        async with LocalSandboxPool(config) as pool, pool.lease("attacker") as lease:
            # the pool's own folder in its given root
            (own,) = root.glob("trajcore-pool-*")  # noqa: ASYNC240 - one listing
            workspace = own / lease.slot.container / "slots" / str(lease.slot.index)
            written = await run(pool, lease, "write_file", path="kit.b64", content=kit_text(kit))
            assert written.error is None, written
            await run(pool, lease, "bash", command="base64 -d kit.b64 > kit; chmod 755 kit")
            await run(pool, lease, "bash", command="./kit keys-dump loot.txt")
            loot = workspace / "loot.txt"
            assert loot.exists(), "the key dump did not run"
            await run(
                pool,
                lease,
                "bash",
                command=f"(./kit hold {marker} ready-{marker} {CORE_PATTERN} >/dev/null 2>&1 &)",
            )
            held = False
            if attack_finished(workspace, marker):
                pids = kit_processes(marker)
                held = any(
                    f.writable and f.fstype == "proc" and f.target.endswith("kernel/core_pattern")
                    for pid in pids
                    for f in open_files(pid)
                )
                end(pids)
            return loot.read_bytes(), held

    try:
        with server_root("pool") as root:
            loot, held = anyio.run(main, root)
    finally:
        remove_key(serial)
    problems = []
    if payload.encode() in loot:
        problems.append("a pool lease read a key of the host's session keyring")
    if held:
        problems.append(f"a pool lease holds {CORE_PATTERN} open for writing")
    assert not problems, "; ".join(problems)
