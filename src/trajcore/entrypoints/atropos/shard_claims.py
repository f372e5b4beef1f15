"""Env processes of one env on one host that would serve the same rows, refused at start.

K env processes of one env share its dataset by ``dataset_shard`` ``I/K`` (docs/deploy.md,
"Several env processes of one env"): each takes rows ``I``, ``I+K``, ... Two of them given the
same ``I/K``, or two ``K`` that differ (``0/2`` beside ``1/3`` both take row 4), would send the
trainer the same rows twice, and nothing else would notice. So a ``serve`` run with a
``dataset_shard`` claims its shard on the host before it waits on anything, and holds the claim
until it ends (``process`` and ``evaluate`` send the trainer no row and claim nothing):

- **One file per run of the env**: its name is a digest of the env's class name, the name it
  registers with the trainer under (``wandb_name``: one class may run as two envs of a run,
  each free to serve the same rows), the trainer's API (``rollout_server_url``), the
  ``dataset`` and its split, so two runs that differ in any of them never meet. It lies
  beside the host's slot uid reservations (``slot_uid_locks.lock_file()``'s folder,
  ``/run/trajcore`` by default) when run as root, else in ``$XDG_RUNTIME_DIR/trajcore`` (else
  ``$TMPDIR/trajcore-UID``), and is checked as they are.
- **Byte ``T(K-1) + I`` stands for shard ``I/K``** (``T(n) = n(n+1)/2``, so every ``K`` has its
  own ``K`` bytes, and the ``K`` s below and above it lie before and after them). A claim holds
  a read lock over every other ``K``'s bytes, then a write lock over its own byte: a second
  claim of the same shard meets the write lock; a claim with another ``K`` meets the first
  one's write lock with its read lock, or its write lock with the first one's read lock.
  Each is a ``ConfigError`` at ``dataset_shard`` saying which.
- The locks are open-file-description locks (``slot_uid_locks.reserve``): the kernel drops them
  however the process ends, so a killed process's shard is free for its restart at once. The
  last claim to end removes the file (under a write lock over all of it and byte ``T(MAX)``
  past it; a claim that finds its file gone or replaced after taking its locks takes them again
  in the new one). A claim first holds a read lock over that byte, so that a removal cannot
  start while it takes its locks, and one under way is not taken for a shard served: the claim
  takes its locks again a moment later. A killed last
  claim leaves its empty file, which the next claim of that run reuses and removes.
- A claim file that cannot be used (a folder of another user, no room) is warned about, naming
  why, and the run goes on unchecked. Processes on other hosts are not seen.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Protocol

from trajcore.adapters.slot_uid_locks import (
    SlotUidLockError,
    SlotUidReservation,
    SlotUidsHeld,
    lock_file,
    reserve,
)
from trajcore.domain.errors import ConfigError

__all__ = ["MAX_SHARDS", "ShardedRun", "claim_file", "claim_shard"]

log = logging.getLogger("trajcore.env")

MAX_SHARDS = 65536
"""The largest ``K`` a claim can stand for (its bytes, and the gate past them, end below 2**32)."""
_SPAN = MAX_SHARDS * (MAX_SHARDS + 1) // 2
"""The bytes of every shard of every ``K``."""
_TRIES = 5
"""How often a claim takes its locks again when the file was removed meanwhile."""
_REMOVAL_PAUSE_S = 0.01
"""How long a claim that met a removal under way waits before it takes its locks again (the
removal holds its lock over a ``stat`` and an ``unlink``)."""


class _Removing(Exception):
    """The last claim's end holds the whole file: it is being removed."""


class ShardedRun(Protocol):
    """The settings a claim reads (``AgentEnvConfig`` has them)."""

    @property
    def dataset(self) -> str | None: ...
    @property
    def dataset_split(self) -> str: ...
    @property
    def dataset_shard(self) -> str | None: ...
    @property
    def rollout_server_url(self) -> str: ...
    @property
    def wandb_name(self) -> str | None: ...


def claim_file(config: ShardedRun, env_name: str) -> Path:
    """The file the shards of this run of ``env_name`` are claimed in (module docstring)."""
    dataset = config.dataset or ""
    if dataset and Path(dataset).exists():
        dataset = str(Path(dataset).resolve())
    key = json.dumps([env_name, config.rollout_server_url, dataset, config.dataset_split])
    if config.wandb_name is not None:  # (files of runs without one keep their names)
        key = json.dumps([key, config.wandb_name])
    name = f"shards-{hashlib.sha256(key.encode()).hexdigest()[:24]}"
    if os.geteuid() == 0:
        return lock_file().parent / name
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime:
        return Path(runtime) / "trajcore" / name
    return Path(tempfile.gettempdir()) / f"trajcore-{os.geteuid()}" / name


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


