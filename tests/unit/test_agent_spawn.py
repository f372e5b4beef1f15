"""How the lease agent runs one ``exec`` call: the request read, the spawn and the wait.

The agent reads a request's header and body in one read, keeps its spawn's file actions and
attributes from call to call while the pipes' descriptors stay the same (the C library checks
each descriptor against ``RLIMIT_NOFILE`` as an action is added, a system call each), and watches
only the command's two pipes: at the end of both it looks for the command's exit with one
``waitpid(WNOHANG)``, and opens a pidfd only when the command still runs then (or once it runs
longer than a few milliseconds), so a command that closes its pipes and runs on, and one whose
background processes hold its pipes after it exited, are both answered right.

What a command sees is checked by the answers here; the system calls by ``strace`` on the agent
alone (the commands run untraced), skipped where strace is missing or cannot trace.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_slot_helper import HAS_COMPILER, Agent, agent_argv
from trajcore.adapters.slot_server.channel import encode_request

pytestmark = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler to build the helper")


def frame(*fields: str) -> bytes:
    payload = encode_request(list(fields))
    return len(payload).to_bytes(4, "big") + payload


def kill_recorded(path: Path) -> None:
    """Kill the process whose pid a command wrote to ``path`` (a background job it left)."""
    if path.exists() and path.read_text().strip():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(path.read_text().strip()), signal.SIGKILL)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    running = Agent(agent_argv(tmp_path), tmp_path)
    try:
        yield running
    finally:
        assert running.close() == 0
        kill_recorded(tmp_path / "workspace" / "background.pid")


def test_a_command_that_closes_its_pipes_and_runs_on_is_waited_for(agent: Agent) -> None:
    reply = agent.ask(
        "exec", "10.0", "1024", "/bin/sh", "-c",
        "echo before; echo err >&2; exec >&- 2>&-; sleep 0.3; exit 3",
    )  # fmt: skip
    assert (reply["exit"], reply["signal"], reply["timed_out"]) == (3, None, False)
    assert (reply["stdout"], reply["stderr"]) == ("before\n", "err\n")
    assert isinstance(reply["duration"], float)
    assert reply["duration"] >= 0.3  # its exit status, not the end of its pipes
    # the control: the same command, its pipes left open, answers the same
    control = agent.ask(
        "exec", "10.0", "1024", "/bin/sh", "-c", "echo before; echo err >&2; sleep 0.3; exit 3"
    )
    assert (control["exit"], control["stdout"], control["stderr"]) == (3, "before\n", "err\n")


def test_a_command_whose_background_job_holds_its_pipes_is_answered_at_its_exit(
    agent: Agent,
) -> None:
    reply = agent.ask(
        "exec", "60.0", "1024", "/bin/sh", "-c",
        "echo out; sleep 30 & echo $! >background.pid; exit 4",
    )  # fmt: skip
    assert (reply["exit"], reply["stdout"], reply["timed_out"]) == (4, "out\n", False)
    assert isinstance(reply["duration"], float)
    assert reply["duration"] < 20, "the agent waited for the background job's pipes"
    # the next call runs on fresh pipes: the job's open ones carry nothing into it
    after = agent.ask("exec", "10.0", "1024", "/bin/sh", "-c", "echo next")
    assert (after["exit"], after["stdout"]) == (0, "next\n")


def test_a_command_that_closed_its_pipes_is_killed_at_its_timeout(
    agent: Agent, tmp_path: Path
) -> None:
    marker = tmp_path / "workspace" / "survived"
    reply = agent.ask(
        "exec", "0.5", "1024", "/bin/sh", "-c",
        f"(sleep 1.5; touch {marker}) >/dev/null 2>&1 & exec >&- 2>&-; sleep 30",
    )  # fmt: skip
    assert (reply["timed_out"], reply["signal"], reply["exit"]) == (True, 9, None)
    after = agent.ask("exec", "5.0", "1024", "/bin/sh", "-c", "sleep 1.5")
    assert after["exit"] == 0
    assert not marker.exists(), "the timed-out command's process group survived"


def test_requests_split_joined_and_over_the_read_ahead_are_answered_in_order(
    agent: Agent,
) -> None:
    big = "x" * (100 << 10)  # a body larger than one read brings (64 KiB)
    joined = (
        frame("exec", "10.0", "64", "/bin/sh", "-c", "echo one")
        + frame("exec", "10.0", str(300 << 10), "/bin/sh", "-c", 'printf %s "$0"', big)
        + frame("exec", "10.0", "64", "/bin/sh", "-c", "echo three")
    )
    agent.socket.sendall(joined)
    first, second, third = agent.receive(), agent.receive(), agent.receive()
    assert (first["exit"], first["stdout"]) == (0, "one\n")
    assert (second["exit"], second["stdout"]) == (0, big)
    assert (third["exit"], third["stdout"]) == (0, "three\n")
    split = frame("exec", "10.0", "64", "/bin/sh", "-c", "echo split")
    for at in range(0, len(split), 3):  # a frame that comes in pieces
        agent.socket.sendall(split[at : at + 3])
    last = agent.receive()
    assert (last["exit"], last["stdout"]) == (0, "split\n")


# ------------------------------------------------------------------------ system calls


@pytest.fixture(scope="module")
def strace() -> str:
    found = shutil.which("strace")
    if found is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run(
        [found, "-qq", "-o", os.devnull, "true"], capture_output=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode(errors='replace')[-200:]}")
    return found


def traced(strace: str, tmp_path: Path, calls: str, *requests: tuple[str, ...]) -> list[str]:
    """The ``calls`` the agent (alone) makes over ``requests``, each sent as one write; every
    answer must be a result."""
    log = tmp_path / "strace.log"
    argv = [strace, "-qq", "-o", str(log), "-e", f"trace={calls}", "-e", "signal=none"]
    running = Agent([*argv, *agent_argv(tmp_path)], tmp_path)
    try:
        for request in requests:
            reply = running.ask(*request)
            assert isinstance(reply["exit"], int), reply
    finally:
        assert running.close() == 0
    return log.read_text().splitlines()


TRUE = ("exec", "10.0", "1024", "/bin/sh", "-c", "true")


def test_later_spawns_make_no_descriptor_limit_calls(strace: str, tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "eight").mkdir()
    one = traced(strace, tmp_path / "one", "prlimit64,getrlimit", TRUE)
    eight = traced(strace, tmp_path / "eight", "prlimit64,getrlimit", *[TRUE] * 8)
    assert len(eight) == len(one), "\n".join(eight)


def test_a_request_is_read_in_one_read(strace: str, tmp_path: Path) -> None:
    lines = traced(strace, tmp_path, "read", *[TRUE] * 6)
    channel = [line for line in lines if line.startswith("read(0,")]
    assert len(channel) == 6 + 1, "\n".join(channel)  # and one for the end of input


def test_a_command_past_its_pipes_is_looked_for_before_a_pidfd_is_opened(
    strace: str, tmp_path: Path
) -> None:
    recorded = tmp_path / "workspace" / "command.pid"
    command = f"echo $$ >{recorded}; exec >&- 2>&-; sleep 0.3; exit 3"
    lines = traced(
        strace, tmp_path, "wait4,pidfd_open", ("exec", "10.0", "64", "/bin/sh", "-c", command)
    )
    pid = recorded.read_text().strip()
    about = [line for line in lines if re.match(rf"(wait4|pidfd_open)\({pid}\b", line)]
    assert about, "\n".join(lines)
    # still running at the end of its pipes: a look that finds it so, then its pidfd, then reaped
    assert re.match(rf"wait4\({pid}, .*WNOHANG.*\) = 0$", about[0]), about
    assert about[1].startswith(f"pidfd_open({pid},"), about
    assert re.match(rf"wait4\({pid}, .*\) = {pid}$", about[-1]), about
