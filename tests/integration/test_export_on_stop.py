"""A slot server stopped (SIGTERM) while an engine's export of an image runs ends the export
by its pid and removes what it made (its container, its staging tree) before it exits, within
its deadline; before, the export ran on to its end, or its container stayed until the next
open of the cache.

The image is large enough that its export is still running when the signal comes: the test
signals as soon as the export's record appears in the cache's ``staging/`` (before its
container is even made).
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_environment_leases import lease
from tests.integration.test_slot_server import searchable_dir, start_server, stop_server
from tests.podman_images import PODMAN, podman_problem
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_refusals import SourceUnavailable
from trajcore.domain.task_environments import EnvironmentRef, parse_environment_ref

IMAGE_BYTES = 96 << 20
"""What the image holds: enough that its export and unpacking take a while."""
WAIT_S = 60.0
"""How long the test waits for a record to appear (never reached when all is well)."""


@pytest.fixture(scope="module")
def large_image() -> Iterator[str]:
    """A podman image of ``IMAGE_BYTES`` of random data, removed afterwards."""
    why = podman_problem()
    if why is not None:
        pytest.skip(why)
    with searchable_dir("export-stop") as folder:
        rootfs = folder / "import.tar"
        with tarfile.open(rootfs, "w") as tar:
            for n in range(IMAGE_BYTES >> 20):
                info = tarfile.TarInfo(f"data/{n}")
                info.size = 1 << 20
                tar.addfile(info, io.BytesIO(os.urandom(info.size)))
        name = f"localhost/trajcore-export-stop:{uuid.uuid4().hex[:12]}"
        subprocess.run(
            [*PODMAN, "import", str(rootfs), name], check=True, capture_output=True, timeout=300
        )
        rootfs.unlink()
        try:
            yield name
        finally:
            subprocess.run(
                [*PODMAN, "rmi", "-f", name], capture_output=True, timeout=120, check=False
            )


def wait_for_export(cache: Path) -> None:
    """Return once an export's record is in ``cache``'s staging."""
    deadline = time.monotonic() + WAIT_S
    while not any(n.startswith("export-") for n in os.listdir(cache / "staging")):
        assert time.monotonic() < deadline, "no export started"
        time.sleep(0.002)


def containers_of(cache: Path) -> str:
    done = subprocess.run(
        [*PODMAN, "ps", "-a", "-q", "--filter", f"label=trajcore.export={cache}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_sigterm_during_an_export_ends_it_and_removes_what_it_made(large_image: str) -> None:
    with searchable_dir("export-stop-server") as folder:
        cache = folder / "cache"
        server = start_server(folder / "root", "--image-cache", str(cache))
        answers: list[object] = []

        def ask() -> None:
            try:
                answers.append(
                    asyncio.run(lease(server, 0, 1, f"containers-storage:{large_image}"))
                )
            except Exception as error:  # noqa: BLE001 - the server may close the connection
                answers.append(error)

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            wait_for_export(cache)
            server.process.send_signal(signal.SIGTERM)
            # one SIGTERM only (``stop_server`` would send another, which forces the stop)
            assert server.process.wait(WAIT_S) == 0  # within its deadline, not forced
            stop_server(server)  # closes its pipes
        finally:
            asker.join(WAIT_S)
        assert not any(isinstance(a, dict) and a.get("ok") for a in answers), answers
        assert containers_of(cache) == ""
        assert sorted(os.listdir(cache / "staging")) == []
        assert sorted(os.listdir(cache / "images")) == []


def acquiring(
    cache: ImageCache, ref: EnvironmentRef
) -> tuple[threading.Thread, list[BaseException]]:
    """A thread, started, that acquires ``ref`` from ``cache`` and closes it at once, and the
    list its failure goes into."""
    failures: list[BaseException] = []

    def ask() -> None:
        try:
            cache.acquire(ref).close()
        except BaseException as error:  # noqa: BLE001 - checked by the caller
            failures.append(error)

    asker = threading.Thread(target=ask)
    asker.start()
    return asker, failures


def test_a_caches_close_ends_its_export_which_is_not_remembered_as_a_refusal(
    tmp_path: Path, large_image: str
) -> None:
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"containers-storage:{large_image}")
    asker, failures = acquiring(cache, ref)
    wait_for_export(tmp_path / "cache")
    assert cache.close(WAIT_S) == []
    asker.join(WAIT_S)
    assert not asker.is_alive()
    assert [type(error) for error in failures] == [SourceUnavailable], failures
    assert len(cache.refusals) == 0
    assert containers_of(tmp_path / "cache") == ""
    assert sorted(os.listdir(tmp_path / "cache" / "staging")) == []
    with pytest.raises(SourceUnavailable, match="closing"):
        cache.acquire(ref)  # no new export once closed


def export_process(parent: int) -> int:
    """The pid of the ``podman export`` that ``parent`` runs, once it runs."""
    deadline = time.monotonic() + WAIT_S
    while True:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    up = int(stat.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as command:
                    words = command.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if up == parent and b"export" in words:
                return int(entry)
        assert time.monotonic() < deadline, "no export ran"
        time.sleep(0.002)


def test_an_export_cut_short_by_its_engine_is_no_refusal_of_the_image(
    tmp_path: Path, large_image: str
) -> None:
    """``podman export`` sent SIGTERM mid-way (a service manager stopping the engine's users,
    say) ends with status 0 and a tar stream cut short. The engine writes that stream, not the
    image: the request fails as a failure of the moment (``SourceUnavailable``), which is not
    remembered, and the next request exports the image again and gets it."""
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"containers-storage:{large_image}")
    asker, failures = acquiring(cache, ref)
    try:
        os.kill(export_process(os.getpid()), signal.SIGTERM)
    finally:
        asker.join(WAIT_S)
    assert not asker.is_alive()
    assert [type(error) for error in failures] == [SourceUnavailable], failures
    # the stream cut short (podman's status 0), or podman's own end seen first (its status)
    said = str(failures[0])
    assert "no whole tar stream" in said or "podman export was ended" in said, failures
    assert len(cache.refusals) == 0
    with cache.acquire(ref) as use:  # exported again, not refused earlier
        assert not use.image.hit
    assert containers_of(tmp_path / "cache") == ""
    cache.close(WAIT_S)