@contextmanager
def claim_shard(config: ShardedRun, env_name: str) -> Iterator[None]:
    """Hold this process's ``dataset_shard`` on the host for the block (nothing when it has
    none).

    Raises:
        ConfigError: at ``dataset_shard``: not ``I/K`` with ``0 <= I < K <= MAX_SHARDS``, or
            another process of this run of the env serves the same shard, or shards of
            another ``K``.
    """
    shard = config.dataset_shard
    if shard is None:
        yield
        return
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count) <= MAX_SHARDS):
        raise ConfigError(
            "dataset_shard", f"expected I/K with 0 <= I < K <= {MAX_SHARDS}, got {shard!r}"
        )
    with ExitStack() as held:
        try:
            _claim(held, config, env_name, int(index), int(count))
        except SlotUidLockError as error:
            log.warning("dataset_shard %s: cannot check that no other process serves it: %s",
                        shard, error)  # fmt: skip
        yield


def _claim(held: ExitStack, config: ShardedRun, env_name: str, index: int, count: int) -> None:
    """Take the read locks over every other ``K``'s bytes, then the write lock over this
    shard's, in the file its path names now, each released by ``held``, and after them the file
    removed when no other claim holds it.

    Raises:
        ConfigError: the shard is taken, or shards of another ``K`` are served.
        SlotUidLockError: the file cannot be used, or was replaced ``_TRIES`` times.
    """
    path = claim_file(config, env_name)
    named = "" if config.wandb_name is None else f" {config.wandb_name!r}"
    where = f"{env_name}{named} against {config.rollout_server_url} on this host"
    removing = 0
    for _ in range(_TRIES):
        with ExitStack() as attempt:
            try:
                locks = _lock_shard(attempt, path, index=index, count=count, where=where)
            except _Removing:
                removing += 1
                time.sleep(_REMOVAL_PAUSE_S)
                continue
            if all(_current(lock, path) for lock in locks):
                held.callback(_remove_unheld, path)  # runs after the locks' releases
                held.push(attempt.pop_all())
                return
    why = f" ({removing} times it was being removed)" if removing else ""
    raise SlotUidLockError(f"{path} was removed or replaced {_TRIES} times while claiming{why}")


def _lock_shard(
    attempt: ExitStack, path: Path, *, index: int, count: int, where: str
) -> list[SlotUidReservation]:
    own = _triangle(count - 1)
    shard = f"{index}/{count}"
    locks: list[SlotUidReservation] = []
    try:  # the gate: no removal starts while this claim takes its locks (module docstring)
        locks.append(reserve(_SPAN, 1, path=path, shared=True))
        attempt.callback(locks[-1].release)
    except SlotUidsHeld:
        raise _Removing from None
    try:
        for first, length in ((0, own), (own + count, _SPAN - own - count)):
            if length > 0:
                locks.append(reserve(first, length, path=path, shared=True))
                attempt.callback(locks[-1].release)
    except SlotUidsHeld:
        raise ConfigError(
            "dataset_shard",
            f"{shard}: another process of {where} serves the dataset in shards of another K "
            "(their rows would overlap); give every process the same K",
        ) from None
    try:
        locks.append(reserve(own + index, 1, path=path))
        attempt.callback(locks[-1].release)
    except SlotUidsHeld:
        raise ConfigError(
            "dataset_shard",
            f"{shard}: another process of {where} serves this shard already; give each process "
            f"its own I (0 to {count - 1})",
        ) from None
    return locks


def _current(lock: SlotUidReservation, path: Path) -> bool:
    """Whether ``path`` still names the file ``lock`` holds (a last claim's end removes it)."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(lock.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _remove_unheld(path: Path) -> None:
    """Remove the claim file when no claim holds any of it: under a write lock over all of it,
    so that a claim taken in it meanwhile sees it gone (``_current``) and takes a new one."""
    try:
        whole = reserve(0, _SPAN + 1, path=path)  # every shard's byte, and the gate
    except (SlotUidsHeld, SlotUidLockError):
        return  # another claim holds some of it: the last one removes it
    try:
        if _current(whole, path):
            path.unlink(missing_ok=True)
    finally:
        whole.release()
