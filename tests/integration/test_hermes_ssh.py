"""hermes-agent's ``terminal_backend: ssh``, end to end: a hermes-style env run by ``trajcore run``
on slot servers that the SSH pool starts through a real sshd on 127.0.0.1.

The env is ``examples/hermes_seed_style.py`` (``format_prompt``, ``compute_reward`` reading the
file through hermes's ``ToolContext``), configured as a hermes user configures it: the seed's
``terminal_backend: ssh`` with ``ssh_host``, ``ssh_user``, ``ssh_port`` and ``ssh_key``, plus
trajcore's ``ssh_known_hosts`` (the loopback sshd's own, so its host key is verified) and
``ssh_python`` (the interpreter with trajcore on the "remote"). The model is the script ``greet``
below: per task, one member writes the file right through the terminal tool and the other leaves
a word out, so the scores say what the slot holds. While the run goes on the script looks at the
host: the files the terminal wrote lie in the workspaces of the slot servers running under that
sshd. Afterwards nothing of the pool is left: no slot server or session under the sshd, no ssh
client of this process, no server directory on the host, no local run directory.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import itertools
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.entrypoints.run import main
from trajcore.entrypoints.seed_settings import SeedSettingWarning
from trajcore.rollout.scripted import ScriptStep, tool_call
from trajcore.testing.loopback_sshd import LoopbackSshd, descendants, loopback_sshd, sshd_problem
from trajcore.testing.processes import running

PROBLEM = sshd_problem() or (None if shutil.which("bwrap") else "bubblewrap is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

ROOT = Path(__file__).resolve().parents[2]
HERMES_ENV = f"{ROOT / 'examples' / 'hermes_seed_style.py'}:GreetingFileEnv"
SCRIPT = f"{__name__}:greet"  # this very module, as pytest imported it
SLOT_SERVER = "trajcore.entrypoints.slot_server"
# The example's tasks, and what the member that leaves a word out writes instead.
TASKS = {"hello.txt": ("hello world", "hello"), "notes/greeting.txt": ("good morning", "good")}
SCORES = [0.5, 1.0]  # compute_reward: 1.0 when the file reads exactly right, 0.5 when not
SESSIONS_END_S = 15.0  # the pool's close (stop_timeout_s 10) and sshd ending a closed session


@attrs.frozen
class Sighting:
    """A file the terminal tool wrote, seen on the host in a slot server's workspace."""

    server: int  # the slot server's pid, a descendant of the loopback sshd
    root: str  # its --root
    path: str
    content: str


@attrs.define
class _Watch:
    sshd: LoopbackSshd
    first_turns: Iterator[int] = attrs.field(factory=itertools.count)
    sightings: list[Sighting] = attrs.field(factory=list)
    ssh_clients: dict[int, list[str]] = attrs.field(factory=dict)


_WATCH: list[_Watch] = []


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _servers_under(sshd: LoopbackSshd) -> dict[int, str]:
    """The slot servers running under ``sshd`` (SSH-started): pid -> their ``--root``."""
    if sshd.process is None:
        return {}
    servers: dict[int, str] = {}
    for pid in descendants(sshd.process.pid):
        argv = _argv(pid)
        if SLOT_SERVER in argv and "--root" in argv:
            servers[pid] = argv[argv.index("--root") + 1]
    return servers


def _ssh_clients() -> dict[int, list[str]]:
    """This process's ``ssh`` clients: pid -> argv."""
    return {
        pid: argv
        for pid in descendants(os.getpid())
        if (argv := _argv(pid)) and os.path.basename(argv[0]) == "ssh"
    }


def _task_file(messages: Sequence[Message]) -> str:
    task = next(m.content for m in messages if m.role == "user")
    return next(name for name in TASKS if f"the file {name} " in task)


def greet(messages: Sequence[Message]) -> ScriptStep:
    """The model: write the task's file with the terminal tool (every other member of a task
    leaves a word out); after the tool's answer, look for the file on the host, then stop."""
    watch = _WATCH[-1]
    name = _task_file(messages)
    right, short = TASKS[name]
    if not any(m.role == "tool" for m in messages):
        text = right if next(watch.first_turns) % 2 == 0 else short
        folder = os.path.dirname(name) or "."
        return tool_call("bash", command=f"mkdir -p {folder} && printf '%s' '{text}' > {name}")
    watch.ssh_clients.update(_ssh_clients())
    for server, root in _servers_under(watch.sshd).items():
        for path in glob.glob(f"{root}/slots/*/{name}"):
            watch.sightings.append(Sighting(server, root, path, Path(path).read_text()))
    return "Done."


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def _forward_dirs(clients: dict[int, list[str]]) -> set[Path]:
    """The local directories of the forwarded sockets on the ssh clients' command lines."""
    found: set[Path] = set()
    for argv in clients.values():
        for flag, value in itertools.pairwise(argv):
            if flag == "-L":
                found.add(Path(value.split(":")[0]).parent)
    return found


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[LoopbackSshd]:
    directory = tmp_path / "sshd"
    directory.mkdir()
    with loopback_sshd(directory) as server:
        yield server


