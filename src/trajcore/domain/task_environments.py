"""Task environments as pure data: which root filesystem a task names, and what each entry of
an image layer may do to the tree it is unpacked into.

A task may run over its own root filesystem, taken from a container image. The slot server
unpacks each image once per host into a read-only cache (``adapters/slot_server/image_cache``);
everything that cache decides without touching a file lives here:

- ``EnvironmentRef``: an image reference as an operator or a dataset writes it, with the
  transports people in this field know from skopeo and podman: ``containers-storage:NAME``
  (podman's local store), ``docker-daemon:NAME`` (docker's), ``oci:PATH[:TAG]`` (an OCI image
  layout directory), ``oci-archive:PATH[:TAG]`` (the same as a tar file), ``docker-archive:PATH``
  (what ``docker save`` writes) and ``directory:PATH`` (a root filesystem already unpacked, used
  in place). ``parse_environment_ref`` refuses anything else, naming the field.
- ``plan_entry``: one tar entry of a layer to one ``EntryPlan``: create a file, directory,
  symlink, hard link or FIFO at a normalized relative path, delete a lower layer's path (a
  ``.wh.`` whiteout) or empty a directory of what lower layers put there (``.wh..wh..opq``).
  Device nodes under ``dev/`` (a debootstrap-made base image holds ``/dev/console`` and the
  like) are skipped and counted: every lease mounts its own ``/dev``. Refused, each as a
  ``LayerRefused`` naming the entry and the reason: absolute names, ``..`` components, NUL
  bytes, device nodes anywhere else and every other special kind, reserved ``.wh..wh.`` names,
  a hard link whose target is outside the tree, and names or link targets past ``max_path_bytes``.
  Symlinks may point anywhere: their targets are resolved inside the lease's root when the lease
  runs, and the unpacker never follows one (it opens every directory with ``O_NOFOLLOW``).
- ``UnpackBudget``: the running count of entries and bytes of one image, refusing the entry that
  would pass ``ImageLimits`` (an archive bomb fails on its first entry past the limit, before its
  bytes are written).

Ownership and modes: the cache holds every file as its own owner's; an entry keeps its
permission bits less set-uid, set-gid, sticky and group/other write (``safe_mode``), so nothing
in the cache gives a lease more than the image's plain read and execute bits.

Rules: no I/O, no clock; paths are text (tar names decoded with ``surrogateescape``); every
refusal names the image reference and the entry.
"""

from __future__ import annotations

import enum
import posixpath
from typing import Literal

import attrs

from trajcore.domain.errors import InfrastructureError, InvalidInput
from trajcore.domain.validators import positive_int

__all__ = [
    "OPAQUE_MARKER",
    "WHITEOUT_PREFIX",
    "CreateEntry",
    "EntryKind",
    "EntryPlan",
    "EnvironmentRef",
    "ImageCacheFull",
    "ImageCacheStatistics",
    "ImageLimits",
    "LayerRefused",
    "LeaseLayerStatistics",
    "MakeOpaque",
    "RemoveLower",
    "SkipDevice",
    "TaskEnvironmentError",
    "Transport",
    "UnpackBudget",
    "parse_environment_ref",
    "plan_entry",
    "safe_mode",
]

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"

Transport = Literal[
    "containers-storage", "docker-daemon", "oci", "oci-archive", "docker-archive", "directory"
]
_TRANSPORTS: dict[str, Transport] = {
    "containers-storage": "containers-storage",
    "docker-daemon": "docker-daemon",
    "oci": "oci",
    "oci-archive": "oci-archive",
    "docker-archive": "docker-archive",
    "directory": "directory",
}
_WITH_TAG: frozenset[str] = frozenset({"oci", "oci-archive"})


class TaskEnvironmentError(InvalidInput):
    """A task's environment cannot be used: the image is missing, malformed or refused."""


class LayerRefused(TaskEnvironmentError):
    """One entry of an image layer was refused; ``field`` names the image and the entry."""


