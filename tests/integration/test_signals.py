"""Signals end a real process-mode run with nothing left behind.

Each test starts ``tests/integration/signal_env.py process ...`` (the shell-tasks env in
Atropos's process mode, or evaluate mode, or serve mode against atroposlib's real ``run-api``
with a registered trainer, on the local pool, with a scripted model that leaves a background
process and a tmux server in its slot, then waits forever), waits until a trajectory is mid-way,
records every process the run started (the env's descendants: slot servers, bubblewrap, the
keepers and agents, the shell's children, tmux) with their start times, sends a signal, and then
looks from outside for what is left: those processes (by pid and start time) and the pool's
directory (``/tmp/trajcore-pool-*``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

from tests.processes import (
    Proc,
    alive,
    child_environment,
    descendants,
    names,
    run_api,
    wait_until_gone,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "signal_env.py"
START_S = 180.0  # the env loads atroposlib and a tokenizer, then starts a slot server


@attrs.frozen
class Run:
    process: subprocess.Popen[bytes]
    pid: int
    run_dir: Path
    servers: list[int]
    started: list[Proc]
    log: Path


@contextmanager
def process_mode_run(
    tmp_path: Path,
    *,
    stuck_close: bool = False,
    mode: str = "process",
    extra: Sequence[str] = (),
) -> Iterator[Run]:
    """The env in ``mode`` (process, evaluate or serve, with ``extra`` flags), mid-trajectory;
    killed (with all it started) on the way out."""
    ready = tmp_path / "ready.json"
    log = tmp_path / "env.log"
    # The env imports wandb, which makes temporary folders that only an orderly exit removes;
    # this test kills it, so its $TMPDIR is one of its own (searchable by the slots' uids,
    # since the local pool's directory is made there), removed on the way out.
    scratch = Path(tempfile.mkdtemp(prefix="trajcore-signals-tmp-"))
    scratch.chmod(0o711)
    environment = child_environment()
    environment.update(
        SIGNAL_ENV_READY=str(ready),
        SIGNAL_ENV_STUCK_CLOSE="1" if stuck_close else "0",
        TMPDIR=str(scratch),
    )
    argv = [
        sys.executable, str(SCRIPT), mode,
        "--env.total_steps", "1", "--env.group_size", "1", "--env.use_wandb", "false",
        "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"),
        "--env.local_containers", "1", "--env.slots_per_container", "1", *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=tmp_path
        )
    started: list[Proc] = []
    run_dir: Path | None = None
    try:
        deadline = time.monotonic() + START_S
        while not ready.exists() or not ready.read_text():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        recorded = json.loads(ready.read_text())
        run_dir = Path(recorded["run_dir"])
        started = descendants(process.pid)
        assert {p.pid for p in started} >= set(recorded["servers"])
        yield Run(process, process.pid, run_dir, recorded["servers"], started, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for proc in alive(started):  # what a failing test left: never outlive the test
            os.kill(proc.pid, signal.SIGKILL)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _signal_ends_it_with_the_pool_closed(run: Run, signum: int) -> None:
    """Send ``signum`` to a run whose slot is busy; it must exit with 128 + signum, leaving no
    process it started and no pool directory."""
    assert run.run_dir.is_dir()
    assert len(run.started) >= 2  # a slot server and what runs in its slot
    if shutil.which("tmux") is not None:
        assert any(p.name.startswith("tmux") for p in run.started), names(run.started)
    run.process.send_signal(signum)
    status = run.process.wait(timeout=60)
    left = wait_until_gone(run.started, 5.0)
    output = run.log.read_text()
    assert status == 128 + signum, output[-3000:]
    assert not left, f"left running: {names(left)}"
    assert not run.run_dir.exists()
    assert "stopping and closing the sandbox pool" in output


@pytest.mark.parametrize(
    ("mode", "signum"),
    [("process", signal.SIGTERM), ("process", signal.SIGINT), ("evaluate", signal.SIGTERM)],
)
def test_a_signal_ends_the_run_with_the_pool_closed(tmp_path: Path, mode: str, signum: int) -> None:
    with process_mode_run(tmp_path, mode=mode) as run:
        _signal_ends_it_with_the_pool_closed(run, signum)


@contextmanager
def run_api_with_a_trainer(tmp_path: Path) -> Iterator[str]:
    """atroposlib's ``run-api`` with a trainer registered (so an env in ``serve`` mode registers
    and runs groups); its URL. Its temporary folders (wandb's) go under ``tmp_path``."""
    scratch = tmp_path / "run-api-tmp"
    scratch.mkdir()
    with run_api(tmp_path, child_environment(scratch), batch_size=8) as api:
        yield str(api.base_url).rstrip("/")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_serve_mode_with_the_pool_closed(tmp_path: Path, signum: int) -> None:
    with (
        run_api_with_a_trainer(tmp_path) as url,
        process_mode_run(
            tmp_path,
            mode="serve",
            extra=["--env.rollout_server_url", url, "--env.wandb_name", "signal_env"],
        ) as run,
    ):
        _signal_ends_it_with_the_pool_closed(run, signum)


def test_a_second_signal_forces_the_end_of_serve_mode_when_the_close_hangs(
    tmp_path: Path,
) -> None:
    with (
        run_api_with_a_trainer(tmp_path) as url,
        process_mode_run(
            tmp_path,
            mode="serve",
            stuck_close=True,
            extra=["--env.rollout_server_url", url, "--env.wandb_name", "signal_env"],
        ) as run,
    ):
        run.process.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):  # the control: the close hangs
            run.process.wait(timeout=3)
        run.process.send_signal(signal.SIGINT)
        status = run.process.wait(timeout=30)
        left = wait_until_gone(run.started, 5.0)
        output = run.log.read_text()
        assert status == 128 + signal.SIGINT, output[-3000:]
        assert not left, f"left running: {names(left)}"
        assert not run.run_dir.exists()
        assert "a second signal" in output


