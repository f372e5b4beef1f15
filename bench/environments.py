"""Task environments: the first use of an image against what a container engine does for it.

For one image of podman's store (by default the slot-server image's base, which ``./dev image``
builds), measured in the same run:

- **first use**: ``ImageCache.acquire`` on an empty cache: ``podman create`` + ``podman
  export`` streamed through the entry checks into the cache's staging tree, then admitted;
- **engine export**: the limit, what podman itself does to give the same tree as files:
  ``podman create`` + ``podman export`` piped into ``tar -x``;
- **copy**: ``cp -a`` of the unpacked tree (what preparing a tree per slot from a cached copy
  would cost);
- **hit**: ``acquire`` again (the image id from ``podman image inspect``; nothing unpacked).

Prints each with the ratio to the engine export (target: first use at most 1.5x the export).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from trajcore.adapters.sandbox.image_cache import ImageCache
from trajcore.adapters.sandbox.removal import remove_tree
from trajcore.domain.task_environments import parse_environment_ref

PODMAN = ["podman", "--runtime", "runc"]
TARGET_FIRST_USE = 1.5


def _timed(action: list[str], **kwargs: object) -> float:
    started = time.perf_counter()
    subprocess.run(action, check=True, capture_output=True, timeout=900, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - started


def _export(image: str, into: Path) -> float:
    started = time.perf_counter()
    created = subprocess.run(
        [*PODMAN, "create", image, "/bin/true"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()
    try:
        into.mkdir()
        export = subprocess.Popen([*PODMAN, "export", created], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(into)], stdin=export.stdout, check=True, timeout=900)
        if export.wait(timeout=900) != 0:
            raise SystemExit("podman export failed")
    finally:
        subprocess.run(
            [*PODMAN, "rm", "-f", created], capture_output=True, timeout=300, check=False
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/trajcore-base:bookworm")
    args = parser.parse_args()
    known = subprocess.run([*PODMAN, "image", "exists", args.image], check=False, timeout=120)
    if known.returncode != 0:
        print(f"NOT RUN: podman's store has no {args.image}: run ./dev image, or pass --image")
        return
    with tempfile.TemporaryDirectory(prefix="trajcore-bench-env-") as scratch:
        root = Path(scratch)
        export_s = _export(args.image, root / "export")
        cache = ImageCache(root / "cache", max_bytes=64 << 30)
        ref = parse_environment_ref(f"containers-storage:{args.image}")
        with cache.acquire(ref) as first:
            first_s = first.image.seconds
            size, entries = first.image.bytes, first.image.entries
            rootfs = first.image.rootfs
        copy_s = _timed(["cp", "-a", str(rootfs), str(root / "copy")])
        with cache.acquire(ref) as again:
            hit_s = again.image.seconds
        for tree in (root / "export", root / "copy"):
            remove_tree(tree)
    load = os.getloadavg()[0]
    print(f"image {args.image}: {size / 1e6:.0f} MB in {entries} entries; load average {load:.1f}")
    print(f"  engine export (create + export | tar -x)  {export_s:7.2f} s   1.00")
    print(
        f"  first use (export + check + unpack)        {first_s:7.2f} s   {first_s / export_s:.2f}"
    )
    print(f"  copy of the unpacked tree (cp -a)          {copy_s:7.2f} s   {copy_s / export_s:.2f}")
    print(f"  hit (inspect, no unpack)                   {hit_s:7.2f} s   {hit_s / export_s:.3f}")
    verdict = "met" if first_s <= TARGET_FIRST_USE * export_s else "NOT met"
    print(f"  target first use <= {TARGET_FIRST_USE} x the engine export: {verdict}")


if __name__ == "__main__":
    main()
