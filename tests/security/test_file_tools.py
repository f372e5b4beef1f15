"""The slot server's file tools and artifact endpoints under attack (classes 5, 6 and 8).

- A FIFO made in the workspace (by the host, where the sandbox refuses ``mkfifo``), then
  ``read_file`` or ``write_file`` on it: the answer must come within a deadline (run under
  ``anyio.fail_after``, so a regression fails instead of hanging) and be an error. Control: a
  naive open of the same FIFO on the host blocks past the deadline.
- A 1 GiB sparse file (made by the host where a file-size limit stops the lease) read with a
  16-byte cap: the slot server's CPU time (its ``/proc/<pid>/stat``, before and after) must stay
  far below what hashing the file costs; the control hashes the file on the host and measures
  that cost, and the check is a generous ratio.
- The archive race: a ``renameat2(RENAME_EXCHANGE)`` loop in the slot swaps a directory with a
  symlink to a host canary directory while the test asks for archives; the canary's secret must
  never be in one. Control: a naive path-based walk on the host, against the same loop run
  unsandboxed, does find it.
- Escapes: ``..``, absolute paths and symlinks out to a host canary, through ``read_file``,
  ``write_file`` and the artifact endpoints; the canary's secret must be in no answer and the
  canary's files unchanged (content, mtime, listing). Control: naive path joins on the host leak
  and modify.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import secrets
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    cpu_seconds,
    end,
    end_and_reap,
    kit_processes,
    leased,
    spawn_kit,
    token,
)
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.errors import SlotServerError, ToolArgumentError, WireError
from trajcore.domain.json_values import JSON
from trajcore.domain.tools import ToolOutcome, ToolResult

DEADLINE_S = 3.0
REFUSALS = (ToolArgumentError, FileNotFoundError, WireError, SlotServerError)


# ----------------------------------------------------------------------------- FIFOs


def release(fifo: Path) -> None:
    """Open the FIFO's other end without blocking, so a thread stuck opening it goes on."""
    for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
        try:
            fd = os.open(fifo, flags)
        except OSError as error:
            if error.errno not in (errno.ENXIO, errno.ENOENT):
                raise
            continue
        with contextlib.suppress(OSError):
            os.read(fd, 1 << 16) if flags & os.O_ACCMODE == os.O_RDONLY else None
        os.close(fd)


async def release_until_idle(client: SlotServerClient, slot: int, fifo: Path) -> None:
    """Free whatever the server left blocked on the FIFO (a slot's queue stuck behind it would
    stall every later call of the suite), for up to 20 s."""
    with anyio.fail_after(20):
        while True:
            release(fifo)
            if not (await client.list_slots()).slots[slot].busy:
                return
            await anyio.sleep(0.05)


@pytest.mark.parametrize("tool", ["read_file", "write_file"])
def test_a_file_tool_on_a_fifo_answers_promptly_with_an_error(server: Server, tool: str) -> None:
    arguments: dict[str, JSON] = {"path": "pipe"}
    if tool == "write_file":
        arguments["content"] = "x"

    async def main() -> tuple[ToolResult | None, float]:
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.bash("mkfifo pipe")
            fifo = lease.workspace / "pipe"
            if not fifo.exists():  # the sandbox refuses FIFOs: the file tool must still cope
                os.mkfifo(fifo, 0o666)
            assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO was not made"
            started = time.monotonic()
            result: ToolResult | None = None
            try:
                with anyio.fail_after(DEADLINE_S):
                    (result,) = await client.execute([lease.call_with(tool, arguments)])
            except TimeoutError:
                result = None
            finally:
                waited = time.monotonic() - started
                await release_until_idle(client, lease.slot, fifo)
            return result, waited

    result, waited = anyio.run(main)
    assert result is not None, f"{tool} on a FIFO did not answer within {DEADLINE_S} s"
    assert result.outcome in (ToolOutcome.REJECTED, ToolOutcome.TOOL_ERROR), result
    assert waited < DEADLINE_S