def test_a_second_signal_forces_the_end_when_the_close_hangs(tmp_path: Path) -> None:
    with process_mode_run(tmp_path, stuck_close=True) as run:
        run.process.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):  # the control: the close hangs
            run.process.wait(timeout=3)
        run.process.send_signal(signal.SIGTERM)
        status = run.process.wait(timeout=30)
        left = wait_until_gone(run.started, 5.0)
        output = run.log.read_text()
        assert status == 128 + signal.SIGTERM, output[-3000:]
        assert not left, f"left running: {names(left)}"
        assert not run.run_dir.exists()
        assert "a second signal" in output


def test_a_sigterm_sent_again_at_once_still_closes_the_pool(tmp_path: Path) -> None:
    # GNU timeout sends SIGTERM to the env and then to its process group: the same request.
    with process_mode_run(tmp_path) as run:
        run.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while "stopping and closing the sandbox pool" not in run.log.read_text():
            assert time.monotonic() < deadline, run.log.read_text()[-3000:]
            time.sleep(0.01)
        run.process.send_signal(signal.SIGTERM)
        status = run.process.wait(timeout=60)
        left = wait_until_gone(run.started, 5.0)
        output = run.log.read_text()
        assert status == 128 + signal.SIGTERM, output[-3000:]
        assert "a second signal" not in output, output[-3000:]
        assert "stopped by SIGTERM" in output, output[-3000:]
        assert not left, f"left running: {names(left)}"
        assert not run.run_dir.exists()


def test_slot_servers_die_with_a_killed_env_and_remove_its_directory(tmp_path: Path) -> None:
    with process_mode_run(tmp_path) as run:
        run.process.kill()  # SIGKILL: no handler runs in the env
        run.process.wait(timeout=30)
        left = wait_until_gone(run.started, 30.0)
        assert not left, f"left running: {names(left)}"
        deadline = time.monotonic() + 30.0  # the orphaned servers remove it once closed
        while run.run_dir.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not run.run_dir.exists()


def test_a_slot_server_whose_parent_is_gone_exits_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
        "--root", str(tmp_path / "slots"), "--unix", str(tmp_path / "s.sock"),
        "--parent-pid", str(gone.pid),
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"the parent {gone.pid} is gone" in done.stderr
    assert not (tmp_path / "s.sock").exists()


