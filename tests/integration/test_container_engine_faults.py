"""The container pool when its engine misbehaves: an engine that cannot be used, a command that
hangs, and containers that other pools (alive or dead) left with the pool's labels.

The engine is a small shell script in front of the real one (or in place of it), so each fault
is what the command line does, with nothing of the pool replaced. The tests that run containers
need the engine and the slot-server image built from this tree, as ``test_container_pool``; each
checks that no container it made is left.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.image_source import image_problem
from trajcore.adapters.pools.container_pool import (
    DEFAULT_IMAGE,
    LABEL,
    ContainerPoolConfig,
    ContainerSandboxPool,
    find_engine,
)
from trajcore.domain.errors import SandboxUnavailable
from trajcore.domain.slot_server_settings import SlotServerSettings

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
    return ContainerPoolConfig(
        containers=1,
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=60.0),
        image=IMAGE,
        engine=engine,
        name_prefix=f"test-faults-{secrets.token_hex(3)}",
        **more,  # type: ignore[arg-type]
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
