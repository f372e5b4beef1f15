"""The persistent shell of a lease over an image without bash (its ``/bin/sh`` only, as a
busybox or dash image), in the sandbox: a command that leaves that sh too few open files to
write its status is reported as such at once, not waited for until its timeout and then read
as a shell that ignored Ctrl-C and was killed.

An sh has no line editor whose terminal mode tells that it is back at its prompt; the agent,
the pid 1 of the lease, sees it blocked reading its terminal instead (``/proc/PID/syscall``).
"""

from __future__ import annotations

import asyncio
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.image_layouts import Entry
from tests.integration.image_leases import image_cache_server
from tests.integration.test_environment_leases import lease, reset
from tests.integration.test_slot_server import Server, call, one, searchable_dir
from trajcore.domain.tools import ToolOutcome

TMUX_NEEDS = ("/usr/bin/tmux", "/bin/mv", "/usr/bin/tail", "/bin/chmod")
LOCALE = Path("/usr/lib/locale/C.utf8")
pytestmark = [
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
    pytest.mark.skipif(
        not all(Path(p).exists() for p in TMUX_NEEDS) or not LOCALE.is_dir(),
        reason=f"the host lacks one of {TMUX_NEEDS} or {LOCALE} for the image",
    ),
]
TIMEOUT_S = 60.0
"""The calls' timeout: a call that waits it out is the fault these tests catch."""


@pytest.fixture(scope="module")
def sh_image_server() -> Iterator[tuple[Server, str]]:
    """A slot server with an image cache, and an image with tmux and ``/bin/sh`` but no bash."""
    with searchable_dir("sh-image-shell") as folder:
        found = sorted(LOCALE.rglob("*"))
        dirs = [
            Entry(name=f"{d}/", kind=tarfile.DIRTYPE, mode=0o755)
            for d in ("usr/lib/locale", *(str(p)[1:] for p in [LOCALE, *found] if p.is_dir()))
        ]
        files = [Entry(name=str(p)[1:], data=p.read_bytes()) for p in found if p.is_file()]
        write_shell_image(folder / "layout", salt="sh-only", extra=(*dirs, *files),
                          programs=TMUX_NEEDS)  # fmt: skip
        with image_cache_server(folder) as running:
            yield running, f"oci:{folder / 'layout'}"


@pytest.mark.parametrize("files", [3, 4])
def test_an_sh_left_too_few_files_in_a_sandbox_is_reported_at_once(
    sh_image_server: tuple[Server, str], files: int
) -> None:
    server, ref = sh_image_server
    slot, epoch = files - 3, 10 + files

    async def main() -> None:
        granted = await lease(server, slot, epoch, ref)
        assert granted["ok"] is True, granted
        async with server.client() as client:
            shell = await one(client, call(slot, "bash", epoch=epoch, command="command -v bash"))
            assert shell.exec is not None, shell
            assert shell.exec.exit_code != 0, shell  # no bash in the image
            starved = await one(
                client,
                call(slot, "bash_stateful", epoch=epoch, timeout_s=TIMEOUT_S,
                     command=f"ulimit -n {files}; echo ran"),
            )  # fmt: skip
            assert starved.outcome is ToolOutcome.TOOL_ERROR, starved
            assert starved.error == "the command ended without an exit status", starved
            assert f"open-files limit (ulimit -n) is {files}" in starved.content, starved
            after = await one(client, call(slot, "bash_stateful", epoch=epoch, command="echo next"))
            assert (after.outcome, after.content) == (ToolOutcome.OK, "next\n"), after
        await reset(server, slot, epoch)

    asyncio.run(main())
