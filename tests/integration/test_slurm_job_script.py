"""The Slurm job script (``slurm_jobs.job_script``) as a node runs it, without Slurm: under
``/bin/sh`` as an unprivileged uid (jobs run as the submitting user), with a stand-in for the slot
server that leaves what a lease may leave, then signalled as ``scancel`` signals a job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.domain.slurm_jobs import SlurmJobSettings, job_script

NOBODY = 65534
STAND_IN = r"""
import os, pathlib, sys, time
root = pathlib.Path(sys.argv[sys.argv.index("--root") + 1])
left = root / "0" / "d"
left.mkdir(parents=True)
(left / "f").write_text("x")
left.chmod(0o500)  # what a model's `chmod -w` leaves in its workspace
print('{"ready": true, "address": "127.0.0.1:1", "pid": %d}' % os.getpid(), flush=True)
time.sleep(600)
"""

PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # one any uid may run

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or PYTHON is None,
    reason="needs root, setpriv and a system python3 to run the job as an unprivileged uid",
)


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A directory every uid may enter (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="trajcore-slurm-script-"))
    path.chmod(0o755)
    yield path
    for entry in path.rglob("*"):
        if entry.is_dir() and not entry.is_symlink():
            entry.chmod(0o700)
    shutil.rmtree(path)


def test_a_cancelled_job_removes_its_root_even_where_a_slot_made_it_read_only(
    job_dir: Path,
) -> None:
    node_tmp, run_dir = job_dir / "node-tmp", job_dir / "run"
    for path in (node_tmp, run_dir):
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
    script = run_dir / "slot-server.sh"
    script.write_text(job_script(SlurmJobSettings()))
    script.chmod(0o755)
    stand_in = run_dir / "stand_in.py"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o644)
    job = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "/bin/sh", str(script), str(run_dir), str(PYTHON), str(stand_in)],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242", "TMPDIR": str(node_tmp)},
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (run_dir / "4242.ready").exists():
            assert job.poll() is None, "the job script ended before its server was ready"
            assert time.monotonic() < deadline, "the stand-in server never became ready"
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGTERM)  # scancel: SIGTERM to every process of the job
        job.wait(timeout=20)
        assert sorted(str(p.relative_to(node_tmp)) for p in node_tmp.rglob("*")) == []
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=10)
