"""An image of the engine's store built for another machine or system is refused by its
config's ``Architecture`` or ``Os``, naming the image, the field, its value and the host's,
before anything is exported or unpacked.

Before, only ``/bin/sh``'s ELF machine was read, after the whole export: an image labelled for
another machine whose shell happened to be this host's was granted, and one without a shell was
refused for the shell, not for what it is built for.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_environment_leases import lease
from tests.integration.test_slot_server import searchable_dir, start_server, stop_server
from tests.integration.test_unrunnable_images import OTHER_ARCHITECTURE
from tests.podman_images import PODMAN, podman_problem
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_checks import HOST_ARCHITECTURE
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref


@pytest.fixture(scope="module")
def engine_images() -> Iterator[dict[str, str]]:
    """Images imported into podman's store by the test (the host's, another architecture's,
    another system's), by what they are; removed afterwards."""
    why = podman_problem()
    if why is not None:
        pytest.skip(why)
    with searchable_dir("engine-platform") as folder:
        rootfs = folder / "import.tar"
        with tarfile.open(rootfs, "w") as tar:
            info = tarfile.TarInfo("etc/os-release")
            info.size = 8
            tar.addfile(info, io.BytesIO(b"ID=test\n"))
        tag = uuid.uuid4().hex[:12]
        names = {
            "host": [],
            "foreign": ["--arch", OTHER_ARCHITECTURE],
            "windows": ["--os", "windows"],
        }
        made = {what: f"localhost/trajcore-platform-{what}:{tag}" for what in names}
        try:
            for what, options in names.items():
                subprocess.run(
                    [*PODMAN, "import", *options, str(rootfs), made[what]],
                    check=True, capture_output=True, timeout=120,
                )  # fmt: skip
            yield made
        finally:
            for name in made.values():
                subprocess.run(
                    [*PODMAN, "rmi", "-f", name], capture_output=True, timeout=120, check=False
                )


def exports_made(cache: Path) -> str:
    """The containers podman holds that an export for ``cache`` made (by their label)."""
    done = subprocess.run(
        [*PODMAN, "ps", "-a", "-q", "--filter", f"label=trajcore.export={cache}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


PLATFORMS = {
    "foreign": ("Architecture", OTHER_ARCHITECTURE, HOST_ARCHITECTURE),
    "windows": ("Os", "windows", "linux"),
}
"""Per image: the config's field that is not the host's, its value, and the host's."""


@pytest.mark.parametrize("what", sorted(PLATFORMS))
def test_an_engine_image_for_another_platform_is_refused_before_its_export(
    tmp_path: Path, engine_images: dict[str, str], what: str
) -> None:
    field, value, host = PLATFORMS[what]
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"containers-storage:{engine_images[what]}")
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(ref)
    assert caught.value.field == f"{ref}: {field}"
    reason = caught.value.reason
    assert str(ref) in reason, reason
    assert f"is built for {value} (its config's {field}), this host runs {host}" in reason
    stats = cache.statistics()
    assert (stats.refused, stats.misses, stats.images) == (1, 0, 0)
    assert exports_made(tmp_path / "cache") == ""
    assert list((tmp_path / "cache" / "images").iterdir()) == []


def test_an_engine_image_of_the_hosts_platform_records_its_architecture(
    tmp_path: Path, engine_images: dict[str, str]
) -> None:
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"containers-storage:{engine_images['host']}")
    with cache.acquire(ref) as use:
        assert use.image.architecture == HOST_ARCHITECTURE


def test_a_lease_over_a_foreign_engine_image_is_refused_naming_it(
    engine_images: dict[str, str],
) -> None:
    ref = f"containers-storage:{engine_images['foreign']}"
    with searchable_dir("engine-platform-server") as folder:
        server = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        try:
            answer = asyncio.run(lease(server, 0, 1, ref))
        finally:
            assert stop_server(server) == 0
    assert answer["ok"] is False, answer
    assert answer["field"] == f"{ref}: Architecture", answer
    assert f"is built for {OTHER_ARCHITECTURE}" in str(answer["error"]), answer
