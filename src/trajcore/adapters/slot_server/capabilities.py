"""What a host can do for the slots, found by trying it once at start.

``probe`` runs ``/bin/true`` in a bubblewrap sandbox with and without a network namespace, then
a keeper and one lease, and checks from inside the lease that it holds no capability, runs
under its seccomp filter and is the first process of its pid namespace; then ``tmux -V``. A
check that fails turns the capability off and says why in ``Capabilities.detail``: a host where
a lease is not proven confined never counts as sandboxed.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.channel import AgentLost, encode_request
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_processes import run_bounded
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.slot_protocol import Capabilities

__all__ = ["probe"]


async def probe(sandboxes: Sandboxes) -> Capabilities:
    """What this host can do for the slots, and (in ``detail``) every problem found. A slot
    helper that fails in a lease turns the sandbox off (there is no other keeper)."""
    isolation = sandboxes.config.isolation
    probe_dir = sandboxes.config.root / "state" / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    probe_ids = sandboxes.ids(0)
    if probe_ids is not None:
        os.chown(probe_dir, *probe_ids)
    problems: list[str] = list(sandboxes.notes)
    if sandboxes.seccomp_problem is not None:
        problems.append(f"leases run without a seccomp filter: {sandboxes.seccomp_problem}")
    if sandboxes.uid_base is None:
        problems.append(f"the slot server is not root: every slot runs as its uid {os.geteuid()}")
    bwrap_ok = net_ok = False
    if shutil.which(sandboxes.config.bwrap) is None:
        problems.append(f"bubblewrap ({sandboxes.config.bwrap}) is not installed")
    else:
        isolated = attrs.evolve(isolation, allow_network=False)
        net_ok, detail = await _run_ok(
            sandboxes.sandbox_argv(isolated, probe_dir, ["/bin/true"]), probe_ids
        )
        if not net_ok:
            problems.append(f"bwrap with a network namespace failed: {detail}")
        if isolation.allow_network:
            bwrap_ok, detail = await _run_ok(
                sandboxes.sandbox_argv(isolation, probe_dir, ["/bin/true"]), probe_ids
            )
            if not bwrap_ok:
                problems.append(f"bwrap failed: {detail}")
        else:
            bwrap_ok = net_ok
        if bwrap_ok and sandboxes.seccomp is None and isolation.require_sandbox:
            bwrap_ok = net_ok = False  # fails closed: a sandbox needs its filter
        if bwrap_ok:
            problem = await _probe_lease(sandboxes, probe_dir)
            if problem is not None:
                bwrap_ok = net_ok = False
                problems.append(f"a lease in the slot sandbox failed: {problem}")
    tmux_ok = False
    tmux = shutil.which("tmux")
    if tmux is None:
        problems.append("tmux is not installed")
    else:
        argv = [tmux, "-V"]
        tmux_ok, detail = await _run_ok(
            sandboxes.sandbox_argv(isolation, probe_dir, argv) if bwrap_ok else argv,
            probe_ids if bwrap_ok else None,
        )
        if not tmux_ok:
            problems.append(f"tmux failed: {detail}")
    if sandboxes.cgroups is None and sandboxes.config.use_cgroups:
        problems.append("no writable cgroup hierarchy: per-process rlimits only")
    return Capabilities(
        bwrap=bwrap_ok,
        tmux=tmux_ok,
        network_isolation=net_ok,
        cgroups=sandboxes.cgroups is not None,
        slot_helper="native",
        slot_helper_origin=sandboxes.native_origin,
        detail="; ".join(problems),
    )


async def _probe_lease(sandboxes: Sandboxes, probe_dir: Path) -> str | None:
    """Start a keeper and one lease in ``probe_dir`` and check, from inside the lease, that
    it holds no capability and is its pid namespace's first user. ``None`` when it works,
    else what failed: a host where this fails must not count as sandboxed."""
    probe = Slot(
        index=-1,
        workspace=Workspace(probe_dir, owner=sandboxes.ids(-1)),
        state_dir=probe_dir / "state",
        cgroup=None,
    )
    script = "while read -r key value; do case $key in Cap*|Seccomp:) echo $key $value;; esac; done"
    try:
        agent = await sandboxes.lease_agent(probe, started=time.monotonic())
        command = f"{script} </proc/self/status; echo $$"
        reply = await agent.request(
            encode_request(["exec", "10.0", "4096", "/bin/sh", "-c", command]),
            10.0 + sandboxes.config.agent_grace_s,
        )
    except AgentLost as error:
        return str(error)
    finally:
        await sandboxes.stop_agent(probe)
        await sandboxes.stop_keeper(probe)
    lines = str(reply.get("stdout") or "").split()
    capabilities = dict(zip(lines[:-1:2], lines[1:-1:2], strict=True))
    seccomp = capabilities.pop("Seccomp:", None)
    if sandboxes.seccomp is not None and seccomp != "2":
        return f"a lease runs without its seccomp filter (Seccomp: {seccomp})"
    held = {key: value for key, value in capabilities.items() if int(value, 16) != 0}
    if len(capabilities) < 4 or held:
        return f"a lease kept capabilities {held or capabilities}"
    if not lines or not lines[-1].isdigit() or int(lines[-1]) > 8:
        return f"a lease's shell is not in a fresh pid namespace (pid {lines[-1:]})"
    return None


async def _run_ok(argv: list[str], ids: tuple[int, int] | None = None) -> tuple[bool, str]:
    try:
        code, _, err = await run_bounded(argv, timeout_s=10, ids=ids)
    except OSError as error:
        return False, str(error)
    if code is None:
        return False, "timed out"
    return code == 0, err.strip()[:500]
