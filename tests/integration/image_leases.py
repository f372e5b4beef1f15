"""Slot servers with an image cache, for the tests of leases over images, started one way.

- ``image_cache_server``: a slot server whose root is ``<folder>/root`` and whose image cache is
  ``<folder>/cache`` (and more flags, as given), ended when the block ends and checked to exit 0
  where the block ended without an error.
- ``shell_image_server``: the same in a fresh searchable folder (``searchable_dir``) that holds
  a shell image (``write_shell_image``, with the entries and salt given) at ``<folder>/layout``,
  with the reference of that image (``oci:<folder>/layout``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.environment_roots import write_shell_image
from tests.image_layouts import Entry
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server

__all__ = ["image_cache_server", "shell_image_server"]


@contextmanager
def image_cache_server(folder: Path, *flags: str) -> Iterator[Server]:
    """A slot server on ``folder / "root"`` with its image cache at ``folder / "cache"``;
    stopped when the block ends, its exit code checked (0) when the block raised nothing."""
    running = start_server(folder / "root", "--image-cache", str(folder / "cache"), *flags)
    try:
        yield running
    finally:
        code = stop_server(running)
    assert code == 0, f"the slot server exited {code}"


@contextmanager
def shell_image_server(
    tag: str,
    *flags: str,
    under: Path | None = None,
    salt: str = "",
    extra: Sequence[Entry] = (),
) -> Iterator[tuple[Server, str]]:
    """``image_cache_server`` in a fresh ``searchable_dir(tag, under)`` that holds a shell image
    with ``extra`` entries at ``layout``; the server and the image's reference."""
    with searchable_dir(tag, under) as folder:
        write_shell_image(folder / "layout", salt=salt, extra=extra)
        with image_cache_server(folder, *flags) as running:
            yield running, f"oci:{folder / 'layout'}"
