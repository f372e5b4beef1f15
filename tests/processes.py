"""The child processes of the integration tests, started and ended one way.

- ``free_port``: a loopback port nothing listens on (the kernel's pick).
- ``child_environment``: a child's environment: offline, no wandb, no proxy, no ``OPENAI_*``,
  the repository on ``PYTHONPATH`` (a test file run as an env imports ``tests.*``), and
  ``$TMPDIR`` the test's own when given (wandb makes temporary folders at import that only an
  orderly exit removes, and the local pool makes its folder there).
- ``process_group``: a command in a process group of its own, ended, all of it, on the way out
  (SIGTERM, then SIGKILL), and checked gone.
- ``Proc``, ``descendants``, ``alive``, ``wait_until_gone``, ``names``: a process tree read from
  ``/proc``; a process is named by its pid and start time, so a reused pid is not it.
- ``wait_until``: poll until a probe answers, else fail with the tails of the logs.
- ``run_api``: atroposlib's ``run-api`` on a free port with a trainer registered and its run
  started, as a client of it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import attrs
import httpx
import pytest

__all__ = [
    "Proc",
    "alive",
    "child_environment",
    "descendants",
    "end_group",
    "free_port",
    "names",
    "process_group",
    "run_api",
    "wait_until",
    "wait_until_gone",
]

T = TypeVar("T")

_PROXIES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
_ROOT = str(Path(__file__).resolve().parents[1])  # the repository: ``tests`` is importable


def free_port() -> int:
    """A free loopback port (the kernel's choice; free when asked, not reserved)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def child_environment(scratch: Path | None = None) -> dict[str, str]:
    """This process's environment for a child: offline, no wandb, no proxy and no ``OPENAI_*``,
    the repository first on ``PYTHONPATH``; ``TMPDIR`` is ``scratch`` when given."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    for name in _PROXIES:
        environment.pop(name, None)
    path = os.pathsep.join(p for p in (_ROOT, environment.get("PYTHONPATH", "")) if p)
    environment.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="disabled",
        NO_PROXY="*",
        PYTHONPATH=path,
    )
    if scratch is not None:
        environment["TMPDIR"] = str(scratch)
    return environment


def _group_left(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def end_group(process: subprocess.Popen[bytes]) -> None:
    """End ``process``'s process group, all of it: SIGTERM, then SIGKILL to what is left of
    the group after 5 s (its leader's exit does not end the rest); reap ``process``."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while (process.poll() is None or _group_left(process.pid)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        if process.poll() is not None and not _group_left(process.pid):
            break
    process.wait(timeout=5)


@contextmanager
def process_group(
    argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in a new session (its own process group), its output in ``log``; the group is
    ended on the way out, and nothing of it may be left."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        end_group(process)
        with pytest.raises(ProcessLookupError):
            os.killpg(process.pid, 0)  # nothing of the group is left


@attrs.frozen
class Proc:
    pid: int
    started: int  # clock ticks after boot: with the pid, names one process for good
    name: str


def _stat(pid: int) -> tuple[int, str, int, str] | None:
    """(ppid, state, start time, name) of ``pid``, or ``None`` when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19]), name


def descendants(root: int) -> list[Proc]:
    """Every live descendant of ``root`` (host pids; zombies left out)."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[int, str, int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            info[int(entry)] = stat
            children.setdefault(stat[0], []).append(int(entry))
    found: list[Proc] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        _, state, started, name = info[pid]
        if state != "Z":
            found.append(Proc(pid, started, name))
        todo.extend(children.get(pid, []))
    return found


def alive(procs: Sequence[Proc]) -> list[Proc]:
    """Those of ``procs`` still running (a zombie or a reused pid does not count)."""
    left = []
    for proc in procs:
        stat = _stat(proc.pid)
        if stat is not None and stat[2] == proc.started and stat[1] != "Z":
            left.append(proc)
    return left


def wait_until_gone(procs: Sequence[Proc], timeout_s: float) -> list[Proc]:
    """Those of ``procs`` still running after at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def names(procs: Sequence[Proc]) -> str:
    return ", ".join(f"{p.name}({p.pid})" for p in procs)


def wait_until(
    deadline: float, what: str, logs: Sequence[Path], probe: Callable[[], T | None]
) -> T:
    """``probe``'s first answer other than ``None`` before ``deadline`` (monotonic), polled
    every 0.2 s; else the test fails naming ``what``, with the last lines of each log."""
    while time.monotonic() < deadline:
        answer = probe()
        if answer is not None:
            return answer
        time.sleep(0.2)
    tails = "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    pytest.fail(f"timed out waiting for {what}\n{tails}")


@contextmanager
def run_api(tmp_path: Path, env: Mapping[str, str], *, batch_size: int) -> Iterator[httpx.Client]:
    """atroposlib's ``run-api`` on a free loopback port (its log ``tmp_path/run-api.log``, in a
    process group of its own, ended on the way out) with a trainer registered for batches of
    ``batch_size`` and the run started; a client of it (its base URL is the API's)."""
    port = free_port()
    log = tmp_path / "run-api.log"
    command = [str(Path(sys.executable).parent / "run-api"), "--host", "127.0.0.1"]
    with (
        process_group([*command, "--port", str(port)], log, env) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0, trust_env=False) as api,
    ):

        def listening() -> bool | None:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                return api.get("/").status_code == 200 or None
            except httpx.TransportError:
                return None

        wait_until(time.monotonic() + 60, "run-api to listen", [log], listening)
        registered = api.post(
            "/register",
            json={
                "wandb_group": "trajcore",
                "wandb_project": "trajcore-test",
                "batch_size": batch_size,
                "max_token_len": 8192,
                "checkpoint_dir": str(tmp_path / "checkpoints"),
                "save_checkpoint_interval": -1,
                "starting_step": 0,
                "num_steps": 100,
            },
        )
        assert registered.status_code == 200, registered.text
        assert "uuid" in registered.json()
        assert api.get("/batch").json()["batch"] is None  # starts the run; nothing yet
        yield api