@pytest.mark.parametrize("mode", ["rb", "wb"])
def test_control_a_naive_open_of_the_fifo_blocks_past_the_deadline(
    tmp_path: Path, mode: str
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    naive = f"open({str(fifo)!r}, {mode!r}).close()"
    with pytest.raises(subprocess.TimeoutExpired):  # subprocess.run kills it when it expires
        subprocess.run([sys.executable, "-c", naive], timeout=DEADLINE_S, check=False)


# ----------------------------------------------------------------------------- big files


def ensure_sparse(path: Path, size: int) -> None:
    """Make ``path`` a sparse file of ``size`` bytes from the host if the lease could not (a
    file-size limit in the sandbox): the server must cope with one all the same."""
    if not path.exists() or path.stat().st_size != size:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    assert path.stat().st_size == size


def host_hash_cpu_seconds(path: Path) -> float:
    """CPU seconds this process spends reading and hashing the whole file (the control)."""
    started = time.process_time()
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return time.process_time() - started


@pytest.mark.slow
def test_reading_16_bytes_of_a_1_gib_file_does_not_cost_the_server_the_whole_file(
    server: Server,
) -> None:
    async def main() -> tuple[float, float, ToolResult]:
        async with server.client() as client, leased(server, client, 0) as lease:
            await lease.bash("truncate -s 1G big")
            big = lease.workspace / "big"
            ensure_sparse(big, 1 << 30)
            before = cpu_seconds(server.pid)
            result = await lease.run("read_file", timeout_s=60, path="big", max_bytes=16)
            spent = cpu_seconds(server.pid) - before
            control = host_hash_cpu_seconds(big)
            return spent, control, result

    spent, control, result = anyio.run(main)
    assert control > 0.1, f"hashing 1 GiB on the host took only {control:.3f} s of CPU"
    assert result.outcome is not ToolOutcome.INFRA_ERROR, result
    assert spent < 0.2 * control, (
        f"reading 16 bytes cost the server {spent:.2f} s of CPU; hashing the file costs "
        f"{control:.2f} s"
    )


# ----------------------------------------------------------------------------- archive race


def archive_bytes(data: bytes) -> bytes:
    """Every member's name and content (and link target) of a tar.gz."""
    seen = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            seen.write(member.name.encode() + b"\n" + member.linkname.encode() + b"\n")
            if member.isfile():
                extracted = tar.extractfile(member)
                if extracted is not None:
                    seen.write(extracted.read())
    return seen.getvalue()


def make_canary(folder: Path) -> bytes:
    """The canary directory and its secret (the workspace's decoy file has the same size, so
    whichever of the two a racing reader sized and opened, it reads a whole file)."""
    secret = f"SECRET{secrets.token_hex(16)}".encode()
    folder.mkdir()
    (folder / "data.txt").write_bytes(secret)
    return secret


def flips(path: Path, within_s: float = 5.0) -> set[str]:
    """What ``path`` is, sampled from the host until it was seen both as a directory and as a
    symlink (the swap loop runs) or ``within_s`` passed."""
    kinds: set[str] = set()
    deadline = time.monotonic() + within_s
    while len(kinds) < 2 and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            kinds.add("link" if path.is_symlink() else "dir")
    return kinds


@pytest.mark.slow
def test_the_archive_never_follows_a_symlink_swapped_in_mid_walk(
    server: Server, kit: Path, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    secret = make_canary(canary)
    marker = token()
    setup = (
        f"mkdir -p out/sub && printf {'h' * len(secret)} > out/sub/data.txt && "
        f"ln -s {canary} out/alt && "
        f"(./kit swap out/sub out/alt 30 {marker} >/dev/null 2>&1 &)"
    )

    async def main() -> tuple[int, int, set[str]]:
        async with server.client() as client, leased(server, client, 2) as lease:
            await lease.install_kit(kit)
            await lease.bash(setup)
            try:
                kinds = flips(lease.workspace / "out" / "sub")
                tries = leaks = 0
                deadline = time.monotonic() + 6
                while tries < 200 and time.monotonic() < deadline:
                    tries += 1
                    try:
                        archive = await client.archive_artifacts(lease.slot, "out")
                    except REFUSALS:
                        continue
                    if secret in archive_bytes(archive.data):
                        leaks += 1
                        break
            finally:
                end(kit_processes(marker))
        return tries, leaks, kinds

    tries, leaks, kinds = anyio.run(main)
    assert kinds == {"dir", "link"}, f"the swap loop did not run (the host saw only {kinds})"
    assert leaks == 0, f"an archive held the host canary's secret (after {tries} archives)"


def naive_walk(base: Path) -> bytes:
    """A path-based walk: list, check, then open by path (the race the archive must not have)."""
    out = io.BytesIO()
    for folder, _, names in os.walk(base):
        for name in names:
            full = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(full).st_mode):
                    with open(full, "rb") as stream:
                        out.write(stream.read())
    return out.getvalue()


def test_control_a_naive_walk_loses_the_race(kit: Path, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    secret = make_canary(canary)
    out = tmp_path / "ws" / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "data.txt").write_bytes(b"h" * len(secret))
    (out / "alt").symlink_to(canary)
    marker = token()
    swapper = spawn_kit(kit, ["swap", "out/sub", "out/alt", "30", marker], tmp_path / "ws")
    try:
        assert flips(out / "sub") == {"dir", "link"}
        deadline = time.monotonic() + 10
        while secret not in naive_walk(out):
            assert time.monotonic() < deadline, "the naive walk never lost the race"
    finally:
        end_and_reap(swapper)


# ----------------------------------------------------------------------------- escapes


def canary_state(folder: Path) -> tuple[list[str], bytes, int]:
    victim = folder / "victim.txt"
    return sorted(p.name for p in folder.iterdir()), victim.read_bytes(), victim.stat().st_mtime_ns


def make_escape_canary(folder: Path) -> bytes:
    secret = f"SECRET{secrets.token_hex(16)}".encode()
    folder.mkdir()
    (folder / "secret.txt").write_bytes(secret)
    (folder / "victim.txt").write_bytes(b"original\n")
    return secret


def escape_paths(canary: Path, workspace: Path) -> tuple[list[str], list[str]]:
    """The paths an escape tries: reads of the secret, writes over and beside the victim."""
    up = os.path.relpath(canary, workspace)
    reads = [f"{up}/secret.txt", f"{canary}/secret.txt", "linkdir/secret.txt", "linkfile"]
    writes = [
        f"{up}/victim.txt", f"{canary}/victim.txt", "linkdir/victim.txt", "linkvictim",
        f"{up}/new.txt", "linkdir/new.txt",
    ]  # fmt: skip
    return reads, writes


def link_out(canary: Path) -> str:
    return (
        f"ln -s {canary} linkdir; ln -s {canary}/secret.txt linkfile; "
        f"ln -s {canary}/victim.txt linkvictim"
    )


def test_file_tools_and_artifacts_stay_in_the_workspace(server: Server, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    secret = make_escape_canary(canary)
    before = canary_state(canary)

    workspace = server.workspace(1)
    reads, writes = escape_paths(canary, workspace)
    folders = ("linkdir", os.path.relpath(canary, workspace), str(canary))

    async def main() -> list[bytes]:
        answers: list[bytes] = []
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.bash(link_out(canary))
            calls = [lease.call("read_file", path=path) for path in reads]
            calls += [lease.call("write_file", path=path, content="pwned") for path in writes]
            answers += [result.content.encode() for result in await client.execute(calls)]
            for path in reads:
                with contextlib.suppress(*REFUSALS):
                    answers.append((await client.read_artifact(lease.slot, path)).data)
            for path in folders:
                with contextlib.suppress(*REFUSALS):
                    listing = await client.list_artifacts(lease.slot, path)
                    answers.append(" ".join(e.name for e in listing.entries).encode())
                with contextlib.suppress(*REFUSALS):
                    archive = await client.archive_artifacts(lease.slot, path)
                    answers.append(archive_bytes(archive.data))
        return answers

    answers = anyio.run(main)
    leaked = [i for i, answer in enumerate(answers) if secret in answer]
    assert leaked == [], f"answers {leaked} held the canary's secret"
    assert canary_state(canary) == before, "the host canary was modified"


def test_control_naive_path_joins_escape(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    secret = make_escape_canary(canary)
    before = canary_state(canary)
    workspace = tmp_path / "root" / "slots" / "1"
    workspace.mkdir(parents=True)
    subprocess.run(["/bin/sh", "-c", link_out(canary)], cwd=workspace, check=True)
    reads, writes = escape_paths(canary, workspace)
    for path in reads:
        assert secret in (workspace / path).read_bytes()
    for path in writes:
        (workspace / path).write_text("pwned")
    assert canary_state(canary) != before
