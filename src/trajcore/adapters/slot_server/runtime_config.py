"""How a slot server runs its slots: ``RuntimeConfig``, and the checks a host must pass for it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import attrs

from trajcore.adapters.slot_uid_locks import lock_file
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import (
    DEFAULT_SLOT_UID_BASE,
    SlotIsolation,
    check_slot_uid_range,
)
from trajcore.domain.validators import flag, non_negative_seconds, positive_int, positive_seconds

__all__ = ["RuntimeConfig", "check_config"]


def _paths(folders: Iterable[Path]) -> tuple[Path, ...]:
    return tuple(folders)


def _default_python() -> str:
    return os.path.realpath(sys.executable)


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """How a slot server runs its slots.

    Attributes:
        slots: How many slots (workspaces ``root/slots/0 .. slots-1``).
        root: The server's directory: workspaces and per-slot state live under it.
        isolation: The sandbox isolation every slot gets.
        bwrap: The bubblewrap executable.
        python: The interpreter every sandbox binds read-only (at its own path), for commands
            and verifiers that run Python in a slot.
        agent_grace_s: Extra time an agent gets past a call's limit before it counts as hung.
        start_timeout_s: How long a sandbox may take to become ready.
        reset_timeout_s: How long a reset may take before it counts as failed.
        dedup_per_slot: Results remembered per slot for ``call_id`` repeats.
        use_cgroups: Try per-slot cgroups before falling back to rlimits.
        slot_helper_path: The slot helper to run (keeper and agents) instead of the one that
            ships with the install or is built at start (``native_helper``); for a helper built
            elsewhere, and for tests. ``None``: find or build it, and refuse to start, naming
            what to install, when neither works.
        slot_uid_base: When the server runs as root, slot ``i``'s sandbox runs as host uid and
            gid ``slot_uid_base + i`` (``slot_ids``); a server that is not root runs every
            slot as itself.
        slot_uid_lock: The host's reservation file of slot uids (``slot_uid_locks``): a server
            run as root holds its range there for its life and refuses to start when another
            holds any of it. ``None``: reserve nothing (the pool that started this server
            holds the range).
        warm_leases: Start a slot's next lease as soon as a reset has cleaned it, so the next
            lease's first call does not wait for its namespaces (``Sandboxes.warm``). Off
            only to measure what it saves (``TRAJCORE_SLOT_WARM_LEASES=0`` for
            ``trajcore slot-server``) and in the tests' controls.
        image_cache: The host's image cache (``image_cache.ImageCache``), which lets a lease
            run over a task environment (``POST /v1/lease``); ``None``: leases run over the
            server's own root only, and a lease request naming an environment is refused.
        image_cache_bytes: The cache's size limit.
        environment_dirs: The folders a ``directory:`` environment's tree may come from (the
            folder itself or any folder below it, symlinks resolved); a dataset row is data
            and must not choose a host path, so any other tree is refused, and with none
            listed (the default) every ``directory:`` reference is. A lease runs over such a
            tree as over an image: its root-owned files are the slot's in the lease's
            idmapped view (its changes go to the lease's own layer), so list only folders
            that hold trees meant for leases. Refused at start: a folder that is ``/`` or
            holds (or lies in) the server's root or the image cache.
        snapshot_bytes: What this server's snapshots (``POST /v1/snapshot``, under
            ``root/snapshots``) may hold together; a snapshot past it is refused.
        disk_check_s: How often a live lease's writable area is measured against its disk
            budget (``SlotIsolation.disk_bytes``, ``disk_files``; ``disk_budget``) at most.
    """

    slots: int = attrs.field(validator=positive_int)
    root: Path
    isolation: SlotIsolation = attrs.field(factory=SlotIsolation)
    bwrap: str = "bwrap"
    python: str = attrs.field(factory=_default_python)
    agent_grace_s: float = attrs.field(default=5.0, validator=non_negative_seconds)
    start_timeout_s: float = attrs.field(default=10.0, validator=positive_seconds)
    reset_timeout_s: float = attrs.field(default=15.0, validator=positive_seconds)
    dedup_per_slot: int = attrs.field(default=4096, validator=positive_int)
    use_cgroups: bool = attrs.field(default=True, validator=flag)
    slot_helper_path: Path | None = None
    slot_uid_base: int = DEFAULT_SLOT_UID_BASE
    slot_uid_lock: Path | None = attrs.field(factory=lock_file)
    warm_leases: bool = attrs.field(default=True, validator=flag)
    image_cache: Path | None = None
    image_cache_bytes: int = attrs.field(default=32 << 30, validator=positive_int)
    environment_dirs: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    snapshot_bytes: int = attrs.field(default=16 << 30, validator=positive_int)
    disk_check_s: float = attrs.field(default=0.5, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        check_slot_uid_range("slot_uid_base", self.slot_uid_base, self.slots)


def check_config(config: RuntimeConfig) -> None:
    """Raise ``ConfigError`` when the config cannot work on this host (no Python, no helper at
    ``slot_helper_path``, bad root)."""
    if not os.access(config.python, os.X_OK):
        raise ConfigError("python", f"{config.python!r} is not executable")
    helper = config.slot_helper_path
    if helper is not None and not (helper.is_file() and os.access(helper, os.X_OK)):
        raise ConfigError("slot_helper_path", f"{str(helper)!r} is not an executable file")
    if config.image_cache is not None and not config.image_cache.is_absolute():
        raise ConfigError("image_cache", f"{str(config.image_cache)!r} is not an absolute path")
    if config.root.exists() and not config.root.is_dir():
        raise ConfigError("root", f"{config.root} is not a directory")
    _check_environment_dirs(config)


def _check_environment_dirs(config: RuntimeConfig) -> None:
    """Each listed folder is an absolute directory, not ``/``, apart from the server's root
    and the image cache (neither holds nor lies in the other); the image cache is set."""
    if config.environment_dirs and config.image_cache is None:
        raise ConfigError("environment_dirs", "directory: environments need an image_cache")
    own = {"root": config.root}  # the slots' workspaces, state and layers lie under it
    if config.image_cache is not None:
        own["image_cache"] = config.image_cache
    for folder in config.environment_dirs:
        if not folder.is_absolute() or not folder.is_dir():
            raise ConfigError("environment_dirs", f"{str(folder)!r} is not an absolute directory")
        real = Path(os.path.realpath(folder))
        if real == Path("/"):
            raise ConfigError("environment_dirs", f"{folder} is the host's root: list folders")
        for name, path in own.items():
            mine = Path(os.path.realpath(path))
            if real == mine or real in mine.parents or mine in real.parents:
                raise ConfigError(
                    "environment_dirs",
                    f"{folder} holds or lies in the server's {name} ({path}), which a lease "
                    "must never see",
                )