class ImageCacheFull(InfrastructureError):
    """The image cache cannot make room: every image it could evict is in use."""


@attrs.frozen(kw_only=True)
class EnvironmentRef:
    """An image reference: how to reach the image (``transport``), where, and which tag.

    Attributes:
        transport: one of ``Transport``.
        location: the image name (engine stores) or a path (the others).
        tag: the ``org.opencontainers.image.ref.name`` to pick from an OCI layout, or None.
    """

    transport: Transport
    location: str
    tag: str | None = None

    def __str__(self) -> str:
        suffix = f":{self.tag}" if self.tag is not None else ""
        if self.tag is None and self.transport in _WITH_TAG and ":" in self.location:
            suffix = ":"  # an explicit empty tag keeps the colons of the path its own
        return f"{self.transport}:{self.location}{suffix}"


def _is_control(char: str) -> bool:
    """Whether ``char`` is a C0 or C1 control character or DEL (NUL, a tab, a newline...)."""
    return ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0


def parse_environment_ref(text: object, *, field: str = "environment") -> EnvironmentRef:
    """The reference ``text`` names; ``TaskEnvironmentError`` naming ``field`` if it names none.

    ``oci`` and ``oci-archive`` paths may end in ``:TAG``; a path that itself holds a colon is
    written with an explicit empty tag (``oci:/a:b:``). Whitespace at either end and control
    characters anywhere are refused, so that a newline left from a dataset row is named here
    rather than failing later as a path that looks right in a log.
    """
    if not isinstance(text, str):
        raise TaskEnvironmentError(field, f"must be text, got {type(text).__name__}")
    if text != text.strip():
        raise TaskEnvironmentError(
            field, f"{text!r} starts or ends with whitespace (a stray space or newline?)"
        )
    control = next((char for char in text if _is_control(char)), None)
    if control is not None:
        raise TaskEnvironmentError(field, f"{text!r} holds the control character {control!r}")
    word, colon, rest = text.partition(":")
    transport = _TRANSPORTS.get(word)
    if not colon or transport is None:
        known = ", ".join(f"{name}:" for name in _TRANSPORTS)
        raise TaskEnvironmentError(field, f"{text!r} names no known transport (one of {known})")
    if not rest:
        raise TaskEnvironmentError(field, f"{text!r} has no image name or path after {transport}:")
    tag: str | None = None
    location = rest
    if transport in _WITH_TAG and ":" in rest:
        location, _, tag_text = rest.rpartition(":")
        tag = tag_text or None
    on_disk = transport not in ("containers-storage", "docker-daemon")
    if on_disk and not location.startswith("/"):
        raise TaskEnvironmentError(field, f"{text!r}: the path must be absolute")
    return EnvironmentRef(transport=transport, location=location, tag=tag)


@attrs.frozen(kw_only=True)
class ImageLimits:
    """What one image may hold, so that an archive bomb fails before it fills the disk.

    Attributes:
        max_bytes: the image's unpacked file bytes, all layers together.
        max_entries: its entries (files, directories, links), all layers together.
        max_path_bytes: the longest entry name or link target, in UTF-8 bytes.
    """

    max_bytes: int = attrs.field(default=8 << 30, validator=positive_int)
    max_entries: int = attrs.field(default=2_000_000, validator=positive_int)
    max_path_bytes: int = attrs.field(default=4096, validator=positive_int)