# A parent that starts one slot server as the local pool does (its own session, ``--parent-pid``
# of this parent, ``--parent-dir``, stderr to a log inside that directory), passes its ready line
# on, and waits to be killed.
_PARENT = """
import os, subprocess, sys
directory, argv = sys.argv[1], sys.argv[2:]
with open(os.path.join(directory, "server.log"), "wb") as log:
    server = subprocess.Popen(
        [*argv, "--parent-pid", str(os.getpid()), "--parent-dir", directory],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
    )
sys.stdout.buffer.write(server.stdout.readline())
sys.stdout.flush()
sys.stdin.read()
"""


@attrs.frozen
class Orphanable:
    parent: subprocess.Popen[bytes]
    server: int  # a pidfd of the slot server (not this process's child: no pid to reuse)
    directory: Path
    log: Path

    def signal_server(self, signum: int) -> bool:
        """Send ``signum`` to the server; False once it is gone."""
        try:
            signal.pidfd_send_signal(self.server, signum)
        except ProcessLookupError:
            return False
        return True

    def server_ended(self, timeout_s: float) -> bool:
        readable, _, _ = select.select([self.server], [], [], timeout_s)
        return bool(readable)


@contextmanager
def orphanable_server(files: int = 0) -> Iterator[Orphanable]:
    """A slot server whose parent (``_PARENT``) the test may kill, with ``files`` empty files in
    its ``--parent-dir`` (a tree that takes a while to remove). Everything is ended and removed
    on the way out."""
    directory = Path(tempfile.mkdtemp(prefix="trajcore-orphan-test-"))
    directory.chmod(0o711)  # the slots' uids (a server run as root) reach their workspaces
    junk = directory / "junk"
    junk.mkdir()
    for index in range(files):
        (junk / str(index)).touch()
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
        "--root", str(directory / "slots"), "--unix", str(directory / "server.sock"),
    ]  # fmt: skip
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(directory), *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_environment(),
    )
    server: int | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, (directory / "server.log").read_text()
        server = os.pidfd_open(json.loads(line)["pid"])
        yield Orphanable(parent, server, directory, directory / "server.log")
    finally:
        parent.kill()
        parent.communicate()  # (closes its pipes)
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(server, signal.SIGKILL)
            select.select([server], [], [], 10.0)
            os.close(server)
        shutil.rmtree(directory, ignore_errors=True)


def test_late_parent_death_signals_never_stop_an_orphaned_server_removing_the_directory() -> None:
    # Linux sends the parent-death SIGHUP once per thread of the parent as they end, so a
    # killed env's SIGHUPs keep coming while its servers close and remove its directory.
    with orphanable_server(files=20_000) as run:
        with run.log.open("rb") as log:  # stays readable once the removal unlinks it
            run.parent.kill()
            run.parent.wait()
            deadline = time.monotonic() + 60.0
            while run.signal_server(signal.SIGHUP) and time.monotonic() < deadline:
                if run.server_ended(0.001):
                    break
            assert run.server_ended(10.0)
            output = log.read().decode(errors="replace")
        assert not run.directory.exists(), (output, sorted(run.directory.rglob("*"))[:10])


def test_an_orphaned_server_forced_to_end_still_removes_the_directory() -> None:
    with orphanable_server() as run:
        # Stopped, the server takes the parent-death SIGHUP, a SIGTERM and a SIGINT at once on
        # SIGCONT: whichever it handles first, the last comes while it closes and forces the end.
        with run.log.open("rb") as log:  # stays readable once the removal unlinks it
            assert run.signal_server(signal.SIGSTOP)
            run.parent.kill()
            run.parent.wait()
            assert run.signal_server(signal.SIGTERM)
            assert run.signal_server(signal.SIGINT)
            assert run.signal_server(signal.SIGCONT)
            assert run.server_ended(30.0)
            output = log.read().decode(errors="replace")
        assert "stopping forcibly" in output
        assert not run.directory.exists(), (output, sorted(run.directory.rglob("*"))[:10])
