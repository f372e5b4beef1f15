"""The SandboxPool contract against a real ``nomad agent -dev``, with raw_exec and with docker.

``./dev nomad-test`` runs it. It runs only where a ``nomad`` binary is on PATH (CI runs the same
suite against the fake Nomad API in ``tests/contract``, and over real containers in
``tests/integration/test_nomad_docker.py``); the docker half needs a docker daemon that Nomad's
docker driver can use, holding the slot-server image ``./dev image`` builds. The test
starts its own dev agent on free loopback ports with raw_exec enabled, and each test registers
its own job of the real slot server (``sys.executable -m trajcore.entrypoints.slot_server``).
A container is crashed with ``nomad alloc signal -s SIGKILL``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.nomad_testbed import nomad_pool_config
from trajcore.adapters.pools.nomad_client import NomadClient, NomadUnavailable
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)

NOMAD = shutil.which("nomad")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NOMAD is None, reason="no nomad binary on PATH"),
]
_jobs = itertools.count(1)
_AGENT_CONFIG = """
ports {{
  http = {http}
  rpc  = {rpc}
  serf = {serf}
}}
plugin "raw_exec" {{
  config {{
    enabled = true
  }}
}}
plugin "docker" {{
  config {{
    allow_privileged = false
  }}
}}
"""
IMAGE = "localhost/trajcore/slot-server:latest"


def _docker_problem() -> str | None:
    """Why Nomad's docker driver cannot run the slot-server image here, or ``None``."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    info = subprocess.run([docker, "info"], capture_output=True, timeout=30, check=False)
    if info.returncode != 0:
        return "the docker daemon does not answer (docker info failed)"
    image = subprocess.run(
        [docker, "image", "inspect", IMAGE], capture_output=True, timeout=60, check=False
    )
    if image.returncode != 0:
        return f"docker holds no {IMAGE}: build it with ./dev image"
    return None


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]


async def _wait_for_leader(address: str, process: subprocess.Popen[bytes]) -> str | None:
    """``None`` once the agent has a leader, else why it never got one."""
    client = NomadClient(address=address, timeout_s=2.0)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"nomad agent -dev exited with {process.returncode}"
        try:
            await client.leader()
        except NomadUnavailable:
            await anyio.sleep(0.5)
        else:
            return None
    return "nomad agent -dev elected no leader within 60 s"


@pytest.fixture(scope="module")
def nomad_agent() -> Iterator[str]:
    """A dev agent with raw_exec enabled; yields its API address."""
    assert NOMAD is not None
    http, rpc, serf = _free_ports(3)
    workdir = Path(tempfile.mkdtemp(prefix="trajcore-nomad-dev-"))
    config = workdir / "agent.hcl"
    config.write_text(_AGENT_CONFIG.format(http=http, rpc=rpc, serf=serf), encoding="utf-8")
    log = workdir / "agent.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [NOMAD, "agent", "-dev", "-bind=127.0.0.1", f"-config={config}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"http://127.0.0.1:{http}"
    try:
        problem = anyio.run(_wait_for_leader, address, process)
        if problem is not None:
            pytest.fail(f"{problem}: {log.read_text(errors='replace')[-2000:]}")
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


class TestNomadAgentPool(SandboxPoolContract):
    supports_crash = True
    driver_settings: dict[str, object] = {}  # noqa: RUF012 - read only

    @pytest.fixture
    def sandbox_pool_factory(self, nomad_agent: str) -> SandboxPoolFactory:
        @asynccontextmanager
        async def factory(shape: PoolShape) -> AsyncIterator[SandboxPool]:
            config = nomad_pool_config(
                nomad_agent,
                **self.driver_settings,
                containers=shape.containers,
                slots_per_container=shape.slots_per_container,
                acquire_timeout_s=shape.acquire_timeout_s,
                job_id=f"trajcore-contract-{os.getpid()}-{next(_jobs)}",
                start_timeout_s=60.0,
                poll_interval_s=0.2,
                purge_on_start=True,
            )
            async with NomadSandboxPool(config) as pool:
                yield pool

        return factory

    @pytest.fixture
    def crash_container(self, nomad_agent: str) -> CrashContainer:
        assert NOMAD is not None
        nomad = NOMAD

        def crash(pool: SandboxPool, container: str) -> None:
            assert isinstance(pool, NomadSandboxPool)
            subprocess.run(
                [nomad, "alloc", "signal", f"-address={nomad_agent}", "-s", "SIGKILL",
                 pool.allocation_id(container)],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip

        return crash


_DOCKER_PROBLEM = _docker_problem() if NOMAD is not None else "no nomad binary on PATH"


@pytest.mark.skipif(_DOCKER_PROBLEM is not None, reason=f"Nomad's docker driver: {_DOCKER_PROBLEM}")
class TestNomadAgentDockerPool(TestNomadAgentPool):
    """The same contract with the docker driver running the slot-server image."""

    driver_settings: dict[str, object] = {  # noqa: RUF012 - read only
        "driver": "docker",
        "image": IMAGE,
        "command": ("trajcore", "slot-server"),
    }


def test_the_interpreter_runs_the_slot_server() -> None:
    # What every raw_exec task of this module runs: fail early and clearly if it cannot start.
    found = subprocess.run(
        [sys.executable, "-m", "trajcore.entrypoints.slot_server", "--help"],
        check=False, capture_output=True, timeout=60,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
