"""A pool's guard never holds the env's stderr: a killed env's stderr ends when the env does,
and what the guard did after it is in the guards' log (``guard_process.guard_log``).

Each test runs an env-like program (a ``GuardProcess`` user, a real local pool) as a child with
its stdout and stderr piped and ``$XDG_STATE_HOME`` the test's own, SIGKILLs it as a scheduler
would, reads its stderr to the end with a deadline, then looks at what the guard did and said.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trajcore.adapters.pools.guard_process import guard_log

pytestmark = pytest.mark.slow

EOF_S = 2.0  # a dead env's stderr ends within this (nothing else holds it)
GUARD_S = 6.0  # how long the slow guard takes after the env's end (longer than EOF_S)
START_S = 120.0  # the program starts its pool and prints its line

_GUARD_USER = """
import logging, sys
import anyio
from trajcore.adapters.pools.guard_process import GuardProcess

SLOW = (
    "import sys, time; sys.stdin.read(); time.sleep(float(sys.argv[1])); "
    "sys.stderr.write('the slow guard cleaned up' + chr(10))"
)

async def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    guard = GuardProcess()
    await guard.start([sys.executable, "-c", SLOW, sys.argv[1]])
    print(guard.pid, flush=True)
    await anyio.sleep_forever()

anyio.run(main)
"""

_LOCAL_POOL_USER = """
import logging
import anyio
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool

async def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    async with LocalSandboxPool(LocalPoolConfig(containers=1)) as pool:
        print(pool.run_dir, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def _environment(state: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), XDG_STATE_HOME=str(state))


def _killed(code: str, state: Path, *args: str) -> tuple[str, float, str]:
    """Run ``code`` until its first line, SIGKILL it, read its stderr to the end (at most
    ``EOF_S`` s after its death); (its line, the seconds that read took, its stderr)."""
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(state),
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    stream, err = process.stderr, list[str]()
    reader = threading.Thread(target=lambda: err.append(stream.read()), daemon=True)
    try:
        line = process.stdout.readline().strip()
        assert line, f"the program ended first ({process.wait(10)})"
        reader.start()
        process.kill()
        process.wait(10)
        died = time.monotonic()
        reader.join(EOF_S)
        took = time.monotonic() - died
        assert not reader.is_alive(), f"its stderr is still open {EOF_S} s after it died"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()
        if not reader.is_alive():
            stream.close()
    return line, took, "".join(err)


def _wait_for(what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _log(state: Path) -> str:
    path = state / "trajcore" / "guards.log"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_a_killed_env_s_stderr_ends_while_its_guard_still_works(tmp_path: Path) -> None:
    state = tmp_path / "state"
    line, took, err = _killed(_GUARD_USER, state, str(GUARD_S))
    guard = int(line)
    try:
        assert _alive(guard), "the guard ended with the env"  # it was still at work at EOF
        assert took < EOF_S
        assert f"reports to {state / 'trajcore' / 'guards.log'}" in err, err
        said = "the slow guard cleaned up"
        _wait_for("the guard's report", lambda: said in _log(state).splitlines(), 30.0)
    finally:
        if _alive(guard):
            os.kill(guard, signal.SIGKILL)
    assert (state / "trajcore" / "guards.log").stat().st_mode & 0o777 == 0o600


def test_a_killed_local_pool_s_directory_goes_and_its_guard_says_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    line, _, err = _killed(_LOCAL_POOL_USER, state)
    run_dir = Path(line)
    assert f"reports to {state / 'trajcore' / 'guards.log'}" in err, err
    _wait_for("the pool's directory removed", lambda: not run_dir.exists(), 60.0)
    said = f"trajcore local pool {run_dir}: its process ended without closing it"
    _wait_for("the guard's report", lambda: said in _log(state), 60.0)
    assert "its directory" in _log(state)


def test_the_guards_log_follows_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert guard_log() == tmp_path / "trajcore" / "guards.log"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert guard_log() == tmp_path / "home" / ".local" / "state" / "trajcore" / "guards.log"
