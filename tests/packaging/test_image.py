"""The slot-server image, smoke-tested from the host over TCP with the bearer token: a container
answers health (sandboxed, with the compiled helper), runs a command in a slot's sandbox, ends the
lease with a reset that wipes the workspace, refuses the old lease and a wrong token, and stops on
SIGTERM leaving no container behind.

``./dev image`` builds the image and runs this file with ``TRAJCORE_IMAGE`` (the tag),
``TRAJCORE_ENGINE`` (podman or docker) and ``TRAJCORE_ENGINE_OPTS`` (the options containers need
on this host) set; without them there is no image to test and the file is skipped.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.errors import SlotServerError
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolOutcome

IMAGE = os.environ.get("TRAJCORE_IMAGE", "")
ENGINE = os.environ.get("TRAJCORE_ENGINE", "")
ENGINE_OPTS = shlex.split(os.environ.get("TRAJCORE_ENGINE_OPTS", ""))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (IMAGE and ENGINE), reason="no image named: ./dev image builds one and runs this"
    ),
]


@attrs.frozen
class Container:
    name: str
    address: str
    token: str


def _engine(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [ENGINE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{ENGINE} {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def _exists(name: str) -> bool:
    listed = _engine("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}")
    return name in listed.split()


@pytest.fixture
def container() -> Iterator[Container]:
    token = secrets.token_hex(16)
    folder = Path(tempfile.mkdtemp(prefix="trajcore-image-"))
    token_file = folder / "token"
    token_file.write_text(token)
    token_file.chmod(0o644)
    name = f"trajcore-smoke-{secrets.token_hex(4)}"
    # not --rm: a container that exits early keeps its log for the failure message
    _engine(
        "run", "--detach", "--name", name, *ENGINE_OPTS,
        "--publish", "127.0.0.1::8765",
        "--volume", f"{token_file}:/run/trajcore/token:ro",
        IMAGE, "--slots", "2", "--listen", "0.0.0.0:8765",
        "--token-file", "/run/trajcore/token",
    )  # fmt: skip
    try:
        port = _engine("port", name, "8765").splitlines()[0].rsplit(":", 1)[1]
        yield Container(name=name, address=f"127.0.0.1:{port}", token=token)
    finally:
        if _exists(name):
            subprocess.run(
                [ENGINE, "rm", "--force", name], capture_output=True, timeout=120, check=False
            )
        token_file.unlink()
        folder.rmdir()


def _call(slot: int, epoch: int, command: str) -> ExecuteCall:
    return ExecuteCall(
        slot=slot,
        epoch=epoch,
        call_id=secrets.token_hex(4),
        tool="bash",
        arguments={"command": command},
        timeout_s=20.0,
    )


def test_the_image_serves_sandboxed_slots_over_tcp_with_the_token(container: Container) -> None:
    async def main() -> None:
        async with SlotServerClient.tcp(container.address, container.token) as client:
            health = await client.wait_healthy(60.0)
            assert health.slots == 2
            assert health.sandboxed
            assert health.capabilities.bwrap, health.capabilities.detail
            assert health.capabilities.slot_helper == "native", health.capabilities.detail
            assert health.capabilities.slot_helper_origin == "shipped"  # its build stage's

            # the first lease: a command in slot 0's sandbox, which leaves a file behind
            (first,) = await client.execute(
                [
                    _call(
                        0,
                        1,
                        "echo left > note; cat note; id -u;"
                        " grep -l 'slot[-]server' /proc/[0-9]*/cmdline 2>/dev/null | wc -l",
                    )
                ]
            )
            assert first.outcome is ToolOutcome.OK, first.error
            lines = first.content.splitlines()
            assert lines[0] == "left"
            assert lines[1] != "0"  # the slot runs as its own uid, not the container's root
            # the sandbox's own pid namespace: the slot server (the container's pid 1) is out of
            # sight (unsandboxed, its command line would be listed here)
            assert lines[2] == "0"

            # a reset through epoch 1 ends that lease: the next one finds an empty workspace
            outcome = await client.reset(0, 1)
            assert outcome.ok, outcome.error
            (after,) = await client.execute([_call(0, 2, "ls -A")])
            assert after.outcome is ToolOutcome.OK, after.error
            assert after.content == ""
            (stale,) = await client.execute([_call(0, 1, "echo stale")])
            assert stale.outcome is ToolOutcome.REJECTED
            assert "stale" in (stale.error or "")

        async with SlotServerClient.tcp(container.address, "not-the-token") as stranger:
            with pytest.raises(SlotServerError):
                await stranger.health()

    asyncio.run(main())
    _engine("stop", "--time", "30", container.name)
    state = _engine("inspect", "--format", "{{.State.ExitCode}}", container.name)
    assert state == "0"