class EntryKind(enum.Enum):
    """What a tar entry is, as the unpacker reads it from the header's type."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    FIFO = "fifo"
    CHAR_DEVICE = "character device"
    BLOCK_DEVICE = "block device"
    OTHER = "other"


_CREATABLE = frozenset(
    {EntryKind.FILE, EntryKind.DIRECTORY, EntryKind.SYMLINK, EntryKind.HARDLINK, EntryKind.FIFO}
)


@attrs.frozen(kw_only=True)
class CreateEntry:
    """Create ``path`` (relative parts) as ``kind`` with ``mode``; ``link`` for links.

    For a hard link ``link`` is the normalized relative path of its target; for a symlink it is
    the target text as written (not followed here or when unpacking).
    """

    path: tuple[str, ...]
    kind: EntryKind
    mode: int
    size: int
    link: str | None = None


@attrs.frozen(kw_only=True)
class RemoveLower:
    """Delete ``path``, which a lower layer made (an OCI whiteout)."""

    path: tuple[str, ...]


@attrs.frozen(kw_only=True)
class MakeOpaque:
    """Empty the directory ``path`` of what lower layers put in it (an opaque whiteout)."""

    path: tuple[str, ...]


@attrs.frozen(kw_only=True)
class SkipDevice:
    """A device node under ``dev/``, left out: every lease mounts a ``/dev`` of its own."""

    path: tuple[str, ...]


EntryPlan = CreateEntry | RemoveLower | MakeOpaque | SkipDevice


def safe_mode(mode: int, kind: EntryKind) -> int:
    """Permission bits kept in the cache: no set-uid, set-gid or sticky, no group/other write.

    A directory always keeps its owner's read, write and search bits (the cache must be able to
    fill and later remove it); it is made read-only to leases by the read-only mount, not here.
    """
    kept = mode & 0o755
    if kind is EntryKind.DIRECTORY:
        kept |= 0o700
    return kept


def _parts(name: str, *, image: str, what: str, limits: ImageLimits) -> tuple[str, ...]:
    field = f"{image}: {what} {name!r}"
    if "\x00" in name:
        raise LayerRefused(field, "holds a NUL byte")
    if len(name.encode("utf-8", "surrogateescape")) > limits.max_path_bytes:
        raise LayerRefused(field, f"is longer than {limits.max_path_bytes} bytes")
    if name.startswith("/"):
        raise LayerRefused(field, "is an absolute path")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise LayerRefused(field, "has a '..' component")
    return parts


def plan_entry(
    *,
    image: str,
    name: str,
    kind: EntryKind,
    mode: int,
    size: int,
    link: str,
    limits: ImageLimits,
) -> EntryPlan | None:
    """What one layer entry does to the tree; None for the layer's own root (``./``).

    Raises ``LayerRefused`` naming ``image`` and the entry for anything listed in the module's
    docstring.
    """
    parts = _parts(name, image=image, what="entry", limits=limits)
    field = f"{image}: entry {name!r}"
    if not parts:
        if kind is EntryKind.DIRECTORY:
            return None
        raise LayerRefused(field, f"names the layer's root as a {kind.value}")
    base = parts[-1]
    if base.startswith(WHITEOUT_PREFIX):
        if kind is not EntryKind.FILE:
            raise LayerRefused(field, f"is a whiteout name on a {kind.value}")
        if base == OPAQUE_MARKER:
            return MakeOpaque(path=parts[:-1])
        if base.startswith(WHITEOUT_PREFIX + WHITEOUT_PREFIX):
            raise LayerRefused(field, "is a reserved whiteout name this unpacker does not know")
        hidden = base[len(WHITEOUT_PREFIX) :]
        if hidden in ("", ".", ".."):
            raise LayerRefused(field, "is a whiteout of no name")
        return RemoveLower(path=(*parts[:-1], hidden))
    if (
        kind in (EntryKind.CHAR_DEVICE, EntryKind.BLOCK_DEVICE)
        and len(parts) > 1
        and parts[0] == "dev"
    ):
        return SkipDevice(path=parts)
    if kind not in _CREATABLE:
        raise LayerRefused(field, f"is a {kind.value}, which an image cache never creates")
    if size < 0 or (kind is not EntryKind.FILE and size != 0):
        raise LayerRefused(field, f"declares {size} bytes for a {kind.value}")
    target: str | None = None
    if kind is EntryKind.HARDLINK:
        target_parts = _parts(
            link, image=image, what=f"hard link target of {name!r}:", limits=limits
        )
        if not target_parts:
            raise LayerRefused(field, "is a hard link to the layer's root")
        target = posixpath.join(*target_parts)
    elif kind is EntryKind.SYMLINK:
        if "\x00" in link or not link:
            raise LayerRefused(field, "has an empty symlink target or one holding a NUL byte")
        if len(link.encode("utf-8", "surrogateescape")) > limits.max_path_bytes:
            raise LayerRefused(
                field, f"has a symlink target longer than {limits.max_path_bytes} bytes"
            )
        target = link
    return CreateEntry(path=parts, kind=kind, mode=safe_mode(mode, kind), size=size, link=target)


@attrs.define
class UnpackBudget:
    """Entries and bytes one image has used so far; ``charge`` refuses the one past a limit."""

    image: str
    limits: ImageLimits
    entries: int = 0
    bytes: int = 0
    skipped_devices: int = 0

    def charge(self, name: str, size: int) -> None:
        """Count one entry of ``size`` bytes; ``LayerRefused`` if the image would pass a limit."""
        if self.entries + 1 > self.limits.max_entries:
            raise LayerRefused(
                f"{self.image}: entry {name!r}",
                f"the image holds more than {self.limits.max_entries} entries",
            )
        if self.bytes + size > self.limits.max_bytes:
            raise LayerRefused(
                f"{self.image}: entry {name!r}",
                f"the image unpacks to more than {self.limits.max_bytes} bytes",
            )
        self.entries += 1
        self.bytes += size


@attrs.frozen(kw_only=True)
class ImageCacheStatistics:
    """An image cache as one slot server saw it: what it holds and what its requests did
    (``ImageCache.statistics``; a slot server's health carries it)."""

    images: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    refused: int
    evicted: int
    unpack_seconds: float
    recently_resolved: int = 0
    """Hits answered from a recent resolution of the reference (the adapter's ``ImageCache``): no
    engine lookup, no archive read."""


@attrs.frozen(kw_only=True)
class LeaseLayerStatistics:
    """What one slot server measured of its leases' writable layers: each lease over an
    environment (an image or a fork) is measured once its reset set what it wrote aside (its
    upper layer over the image and, for a fork, its workspace overlay's upper layer), before
    the trash is emptied. A slot server's health carries it.

    Attributes:
        measured: Layers measured (one per lease that started a sandbox or a fork).
        bytes: Their disk use added up (allocated blocks, each inode once, as ``du`` counts).
        entries: Their entries added up (files, directories, links, whiteouts).
        largest_bytes: The largest one's disk use.
        last_bytes: The latest one's disk use.
        last_entries: The latest one's entries.
        cut_short: Measurements stopped at their deadline (their figures are a lower bound).
        measure_seconds: Seconds spent measuring (off the resets' path).
    """

    measured: int = 0
    bytes: int = 0
    entries: int = 0
    largest_bytes: int = 0
    last_bytes: int = 0
    last_entries: int = 0
    cut_short: int = 0
    measure_seconds: float = 0.0

    def add(
        self, *, size: int, entries: int, cut_short: bool, seconds: float
    ) -> LeaseLayerStatistics:
        """These figures with one more layer counted. Raises ``ValueError`` for a negative
        figure, naming it."""
        for name, value in (("size", size), ("entries", entries), ("seconds", seconds)):
            if value < 0:
                raise ValueError(f"{name}: a layer's figure cannot be negative, got {value}")
        return LeaseLayerStatistics(
            measured=self.measured + 1,
            bytes=self.bytes + size,
            entries=self.entries + entries,
            largest_bytes=max(self.largest_bytes, size),
            last_bytes=size,
            last_entries=entries,
            cut_short=self.cut_short + cut_short,
            measure_seconds=self.measure_seconds + seconds,
        )
