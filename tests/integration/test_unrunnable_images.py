"""An image no command could run over is refused at its lease, never charged to the model.

A real slot server with an image cache and images written at test time: one with no
``/bin/sh`` (a layer holding only ``etc/task-id``), one whose config names another
architecture, one whose ``/bin/sh`` is an absolute symlink the tree does not hold (the host
does), a usr-merged one (``/bin -> usr/bin``: accepted), and the shell image, which has no
tmux (``bash_stateful`` over it is an infrastructure error naming the image). On the local
pool, the refusal is ``EnvironmentUnavailable`` and a hook's ``SlotTools.run`` whose command
never started raises ``SlotInfraError`` instead of answering ``exit_code None``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, shell_entries, write_shell_image
from tests.image_layouts import Entry, write_layout
from tests.integration.image_leases import image_cache_server
from tests.integration.test_environment_leases import lease, reset, shell
from tests.integration.test_slot_server import (
    Server,
    call,
    one,
    searchable_dir,
)
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.slot_server.image_checks import HOST_ARCHITECTURE
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.environment_leases import EnvironmentUnavailable
from trajcore.domain.errors import SlotInfraError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.tools import ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]

OTHER_ARCHITECTURE = "arm64" if HOST_ARCHITECTURE != "arm64" else "amd64"
EPOCHS = itertools.count(1)  # slot 0's, across the parameters
TASK_ID = Entry(name="etc/task-id", data=b"task-7\n")


def _usr_merged() -> list[Entry]:
    """The shell image with its ``bin`` moved to ``usr/bin`` and ``/bin -> usr/bin``."""
    moved = []
    for entry in shell_entries():
        if entry.name == "bin/":
            continue
        name = "usr/" + entry.name if entry.name.startswith("bin/") else entry.name
        moved.append(Entry(name=name, data=entry.data, kind=entry.kind, mode=entry.mode))
    dirs = [Entry(name="usr/", kind=tarfile.DIRTYPE, mode=0o755)]
    dirs.append(Entry(name="usr/bin/", kind=tarfile.DIRTYPE, mode=0o755))
    link = Entry(name="bin", kind=tarfile.SYMTYPE, link="usr/bin")
    return dirs + moved + [link]


@pytest.fixture(scope="module")
def images() -> Iterator[tuple[Server, Path]]:
    """A server with an image cache, and a folder of layouts named by what they hold."""
    with searchable_dir("unrunnable") as folder:
        write_layout(folder / "noshell", [[TASK_ID]])
        write_shell_image(folder / "foreign", salt="foreign", architecture=OTHER_ARCHITECTURE)
        outside = [  # the host has /bin/sh; the tree has no usr/bin/dash
            Entry(name="bin/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry(name="bin/sh", kind=tarfile.SYMTYPE, link="/usr/bin/dash"),
            TASK_ID,
        ]
        write_layout(folder / "outside", [outside])
        above = Entry(name="bin/sh", kind=tarfile.SYMTYPE, link="../../../../../usr/bin/dash")
        write_layout(folder / "escape", [[outside[0], above, TASK_ID]])
        write_layout(folder / "merged", [_usr_merged()], salt="merged")
        write_shell_image(folder / "shell", salt="shell")
        with image_cache_server(folder) as running:
            yield running, folder


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        ("noshell", "has no /bin/sh"),
        ("outside", "has no /bin/sh"),
        ("escape", "has no /bin/sh"),
        ("foreign", f"is built for {OTHER_ARCHITECTURE}, this host runs {HOST_ARCHITECTURE}"),
    ],
)
def test_an_image_no_command_could_run_over_is_refused_naming_it(
    images: tuple[Server, Path], layout: str, reason: str
) -> None:
    server, folder = images
    ref = f"oci:{folder / layout}"

    async def main() -> None:
        for epoch in (next(EPOCHS), next(EPOCHS)):  # the second: from the first's answer
            answer = await lease(server, 0, epoch, ref)
            assert answer["ok"] is False, answer
            assert answer["field"] == "environment", answer
            assert reason in str(answer["error"]), answer
            assert ref in str(answer["error"]), answer
            await reset(server, 0, epoch)

    asyncio.run(main())


def test_a_usr_merged_image_runs_its_shell_through_the_link(
    images: tuple[Server, Path],
) -> None:
    server, folder = images

    async def main() -> None:
        answer = await lease(server, 1, 1, f"oci:{folder / 'merged'}")
        assert answer["ok"] is True, answer
        assert await shell(server, 1, 1, "echo ran") == (0, "ran\n")
        await reset(server, 1, 1)

    asyncio.run(main())


def test_bash_stateful_over_an_image_without_tmux_is_an_infra_error(
    images: tuple[Server, Path],
) -> None:
    server, folder = images
    ref = f"oci:{folder / 'shell'}"

    async def main() -> None:
        assert (await lease(server, 2, 1, ref))["ok"] is True
        async with server.client() as client:
            result = await one(client, call(2, "bash_stateful", epoch=1, command="echo hi"))
        assert result.outcome is ToolOutcome.INFRA_ERROR, result
        assert result.error == f"image {ref} has no tmux: bash_stateful cannot run in this sandbox"
        assert await shell(server, 2, 1, "echo still") == (0, "still\n")  # bash runs on
        await reset(server, 2, 1)

    asyncio.run(main())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_pool_fails_the_lease_and_a_hook_run_that_never_started_raises(
    images: tuple[Server, Path],
) -> None:
    _, folder = images
    config = LocalPoolConfig(
        containers=1,
        server=SlotServerSettings(
            slots_per_container=1, isolation=SlotIsolation(require_sandbox=True)
        ),
        image_cache_dir=folder / "cache",
    )
    shell_image = f"oci:{folder / 'shell'}"
    async with LocalSandboxPool(config) as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        with pytest.raises(EnvironmentUnavailable, match="has no /bin/sh"):
            async with pool.lease("t", environment=f"oci:{folder / 'noshell'}"):
                pass
        async with pool.lease("t", environment=shell_image) as held:
            router = ToolRouter(
                lease=held, dispatcher=dispatcher, tool_server=None, offered=frozenset(),
                tool_timeout_s=30.0, trajectory_id="t",
            )  # fmt: skip
            tools = SlotTools(router, pool=pool, environment=shell_image)
            assert (await tools.run("exit 3")).exit_code == 3  # a real code is an answer
            assert (await tools.run("rm /bin/sh")).exit_code == 0
            with pytest.raises(SlotInfraError, match="never ran: cannot start /bin/sh"):
                await tools.run("true")
            with pytest.raises(SlotInfraError, match="never ran"):
                await tools.check("true")
