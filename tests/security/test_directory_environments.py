"""A dataset row cannot choose a host folder as its root filesystem.

A ``directory:`` lease runs over the tree in an idmapped view that makes its root-owned files
the slot's, so a row naming ``directory:/`` (or any host folder) would hand the model every
root-only file there. The server takes ``directory:`` trees only from the folders its operator
lists (``--environment-dir``). Each tree below holds a root-only canary the test writes (mode
0600, owned by the server's user); the check is the server's own answers: a refused lease,
and no canary text in any result. The control is a listed tree with the same canary: the same
read returns it, so the check sees the attack when it is allowed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_tree
from tests.integration.test_environment_leases import lease, reset, shell
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


def _tree_with_canary(tree: Path) -> str:
    """A shell tree at ``tree`` holding ``/canary``, readable by its owner only; the text."""
    write_shell_tree(tree)
    text = f"canary-{secrets.token_hex(8)}"
    canary = tree / "canary"
    canary.write_text(text)
    canary.chmod(0o600)
    return text


@pytest.fixture(scope="module")
def listed_server() -> Iterator[tuple[Server, Path, dict[str, str]]]:
    """A server listing ``listed`` only; trees with canaries inside and outside of it."""
    with searchable_dir("directory-roots") as folder:
        canaries = {
            "listed": _tree_with_canary(folder / "listed" / "task"),
            "outside": _tree_with_canary(folder / "outside" / "task"),
        }
        (folder / "listed").chmod(0o755)
        (folder / "outside").chmod(0o755)
        (folder / "listed" / "through").symlink_to(folder / "outside")
        running = start_server(
            folder / "root", "--image-cache", str(folder / "cache"),
            "--environment-dir", str(folder / "listed"),
        )  # fmt: skip
        yield running, folder, canaries
        assert stop_server(running) == 0


def test_a_row_naming_a_host_folder_outside_the_list_is_refused(
    listed_server: tuple[Server, Path, dict[str, str]],
) -> None:
    server, folder, canaries = listed_server
    outside = folder / "outside" / "task"

    async def main() -> None:
        named_trees = (outside, folder / "listed" / "through" / "task", Path("/"))
        for epoch, named in enumerate(named_trees, start=1):
            answer = await lease(server, 0, epoch, f"directory:{named}")
            assert answer["ok"] is False, answer
            assert str(named) in str(answer["field"]), answer
            assert "environment_dirs" in str(answer["error"]), answer
            # the epoch runs over the server's root, where the tree is the host's own
            code, text = await shell(server, 0, epoch, f"cat {outside / 'canary'}")
            assert canaries["outside"] not in text, text
            assert code != 0, text
            await reset(server, 0, epoch)

    asyncio.run(main())


def test_a_listed_folder_runs_and_owns_its_tree(
    listed_server: tuple[Server, Path, dict[str, str]],
) -> None:
    """The control: the same read over a listed tree returns its canary."""
    server, folder, canaries = listed_server

    async def main() -> None:
        answer = await lease(server, 1, 1, f"directory:{folder / 'listed' / 'task'}")
        assert answer["ok"] is True, answer
        assert await shell(server, 1, 1, "cat /canary") == (0, canaries["listed"])
        await reset(server, 1, 1)

    asyncio.run(main())


def test_a_server_without_a_list_refuses_every_directory() -> None:
    with searchable_dir("no-directory-list") as folder:
        canary = _tree_with_canary(folder / "task")
        running = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        try:

            async def main() -> None:
                answer = await lease(running, 0, 1, f"directory:{folder / 'task'}")
                assert answer["ok"] is False, answer
                assert "directory: environments are off" in str(answer["error"]), answer
                assert "--environment-dir" in str(answer["error"]), answer
                code, text = await shell(running, 0, 1, f"cat {folder / 'task' / 'canary'}")
                assert code != 0, text
                assert canary not in text, text

            asyncio.run(main())
        finally:
            assert stop_server(running) == 0


def test_a_tree_another_user_could_swap_after_its_check_is_refused() -> None:
    """The lease mounts its tree by path after the check, so a tree below a folder that others
    may write could be swapped, once granted, for a link to a folder outside the list. Such a
    tree is refused at its lease. The control is the same swap under a folder only the
    server's user writes (the server's user may always change its own folders): the lease
    runs over the swapped-in tree, so the check sees the attack when it is allowed."""
    with searchable_dir("directory-swap") as folder:
        outside = _tree_with_canary(folder / "outside" / "task")
        for name in ("open", "kept"):
            _tree_with_canary(folder / "listed" / name / "task")
            (folder / "listed" / name).chmod(0o755)
        (folder / "listed").chmod(0o755)
        (folder / "outside").chmod(0o755)
        (folder / "listed" / "open").chmod(0o777)
        running = start_server(
            folder / "root", "--image-cache", str(folder / "cache"),
            "--environment-dir", str(folder / "listed"),
            env={**os.environ, "TRAJCORE_SLOT_WARM_LEASES": "0"},  # mounted at the first call
        )  # fmt: skip
        try:

            async def main() -> None:
                for slot, name in enumerate(("open", "kept")):
                    tree = folder / "listed" / name / "task"
                    answer = await lease(running, slot, 1, f"directory:{tree}")
                    if name == "open":
                        assert answer["ok"] is False, answer
                        assert "may be changed by users other than root" in str(answer["error"])
                        continue
                    assert answer["ok"] is True, answer
                    tree.rename(tree.with_name("was-task"))
                    tree.symlink_to(folder / "outside" / "task")
                    assert await shell(running, slot, 1, "cat /canary") == (0, outside)
                    await reset(running, slot, 1)

            asyncio.run(main())
        finally:
            assert stop_server(running) == 0
