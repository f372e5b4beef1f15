"""Leases over task environments in a real slot server (real bubblewrap, the compiled keeper).

A lease that names an image (``POST /v1/lease``) runs with the image's tree as its root and a
writable layer of its own, which the epoch's reset discards; a lease that names none runs over
the server's own root exactly as before; a bad image fails only its own lease request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from tests.image_layouts import Entry
from tests.integration.image_leases import shell_image_server
from tests.integration.test_slot_server import (
    TOKEN,
    Server,
    call,
    one,
    searchable_dir,
    start_server,
    stop_server,
)
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.slot_protocol import SnapshotAnswer
from trajcore.domain.task_environments import LeaseLayerStatistics
from trajcore.domain.tools import ToolOutcome

HOST_RELEASE = Path("/etc/os-release").read_text()
REPOSITORY = (
    Entry(name="repo/", kind=tarfile.DIRTYPE, mode=0o755),
    Entry(name="repo/app.py", data=b"return 1\n", mode=0o644),
    Entry(name="repo/README", data=b"read me\n", mode=0o644),
    Entry(name="repo/owner-only", data=b"owner-only\n", mode=0o600),
    Entry(name="repo/pkg/", kind=tarfile.DIRTYPE, mode=0o755),
)
"""A repository the image holds as root (as SWE-style images hold theirs)."""
pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


def tree_digest(root: Path) -> str:
    """A digest of every name, mode and content under ``root`` (what a lease must not change)."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files) + dirs:
            path = Path(folder) / name
            info = path.lstat()
            digest.update(f"{path.relative_to(root)} {info.st_mode} {info.st_size}\n".encode())
            if path.is_file() and not path.is_symlink():
                digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    """A slot server with an image cache, and the reference of a small image with a shell."""
    with shell_image_server("environments", extra=REPOSITORY) as running:
        yield running


async def lease(server: Server, slot: int, epoch: int, environment: str) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.ready['address']}/v1/lease",
            json={"slot": slot, "epoch": epoch, "environment": environment},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, object] = json.loads(await response.text())
        return answer


async def shell(server: Server, slot: int, epoch: int, command: str) -> tuple[int | None, str]:
    async with server.client() as client:
        result = await one(client, call(slot, "bash", epoch=epoch, command=command))
    assert result.outcome in (ToolOutcome.OK, ToolOutcome.TOOL_ERROR), result
    return (result.exec.exit_code if result.exec else None), result.content


async def reset(server: Server, slot: int, epoch: int) -> None:
    async with server.client() as client:
        done = await client.reset(slot, epoch)
    assert done.ok, done.error


async def run_in_lease(
    client: SlotServerClient,
    server: Server,
    slot: int,
    epoch: int,
    environment: str,
    *,
    command: str,
    snapshot: str | None = None,
) -> None:
    """The slot's lease ``epoch`` over ``environment`` (a fork of ``snapshot``, given one) is
    granted and runs ``command``, which exits 0."""
    assert (await client.lease(slot, epoch, environment, snapshot=snapshot)).ok
    code, text = await shell(server, slot, epoch, command)
    assert code == 0, text


async def freeze(client: SlotServerClient, slot: int, epoch: int) -> SnapshotAnswer:
    """The slot's lease ``epoch`` is frozen: the server's answer (granted, with an id)."""
    frozen = await client.snapshot(slot, epoch)
    assert frozen.ok, frozen
    assert frozen.snapshot is not None
    return frozen


def cached_rootfs(server_root: Path, image_id: str) -> Path:
    return server_root.parent / "cache" / "images" / image_id / "rootfs"


