"""A lease's failure is its own: what a lease leaves or sends never reaches its neighbours, its
server or the next lease (containment, as opposed to escape).

An exploring policy does these by accident every day at scale: a runaway directory recursion,
a file name holding a byte that is not UTF-8, a tool argument holding a lone surrogate from a
``\\udcff`` escape. Each test makes the hostile thing, checks from the host that it is really
there (the control: for the tree, that a recursive removal fails on the very same shape), and
then checks from the host that the server is the same process, the neighbour's process and
calls carry on, and the next lease starts on an empty workspace.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Lease,
    Server,
    bwrap_missing,
    compiler,
    end,
    kit_processes,
    leased,
    running,
    server_root,
    start_server,
    start_sleeper,
    stop_server,
    token,
)
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.removal import remove_tree
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome

DEPTH = 3000  # well past Python's recursion limit (1000), as a loop in a model's command makes


def deep_tree_command(depth: int) -> str:
    """A shell command that makes a chain of ``depth`` directories named ``d`` (in steps of at
    most 1500, each a path shorter than PATH_MAX)."""
    steps = []
    left = depth
    while left > 0:
        step = min(left, 1500)
        steps.append(f"p=$(printf 'd/%.0s' $(seq {step})); mkdir -p $p")
        left -= step
    # cd -P: the shell's logical path would pass PATH_MAX after the first step
    return " && cd -P $p && ".join(steps) + " && echo made"


DEEP = deep_tree_command(DEPTH)


def chain_depth(root: Path) -> int:
    """How deep the ``d/d/d...`` chain under ``root`` goes, walked from the host one descriptor
    at a time (no path is ever longer than one name)."""
    depth = 0
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                child = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return depth
            os.close(fd)
            fd = child
            depth += 1
    finally:
        os.close(fd)


def test_control_a_recursive_removal_fails_on_the_tree_a_lease_makes(tmp_path: Path) -> None:
    """The control: the tree below is a real hazard, since a plain recursive removal on the host
    (``shutil.rmtree`` on Python 3.11, as the wipe was) fails on the same shape."""
    subprocess.run(
        ["/bin/sh", "-c", deep_tree_command(DEPTH)], cwd=tmp_path, check=True,
        stdout=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    try:
        assert chain_depth(tmp_path) == DEPTH
        if sys.version_info >= (3, 12):
            pytest.skip("Python 3.12's rmtree is no longer recursive: the control needs 3.11's")
        with pytest.raises(RecursionError):
            shutil.rmtree(tmp_path / "d")
    finally:
        remove_tree(tmp_path / "d")  # pytest's own clean-up of tmp_path is recursive too


def test_a_deep_tree_fails_neither_its_reset_nor_the_neighbours(server: Server, kit: Path) -> None:
    marker = token()

    async def main() -> tuple[int, int, list[str], str]:
        async with server.client() as client, leased(server, client, 1) as neighbour:
            await neighbour.install_kit(kit)
            sleeper = await start_sleeper(neighbour, marker)
            async with leased(server, client, 0) as lease:
                made = await lease.bash(deep_tree_command(DEPTH), timeout_s=60)
                assert made.content.strip() == "made", made
                depth = chain_depth(lease.workspace)  # the host sees the whole tree
            # leased() asserted the reset went well; the neighbour is untouched
            assert running(sleeper), "the neighbour's process died with the reset"
            answer = await neighbour.bash("echo still-here")
            async with leased(server, client, 0) as after:
                left = sorted(os.listdir(after.workspace))
                again = await after.bash("echo next-lease")
        end([sleeper])
        return depth, server.process.poll() or 0, left, answer.content + again.content

    try:
        depth, exited, left, answers = anyio.run(main)
    finally:
        end(kit_processes(marker))
    assert depth == DEPTH
    assert (server.process.poll(), exited) == (None, 0), "the slot server died"
    assert left == [], f"the next lease found {left}"
    assert answers == "still-here\nnext-lease\n"


NAME = b"bad-\xff-name"


def test_a_file_name_that_is_not_utf8_is_listed_read_and_archived(server: Server) -> None:
    """Names travel in one form: each byte that is not UTF-8, 0xNN, is the code point U+DCNN
    (Python's ``surrogateescape``), carried as a JSON ``\\uDCNN`` escape; the same text names the
    file in every request, and archives hold the raw bytes."""
    escaped = os.fsdecode(NAME)
    assert escaped == "bad-\udcff-name"

    async def main() -> tuple[list[bytes], list[str], bytes, list[bytes], str, list[bytes]]:
        async with server.client() as client, leased(server, client, 2) as lease:
            made = await lease.bash("printf 'inside' > \"$(printf 'bad-\\377-name')\"")
            assert made.outcome is ToolOutcome.OK, made
            host = os.listdir(os.fsencode(lease.workspace))  # the control: raw bytes on disk
            listing = await client.list_artifacts(2, ".")
            found = await client.read_artifact(2, escaped)
            archive = await client.archive_artifacts(2, ".")
            with tarfile.open(fileobj=io.BytesIO(archive.data)) as tar:
                members = [
                    os.fsencode(member.name) for member in tar.getmembers() if member.isfile()
                ]
            written = await lease.run("write_file", path=escaped + "-copy", content="copy")
            after = os.listdir(os.fsencode(lease.workspace))
            names = [entry.name for entry in listing.entries]
            return host, names, found.data, members, written.content, sorted(after)

    host, names, data, members, written, after = anyio.run(main)
    assert host == [NAME]
    assert names == [escaped]
    assert data == b"inside"
    assert [member.rsplit(b"/", 1)[-1] for member in members] == [NAME]
    assert after == [NAME, NAME + b"-copy"], written


def surrogate_call(lease: Lease, tool: str, **arguments: str) -> ExecuteCall:
    return lease.call_with(tool, dict(arguments))


def test_odd_text_in_one_call_is_refused_for_that_call_alone(server: Server) -> None:
    """A lone surrogate (a model's ``\\udcff`` or ``\\ud800`` escape) and a NUL are refused in
    the call that holds them, naming the field; the other calls of the same batch, another
    slot's among them, run."""

    async def main() -> list[tuple[ToolOutcome, str]]:
        async with (
            server.client() as client,
            leased(server, client, 0) as one,
            leased(server, client, 3) as other,
        ):
            batch = [
                surrogate_call(one, "bash", command="echo \udcff"),
                surrogate_call(other, "bash", command="echo fine"),
                surrogate_call(one, "write_file", path="x-\ud800", content="a"),
                surrogate_call(one, "bash", command="echo a\0b"),
                surrogate_call(other, "write_file", path="ok.txt", content="b\udcff"),
                surrogate_call(
                    other, "bash", command="test -e ok.txt && echo exists || echo absent"
                ),
            ]
            results = await client.execute(batch)
        return [(r.outcome, r.content) for r in results]

    (lone, fine, path, nul, content, readback) = anyio.run(main)
    assert (lone[0], lone[1].endswith("@ $.command")) == (ToolOutcome.REJECTED, True), lone
    assert fine == (ToolOutcome.OK, "fine\n")
    assert (path[0], "@ $.path" in path[1]) == (ToolOutcome.REJECTED, True), path
    assert (nul[0], nul[1].endswith("@ $.command")) == (ToolOutcome.REJECTED, True), nul
    assert (content[0], content[1].endswith("@ $.content")) == (ToolOutcome.REJECTED, True)
    assert readback == (ToolOutcome.OK, "absent\n"), readback


def test_closing_a_pool_removes_a_deep_tree_a_held_lease_left() -> None:
    """The pool closes while a lease that made a deep tree still holds its slot: the close ends
    cleanly and its private directory (workspaces included) is gone."""
    pool = LocalSandboxPool(
        LocalPoolConfig(
            containers=1,
            server=SlotServerSettings(
                slots_per_container=1, acquire_timeout_s=60.0,
                isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2, max_processes=64),
            ),
        )
    )  # fmt: skip

    async def main() -> tuple[Path, int]:
        async with pool:
            run_dir = pool.run_dir
            assert run_dir is not None
            async with pool.lease("deep") as lease:
                command = ToolCall(id="deep", name="bash", arguments={"command": DEEP})
                call = SlotCall(lease=lease, call=command, timeout_s=60.0)
                (made,) = await pool.execute(lease.slot.container, [call])
                assert made.content.strip() == "made", made
                workspaces = [p for p in run_dir.glob("slots/*/slots/0") if p.is_dir()]
                assert len(workspaces) == 1
                depth = chain_depth(workspaces[0])
                await pool.aclose()
        return run_dir, depth

    run_dir, depth = anyio.run(main)
    assert depth == DEPTH
    assert not run_dir.exists(), f"the pool left {run_dir} behind"


WRITABLE = ("/", "/var", "/opt", "/home", "/root", "/srv", "/mnt", "/usr/local")


def test_with_a_writable_root_a_lease_leaves_nothing_for_the_next(kit: Path) -> None:
    """With ``--writable-root`` the sandbox's root is a tmpfs of its own; a file a lease writes
    there (outside the workspace, /tmp and /dev/shm) must not be there for the next lease. The
    control: the write succeeds, and the host sees the file through the lease's /proc root."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed")
    if compiler() is None:
        pytest.skip("no C compiler to build the slot helper")
    payload = token()
    name = f"canary-{payload}"
    plant = "; ".join(
        f"echo {payload} > {d.rstrip('/')}/{name} 2>/dev/null && echo {d}" for d in WRITABLE
    )

    async def main(server: Server) -> tuple[list[str], list[str], list[str]]:
        async with server.client() as client:
            async with leased(server, client, 0) as first:
                await first.install_kit(kit)
                done = await first.bash(plant)
                assert done.exec is not None, done
                planted = done.exec.stdout.split()
                pid = await start_sleeper(first, token())
                seen = [
                    d
                    for d in planted
                    if (Path(f"/proc/{pid}/root") / d.lstrip("/") / name).exists()
                ]
                end([pid])
            async with leased(server, client, 0) as second:
                await second.install_kit(kit)
                pid = await start_sleeper(second, token())
                root = Path(f"/proc/{pid}/root")
                found = [d for d in planted if (root / d.lstrip("/") / name).exists()]
                end([pid])
        return planted, seen, found

    with server_root("writable") as root:
        server = start_server(root, "--writable-root")
        try:
            planted, seen, found = anyio.run(main, server)
        finally:
            stop_server(server)
    assert planted, "the lease could write nowhere on its root: the attack proves nothing"
    assert seen == planted, "the host does not see what the lease wrote"
    assert found == [], f"the next lease found the file in {found}"
