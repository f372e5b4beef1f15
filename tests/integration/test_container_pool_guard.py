"""A container pool whose env process ends: killed (its guard removes the containers at once),
stopped by Ctrl-C (its close removes them), or closed normally (its guard exits with it).

The env is a child process (``ENV`` below) that starts a real container pool and prints one
JSON line once the pool is up; the tests wait for that line, signal the process as a scheduler,
the out-of-memory killer or a terminal would, and look from outside with the engine, with
deadlines. They need a container engine and the slot-server image built from this tree, as
``test_container_pool``; without them they are skipped saying why.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import attrs
import pytest

from tests.image_source import image_problem
from tests.processes import Proc, alive, descendants, wait_until_gone
from trajcore.adapters.pools.container_guard import LABEL, OWNER_LABEL
from trajcore.adapters.pools.container_pool import (
    DEFAULT_IMAGE,
    ContainerPoolConfig,
    ContainerSandboxPool,
    find_engine,
)
from trajcore.domain.slot_server_settings import SlotServerSettings

ENGINE = find_engine()
IMAGE = os.environ.get("TRAJCORE_IMAGE") or DEFAULT_IMAGE
IMAGE_PROBLEM = image_problem(ENGINE, IMAGE)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM)),
]

START_S = 120.0  # the env imports trajcore and starts two containers
GONE_S = 30.0  # a killed env's containers are removed within this (no next pool needed)
EXIT_S = 60.0  # an interrupted env closes its pool within this
EOF_S = 2.0  # a killed env's stderr ends within this (its guard does not hold it)

ENV = """
import json, sys
import anyio
from trajcore.adapters.pools.container_pool import ContainerPoolConfig, ContainerSandboxPool
from trajcore.domain.slot_server_settings import SlotServerSettings

async def main() -> None:
    config = ContainerPoolConfig(
        containers=2, image=sys.argv[1], name_prefix=sys.argv[2],
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=60.0),
    )
    pool = ContainerSandboxPool(config)
    try:
        async with pool:
            print(json.dumps({"ready": pool.container_names()}), flush=True)
            await anyio.sleep_forever()
    finally:
        print(json.dumps({"closed": True, "restarts": pool.restarts}), flush=True)

anyio.run(main)
"""


def _engine(*args: str) -> str:
    assert ENGINE is not None
    done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{ENGINE} {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def labelled(prefix: str) -> dict[str, str]:
    """Every container (running or not) of pool label ``prefix``: name -> owner label."""
    assert ENGINE is not None
    for _ in range(10):
        names = _engine(
            "ps", "--all", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}}"
        ).split()
        if not names:
            return {}
        template = f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}'
        done = subprocess.run(
            [ENGINE, "inspect", "--format", template, *names],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return dict(zip(names, done.stdout.split(), strict=True))
        # (one was removed between the listing and the inspection: list again)
    raise AssertionError(f"{ENGINE} inspect kept failing: {done.stderr}")


def _remove_labelled(prefix: str) -> None:
    for name in labelled(prefix):
        subprocess.run(
            [ENGINE or "podman", "rm", "--force", "--volumes", name],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip


@attrs.define
class Env:
    process: subprocess.Popen[str]
    prefix: str
    state: Path  # its $XDG_STATE_HOME: the guards' log is below it
    started: list[Proc] = attrs.field(factory=list)

    def stderr_ends(self, timeout_s: float) -> None:
        """Read the env's stderr to its end, which must come within ``timeout_s``."""
        assert self.process.stderr is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stderr, selectors.EVENT_READ)
            while selector.select(max(0.0, deadline - time.monotonic())):
                if not os.read(self.process.stderr.fileno(), 1 << 16):
                    return
        raise AssertionError(f"the env's stderr is still open {timeout_s} s after it ended")

    def guards_log(self) -> str:
        path = self.state / "trajcore" / "guards.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def line(self, timeout_s: float) -> dict[str, object]:
        """The env's next JSON line on stdout (a thread-free bounded read: ``select``)."""
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout_s), f"the env said nothing within {timeout_s} s"
        text = self.process.stdout.readline()
        assert text, f"the env ended ({self.process.wait(10)}): {self._stderr()}"
        parsed = json.loads(text)
        assert isinstance(parsed, dict), text
        return parsed

    def _stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read()[-3000:]


@contextmanager
def env_process() -> Iterator[Env]:
    """The env (``ENV``) in a session of its own, its pool named ``test-guard-<random>``;
    ended, with whatever it left, on the way out."""
    prefix = f"test-guard-{secrets.token_hex(3)}"
    state = Path(tempfile.mkdtemp(prefix="trajcore-guard-state-"))
    process = subprocess.Popen(
        [sys.executable, "-c", ENV, IMAGE, prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "XDG_STATE_HOME": str(state)},
        start_new_session=True,
    )
    env = Env(process, prefix, state)
    try:
        yield env
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for proc in alive(env.started):  # the guard of a failing test: never outlive it
            os.kill(proc.pid, signal.SIGKILL)
        _remove_labelled(prefix)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        shutil.rmtree(state, ignore_errors=True)


