"""The slot helper's first step, ``--ids UID:GID PROGRAM [ARG]...`` (docs/sandbox.md, "The slot
helper and its protocol"): it drops to the given ids with no supplementary group, checked, then
runs the program; a bad value or ids it cannot take are refused before anything runs.

What a program runs as is read from outside, in ``/proc/PID/status``. The server's own use
(each slot's keeper) is checked through a real server in
tests/integration/test_slot_keeper_ids.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.slot_server.native_helper import build_slot_helper

NOBODY = 65534
HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))


@pytest.fixture(scope="module")
def helper() -> Path:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    return build_slot_helper()


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("taking other ids needs root")


def status_of(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@pytest.fixture
def sleeper(helper: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (each a ``sleep``), killed and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def running_status(process: subprocess.Popen[bytes], program: str) -> dict[str, str]:
    """The status of ``process`` once it has exec'd ``program`` (within 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        status = status_of(process.pid)
        if status["Name"] == program:
            return status
        time.sleep(0.01)
    raise AssertionError(f"{process.pid} never became {program}")


def test_the_program_runs_as_the_ids_with_no_supplementary_group(
    helper: Path, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    needs_root()
    process = subprocess.Popen([str(helper), "--ids", f"{NOBODY}:{NOBODY - 1}", "/bin/sleep", "30"])
    sleeper.append(process)
    status = running_status(process, "sleep")
    assert status["Uid"].split() == [str(NOBODY)] * 4  # real, effective, saved, filesystem
    assert status["Gid"].split() == [str(NOBODY - 1)] * 4
    assert status["Groups"] == ""
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0


def test_control_without_ids_the_same_program_keeps_roots_ids_and_groups(
    sleeper: list[subprocess.Popen[bytes]],
) -> None:
    needs_root()
    process = subprocess.Popen(["/bin/sleep", "30"], extra_groups=[NOBODY])
    sleeper.append(process)
    status = running_status(process, "sleep")
    assert status["Uid"].split() == ["0"] * 4
    assert status["Groups"] != ""  # what the check above reads is not empty by itself


@pytest.mark.parametrize(
    "value",
    ["abc", "0:5", "5:0", "5:", ":5", "5", "-1:5", "5:4294967295", "5:99999999999", " 5:5",
     "5:5:5", "5:+5", ""],
)  # fmt: skip
def test_a_bad_ids_value_is_refused_before_anything_runs(helper: Path, value: str) -> None:
    done = subprocess.run(
        [str(helper), "--ids", value, "/bin/sh", "-c", "echo ran"],
        capture_output=True, timeout=10, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == b""
    message = done.stderr.decode()
    assert f"--ids '{value}': not UID:GID" in message
    assert "root's 0 is refused" in message


def test_a_program_that_cannot_start_is_said(helper: Path) -> None:
    needs_root()
    done = subprocess.run(
        [str(helper), "--ids", f"{NOBODY}:{NOBODY}", "/nonexistent/program"],
        capture_output=True, timeout=10, check=False,
    )  # fmt: skip
    assert done.returncode == 127
    assert "cannot start /nonexistent/program: No such file" in done.stderr.decode()


def test_ids_without_a_program_are_refused(helper: Path) -> None:
    done = subprocess.run(
        [str(helper), "--ids", "5:5"], capture_output=True, timeout=10, check=False
    )
    assert done.returncode == 2
    assert "--ids takes UID:GID and then a program" in done.stderr.decode()


def test_ids_that_cannot_be_taken_are_refused_and_nothing_runs(helper: Path) -> None:
    """Started without the right to change ids (here as nobody), the helper cannot clear its
    groups or take others: it says so and does not run the program as what it is."""
    needs_root()
    folder = Path(tempfile.mkdtemp(prefix="trajcore-ids-"))
    try:
        folder.chmod(0o755)  # nobody reaches this copy; root's cache is private
        reachable = folder / "slot-helper"
        shutil.copy2(helper, reachable)
        done = subprocess.run(
            [str(reachable), "--ids", f"{NOBODY - 1}:{NOBODY - 1}", "/bin/sh", "-c", "echo ran"],
            capture_output=True, timeout=10, check=False, user=NOBODY, group=NOBODY,
            extra_groups=[],
        )  # fmt: skip
    finally:
        shutil.rmtree(folder)
    assert done.returncode == 2
    assert done.stdout == b""
    assert f"--ids {NOBODY - 1}:{NOBODY - 1}: cannot take the ids" in done.stderr.decode()
