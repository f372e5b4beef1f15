"""The slot helper's ``bare`` role: the agent of a slot that runs without bubblewrap.

It serves the same protocol as a lease's agent (tests/unit/test_slot_helper.py) on fd 0, with
what a sandbox would otherwise give: it enters the workspace, sets the slot's resource limits on
itself (and so on all it starts), and keeps every command in its own session, in a process group
of the command's own, so the slot server can end all a lease left by that one session. A lease
agent (``serve``), the control, gives each command a session of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_slot_helper import HAS_COMPILER, Agent
from trajcore.adapters.slot_server.limits import rlimits_for
from trajcore.adapters.slot_server.native_helper import build_slot_helper
from trajcore.domain.isolation import SlotIsolation

pytestmark = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler to build the helper")

IDS = "import os; print(os.getpid(), os.getsid(0), os.getpgid(0))"


def bare_argv(tmp_path: Path, *limits: str) -> list[str]:
    (tmp_path / "workspace").mkdir(exist_ok=True)
    return [
        str(build_slot_helper()), "bare", "--workspace", str(tmp_path / "workspace"),
        "--state-dir", str(tmp_path / "state"), *limits,
    ]  # fmt: skip


def start(argv: list[str], tmp_path: Path) -> Agent:
    # a session of its own, as the slot server starts it
    return Agent(["setsid", *argv] if shutil.which("setsid") else argv, tmp_path)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Agent]:
    running = start(bare_argv(tmp_path, "--limit", "fsize", "4096"), tmp_path)
    try:
        yield running
        assert running.close() == 0
    finally:
        socket_path = tmp_path / "state" / "tmux.sock"
        tmux = shutil.which("tmux")
        if tmux is not None and socket_path.exists():
            subprocess.run(
                [tmux, "-S", str(socket_path), "kill-server"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip


def test_a_command_stays_in_the_bare_agents_session_in_a_group_of_its_own(bare: Agent) -> None:
    agent_pid = bare.greeting["pid"]
    assert isinstance(agent_pid, int)
    reply = bare.ask("exec", "10.0", "4096", sys.executable, "-c", IDS)
    pid, sid, pgid = map(int, str(reply["stdout"]).split())
    assert sid == os.getsid(agent_pid)  # the agent's session: ending it ends the command
    assert pgid == pid != sid  # a group of its own: a timeout kills the command's group only


def test_control_a_lease_agent_gives_each_command_a_session_of_its_own(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    argv = [str(build_slot_helper()), "serve", "0", str(tmp_path / "state"), str(workspace), ""]
    agent = Agent(argv, tmp_path)
    try:
        reply = agent.ask("exec", "10.0", "4096", sys.executable, "-c", IDS)
    finally:
        assert agent.close() == 0
    pid, sid, pgid = map(int, str(reply["stdout"]).split())
    assert sid == pid == pgid


def test_the_bare_agent_enters_the_workspace_and_sets_the_limits(
    bare: Agent, tmp_path: Path
) -> None:
    where = bare.ask("exec", "10.0", "4096", "/bin/sh", "-c", "pwd")
    assert where["stdout"] == f"{tmp_path / 'workspace'}\n"
    limits = bare.ask("exec", "10.0", "8192", "/bin/cat", "/proc/self/limits")
    line = next(row for row in str(limits["stdout"]).splitlines() if "Max file size" in row)
    assert line.split()[3:5] == ["4096", "4096"], line
    assert bare.greeting["tmux"] is (shutil.which("tmux") is not None)


def test_a_slots_processes_may_write_no_core_dump_whatever_the_servers_limit(
    tmp_path: Path,
) -> None:
    """The limits every slot gets hold ``RLIMIT_CORE`` 0, soft and hard, so no process of the
    slot can raise it back; the agent is started under an unlimited core limit (the control: what
    the server's own limit would otherwise hand down)."""
    isolation = SlotIsolation()
    limits = rlimits_for(isolation, cgroup_pids=True, cgroup_memory=True)
    flags = [part for name, value in limits.items() for part in ("--limit", name, str(value))]
    argv = ["prlimit", "--core=unlimited:unlimited", "--", *bare_argv(tmp_path, *flags)]
    agent = start(argv, tmp_path)
    try:
        reply = agent.ask("exec", "10.0", "8192", "/bin/cat", "/proc/self/limits")
    finally:
        assert agent.close() == 0
    line = next(row for row in str(reply["stdout"]).splitlines() if "Max core file size" in row)
    assert line.split()[4:6] == ["0", "0"], line


@pytest.mark.parametrize(
    "extra",
    [
        ["--tmp", "/tmp"],
        ["--own-network"],
        ["--seccomp", "00" * 8],
        ["--carry-ro", "/usr"],
        ["--mask", "/proc/kcore"],
        ["--limit", "stack", "1"],
    ],
    ids=["tmp", "own-network", "seccomp", "carry", "mask", "unknown-limit"],
)
def test_sandbox_only_flags_are_refused_by_the_bare_role(extra: list[str], tmp_path: Path) -> None:
    """A bare agent has no namespaces to set up: a flag that would ask for one is a mistake
    that must not pass as if the slot were confined."""
    done = subprocess.run(
        [*bare_argv(tmp_path), *extra], capture_output=True, timeout=10, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    assert b"usage: slot-helper" in done.stderr
    missing = subprocess.run(
        [str(build_slot_helper()), "bare", "--workspace", str(tmp_path)],
        capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert missing.returncode == 2, "a bare agent needs its state directory"
