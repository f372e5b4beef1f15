"""What an image cache remembers of an image source: what it resolved to lately, and that it
was refused.

An image refused (a layer the unpacking rules refuse, a digest that does not match, an ``Env``
that is not ``NAME=VALUE``, a missing blob) is refused for every member of a group that asks for
it, and each would pay the whole read and unpack again to learn it. ``RefusedImages`` keeps the
refusal per source instead, and a later request for the same source, unchanged, is answered at
once with the same reason, saying it was refused earlier. The rules it keeps:

- **Keyed by what the source is now.** A file source is keyed by ``source_key``: the status
  (inode, size, times) of the archive, or of a layout's ``index.json`` and every blob of it, so
  an operator's fix (a blob put right, a new ``index.json``) makes a new key and the source is
  read again. An engine's image has no such key before the engine is asked; once asked, its
  id (which names its content) is the key of what unpacking it found.
- **Only a judgement on the image.** A failure of the moment is never remembered: a full disk
  or any other ``OSError``, a full cache, a lock waited for too long, an engine that is missing,
  timed out or failed its export (``SourceUnavailable``). The next request tries again.
- **Bounded.** A refusal is kept ``ttl_s`` seconds, and at most ``max_entries`` of them (the
  oldest go first), so a source fixed in a way its key cannot see is read again in time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import attrs

from trajcore.domain.task_environments import EnvironmentRef, TaskEnvironmentError

__all__ = ["RefusedImages", "SourceUnavailable", "source_key", "source_stamp"]


class SourceUnavailable(TaskEnvironmentError):
    """An image could not be read for a reason of the moment (its engine missing, timed out
    or failing, a full disk): not a judgement on the image, so never remembered as a refusal."""


SourceKey = tuple[object, ...]


def _status(path: Path) -> tuple[int, ...] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def source_stamp(ref: EnvironmentRef) -> tuple[int, ...]:
    """What identifies a layout's or an archive's content without reading it (``()``: nothing,
    for an engine's image or a file that is not there)."""
    if ref.transport == "oci":
        path = Path(ref.location) / "index.json"
    elif ref.transport in ("oci-archive", "docker-archive"):
        path = Path(ref.location)
    else:
        return ()
    try:
        return _status(path) or ()
    except OSError:
        return ()


def source_key(ref: EnvironmentRef) -> SourceKey | None:
    """What a refusal of ``ref`` is remembered by: the status of every file that makes the
    image (an archive; a layout's ``index.json`` and blobs, a missing one as missing), read
    with a few system calls and nothing opened; ``None`` for an engine's image or a source
    whose status cannot be read (its refusal is then not remembered)."""
    try:
        if ref.transport in ("oci-archive", "docker-archive"):
            return (ref.transport, _status(Path(ref.location)))
        if ref.transport != "oci":
            return None
        layout = Path(ref.location)
        blobs: list[tuple[str, tuple[int, ...] | None]] = []
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError),
            os.scandir(layout / "blobs" / "sha256") as entries,
        ):
            blobs.extend((entry.name, _status(Path(entry.path))) for entry in entries)
        return ("oci", _status(layout), _status(layout / "index.json"), tuple(sorted(blobs)))
    except OSError:
        return None


def remembered(error: BaseException) -> bool:
    """Whether ``error`` judges the image, and so is remembered as its refusal."""
    return isinstance(error, TaskEnvironmentError) and not isinstance(error, SourceUnavailable)


@attrs.frozen
class _Refusal:
    key: SourceKey
    field: str
    reason: str
    at: float


class RefusedImages:
    """Refusals of image sources, per reference and key (see the module's rules); safe to use
    from several threads (a cache's requests run in worker threads)."""

    def __init__(self, *, ttl_s: float, max_entries: int) -> None:
        if ttl_s < 0:
            raise ValueError(f"refusal_ttl_s must be >= 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._found: OrderedDict[tuple[str, SourceKey], _Refusal] = OrderedDict()

    def remember(self, ref: EnvironmentRef, key: SourceKey | None, error: BaseException) -> None:
        """Keep ``error`` as the refusal of ``ref`` as ``key`` has it, when it judges the
        image (``remembered``) and there is a key; else nothing."""
        if key is None or self.ttl_s == 0 or not isinstance(error, TaskEnvironmentError):
            return
        if not remembered(error):
            return
        with self._lock:
            self._found[(str(ref), key)] = _Refusal(
                key, error.field, error.reason, time.monotonic()
            )
            self._found.move_to_end((str(ref), key))
            while len(self._found) > self.max_entries:
                self._found.popitem(last=False)

    def recall(self, ref: EnvironmentRef, key: SourceKey | None) -> TaskEnvironmentError | None:
        """The refusal of ``ref`` as ``key`` has it, when one was kept less than ``ttl_s``
        ago: its field, and its reason followed by when it was refused; else ``None``."""
        if key is None:
            return None
        now = time.monotonic()
        with self._lock:
            found = self._found.get((str(ref), key))
            if found is None:
                return None
            if now - found.at > self.ttl_s:
                del self._found[(str(ref), key)]
                return None
        return TaskEnvironmentError(
            found.field,
            f"{found.reason} (refused earlier, {now - found.at:.0f} s ago, and the source is "
            "unchanged since: it is read again once it changes)",
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._found)
