"""``trajcore run`` stopped from outside, as a user or a scheduler stops it.

Each test starts the real command in its own session (as a shell starts a job), waits for a
known point in its output, sends what a terminal or a scheduler sends (Ctrl-C is SIGINT to the
whole process group; a scheduler sends SIGTERM and, after its grace period, SIGKILL), and then
looks from outside, with deadlines: the exit status and message, every process the run started
(by pid and start time), the pool's directory (the run's ``$TMPDIR`` is the test's own), and
the output files, whose lines must each be whole JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

from tests.processes import Proc, alive, descendants, wait_until_gone

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ENVS = HERE / "interrupt_envs.py"
START_S = 180.0  # atroposlib, a tokenizer and a slot server load first
EXIT_S = 30.0  # a stopped run closes its pool and writes its report within this


@attrs.define
class Run:
    process: subprocess.Popen[str]
    out: Path
    scratch: Path
    stderr: list[str] = attrs.field(factory=list)
    started: list[Proc] = attrs.field(factory=list)

    def wait_for(self, text: str, timeout_s: float = START_S) -> None:
        """Wait until ``text`` is on stderr, noting every process the run started meanwhile."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.stderr):
            assert self.process.poll() is None, "".join(self.stderr)[-3000:]
            assert time.monotonic() < deadline, "".join(self.stderr)[-3000:]
            self.note_processes()
            time.sleep(0.05)
        self.note_processes()

    def note_processes(self) -> None:
        known = set(self.started)
        self.started += [p for p in descendants(self.process.pid) if p not in known]

    def ctrl_c(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)  # what a terminal sends: the whole group

    def wait(self) -> int:
        return self.process.wait(timeout=EXIT_S)

    def pool_dirs(self) -> list[Path]:
        return sorted(self.scratch.glob("trajcore-pool-*"))

    def lines(self, name: str) -> list[object]:
        """The records of ``name`` in ``--out``; each line must be whole JSON."""
        text = (self.out / name).read_text(encoding="utf-8")
        assert not text or text.endswith("\n"), text[-200:]
        return [json.loads(line) for line in text.splitlines()]


@contextmanager
def trajcore_run(tmp_path: Path, *, groups: int, **environment: str) -> Iterator[Run]:
    """``trajcore run interrupt_envs.py:TwoGroupsEnv --policy play`` on the local pool, in a
    session of its own; ended with all it started on the way out."""
    scratch = Path(tempfile.mkdtemp(prefix="trajcore-interrupts-tmp-"))
    scratch.chmod(0o711)  # the local pool's directory is made here; the slots' uids search it
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(environment, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    env.update(TMPDIR=str(scratch), PYTHONPATH=os.pathsep.join(sys.path))
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.cli", "run", f"{ENVS}:TwoGroupsEnv",
        "--policy", f"{ENVS}:play", "--groups", str(groups), "--out", str(out), "--plain",
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    run = Run(process, out, scratch)
    assert process.stderr is not None
    reader = threading.Thread(target=run.stderr.extend, args=(process.stderr,), daemon=True)
    reader.start()
    try:
        yield run
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for proc in alive(run.started):  # what a failing test left: never outlive the test
            os.kill(proc.pid, signal.SIGKILL)
        reader.join(5)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _names(procs: list[Proc]) -> str:
    return ", ".join(f"{p.name}({p.pid})" for p in procs)


def _nothing_left(run: Run) -> None:
    left = wait_until_gone(run.started, 10.0)
    assert not left, f"left running: {_names(left)}"
    deadline = time.monotonic() + 10.0  # a killed run's servers remove its directory
    while run.pool_dirs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not run.pool_dirs()


def test_ctrl_c_while_the_env_loads_ends_with_one_line(tmp_path: Path) -> None:
    with trajcore_run(tmp_path, groups=1, INTERRUPT_ENVS_SLOW_IMPORT="1") as run:
        assert run.process.stdout is not None
        assert run.process.stdout.readline() == "importing\n"
        run.ctrl_c()
        status = run.wait()
        err = "".join(run.stderr)
    assert status == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "trajcore run: interrupted (SIGINT)" in err


def test_sigterm_while_the_env_loads_ends_with_one_line(tmp_path: Path) -> None:
    told = tmp_path / "go-on"
    with trajcore_run(tmp_path, groups=1, INTERRUPT_ENVS_IMPORT_UNTIL=str(told)) as run:
        assert run.process.stdout is not None
        try:
            assert run.process.stdout.readline() == "importing\n"
            run.note_processes()
            run.process.send_signal(signal.SIGTERM)  # what a scheduler sends: the process
            status = run.wait()
        finally:
            told.touch()  # a run the signal did not end goes on, and is killed on the way out
        deadline = time.monotonic() + 10.0  # stderr is read by a thread, maybe late
        while "(SIGTERM)" not in "".join(run.stderr) and time.monotonic() < deadline:
            time.sleep(0.05)
        err = "".join(run.stderr)
        _nothing_left(run)
    assert status == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("trajcore")]
    assert ours == ["trajcore run: terminated (SIGTERM)"], err[-3000:]


