"""The fake Nomad API's ``docker`` containers do not outlive its process, however it ends.

A child process (``FAKE`` below, as a test run would) serves the fake with the ``docker``
driver through the container engine here and registers a job whose one task is a container
that sleeps; once the container runs, the test ends the process with SIGTERM (Python's default:
death, no close) or SIGKILL, and watches the engine, with a deadline, for every container of
the fake's prefix to go (the fake's guard process, ``processes.ContainerGuard``). Needs podman
or docker and an image with ``sh`` (the slot-server image, used only for its shell); skipped
naming what is missing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

IMAGE = os.environ.get("TRAJCORE_IMAGE") or "localhost/trajcore/slot-server:latest"
ENGINE = next((name for name in ("podman", "docker") if shutil.which(name)), None)
# The engine's words as the Nomad docker tests give them (podman with runc when installed).
WORDS = [ENGINE, "--runtime", "runc"] if ENGINE == "podman" and shutil.which("runc") else [ENGINE]
START_S = 120.0  # the fake starts and the engine runs the container
GONE_S = 60.0  # a killed fake's containers are removed within this


def _missing() -> str | None:
    if ENGINE is None:
        return "no container engine (podman or docker)"
    found = subprocess.run(
        [ENGINE, "image", "inspect", IMAGE], capture_output=True, timeout=60, check=False
    )
    return None if found.returncode == 0 else f"no image {IMAGE} ({ENGINE}): ./dev image builds it"


MISSING = _missing()

FAKE = """
import sys
import anyio
from trajcore.adapters.pools.nomad_client import NomadClient
from trajcore.domain.nomad_job import NomadJobSettings, NomadJobSpec, register_request
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

async def main() -> None:
    image, prefix, *engine = sys.argv[1:]
    fake_api = FakeNomadAPI(drivers=("docker",), engine=tuple(engine), container_prefix=prefix)
    async with fake_api as fake:
        job = NomadJobSettings(
            job_id="sleepers", driver="docker", image=image, command=("sh", "-c", "sleep 600")
        )
        spec = NomadJobSpec(
            job=job, count=1, token="t" * 32, server=SlotServerSettings(slots_per_container=1)
        )
        await NomadClient(address=fake.address).register("sleepers", register_request(spec))
        print("registered", flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def _containers(prefix: str) -> list[str]:
    assert ENGINE is not None
    listed = subprocess.run(
        [ENGINE, "ps", "--all", "--filter", f"name={prefix}", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def _guards_log(state: Path) -> str:
    path = state / "trajcore" / "guards.log"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def _wait_for(what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_fake_s_containers_are_removed(tmp_path: Path, signum: int) -> None:
    assert ENGINE is not None
    prefix = f"trajcore-test-fake-{secrets.token_hex(3)}"
    state = tmp_path / "state"
    process = subprocess.Popen(
        [sys.executable, "-c", FAKE, IMAGE, prefix, *WORDS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), XDG_STATE_HOME=str(state)),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "registered\n", process.communicate(timeout=60)[1]
        _wait_for("the task's container runs", lambda: _containers(prefix), START_S)
        process.send_signal(signum)
        assert process.wait(30) == -signum
        _wait_for("the killed fake's containers removed", lambda: not _containers(prefix), GONE_S)
        said = f"trajcore container pool {prefix}: its process ended without closing it; removed"
        _wait_for("the guard's report", lambda: said in _guards_log(state), GONE_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        for name in _containers(prefix):  # what a failing test left
            subprocess.run(
                [ENGINE, "rm", "--force", name], capture_output=True, timeout=120, check=False
            )
