"""Test-wide settings: hypothesis profiles, offline model hubs, and no process left behind."""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# The pools' guards append what they have to say to $XDG_STATE_HOME/trajcore/guards.log: a test
# run's lines go to a folder of its own, removed when the run ends, not to the user's.
_STATE_HOME = tempfile.mkdtemp(prefix="trajcore-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)

# ci: reproducible and bounded, no per-example deadline (shared machines are noisy).
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# dev: random exploration, more examples, for local runs.
settings.register_profile("dev", max_examples=300, deadline=None)
# deep (./dev test --deep): long random exploration, for a night run or before a release; the
# contract suites scale their sequences from max_examples and stateful_step_count.
settings.register_profile(
    "deep",
    max_examples=2000,
    stateful_step_count=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# ------------------------------------------------------------------ processes left behind
#
# Every test must end the processes it starts. The check below is cheap when a test behaves
# (two listings of /proc, nothing else read): it looks only at processes that appeared during
# the test and are still running after it, and among those only at
# - descendants of this test process reached through processes that also appeared during the
#   test (children of a longer-lived fixture's process belong to that fixture), and
# - orphans (parent pid 1) named tmux, bwrap or slot-* whose environment carries this run's
#   mark (daemons such as the tmux server leave their parent at once; the mark keeps processes
#   of other test runs on the same machine out).
# Those that do not go within LEFTOVER_GRACE_S are named in the test's failure and killed, by
# pid, so the next test starts clean.

RUN_MARK = "TRAJCORE_TEST_RUN"
RUN_ID = f"{os.getpid()}-{secrets.token_hex(8)}"
os.environ[RUN_MARK] = RUN_ID
LEFTOVER_GRACE_S = 2.0
ORPHAN_NAMES = ("tmux", "bwrap", "slot-")


@attrs.frozen
class ProcessSeen:
    """One process as ``/proc/PID/stat`` shows it."""

    pid: int
    ppid: int
    comm: str
    state: str


def running_pids() -> frozenset[int]:
    """Every process id in ``/proc`` now."""
    return frozenset(int(name) for name in os.listdir("/proc") if name.isdigit())


def process_seen(pid: int) -> ProcessSeen | None:
    """``pid``'s parent, name and state, or ``None`` once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    return ProcessSeen(
        pid=pid,
        ppid=int(fields[1]),
        comm=head.partition(b"(")[2].decode(errors="replace"),
        state=fields[0].decode(),
    )


def carries_run_mark(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_MARK}={RUN_ID}".encode() in environ.split(b"\0")


def leftover_processes(before: frozenset[int]) -> list[ProcessSeen]:
    """Processes started since ``before`` was taken that this run still has to end (see
    above); zombies are not counted (they run nothing)."""
    seen = {pid: process_seen(pid) for pid in running_pids() - before}
    alive = {pid: p for pid, p in seen.items() if p is not None and p.state != "Z"}
    me = os.getpid()

    def ours(process: ProcessSeen) -> bool:
        hops = 0
        while process.ppid != me:
            parent = alive.get(process.ppid)
            hops += 1
            if parent is None or hops > len(alive):
                return False
            process = parent
        return True

    return sorted(
        (
            p
            for p in alive.values()
            if ours(p)
            or (p.ppid == 1 and p.comm.startswith(ORPHAN_NAMES) and carries_run_mark(p.pid))
        ),
        key=lambda p: p.pid,
    )


def end_processes(processes: list[ProcessSeen]) -> None:
    """SIGKILL each by pid; reap those that are this process's children."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    for process in processes:
        if process.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(process.pid, 0)


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fails a test that leaves a process running (see above), and ends those processes."""
    before = running_pids()
    yield
    leftovers = leftover_processes(before)
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.02)
        leftovers = leftover_processes(before)
    if leftovers:
        end_processes(leftovers)
        named = ", ".join(f"{p.pid} {p.comm!r} (parent {p.ppid})" for p in leftovers)
        pytest.fail(f"the test left processes running, now killed: {named}", pytrace=False)