def test_a_lease_over_an_image_runs_in_it_and_writes_to_its_own_layer(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        answer = await lease(server, 0, 1, ref)
        assert answer["ok"] is True, answer
        rootfs = cached_rootfs(server.root, str(answer["image_id"]))
        before = tree_digest(rootfs)
        code, text = await shell(server, 0, 1, "cat /etc/os-release")
        assert (code, text.strip()) == (0, IMAGE_OS_RELEASE.decode().strip())
        code, text = await shell(
            server, 0, 1, "echo lease-wrote > /made-by-lease && cat /made-by-lease"
        )
        assert (code, text.strip()) == (0, "lease-wrote")
        # the image's own files are the lease's (an idmapped lower): a change is copied up
        code, text = await shell(
            server, 0, 1, "echo changed > /etc/os-release; cat /etc/os-release"
        )
        assert (code, text) == (0, "changed\n"), text
        code, text = await shell(server, 0, 1, "echo ws > /workspace/f && cat /workspace/f")
        assert (code, text.strip()) == (0, "ws")
        layer = server.root / "layers" / "0"
        assert (layer / "upper" / "made-by-lease").read_text() == "lease-wrote\n"
        assert (layer / "upper" / "etc" / "os-release").read_text() == "changed\n"
        assert not (rootfs / "made-by-lease").exists()
        assert tree_digest(rootfs) == before
        await reset(server, 0, 1)
        # the reset discarded the layer: the empty folders the keeper mounts on stay, and the
        # next lease's empty upper and work layers are made, the slot's
        kept = {path.name: list(path.iterdir()) for path in layer.iterdir()}
        assert {"root", "upper", "work"} <= set(kept), kept
        assert set(kept) <= {"root", "upper", "work", *(f"lower-{i}" for i in range(17))}, kept
        assert not any(kept.values()), kept
        assert (layer / "upper").stat().st_uid == (layer / "root").stat().st_uid != 0
        again = await lease(server, 0, 2, ref)
        assert again["ok"] is True, again
        assert again["hit"] is True, again
        code, text = await shell(server, 0, 2, "ls / ; cat /made-by-lease")
        assert code != 0, text
        assert "made-by-lease" not in text.split(), text
        code, text = await shell(server, 0, 2, "ls /workspace; cat /etc/os-release")
        assert (code, text.strip()) == (0, IMAGE_OS_RELEASE.decode().strip())
        await reset(server, 0, 2)
        assert tree_digest(rootfs) == before

    asyncio.run(main())


def test_a_lease_without_an_environment_runs_over_the_servers_root(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        assert (await lease(server, 1, 1, ref))["ok"] is True
        code, text = await shell(server, 1, 1, "cat /etc/os-release")
        assert text.strip() == IMAGE_OS_RELEASE.decode().strip()
        await reset(server, 1, 1)
        # the next lease names no environment: the host's system paths, as before
        code, text = await shell(server, 1, 2, "cat /etc/os-release")
        assert (code, text) == (0, HOST_RELEASE)
        await reset(server, 1, 2)

    asyncio.run(main())


def test_a_missing_image_fails_only_its_lease(image_server: tuple[Server, str]) -> None:
    server, ref = image_server
    missing = f"oci:{server.root.parent / 'no-such-layout'}"

    async def main() -> None:
        answer = await lease(server, 2, 1, missing)
        assert answer["ok"] is False
        assert "no-such-layout" in str(answer["field"]) + str(answer["error"]), answer
        bad = await lease(server, 2, 1, "nonsense:/x")
        assert bad["ok"] is False, bad
        assert bad["field"] == "environment", bad
        assert "names no known transport" in str(bad["error"])
        # the slot and the server carry on: the same epoch runs over the server's root
        code, text = await shell(server, 2, 1, "cat /etc/os-release")
        assert (code, text) == (0, HOST_RELEASE)
        # an epoch whose calls have started cannot take an environment any more
        late = await lease(server, 2, 1, ref)
        assert late["ok"] is False, late
        assert late["field"] == "epoch", late
        await reset(server, 2, 1)
        stale = await lease(server, 2, 1, ref)
        assert stale["ok"] is False, stale
        assert stale["field"] == "epoch", stale

    asyncio.run(main())


def test_a_server_without_an_image_cache_refuses_environments() -> None:
    with searchable_dir("no-cache") as folder:
        running = start_server(folder / "root")
        try:
            _refuses(running)
        finally:
            assert stop_server(running) == 0


def test_a_full_cache_names_the_image_once() -> None:
    with shell_image_server("full-cache", "--image-cache-bytes", "1000") as (running, ref):
        answer = asyncio.run(lease(running, 0, 1, ref))
    assert answer["ok"] is False, answer
    error = str(answer["error"])
    assert error.startswith(f"ImageCacheFull: image {ref} unpacks to "), error
    assert error.count(ref) == 1, error


def _refuses(running: Server) -> None:
    answer = asyncio.run(lease(running, 0, 1, "oci:/x"))
    assert answer["ok"] is False
    assert "environments need an image cache" in str(answer["error"]), answer

    async def health_has_no_cache() -> None:
        async with running.client() as client:
            assert (await client.health()).image_cache is None

    asyncio.run(health_has_no_cache())


def test_health_carries_the_image_caches_figures(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            before = (await client.health()).image_cache
            assert before is not None
            assert before.max_bytes > 0
            for epoch in (1, 2):  # the second finds the image held and resolved lately
                answer = await client.lease(2, epoch + 10, ref)
                assert answer.ok is True, answer
                await reset(server, 2, epoch + 10)
            after = (await client.health()).image_cache
            assert after is not None
            assert after.images >= 1
            assert after.bytes > 0
            assert after.hits - before.hits + after.misses - before.misses == 2
            assert after.recently_resolved - before.recently_resolved >= 1

    asyncio.run(main())


def test_the_clients_lease_method_answers_and_refuses(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            answer = await client.lease(3, 1, ref)
            assert answer.ok is True, answer
            assert (answer.slot, answer.epoch, answer.error) == (3, 1, None)
            assert len(answer.image_id or "") == 64, answer
            assert answer.duration_s > 0
            _, text = await shell(server, 3, 1, "cat /etc/os-release")
            assert text.strip() == IMAGE_OS_RELEASE.decode().strip()
            await reset(server, 3, 1)
            # a refusal is an answer, not an exception, and names the field
            bad = await client.lease(3, 2, "nonsense:/x")
            assert (bad.ok, bad.field) == (False, "environment"), bad
            assert "names no known transport" in str(bad.error)
            unknown = await client.lease(3, 2, ref, snapshot="no-such-snapshot")
            assert (unknown.ok, unknown.field) == (False, "snapshot"), unknown
            assert unknown.error, unknown
            # the slot stays usable: the epoch runs over the server's root
            code, text = await shell(server, 3, 2, "cat /etc/os-release")
            assert (code, text) == (0, HOST_RELEASE)
            await reset(server, 3, 2)

    asyncio.run(main())


async def sandbox_running(client: SlotServerClient, slot: int, wait_s: float) -> bool:
    """Whether the slot has a lease running (before any call of it) within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        if (await client.list_slots()).slots[slot].sandbox_running:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)


def test_a_lease_over_an_image_is_warmed_when_named_not_at_the_reset(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            await run_in_lease(client, server, 0, 10, ref, command="true")  # the slot's keeper runs
            await reset(server, 0, 10)
            # no lease over the server's root is warmed after a lease over an image ...
            assert not await sandbox_running(client, 0, 0.5)
            # ... the next one starts over the image as soon as it is named
            assert (await client.lease(0, 11, ref)).ok
            assert await sandbox_running(client, 0, 5.0)
            code, text = await shell(server, 0, 11, "cat /etc/os-release")
            assert (code, text.strip()) == (0, IMAGE_OS_RELEASE.decode().strip())
            await reset(server, 0, 11)

    asyncio.run(main())


def test_a_lease_edits_the_images_root_owned_repository_in_its_own_layer(
    image_server: tuple[Server, str],
) -> None:
    """An SWE-style image puts its repository at ``/repo`` as root: the lease owns it there
    (the cache's owner shown as the slot's uid), edits it, and the reset takes the edit away;
    the cached tree never changes."""
    server, ref = image_server

    async def main() -> None:
        answer = await lease(server, 0, 30, ref)
        assert answer["ok"] is True, answer
        rootfs = cached_rootfs(server.root, str(answer["image_id"]))
        cached = rootfs / "repo" / "app.py"
        assert (cached.stat().st_uid, cached.stat().st_mode & 0o777) == (os.geteuid(), 0o644)
        before = tree_digest(rootfs)
        code, text = await shell(server, 0, 30, "id -u; ls -ln /repo/app.py; cat /repo/owner-only")
        assert code == 0, text
        uid = text.split()[0]
        assert text.split()[3] == uid, text  # the file's owner, as the lease sees it: itself
        assert "owner-only\n" in text, text  # mode 0600: readable by its owner, the lease
        edit = (
            "echo 'return 2' >> /repo/app.py && rm /repo/README && echo new > /repo/new.py && "
            "mkdir /repo/pkg/sub && cat /repo/app.py && ls /repo"
        )
        code, text = await shell(server, 0, 30, edit)
        assert code == 0, text
        assert text.split() == ["return", "1", "return", "2", "app.py", "new.py", "owner-only",
                                "pkg"], text  # fmt: skip
        upper = server.root / "layers" / "0" / "upper" / "repo"
        assert (upper / "app.py").read_text() == "return 1\nreturn 2\n"
        assert cached.read_text() == "return 1\n"
        assert (rootfs / "repo" / "README").exists()
        assert tree_digest(rootfs) == before
        await reset(server, 0, 30)
        assert (await lease(server, 0, 31, ref))["ok"] is True
        code, text = await shell(server, 0, 31, "cat /repo/app.py; ls /repo")
        assert text.split() == ["return", "1", "README", "app.py", "owner-only", "pkg"], text
        await reset(server, 0, 31)
        assert tree_digest(rootfs) == before

    asyncio.run(main())


async def measured_layers(
    client: SlotServerClient, server: Server, at_least: int
) -> LeaseLayerStatistics:
    """Health's layer figures once the trash is swept and ``at_least`` layers were measured
    (the sweep measures them after the resets, in the background)."""
    deadline = time.monotonic() + 20
    while True:
        figures = (await client.health()).lease_layers
        trash = server.root / "trash"
        if figures.measured >= at_least and not (trash.exists() and any(trash.iterdir())):
            return figures
        assert time.monotonic() < deadline, (figures, at_least)
        await asyncio.sleep(0.05)


def test_a_reset_measures_the_layer_its_lease_wrote_over_the_image(
    image_server: tuple[Server, str],
) -> None:
    """Health counts each lease's writable layer after its reset: one that wrote 400 kB over
    the image counts a layer at least that large, one that wrote nothing (the control) a small
    one; the count, the total and the largest add up."""
    server, ref = image_server
    size = 200_000

    async def main() -> None:
        async with server.client() as client:
            before = await measured_layers(client, server, 0)
            assert (await lease(server, 1, 90, ref))["ok"] is True
            wrote = await one(
                client, call(1, "write_file", epoch=90, path="big.bin", content="x" * size)
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            code, text = await shell(
                server, 1, 90, "cat /workspace/big.bin > /big && cat /workspace/big.bin > /big2"
            )
            assert code == 0, text
            await reset(server, 1, 90)
            big = await measured_layers(client, server, before.measured + 1)
            assert big.measured == before.measured + 1, big
            assert big.last_bytes >= 2 * size, big
            assert big.last_entries >= 2, big
            assert big.largest_bytes >= big.last_bytes, big
            assert big.bytes - before.bytes == big.last_bytes, big
            assert (await lease(server, 1, 91, ref))["ok"] is True
            code, text = await shell(server, 1, 91, "true")
            assert code == 0, text
            await reset(server, 1, 91)
            small = await measured_layers(client, server, big.measured + 1)
            assert small.measured == big.measured + 1, small
            assert small.last_bytes < size, small  # the control: it wrote nothing of its own
            assert small.largest_bytes == max(before.largest_bytes, big.last_bytes), small
            assert small.bytes - big.bytes == small.last_bytes, small
            assert small.cut_short == before.cut_short, small

    asyncio.run(main())


IMAGE_PATH = "/opt/custom/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_ENV = (f"PATH={IMAGE_PATH}", "TASK_VAR=hello from the image", "LANG=C", "HOME=/root")
"""An image's ``Env`` as SWE-style images set theirs: its tools on PATH, a variable, and a HOME
and a LANG of its own."""


@pytest.fixture(scope="module")
def env_image() -> Iterator[str]:
    """The reference of an image whose config sets ``IMAGE_ENV``, with a tool in
    ``/opt/custom/bin`` (and what the stateful shell needs, where the host has it: bash, tmux,
    ``mv``, ``tail`` and the C.UTF-8 locale)."""
    with searchable_dir("environment-env") as folder:
        _write_env_image(folder / "layout", IMAGE_ENV)
        yield f"oci:{folder / 'layout'}"


def _write_env_image(layout: Path, env: Sequence[str]) -> None:
    """``env_image``'s image at ``layout``, its config's ``Env`` being ``env``."""
    tool = Entry(name="opt/custom/bin/mytool", data=b"#!/bin/sh\necho mytool-ran\n", mode=0o755)
    dirs = [
        Entry(name=d, kind=tarfile.DIRTYPE, mode=0o755)
        for d in ("opt/", "opt/custom/", "opt/custom/bin/")
    ]
    programs = [
        path
        for path in ("/usr/bin/bash", "/usr/bin/tmux", "/bin/mv", "/usr/bin/tail", "/bin/chmod")
        if Path(path).exists()
    ]
    # the C.UTF-8 locale tmux asks for, where the host has it (as Debian's images do)
    locale = Path("/usr/lib/locale/C.utf8")
    found = sorted(locale.rglob("*")) if locale.is_dir() else []
    dirs += [
        Entry(name=f"{d}/", kind=tarfile.DIRTYPE, mode=0o755)
        for d in ("usr/lib/locale", *(str(p)[1:] for p in [locale, *found] if p.is_dir()))
    ]
    dirs += [Entry(name=str(p)[1:], data=p.read_bytes(), mode=0o644) for p in found if p.is_file()]
    write_shell_image(layout, extra=(*dirs, tool), programs=programs, env=env)


def test_a_lease_over_an_image_runs_its_commands_with_the_images_env(
    image_server: tuple[Server, str], env_image: str
) -> None:
    server, _ref = image_server

    async def main() -> None:
        assert (await lease(server, 2, 201, env_image))["ok"] is True
        code, text = await shell(server, 2, 201, 'echo "$PATH|$TASK_VAR|$LANG|$TERM|$HOME|$TMPDIR"')
        path, task_var, lang, term, home, tmpdir = text.strip().split("|")
        assert (code, path, task_var, lang) == (0, IMAGE_PATH, "hello from the image", "C")
        # trajcore's own: the workspace is HOME and the lease's tmp TMPDIR; TERM where unset
        assert term == "xterm-256color"
        assert (home, tmpdir) == ("/workspace", "/tmp")
        code, text = await shell(server, 2, 201, "mytool")
        assert (code, text.strip()) == (0, "mytool-ran")
        await reset(server, 2, 201)
        # the next lease over the server's root keeps the server's environment
        code, text = await shell(server, 2, 202, 'echo "$PATH|$TASK_VAR|$LANG"')
        assert (code, text.strip()) == (
            0,
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin||C.UTF-8",
        )
        await reset(server, 2, 202)

    asyncio.run(main())


@pytest.mark.skipif(
    not all(Path(p).exists() for p in ("/usr/bin/tmux", "/usr/bin/bash", "/usr/lib/locale/C.utf8")),
    reason="the host has no tmux, bash or C.UTF-8 locale (/usr/lib/locale/C.utf8) for the image",
)
def test_the_stateful_shell_of_a_lease_over_an_image_has_the_images_env(
    image_server: tuple[Server, str], env_image: str
) -> None:
    server, _ref = image_server

    async def main() -> None:
        assert (await lease(server, 3, 301, env_image))["ok"] is True
        async with server.client() as client:
            result = await one(
                client, call(3, "bash_stateful", epoch=301, command='echo "$TASK_VAR"; mytool')
            )
        assert result.outcome is ToolOutcome.OK, result.content
        assert result.content.split() == ["hello", "from", "the", "image", "mytool-ran"]
        await reset(server, 3, 301)

    asyncio.run(main())


def test_a_fork_of_a_lease_over_an_image_runs_with_the_images_env(
    image_server: tuple[Server, str], env_image: str
) -> None:
    server, _ref = image_server

    async def main() -> None:
        async with server.client() as client:
            prepare = "echo prepared > /workspace/prep.txt"
            await run_in_lease(client, server, 2, 203, env_image, command=prepare)
            frozen = await freeze(client, 2, 203)
            assert frozen.snapshot is not None
            forked = await client.lease(3, 302, env_image, snapshot=frozen.snapshot)
            assert forked.ok, forked
            code, text = await shell(
                server, 3, 302, 'cat /workspace/prep.txt; echo "$TASK_VAR"; mytool'
            )
            assert (code, text.split("\n")[:3]) == (
                0,
                ["prepared", "hello from the image", "mytool-ran"],
            ), text
            await reset(server, 2, 203)
            await reset(server, 3, 302)
            assert (await client.drop_snapshot(frozen.snapshot)).ok

    asyncio.run(main())


@pytest.mark.skipif(
    not all(Path(p).exists() for p in ("/usr/bin/tmux", "/usr/bin/bash", "/usr/lib/locale/C.utf8")),
    reason="the host has no tmux, bash or C.UTF-8 locale (/usr/lib/locale/C.utf8) for the image",
)
def test_an_images_path_with_an_empty_entry_never_runs_the_workspaces_programs_for_the_helper(
    image_server: tuple[Server, str],
) -> None:
    """An image's PATH may hold an empty entry (the current folder: the workspace). The helper
    looks its own programs (bash, tmux) up in absolute entries only, so a ``bash`` the model
    left in its workspace is not what the stateful shell starts; its own commands still read
    the image's PATH as it is."""
    server, _ref = image_server
    plant = (
        "printf '#!/bin/sh\\necho planted > /workspace/planted\\nexec /usr/bin/bash \"$@\"\\n'"
        " > bash && chmod +x bash && echo ok"
    )

    async def main() -> None:
        with searchable_dir("environment-empty-path") as folder:
            _write_env_image(folder / "layout", ("PATH=:/usr/local/bin:/usr/bin:/bin",))
            assert (await lease(server, 2, 250, f"oci:{folder / 'layout'}"))["ok"] is True
            code, text = await shell(server, 2, 250, plant)
            assert (code, text.strip()) == (0, "ok"), text
            async with server.client() as client:
                result = await one(client, call(2, "bash_stateful", epoch=250, command="echo hi"))
            assert (result.outcome, result.content.strip()) == (ToolOutcome.OK, "hi"), result
            code, text = await shell(server, 2, 250, 'ls planted 2>&1; echo "$PATH"')
            assert "planted" not in text.splitlines()[0] or "No such file" in text, text
            assert text.splitlines()[-1] == ":/usr/local/bin:/usr/bin:/bin"
            await reset(server, 2, 250)

    asyncio.run(main())
