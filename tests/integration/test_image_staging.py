"""What a stopped or crashed server leaves in the image cache's staging (a partial unpack, the
container an engine's export made) is removed when the next cache opens, from a dead owner
only: two servers share one cache on a host, and a live server's entries are never touched."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.podman_images import PODMAN, imported_image
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_sources import EngineExport, exported
from trajcore.domain.task_environments import TaskEnvironmentError

_OWNER = """
import sys, tempfile
from pathlib import Path
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_sources import EngineExport, exported
from trajcore.domain.task_environments import TaskEnvironmentError
cache = ImageCache(Path(sys.argv[1]), max_bytes=1 << 30)
staged = tempfile.mkdtemp(dir=cache.root / "staging", prefix=f"image-{cache._token}-")
(Path(staged) / "rootfs").mkdir()
print(cache._token, staged, flush=True)
if sys.argv[2] == "live":
    sys.stdin.read()
"""


@contextmanager
def owner(root: Path, *, live: bool) -> Iterator[tuple[str, Path]]:
    """A server's cache in a process of its own that staged a partial tree: its token and
    that tree; it ends at once (a crashed server) or when the block ends (a live one)."""
    with subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(root), "live" if live else "dead"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        token, staged = process.stdout.readline().split()
        if not live:
            assert process.wait(timeout=60) == 0
        try:
            yield token, Path(staged)
        finally:
            process.stdin.close()  # a live one ends here
            process.wait(timeout=60)


def test_a_dead_owners_staging_is_removed_at_open_and_a_live_owners_kept(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    ImageCache(root, max_bytes=1 << 30)
    old_style = root / "staging" / "image-abc123"  # an older trajcore's, an hour young
    (old_style / "rootfs").mkdir(parents=True)
    with owner(root, live=True) as (live, live_tree), owner(root, live=False) as (dead, dead_tree):
        assert dead_tree.is_dir()
        assert live_tree.is_dir()
        ImageCache(root, max_bytes=1 << 30)
        assert not dead_tree.exists()
        assert not (root / "locks" / f"owner-{dead}.lock").exists()
        assert live_tree.is_dir()
        assert (root / "locks" / f"owner-{live}.lock").exists()
        assert old_style.is_dir()
    ImageCache(root, max_bytes=1 << 30)  # the live one has ended since
    assert not live_tree.exists()


@pytest.fixture
def podman_image(tmp_path: Path) -> Iterator[str]:
    with imported_image(tmp_path, "staging", {"etc/hostname": b"x\n"}) as name:
        yield name


def _container_exists(name: str) -> bool:
    done = subprocess.run(
        [*PODMAN, "container", "exists", name], capture_output=True, timeout=120, check=False
    )
    return done.returncode == 0


def test_a_dead_owners_export_container_is_removed_at_open(
    tmp_path: Path, podman_image: str
) -> None:
    root = tmp_path / "cache"
    ImageCache(root, max_bytes=1 << 30)
    made = []
    with owner(root, live=True) as (live, _), owner(root, live=False) as (dead, _):
        for token in (dead, live):  # as an export in flight records its container
            container = f"trajcore-export-{token}-x1"
            record = root / "staging" / f"export-{token}-x1"
            record.write_text(json.dumps({"engine": "podman", "container": container}))
            subprocess.run(
                [*PODMAN, "create", "--name", container, "--label", f"trajcore.export={root}",
                 podman_image, "/bin/true"],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            made.append((container, record))
        try:
            ImageCache(root, max_bytes=1 << 30)
            assert [(_container_exists(c), r.exists()) for c, r in made] == [
                (False, False),
                (True, True),
            ]
        finally:
            for container, _record in made:
                subprocess.run(
                    [*PODMAN, "rm", "-f", container], capture_output=True, timeout=120, check=False
                )


def test_a_dead_exports_record_stays_until_its_engine_has_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that cannot be run leaves the record of a dead owner's container (its name is
    all that finds the container), so the next open removes it; one that ran removes it."""
    root = tmp_path / "cache"
    ImageCache(root, max_bytes=1 << 30)
    dead = uuid.uuid4().hex[:12]  # an owner whose lock is gone: dead
    record = root / "staging" / f"export-{dead}-x1"
    record.write_text(json.dumps({"engine": "docker", "container": f"trajcore-export-{dead}-x1"}))
    partial = root / "staging" / f"image-{dead}-x2"
    partial.mkdir()
    engines = tmp_path / "bin"
    engines.mkdir()
    monkeypatch.setenv("PATH", str(engines))  # no docker to run
    ImageCache(root, max_bytes=1 << 30)
    assert (record.exists(), partial.exists()) == (True, False)
    ran = tmp_path / "ran"
    docker = engines / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" > {ran}\necho "No such container" >&2\nexit 1\n')
    docker.chmod(0o755)
    ImageCache(root, max_bytes=1 << 30)
    assert ran.read_text().split() == ["rm", "-f", f"trajcore-export-{dead}-x1"]
    assert not record.exists()


def test_an_export_whose_create_failed_removes_its_named_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create the engine failed or was cut short in may have made the container all the
    same; the export removes it by its name, as its record goes with it."""
    engines = tmp_path / "bin"
    engines.mkdir()
    asked = tmp_path / "asked"
    docker = engines / "docker"
    docker.write_text(
        f'#!/bin/sh\necho "$@" >> {asked}\n'
        '[ "$1" = create ] && { echo "killed while creating" >&2; exit 1; }\nexit 0\n'
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", str(engines))
    export = EngineExport(image_id="0" * 64, engine="docker", name="some/image")
    with (
        pytest.raises(TaskEnvironmentError, match="killed while creating"),
        exported(export, timeout_s=60, container="trajcore-export-t-x1", label="l=1"),
    ):
        pass
    assert asked.read_text().splitlines()[-1] == "rm -f trajcore-export-t-x1"
