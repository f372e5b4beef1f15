"""The check behind the autouse ``no_process_left_behind`` fixture (tests/conftest.py) sees the
processes a test leaves behind, and only those of this run.

Each test here leaves processes on purpose, hands them to ``end_processes`` itself, and checks
from ``/proc`` that they are gone, so the autouse fixture finds nothing after it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import (
    RUN_MARK,
    end_processes,
    leftover_processes,
    process_seen,
    running_pids,
)


def orphan(program: Path, env: dict[str, str]) -> int:
    """Start ``program 30`` so that its parent exits at once (it becomes pid 1's child, as a
    daemon does); returns its pid."""
    shell = subprocess.run(
        ["/bin/sh", "-c", f'"{program}" 30 >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
        env=env,
    )
    pid = int(shell.stdout)
    deadline = time.monotonic() + 5
    while (seen := process_seen(pid)) is not None and seen.ppid != 1:
        assert time.monotonic() < deadline, "the orphan never reached pid 1"
        time.sleep(0.01)
    return pid


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while (seen := process_seen(pid)) is not None and seen.state != "Z":
        assert time.monotonic() < deadline, f"{pid} is still running"
        time.sleep(0.01)


@pytest.fixture
def fake_tmux(tmp_path: Path) -> Path:
    sleep = shutil.which("sleep")
    assert sleep is not None
    named = tmp_path / "tmux-lookalike"  # what /proc/PID/comm shows
    shutil.copy(sleep, named)
    return named


def test_a_child_left_running_is_found_and_ended() -> None:
    before = running_pids()
    child = subprocess.Popen(["sleep", "30"])
    try:
        found = leftover_processes(before)
        assert [p.pid for p in found] == [child.pid]
        end_processes(found)  # kills and reaps it
        assert process_seen(child.pid) is None
        assert leftover_processes(before) == []
    finally:
        child.kill()
        child.wait(5)


def test_an_orphan_of_this_run_is_found_one_of_another_run_is_not(fake_tmux: Path) -> None:
    before = running_pids()
    mine = orphan(fake_tmux, dict(os.environ))
    theirs = orphan(fake_tmux, {k: v for k, v in os.environ.items() if k != RUN_MARK})
    try:
        found = leftover_processes(before)
        assert [(p.pid, p.ppid, p.comm) for p in found] == [(mine, 1, "tmux-lookalike")]
        end_processes(found)
        wait_gone(mine)
        assert leftover_processes(before) == []
    finally:
        kill_quietly(mine)
        kill_quietly(theirs)
    wait_gone(theirs)


def test_an_orphan_with_another_name_is_not_counted(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    before = running_pids()
    other = orphan(Path(sleep), dict(os.environ))
    try:
        assert leftover_processes(before) == []
    finally:
        kill_quietly(other)
    wait_gone(other)
