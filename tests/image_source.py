"""Which source tree an image was built from: a digest of what goes into it.

``./dev image`` labels the slot-server image ``trajcore.source=<digest>``; the tests that run
containers of it compare the label with this tree's digest, so an image built from another
tree (whose slot server may not take this tree's flags) is named as stale instead of failing
every start. ``python tests/image_source.py`` prints the digest.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABEL = "trajcore.source"
_INPUTS = ("src", "Containerfile", "pyproject.toml", "hatch_build.py", "requirements.lock")


def source_digest(root: Path = ROOT) -> str:
    """sha256 over the paths and bytes of the image's inputs (caches excluded), in path order."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for name in _INPUTS:
        path = root / name
        if path.is_dir():
            files.extend(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.is_file():
            files.append(path)
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def image_problem(engine: str | None, image: str) -> str | None:
    """Why the tests cannot use ``image`` here (``None``: it is there and built from this tree)."""
    if engine is None:
        return "no container engine (podman or docker)"
    done = subprocess.run(
        [engine, "image", "inspect", "--format", '{{index .Labels "' + LABEL + '"}}', image],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return f"no image {image}: ./dev image builds it"
    if done.stdout.strip() != source_digest():
        return f"the image {image} was built from another source tree: ./dev image rebuilds it"
    return None


if __name__ == "__main__":
    sys.stdout.write(source_digest() + "\n")