def _wait_for(what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


@pytest.fixture
def control() -> Iterator[str]:
    """A container created now with a running pool's labels of another owner (this process):
    the guard of the killed env must not remove it."""
    name = f"test-guard-control-{secrets.token_hex(3)}"
    yield name
    subprocess.run(
        [ENGINE or "podman", "rm", "--force", name], capture_output=True, timeout=120, check=False
    )


def test_a_killed_env_s_containers_go_at_once_and_no_others(control: str) -> None:
    with env_process() as env:
        ready = env.line(START_S)
        assert "ready" in ready, ready
        env.started = descendants(env.process.pid)
        ours = labelled(env.prefix)
        assert len(ours) == 2, ours
        (owner,) = set(ours.values())
        other = owner.rsplit("/", 1)[0] + "/someone-else"  # the same process, another pool
        _engine("create", "--name", control, "--label", f"{LABEL}={env.prefix}",
                "--label", f"{OWNER_LABEL}={other}", IMAGE)  # fmt: skip
        env.process.kill()  # SIGKILL to the env alone, as the out-of-memory killer sends it
        env.process.wait(10)
        env.stderr_ends(EOF_S)  # its guard, still at work, does not hold it
        _wait_for(
            "the killed env's containers removed",
            lambda: set(labelled(env.prefix)) == {control},
            GONE_S,
        )
        assert labelled(env.prefix) == {control: other}
        said = f"removed its containers ({', '.join(sorted(ours))}) and its token folder"
        _wait_for("the guard's report", lambda: said in env.guards_log(), GONE_S)
        left = wait_until_gone(env.started, GONE_S)  # the guard exits once they are gone
        assert not left, f"left running: {left}"


def test_a_normal_close_leaves_no_guard_and_no_container() -> None:
    with env_process() as env:
        assert "ready" in env.line(START_S)
        env.started = descendants(env.process.pid)
        guards = [p for p in env.started if p.name.startswith("python")]
        assert guards, env.started  # the guard runs while the pool does
        os.kill(env.process.pid, signal.SIGINT)  # the env alone: it closes its pool
        closed = env.line(EXIT_S)
        assert closed == {"closed": True, "restarts": 0}, closed
        env.process.wait(EXIT_S)
        assert labelled(env.prefix) == {}
        left = wait_until_gone(env.started, 10.0)
        assert not left, f"left running: {left}"


def test_ctrl_c_to_the_terminal_s_group_closes_the_pool_without_replacing_containers() -> None:
    """A terminal's Ctrl-C reaches every process of the env's group: the engine's commands
    must not die of it under the pool (a ``wait`` that ends reads as a container that ended,
    which the pool would replace while it closes)."""
    with env_process() as env:
        assert "ready" in env.line(START_S)
        env.started = descendants(env.process.pid)
        os.killpg(env.process.pid, signal.SIGINT)
        closed = env.line(EXIT_S)
        assert closed == {"closed": True, "restarts": 0}, closed
        env.process.wait(EXIT_S)
        assert labelled(env.prefix) == {}
        left = wait_until_gone(env.started, 10.0)
        assert not left, f"left running: {left}"


@pytest.mark.anyio
async def test_the_guard_is_released_by_the_close() -> None:
    config = ContainerPoolConfig(
        containers=1,
        image=IMAGE,
        name_prefix=f"test-guard-{secrets.token_hex(3)}",
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=60.0),
    )
    pool = ContainerSandboxPool(config)
    async with pool:
        guard = pool._engine.guard.pid
        assert guard is not None
        assert [p.pid for p in alive(descendants(os.getpid())) if p.pid == guard] == [guard]
    assert pool._engine.guard.pid is None
    assert guard not in {p.pid for p in descendants(os.getpid())}  # exited and reaped


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _engine_waits() -> dict[int, str]:
    """This process's ``ENGINE wait ID`` children: pid -> the container they wait for."""
    waits: dict[int, str] = {}
    for proc in alive(descendants(os.getpid())):
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().decode("utf-8", "replace").split("\0")
        if len(words) >= 3 and words[1] == "wait":
            waits[proc.pid] = words[2]
    return waits


@pytest.mark.anyio
async def test_an_engine_wait_ended_by_a_signal_is_not_the_container_s_end() -> None:
    """A ``wait`` that a Ctrl-C (or anything else) ends while its container runs: the pool
    waits again, and neither drops nor replaces the container."""
    config = ContainerPoolConfig(
        containers=1,
        image=IMAGE,
        name_prefix=f"test-guard-{secrets.token_hex(3)}",
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=60.0),
    )
    async with ContainerSandboxPool(config) as pool:
        (name,) = pool.container_names()
        with anyio.fail_after(30):
            while not (first := _engine_waits()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        (pid, waited) = next(iter(first.items()))
        os.kill(pid, signal.SIGINT)
        with anyio.fail_after(60):
            while not (again := {p: c for p, c in _engine_waits().items() if p != pid}):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert list(again.values()) == [waited]  # the same container, waited for again
        assert pool.container_names() == [name]
        assert pool.restarts == 0
    assert labelled(config.name_prefix or "") == {}