def test_hermes_ssh_backend_runs_a_hermes_style_env_end_to_end(
    sshd: LoopbackSshd, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    hermes_settings = {
        "terminal_backend": "ssh",
        "ssh_host": "127.0.0.1",
        "ssh_user": getpass.getuser(),
        "ssh_port": str(sshd.port),
        "ssh_key": str(sshd.directory / "user_key"),
        "ssh_known_hosts": str(sshd.directory / "known_hosts"),
        "ssh_python": sys.executable,
    }
    run_settings = {
        "tokenizer_name": str(qwen3_tokenizer_path()),
        "require_sandbox": "true",
        "local_containers": "2",  # servers per host
        "slots_per_container": "1",
        "acquire_timeout_s": "120",
    }
    argv = [HERMES_ENV, "--policy", SCRIPT, "--groups", "2", "--group-size", "2"]
    for field, value in (hermes_settings | run_settings).items():
        argv += ["--set", f"{field}={value}"]
    argv += ["--out", str(out), "--plain"]
    watch = _Watch(sshd)
    _WATCH.append(watch)
    try:
        with pytest.warns(SeedSettingWarning, match="terminal_backend"):
            status = main(argv)
        assert status == 0
        _check_the_run(out, watch)
        _check_nothing_is_left(sshd, watch)
    finally:
        _WATCH.remove(watch)
        _end_what_outlived_the_run(watch)


def _check_the_run(out: Path, watch: _Watch) -> None:
    """Every trajectory ran its terminal call on the SSH host's slot servers, and scored what
    the call wrote."""
    # The scores say what the terminal wrote: the right text 1.0, a word short 0.5.
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 4
    by_group: dict[str, list[float]] = {}
    for record in records:
        assert record["status"] == "finished", record["detail"]
        assert str(record["slot"]).startswith("ssh-"), record["slot"]
        (result,) = record["tool_results"]
        assert (result["name"], result["outcome"], result["exit_code"]) == ("bash", "ok", 0)
        assert result["sandboxed"] is True
        by_group.setdefault(record["group"], []).append(record["score"])
    assert [sorted(scores) for scores in by_group.values()] == [SCORES, SCORES]

    # The calls ran on the SSH-started slot servers: their workspaces on the host held the files.
    seen = {(Path(s.path).name, s.content) for s in watch.sightings}
    expected = {(Path(name).name, text) for name, texts in TASKS.items() for text in texts}
    assert seen == expected, watch.sightings
    servers = {s.server for s in watch.sightings}
    roots = {Path(s.root) for s in watch.sightings}
    assert len(servers) == 2  # both servers of the host served
    assert all(root.parent.parent == Path("/tmp") for root in roots)  # remote_dir /tmp


def _check_nothing_is_left(sshd: LoopbackSshd, watch: _Watch) -> None:
    """The pool closed: nothing of it is left on the host or here."""
    servers = {s.server for s in watch.sightings}
    roots = {Path(s.root) for s in watch.sightings}
    _wait_for(lambda: sshd.sessions() == [], SESSIONS_END_S, "the ssh sessions ended")
    assert _servers_under(sshd) == {}
    assert not any(running(pid) for pid in servers)
    assert not any(root.parent.exists() for root in roots), roots  # the servers' directories
    run_ids = {root.parent.name.split("-")[1] for root in roots}
    (run_id,) = run_ids
    assert glob.glob(f"/tmp/trajcore-{run_id}-*") == []  # nor the start check's probe socket
    assert watch.ssh_clients, "the run's ssh clients were seen"
    assert not any(running(pid) for pid in watch.ssh_clients)
    assert _ssh_clients() == {}
    forward_dirs = _forward_dirs(watch.ssh_clients)
    assert forward_dirs
    assert not any(path.exists() for path in forward_dirs)


def _end_what_outlived_the_run(watch: _Watch) -> None:
    """What a failing pool left (the servers it started on the host, its ssh clients), ended
    by pid: each is the leader of its own process group."""
    leaders = {s.server for s in watch.sightings} | set(watch.ssh_clients)
    for pid in leaders:
        if running(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