def test_a_run_killed_after_sigterm_keeps_the_groups_it_finished(tmp_path: Path) -> None:
    with trajcore_run(tmp_path, groups=2) as run:
        run.wait_for("slow call")
        assert len(run.started) >= 2  # a slot server and the sandboxes of its slots
        run.process.send_signal(signal.SIGTERM)
        run.wait_for("stopping and closing the sandbox pool", timeout_s=EXIT_S)
        run.process.kill()  # the scheduler's grace period is over
        assert run.wait() == -signal.SIGKILL
        _nothing_left(run)
        records = run.lines("trajectories.jsonl")
    assert [r["status"] for r in records] == ["finished", "finished"]  # type: ignore[index]
    assert {r["group"] for r in records} == {records[0]["group"]}  # type: ignore[index]


def test_a_second_ctrl_c_keeps_the_groups_it_finished(tmp_path: Path) -> None:
    with trajcore_run(tmp_path, groups=3, INTERRUPT_ENVS_STUCK_CLOSE="1") as run:
        run.wait_for("slow call")
        run.ctrl_c()
        run.wait_for("send it again to stop at once", timeout_s=EXIT_S)
        run.ctrl_c()
        status = run.wait()
        err = "".join(run.stderr)
        _nothing_left(run)
        records = run.lines("trajectories.jsonl")
    assert status == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "a second signal: ending the slot servers and stopping now" in err
    assert [r["status"] for r in records] == ["finished", "finished"]  # type: ignore[index]


def test_a_run_stopped_by_sigterm_says_so_in_its_summary_and_report(tmp_path: Path) -> None:
    """The table and the report hold the groups done; both say the run was stopped, by what,
    and after how many of the groups asked for (the exit status and stderr are not all)."""
    with trajcore_run(tmp_path, groups=3) as run:
        run.wait_for("slow call")
        run.process.send_signal(signal.SIGTERM)
        status = run.wait()
        assert run.process.stdout is not None
        out = run.process.stdout.read()
        err = "".join(run.stderr)
        _nothing_left(run)
        records = run.lines("trajectories.jsonl")
        page = (run.out / "report.html").read_text(encoding="utf-8")
    assert status == 143, err[-3000:]
    said = "stopped by SIGTERM after 1 of 3 groups"
    assert "2 trajectories in 1 groups" in out
    assert f"\n{said}\n" in out, out
    assert f"<title>trajcore run: TwoGroupsEnv: {said}</title>" in page
    assert f"<h1>trajcore run: TwoGroupsEnv: {said}</h1>" in page
    assert [r["status"] for r in records] == ["finished", "finished"]  # type: ignore[index]
