"""The container pool when its engine misbehaves: an engine that cannot be used, a command that
hangs, and containers that other pools (alive or dead) left with the pool's labels.

The engine is a small shell script in front of the real one (or in place of it), so each fault
is what the command line does, with nothing of the pool replaced. The tests that run containers
need the engine and the slot-server image built from this tree, as ``test_container_pool``; each
checks that no container it made is left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image_source import image_problem
from trajcore.adapters.pools.container_guard import LABEL, OWNER_LABEL
from trajcore.adapters.pools.container_pool import (
    DEFAULT_IMAGE,
    ContainerPoolConfig,
    ContainerSandboxPool,
    abandon_container_pools,
    default_engine_options,
    find_engine,
)
from trajcore.domain.errors import ConfigError, SandboxUnavailable, SlotServerError
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.tools import ToolOutcome
from trajcore.testing.portal_pools import slot_call

ENGINE = find_engine()
IMAGE = os.environ.get("TRAJCORE_IMAGE") or DEFAULT_IMAGE
NEEDS_IMAGE = pytest.mark.skipif(
    (problem := image_problem(ENGINE, IMAGE)) is not None, reason=str(problem)
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _engine(*args: str) -> str:
    assert ENGINE is not None
    done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{ENGINE} {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def containers_labelled(prefix: str) -> list[str]:
    return _engine(
        "ps", "--all", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}}"
    ).split()


def script(folder: Path, body: str) -> str:
    """An executable ``sh`` script at ``folder/engine`` running ``body``: the pool's engine."""
    path = folder / "engine"
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def config(engine: str | None = None, **more: object) -> ContainerPoolConfig:
    values: dict[str, object] = {
        "name_prefix": f"test-faults-{secrets.token_hex(3)}", "containers": 1
    } | more  # fmt: skip
    return ContainerPoolConfig(
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=60.0),
        image=IMAGE,
        engine=engine,
        **values,  # type: ignore[arg-type]
    )


@pytest.mark.anyio
async def test_an_engine_that_cannot_be_used_is_named_with_its_error(tmp_path: Path) -> None:
    """A broken engine (its socket down, its storage unreadable) is not reported as a missing
    image: the refusal carries what the engine said."""
    broken = script(
        tmp_path,
        'echo "Error: unable to connect to Podman socket: connection refused" >&2; exit 125',
    )
    with pytest.raises(SandboxUnavailable) as refused:
        async with ContainerSandboxPool(config(broken)):
            pytest.fail("a pool started over a broken engine")
    message = str(refused.value)
    assert "unable to connect to Podman socket: connection refused" in message
    assert "./dev image" not in message


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_hung_stop_still_removes_the_container(tmp_path: Path) -> None:
    """An engine whose ``stop`` hangs: the stop is given up after its deadline, the container
    is removed all the same, and the pool's close raises nothing."""
    hung = script(tmp_path, f'if [ "$1" = stop ]; then exec sleep 120; fi\nexec {ENGINE} "$@"')
    pool_config = config(hung, engine_timeout_s=2.0, stop_timeout_s=1.0)
    assert pool_config.name_prefix is not None
    try:
        async with ContainerSandboxPool(pool_config) as pool:
            assert len(pool.container_names()) == 1
        assert containers_labelled(pool_config.name_prefix) == []
    finally:
        for name in containers_labelled(pool_config.name_prefix):
            _engine("rm", "--force", "--volumes", name)


def _start_of(pid: int) -> str:
    """Process ``pid``'s start time, as the owner label records it (``/proc``)."""
    return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[19]


