"""The per-host cache of task environments: each image unpacked once, read-only, shared by
every slot of every slot server on the host.

Layout under the cache's root::

    images/<id>/rootfs/     the unpacked tree (``id``: the image config's sha256)
    images/<id>/image.json  what it is: reference, bytes, entries, seconds to unpack, and what
                            its config says about running it (``env``, ``working_dir``,
                            ``user``)
    locks/<id>.lock         flock: exclusive while the image is made or evicted, shared while used
    locks/owner-<token>.lock  flock: exclusive for as long as the cache object that opened
                            it lives (one per server): its owner is alive while it is held
    staging/                trees and exports in progress (each named ``<kind>-<token>-...``
                            after its owner), and evicted trees being removed
    staging/export-<token>-<n>  an engine's export in progress: the engine and its container's
                            name (``trajcore-export-<token>-<n>``, labelled
                            ``trajcore.export=<cache root>``)
    cache.lock              flock: exclusive around admission and eviction

The rules it keeps:

- **Once per host.** Two servers that ask for the same image at once: one unpacks it, the other
  waits on its lock and then finds it made (a hit). An image appears under ``images/`` by one
  rename of a finished tree, so a reader never sees half an image.
- **Consistent after any failure.** Unpacking happens in ``staging/``; a refused layer, a
  digest mismatch, a full disk or a crash leave nothing under ``images/``. What a stopped or
  crashed server left in ``staging/`` (a partial unpack, an engine's container made for an
  export) is removed when the next cache opens: an entry whose owner's lock is free is a dead
  owner's; a live server's entries are never touched.
- **In use is never evicted.** A lease holds its image's lock shared for as long as it runs
  over it (``ImageUse``); eviction takes the lock exclusive without waiting and skips images it
  cannot take. Images leave least recently used first when a new one would pass ``max_bytes``;
  when everything that could leave is in use, the new image is refused with ``ImageCacheFull``
  naming the image and the sizes, and the cache stays as it was.
- **Bounded waits.** Waiting for another server's unpacking ends at ``lock_timeout_s``.
- **A refusal is told once.** An image refused (malformed, a layer refused) is remembered by
  its source's key for ``refusal_ttl_s`` (``image_refusals``): a later request for the same
  source, unchanged, is refused at once with the same reason, and one waiting on the image's
  lock while another thread's unpacking was refused learns it without unpacking again. A failure
  of the moment (a full disk, an engine's timeout) is not remembered.

A ``directory:`` environment is not copied: its tree is used in place (the operator keeps it
unchanged while runs use it) and takes no room in the cache. A dataset row names it, and a row is
data: the tree must be one of the folders the operator lists (``environment_dirs``, the slot
server's ``--environment-dir``) or lie below one, its symlinks resolved; any other path, or any
path when none is listed, is refused. A lease runs over such a tree as over an image, its
root-owned files the slot's in the lease's idmapped view, so only folders meant for leases belong
in the list. The lease mounts the tree by path after this check, so every folder above it must
be writable only by root or the server's user (a sticky one: with the entry below theirs), or a
user who could rename an entry there could swap the tree for a link to any host folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import overload

import attrs

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.image_exports import RunningExports, remove_container
from trajcore.adapters.slot_server.image_refusals import (
    RefusedImages,
    SourceKey,
    source_key,
    source_stamp,
)
from trajcore.adapters.slot_server.image_sources import (
    EngineExport,
    ImageLayers,
    exported,
    read_image,
)
from trajcore.adapters.slot_server.image_unpack import unpack_layer, unpack_stream
from trajcore.adapters.slot_server.tree_owners import swappable
from trajcore.domain.task_environments import (
    EnvironmentRef,
    ImageCacheFull,
    ImageCacheStatistics,
    ImageLimits,
    TaskEnvironmentError,
    UnpackBudget,
)

__all__ = ["CachedImage", "ImageCache", "ImageUse"]

_STAGED_KINDS = frozenset({"read", "image", "evicted", "export"})

_POLL_S = 0.05
# The most a cache's open waits on an engine for each dead export's container it removes.
_SWEEP_ENGINE_S = 30.0


@attrs.frozen(kw_only=True)
class CachedImage:
    """An image ready to run over.

    Attributes:
        ref: the reference it was asked by.
        image_id: its config's sha256 (``directory:`` trees: the reference itself).
        rootfs: the tree a lease mounts read-only as its root.
        bytes: its unpacked file bytes (0 for a directory used in place).
        entries: its entries (0 for a directory used in place).
        hit: whether it was in the cache already.
        seconds: how long this request took to make it ready.
        architecture: the architecture its config names (``""``: none given, or a
            ``directory:`` tree).
        env: its config's ``Env`` (``NAME=VALUE`` each): every command of a lease over it runs
            with these variables (docs/environments.md, "The image's environment"); none for
            a ``directory:`` tree, which has no config.
        working_dir: its config's ``WorkingDir``, recorded only.
        user: its config's ``User``, recorded only.
    """

    ref: str
    image_id: str
    rootfs: Path
    bytes: int
    entries: int
    hit: bool
    seconds: float
    architecture: str = ""
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""


class ImageUse:
    """An image held in use (its lock shared) until ``close``: the cache will not evict it."""

    def __init__(self, image: CachedImage, lock_fd: int | None) -> None:
        self.image = image
        self._lock_fd = lock_fd

    def close(self) -> None:
        """Stop holding the image; idempotent."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops its flock

    def __enter__(self) -> ImageUse:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@attrs.define
