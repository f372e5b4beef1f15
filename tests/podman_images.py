"""Images the tests import into podman's store, made and removed one way.

- ``PODMAN``: podman's command line, with the runc runtime (crun is not on every host).
- ``podman_problem``: why podman cannot run here (the reason a test skips with), or ``None``.
- ``imported_image``: a small image imported into podman's store from the files a test names
  (and ``podman import --change`` instructions: ``ENV``, ``WORKDIR``, ``USER``), under a name
  of its own, removed when the block ends. A test that asks for one where podman cannot run is
  skipped, naming why.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["PODMAN", "imported_image", "podman_problem"]

PODMAN = ("podman", "--runtime", "runc")


def podman_problem() -> str | None:
    """Why podman (with runc) cannot run here, or ``None`` where ``podman info`` answers."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    done = subprocess.run([*PODMAN, "info"], capture_output=True, timeout=60, check=False)
    return None if done.returncode == 0 else f"podman info failed: {done.stderr[-200:]!r}"


@contextmanager
def imported_image(
    folder: Path,
    tag: str,
    files: Mapping[str, bytes],
    *,
    mode: int = 0o644,
    changes: Sequence[str] = (),
) -> Iterator[str]:
    """The name of an image in podman's store (``localhost/trajcore-<tag>-test:<random>``)
    holding ``files`` (path in the image to content, each of ``mode``) and configured by
    ``changes``, imported from a tar written in ``folder``; removed when the block ends.
    Skips the test where podman cannot run (``podman_problem``)."""
    why = podman_problem()
    if why is not None:
        pytest.skip(why)
    rootfs = folder / f"{tag}-import.tar"
    with tarfile.open(rootfs, "w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    name = f"localhost/trajcore-{tag}-test:{uuid.uuid4().hex[:12]}"
    command = [*PODMAN, "import", *(f"--change={change}" for change in changes), str(rootfs), name]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    try:
        yield name
    finally:
        subprocess.run([*PODMAN, "rmi", "-f", name], capture_output=True, timeout=120, check=False)