def _ended_pid() -> int:
    """The pid of a process that ran and was reaped."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@pytest.fixture
def leftovers() -> Iterator[dict[str, str]]:
    """Three containers as other pools left them, by the prefix of each: ``dead`` (its owner
    process ended), ``alive`` (its owner runs) and ``unowned`` (no owner label)."""
    host = socket.gethostname()
    space = os.stat("/proc/self/ns/pid").st_ino
    living = subprocess.Popen(["sleep", "120"])  # a process that runs a pool elsewhere
    owners = {
        "dead": f"{host}/{space}/{_ended_pid()}/0/abc",
        "alive": f"{host}/{space}/{living.pid}/{_start_of(living.pid)}/abc",
        # a pool of another pid namespace (a container sharing the engine): its pid says nothing
        "elsewhere": f"{host}/{space + 1}/{_ended_pid()}/0/abc",
        "unowned": "",
    }
    created: list[str] = []
    try:
        prefixes: dict[str, str] = {}
        for role, owner in owners.items():
            prefix = prefixes[role] = f"test-left-{role}-{secrets.token_hex(3)}"
            labels = ["--label", f"{LABEL}={prefix}"]
            if owner:
                labels += ["--label", f"{OWNER_LABEL}={owner}"]
            created.append(_engine("create", "--name", f"{prefix}-0-1", *labels, IMAGE))
        yield prefixes
    finally:
        living.kill()
        living.wait()
        for container in created:  # one at a time: podman 4's rm skips all if one is gone
            subprocess.run(
                [ENGINE or "podman", "rm", "--force", "--volumes", container],
                capture_output=True,
                check=False,
            )


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_containers_of_a_killed_pool_are_removed_at_the_next_start(
    leftovers: dict[str, str],
) -> None:
    """A pool whose process was killed leaves its containers running under its own (random)
    prefix; the next pool on this host removes them, and leaves a running pool's containers
    and those without an owner alone."""
    async with ContainerSandboxPool(config()) as pool:
        assert len(pool.container_names()) == 1
    assert containers_labelled(leftovers["dead"]) == []
    assert containers_labelled(leftovers["alive"]) == [f"{leftovers['alive']}-0-1"]
    assert containers_labelled(leftovers["unowned"]) == [f"{leftovers['unowned']}-0-1"]
    assert containers_labelled(leftovers["elsewhere"]) == [f"{leftovers['elsewhere']}-0-1"]


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_prefix_a_running_pool_holds_is_refused_and_that_pool_keeps_serving() -> None:
    """Two pools given the same ``name_prefix``: the second is refused naming the setting,
    instead of removing the first one's containers."""
    first_config = config()
    prefix = first_config.name_prefix
    assert prefix is not None
    async with ContainerSandboxPool(first_config) as first:
        running = containers_labelled(prefix)
        with pytest.raises(ConfigError) as refused:
            async with ContainerSandboxPool(config(name_prefix=prefix)):
                pytest.fail("a second pool started over a running pool's prefix")
        assert refused.value.field == "name_prefix"
        assert containers_labelled(prefix) == running
        async with first.lease("still") as lease:
            (result,) = await first.execute(
                lease.slot.container, [slot_call(lease, "bash", command="echo ok")]
            )
        assert result.outcome is ToolOutcome.OK, result
    assert containers_labelled(prefix) == []


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_forced_end_removes_the_containers_when_one_listed_is_gone(
    tmp_path: Path,
) -> None:
    """A forced end (``abandon_container_pools``) while a container is being removed by the
    pool's own stop: the engine lists an ID that is gone by the time of ``rm``; the pool's
    other containers are removed all the same."""
    gone = "0" * 64
    racing = script(
        tmp_path,
        f'if [ "$1" = ps ]; then {ENGINE} "$@" && echo {gone}; exit $?; fi\nexec {ENGINE} "$@"',
    )
    pool_config = config(racing, containers=2)
    assert pool_config.name_prefix is not None
    try:
        async with ContainerSandboxPool(pool_config):
            assert len(containers_labelled(pool_config.name_prefix)) == 2
            assert abandon_container_pools(grace_s=60.0) == 1
            assert containers_labelled(pool_config.name_prefix) == []
    finally:
        for name in containers_labelled(pool_config.name_prefix):
            _engine("rm", "--force", "--volumes", name)


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_server_that_exits_at_once_fails_the_start_with_what_it_said(
    tmp_path: Path,
) -> None:
    """A server that rejects its flags (an image of another tree) ends before the pool asks
    for its port; the start's error carries what the server said, not only that no port was
    published."""
    slow_run = script(
        tmp_path,
        f'if [ "$1" = run ]; then {ENGINE} "$@"; done=$?; sleep 1; exit $done; fi\n'
        f'exec {ENGINE} "$@"',
    )
    assert ENGINE is not None
    refusing = json.dumps(["/bin/sh", "-c", "echo 'error: unrecognized arguments: --x' >&2"])
    options = (*default_engine_options(ENGINE), "--entrypoint", refusing)
    pool_config = config(slow_run, engine_options=options)
    assert pool_config.name_prefix is not None
    try:
        with pytest.raises(SlotServerError, match="unrecognized arguments: --x"):
            async with ContainerSandboxPool(pool_config):
                pytest.fail("a pool started with a server that exited")
        assert containers_labelled(pool_config.name_prefix) == []
    finally:
        for name in containers_labelled(pool_config.name_prefix):
            _engine("rm", "--force", "--volumes", name)


@pytest.fixture
def token_folders() -> Iterator[tuple[Path, Path]]:
    """Two token folders as pools left them: of a process that ended, of one that runs."""
    living = subprocess.Popen(["sleep", "120"])
    temporary = Path(tempfile.gettempdir())
    tag = secrets.token_hex(3)
    dead = temporary / f"trajcore-containers-{_ended_pid()}.1-{tag}"
    alive = temporary / f"trajcore-containers-{living.pid}.{_start_of(living.pid)}-{tag}"
    try:
        for folder in (dead, alive):
            folder.mkdir(mode=0o700)
            (folder / "token").write_text("old", encoding="utf-8")
        yield dead, alive
    finally:
        living.kill()
        living.wait()
        for folder in (dead, alive):
            shutil.rmtree(folder, ignore_errors=True)


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_the_token_folder_of_a_killed_pool_is_removed_at_the_next_start(
    token_folders: tuple[Path, Path],
) -> None:
    """A killed env leaves its pool's token folder (the bearer token) in the temporary
    directory; the next pool removes it, and leaves the folder of a process still running."""
    dead, alive = token_folders
    async with ContainerSandboxPool(config()) as pool:
        assert len(pool.container_names()) == 1
    assert not dead.exists()
    assert (alive / "token").exists()


@NEEDS_IMAGE
@pytest.mark.slow
@pytest.mark.anyio
async def test_engine_options_the_engine_refuses_name_the_defaults_they_replace() -> None:
    """``engine_options`` replaces every default option; when the engine refuses the run, the
    error says so and what the defaults are, so that a limit is added to them."""
    assert ENGINE is not None
    pool_config = config(engine_options=("--no-such-option",))
    assert pool_config.name_prefix is not None
    try:
        with pytest.raises(SlotServerError) as refused:
            async with ContainerSandboxPool(pool_config):
                pytest.fail("a pool started with an option the engine refuses")
        assert "no-such-option" in str(refused.value)
        assert " ".join(default_engine_options(ENGINE)) in str(refused.value)
        assert containers_labelled(pool_config.name_prefix) == []
    finally:
        for name in containers_labelled(pool_config.name_prefix):
            _engine("rm", "--force", "--volumes", name)