class _Counters:
    """This process's requests so far, named as ``ImageCacheStatistics`` names them."""

    hits: int = 0
    misses: int = 0
    refused: int = 0
    evicted: int = 0
    unpack_seconds: float = 0.0
    recently_resolved: int = 0


class ImageCache:
    """Images unpacked once per host under ``root`` (see the module's rules)."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        limits: ImageLimits | None = None,
        engine_timeout_s: float = 600.0,
        lock_timeout_s: float = 900.0,
        resolve_ttl_s: float = 30.0,
        environment_dirs: Sequence[Path] = (),
        refusal_ttl_s: float = 300.0,
        max_refusals: int = 1024,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if resolve_ttl_s < 0:
            raise ValueError(f"resolve_ttl_s must be >= 0, got {resolve_ttl_s}")
        self.root = root
        self.max_bytes = max_bytes
        self.limits = limits or ImageLimits()
        self.engine_timeout_s = engine_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.resolve_ttl_s = resolve_ttl_s
        # the folders ``directory:`` trees may come from, symlinks resolved (``_directory``)
        self.environment_dirs = tuple(Path(os.path.realpath(d)) for d in environment_dirs)
        self._counters = _Counters()
        # reference -> (its source's stamp, when resolved, image id): see ``_recent``
        self._resolved: dict[str, tuple[tuple[int, ...], float, str]] = {}
        self.refusals = RefusedImages(ttl_s=refusal_ttl_s, max_entries=max_refusals)
        for name in ("images", "locks", "staging"):
            (root / name).mkdir(parents=True, exist_ok=True)
        self._token = uuid.uuid4().hex[:12]
        self._owner_fd = self._own()
        self.exports = RunningExports(root / "staging", self._token)
        # the owner lock lasts as long as this cache object (or its process): then it is free
        weakref.finalize(self, os.close, self._owner_fd)
        self._sweep_staging()
        self._trim()

    # -- requests

    def acquire(self, ref: EnvironmentRef) -> ImageUse:
        """The image of ``ref``, unpacked if needed, held in use until the result is closed.

        Raises:
            TaskEnvironmentError: the image is missing or malformed, or a layer is refused
                (or was, for this source unchanged: ``refusals``).
            ImageCacheFull: it cannot fit beside the images in use.
            TimeoutError: another server's unpacking of it passed ``lock_timeout_s``.
        """
        started = time.monotonic()
        if ref.transport == "directory":
            return ImageUse(self._directory(ref, started), None)
        held = self._take_recent(ref, started, wait=True)
        if held is not None:
            return held
        stamp = source_stamp(ref)
        key = source_key(ref)
        earlier = self.refusals.recall(ref, key)
        if earlier is not None:
            self._counters.refused += 1
            raise earlier
        with tempfile.TemporaryDirectory(
            dir=self.root / "staging", prefix=f"read-{self._token}-"
        ) as scratch:
            try:
                found = read_image(
                    ref, Path(scratch), timeout_s=self.engine_timeout_s, known=self._holds
                )
            except TaskEnvironmentError as error:
                self._counters.refused += 1
                self.refusals.remember(ref, key, error)
                raise
            image_id = found if isinstance(found, str) else found.image_id
            self._resolved[str(ref)] = (stamp, time.monotonic(), image_id)
            lock_fd = self._lock(image_id, fcntl.LOCK_SH)
            try:
                if self._holds(image_id):
                    self._counters.hits += 1
                    return ImageUse(self._entry(ref, image_id, hit=True, started=started), lock_fd)
                assert not isinstance(found, str)  # an id alone comes only for a held image
                if not self._make(ref, found, lock_fd):
                    self._counters.hits += 1  # another server unpacked it while this one waited
                    return ImageUse(self._entry(ref, image_id, hit=True, started=started), lock_fd)
                self._counters.misses += 1
                image = self._entry(ref, image_id, hit=False, started=started)
                self._counters.unpack_seconds += image.seconds
                return ImageUse(image, lock_fd)
            except BaseException:
                os.close(lock_fd)
                raise

    def acquire_recent(self, ref: EnvironmentRef) -> ImageUse | None:
        """``acquire``'s answer, counted as it counts a hit, when ``ref`` resolved lately to
        an image the cache holds and whose lock is free at once; else ``None``, and ``acquire``
        finds out. A few system calls on the cache's own files (a stat, the lock, the image's
        ``image.json``), no engine, no archive and no wait: a lease request takes it on the
        event loop instead of a round trip through a worker thread."""
        if ref.transport == "directory":
            return None
        return self._take_recent(ref, time.monotonic(), wait=False)

    def _take_recent(self, ref: EnvironmentRef, started: float, *, wait: bool) -> ImageUse | None:
        """The held image ``ref`` resolved to lately (``_recent``), its lock taken shared and
        counted as a hit; ``None`` when there is none, it was evicted since, or (``wait``
        false) its lock is not free at once or its files cannot be read, for ``acquire`` to
        sort out. With ``wait``, the lock is waited for (``lock_timeout_s``) and an unreadable
        image raises."""
        recent = self._recent(ref, started)
        if recent is None:
            return None
        lock_fd = self._lock(recent, fcntl.LOCK_SH, wait=wait)
        if lock_fd is None:
            return None
        try:
            if self._holds(recent):
                image = self._entry(ref, recent, hit=True, started=started)
                self._counters.hits += 1
                self._counters.recently_resolved += 1
                return ImageUse(image, lock_fd)
        except (OSError, ValueError, KeyError):
            os.close(lock_fd)
            if wait:
                raise
            return None
        except BaseException:
            os.close(lock_fd)
            raise
        os.close(lock_fd)  # evicted since: read the reference again
        return None

    def close(self, timeout_s: float) -> list[str]:
        """End the engine exports running now (``RunningExports.end``: their processes, their
        containers, their staging trees) within ``timeout_s``, and refuse later ones; what is
        left then, in words (the next open removes it). The cache's images stay."""
        return self.exports.end(timeout_s)

    def statistics(self) -> ImageCacheStatistics:
        """What the cache holds now, and this process's requests so far."""
        images = total = 0
        for meta in (self.root / "images").glob("*/image.json"):
            with contextlib.suppress(OSError, ValueError):
                total += int(json.loads(meta.read_text())["bytes"])
                images += 1
        return ImageCacheStatistics(
            images=images, bytes=total, max_bytes=self.max_bytes, **attrs.asdict(self._counters)
        )

    # -- inside

    def _directory(self, ref: EnvironmentRef, started: float) -> CachedImage:
        """The tree ``ref`` names, used in place, when it is an operator-listed folder or below
        one (``environment_dirs``), its symlinks resolved; else ``TaskEnvironmentError``."""
        tree = Path(ref.location)
        if not self.environment_dirs:
            raise TaskEnvironmentError(
                str(ref),
                "directory: environments are off on this slot server: list the folders their "
                "trees may come from (environment_dirs; the slot server's --environment-dir, "
                "the env's --env.environment_dirs, on the container pool "
                "--env.container_environment_dirs)",
            )
        # the list first: what lies outside it is refused alike whether it exists or not, so
        # a reference cannot probe the host's paths
        real = Path(os.path.realpath(tree))
        if not any(real == folder or folder in real.parents for folder in self.environment_dirs):
            listed = ", ".join(str(folder) for folder in self.environment_dirs)
            raise TaskEnvironmentError(
                str(ref),
                f"{real} is not in a folder listed for directory: environments ({listed}): "
                "add its folder to environment_dirs (the slot server's --environment-dir)",
            )
        if not tree.is_dir() or tree.is_symlink():
            raise TaskEnvironmentError(str(ref), f"{tree} is not a directory")
        open_path = swappable(real)
        if open_path is not None:
            raise TaskEnvironmentError(str(ref), open_path)
        self._counters.hits += 1
        return CachedImage(
            ref=str(ref),
            image_id=str(ref),
            rootfs=real,
            bytes=0,
            entries=0,
            hit=True,
            seconds=time.monotonic() - started,
        )

    def _recent(self, ref: EnvironmentRef, now: float) -> str | None:
        """The image id ``ref`` resolved to lately, when it still stands: a layout or archive
        whose file is unchanged (same inode, size and modification time), or an engine's image
        resolved less than ``resolve_ttl_s`` ago (a tag moved in the engine's store is seen
        after that). Saves a lease the engine's ``image inspect`` (a process of its own) or an
        archive's extraction."""
        entry = self._resolved.get(str(ref))
        if entry is None:
            return None
        stamp, resolved_at, image_id = entry
        if ref.transport in ("containers-storage", "docker-daemon"):
            fresh = now - resolved_at < self.resolve_ttl_s
        else:
            fresh = stamp != () and stamp == source_stamp(ref)
        return image_id if fresh else None

    def _holds(self, image_id: str) -> bool:
        return (self.root / "images" / image_id / "image.json").is_file()

    @overload
    def _lock(self, image_id: str, mode: int) -> int: ...
    @overload
    def _lock(self, image_id: str, mode: int, *, wait: bool) -> int | None: ...
    def _lock(self, image_id: str, mode: int, *, wait: bool = True) -> int | None:
        """The image's lock file, flocked in ``mode``, waiting at most ``lock_timeout_s``;
        without ``wait``, ``None`` when the lock is not free at once."""
        fd = os.open(
            self.root / "locks" / f"{image_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            if wait:
                self._flock(fd, mode, what=f"image {image_id}")
            else:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BaseException as error:
            os.close(fd)
            if not wait and isinstance(error, OSError):
                return None  # held by an unpacking or an eviction, or unusable: not at once
            raise
        return fd

    def _flock(self, fd: int, mode: int, *, what: str) -> None:
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{what} stayed locked past {self.lock_timeout_s} s"
                    ) from None
                time.sleep(_POLL_S)

    def _make(self, ref: EnvironmentRef, found: ImageLayers | EngineExport, lock_fd: int) -> bool:
        """Unpack ``found`` and admit it, the lock held exclusive meanwhile, then shared again;
        a refusal is remembered by its source's key, an engine's by its image id (and one
        remembered while this waited is raised).

        Returns False when another server made it while this one waited for the lock (two
        servers that both held it shared, saw no image and asked to unpack it)."""
        self._flock(lock_fd, fcntl.LOCK_EX, what=f"image {found.image_id}")
        try:
            if self._holds(found.image_id):
                return False
            key: SourceKey = source_key(ref) or ("engine", found.image_id)
            earlier = self.refusals.recall(ref, key)
            if earlier is not None:
                self._counters.refused += 1
                raise earlier
            staged = Path(
                tempfile.mkdtemp(dir=self.root / "staging", prefix=f"image-{self._token}-")
            )
            staged.chmod(0o755)  # slots run as other uids, and mount the tree below them
            try:
                (staged / "rootfs").mkdir(mode=0o755)
                budget = UnpackBudget(image=str(ref), limits=self.limits)
                started = time.monotonic()
                if isinstance(found, EngineExport):
                    with (
                        self.exports.record(found.engine, staged) as run,
                        exported(
                            found,
                            timeout_s=self.engine_timeout_s,
                            container=run.container,
                            label=f"trajcore.export={self.root}",
                            on_start=run.started,
                        ) as stream,
                    ):
                        unpack_stream(
                            stream,
                            staged / "rootfs",
                            image=str(ref),
                            label="(export)",
                            sha256=None,
                            budget=budget,
                        )
                else:
                    for layer in found.layers:
                        unpack_layer(layer, staged / "rootfs", image=str(ref), budget=budget)
                meta = {
                    "ref": str(ref),
                    "bytes": budget.bytes,
                    "entries": budget.entries,
                    "skipped_devices": budget.skipped_devices,
                    "seconds": round(time.monotonic() - started, 6),
                    "architecture": found.architecture,
                    "env": list(found.config.env),
                    "working_dir": found.config.working_dir,
                    "user": found.config.user,
                }
                (staged / "image.json").write_text(json.dumps(meta))
                self._admit(ref, found.image_id, staged, budget.bytes)
                return True
            except TaskEnvironmentError as error:
                self._counters.refused += 1
                self.refusals.remember(ref, key, error)
                raise
            finally:
                if staged.exists():
                    remove_tree(staged)
        finally:
            self._flock(lock_fd, fcntl.LOCK_SH, what=f"image {found.image_id}")

    def _admit(self, ref: EnvironmentRef, image_id: str, staged: Path, size: int) -> None:
        if size > self.max_bytes:
            self._counters.refused += 1
            raise ImageCacheFull(
                f"image {ref} unpacks to {size} bytes, more than the cache's {self.max_bytes}"
            )
        guard = os.open(self.root / "cache.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self._flock(guard, fcntl.LOCK_EX, what="the image cache")
            self._evict_for(ref, size)
            os.rename(staged, self.root / "images" / image_id)
        finally:
            os.close(guard)

    def _trim(self) -> None:
        """At open: images made before the cache recorded an image's ``Env`` (a lease over one
        would run without it) leave, then the least recently used while the cache holds more
        than ``max_bytes`` (a limit lowered since they came); those in use stay."""
        guard = os.open(self.root / "cache.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self._flock(guard, fcntl.LOCK_EX, what="the image cache")
            for meta in (self.root / "images").glob("*/image.json"):
                with contextlib.suppress(OSError, ValueError):
                    if "env" not in json.loads(meta.read_text()):
                        self._evict(meta.parent.name)
            self._evict_down_to(0)
        finally:
            os.close(guard)

    def _evict_for(self, ref: EnvironmentRef, size: int) -> None:
        total, in_use = self._evict_down_to(size)
        if total + size > self.max_bytes:
            self._counters.refused += 1
            raise ImageCacheFull(
                f"image {ref} needs {size} bytes; the cache holds {total} of {self.max_bytes}, "
                f"{in_use} of them in images that leases are using"
            )

    def _evict_down_to(self, size: int) -> tuple[int, int]:
        """Evict images nobody uses, least recently used first, until ``size`` more bytes fit
        under ``max_bytes`` or none is left to evict: the bytes held then, and of them those in
        images in use."""
        held: list[tuple[float, str, int]] = []
        for meta in (self.root / "images").glob("*/image.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                held.append(
                    (
                        meta.stat().st_mtime,
                        meta.parent.name,
                        int(json.loads(meta.read_text())["bytes"]),
                    )
                )
        total = sum(bytes_ for _, _, bytes_ in held)
        in_use = 0
        for _, image_id, bytes_ in sorted(held):
            if total + size <= self.max_bytes:
                break
            if self._evict(image_id):
                total -= bytes_
            else:
                in_use += bytes_
        return total, in_use

    def _evict(self, image_id: str) -> bool:
        """Remove an image nobody uses; False (and nothing changed) when one does."""
        fd = os.open(
            self.root / "locks" / f"{image_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            gone = Path(
                tempfile.mkdtemp(dir=self.root / "staging", prefix=f"evicted-{self._token}-")
            )
            os.rename(self.root / "images" / image_id, gone / "image")
            remove_tree(gone)
            self._counters.evicted += 1
            return True
        finally:
            os.close(fd)

    def _own(self) -> int:
        """This cache's owner lock (``locks/owner-<token>.lock``), held exclusive until the
        process ends: flocked before it is renamed into place, so that no sweep ever finds it
        free while its owner lives."""
        locks = self.root / "locks"
        fd, made = tempfile.mkstemp(dir=locks, prefix=".owner-")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(made, locks / f"owner-{self._token}.lock")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(made)
            raise
        os.set_inheritable(fd, False)
        return fd

    def _owner_alive(self, token: str) -> bool:
        """Whether the cache object that named its entries ``token`` still lives (holds its
        owner lock); a lock file that is gone is a dead owner's."""
        if token == self._token:
            return True
        try:
            fd = os.open(self.root / "locks" / f"owner-{token}.lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _sweep_staging(self) -> None:
        """Remove what a dead owner left in ``staging/`` (its partial trees, and the containers
        its exports made) and its owner lock; an entry of no known owner (an older trajcore's)
        once it is an hour old. A live owner's entries stay."""
        guard = os.open(self.root / "cache.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        exports: list[Path] = []
        try:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another server is admitting; it will not leave debris behind
            for left in (self.root / "staging").iterdir():
                kind, _, rest = left.name.partition("-")
                token = rest.partition("-")[0]
                if kind in _STAGED_KINDS and len(token) == len(self._token):
                    if self._owner_alive(token):
                        continue
                elif time.time() - left.stat().st_mtime <= 3600:
                    continue
                if kind == "export" and left.is_file():
                    exports.append(left)  # its container goes first, below
                    continue
                with contextlib.suppress(OSError):
                    remove_tree(left) if left.is_dir() else left.unlink()
            for owner in (self.root / "locks").glob("owner-*.lock"):
                token = owner.name.removeprefix("owner-").removesuffix(".lock")
                if not self._owner_alive(token):
                    with contextlib.suppress(OSError):
                        owner.unlink()
        finally:
            os.close(guard)
        # Outside cache.lock (no other server's admission waits on an engine), each record
        # kept until its container is known gone: an engine that cannot be run or does not
        # answer leaves it, and the ones after it, to the next open.
        for record in exports:
            if not remove_container(record, min(self.engine_timeout_s, _SWEEP_ENGINE_S)):
                break
            with contextlib.suppress(OSError):
                record.unlink()

    def _entry(
        self, ref: EnvironmentRef, image_id: str, *, hit: bool, started: float
    ) -> CachedImage:
        """The held image ``image_id``, marked as used now (least recently used leaves first)."""
        meta_path = self.root / "images" / image_id / "image.json"
        with contextlib.suppress(OSError):
            os.utime(meta_path)
        meta = json.loads(meta_path.read_text())
        return CachedImage(
            ref=str(ref),
            image_id=image_id,
            rootfs=meta_path.parent / "rootfs",
            bytes=int(meta["bytes"]),
            entries=int(meta["entries"]),
            hit=hit,
            seconds=time.monotonic() - started,
            architecture=str(meta.get("architecture", "")),
            env=tuple(str(entry) for entry in meta.get("env", ())),
            working_dir=str(meta.get("working_dir", "")),
            user=str(meta.get("user", "")),
        )
