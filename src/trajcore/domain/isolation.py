"""The slot isolation: what a slot server and its sandboxes may do, as one frozen value.

A slot server runs every slot's commands inside one bubblewrap sandbox per slot. ``SlotIsolation``
is what the *server's configuration* fills in (never the model: a model that writes
``allow_network`` or ``timeout`` into its call's arguments changes nothing here). The isolation is
one value wherever it goes: the runtime reads it in process, and the pools and job
descriptions pass it to ``trajcore slot-server`` on its command line. Memory is in bytes
everywhere.

Where the isolation is carried out, each in its own module:

- ``slot_server_flags``: the isolation as ``trajcore slot-server`` flags (``isolation_argv``)
  and the table the server's parser is built from (``ISOLATION_FLAGS``);
- ``bwrap``: the bubblewrap argument vector of a slot's sandbox (``bwrap_argv``) and the
  capabilities only a slot's keeper may keep;
- ``kernel_masks`` and ``seccomp_rules``: what every lease hides, makes read-only and refuses.

Rules this module keeps:

- Every setting is checked when the value is built; a bad one is a ``ConfigError`` naming the
  field, so a pool never starts a server that would exit on its flags.
  ``min_timeout_s <= default_timeout_s <= max_timeout_s``; the workspace is never ``/``,
  ``/tmp``, ``/proc`` or ``/dev``.
- Timeouts: a call's limit is clamped into ``[min_timeout_s, max_timeout_s]``; a model-given figure
  may only shorten the env's limit, never lengthen it (``clamp_timeout``).
- Slot uids: a slot server run as root runs slot ``i`` as host uid and gid ``slot_uid_base + i``,
  a range checked by ``check_slot_uid_range``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError

__all__ = [
    "DEFAULT_SLOT_UID_BASE",
    "DEFAULT_SYSTEM_PATHS",
    "MAX_SLOT_UID",
    "MIN_SLOT_UID_BASE",
    "SANDBOX_TMP",
    "Bind",
    "SlotIsolation",
    "check_slot_uid_range",
    "clamp_timeout",
    "positive_seconds",
]

# The sandbox's private /tmp: a path inside the sandbox, not the host's shared one.
SANDBOX_TMP = "/tmp"  # noqa: S108 - names the sandbox's own tmpfs, created fresh per slot

DEFAULT_SYSTEM_PATHS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
)

# A slot server run as root runs slot ``i``'s sandbox as host uid and gid ``base + i``. The
# default lies far above ordinary accounts (1000..60000), the ``nobody`` ids (65534) and the
# subordinate id ranges that ``useradd`` hands out (100000 upwards, 65536 per user), and below
# 2**31 so that no tool reading a uid as a signed number sees a negative one.
DEFAULT_SLOT_UID_BASE = 1_900_000_000
MIN_SLOT_UID_BASE = 65536
MAX_SLOT_UID = (1 << 31) - 1


def check_slot_uid_range(field: str, base: object, count: int) -> None:
    """Raise ``ConfigError`` unless ``base .. base + count - 1`` are usable slot uids."""
    if isinstance(base, bool) or not isinstance(base, int):
        raise ConfigError(field, f"must be an integer, got {base!r}")
    if base < MIN_SLOT_UID_BASE:
        raise ConfigError(
            field, f"must be >= {MIN_SLOT_UID_BASE} (above ordinary accounts), got {base}"
        )
    if base + count - 1 > MAX_SLOT_UID:
        raise ConfigError(
            field, f"{base} + {count} slots runs past the largest slot uid {MAX_SLOT_UID}"
        )


def _absolute(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise ConfigError(attribute.name, f"{value!r} is not an absolute path")
    if any(part == ".." for part in value.split("/")):
        raise ConfigError(attribute.name, f"{value!r} must not contain '..'")


def _executable(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value or value != value.strip() or "\0" in value:
        raise ConfigError(attribute.name, f"must be a program name or path, got {value!r}")


def _slot_uid_base(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_slot_uid_range(attribute.name, value, 1)


@attrs.frozen(kw_only=True)
class Bind:
    """One extra host path made visible in the sandbox.

    Attributes:
        source: The host path.
        dest: Where it appears inside the sandbox.
        writable: Bound read-write (``--bind``) instead of read-only (``--ro-bind``).
        optional: Skipped silently when the host path is missing (``--*-try``).
    """

    source: str = attrs.field(validator=_absolute)
    dest: str = attrs.field(validator=_absolute)
    writable: bool = attrs.field(default=False, validator=validators.flag)
    optional: bool = attrs.field(default=False, validator=validators.flag)


def _paths(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _binds(value: Sequence[Bind]) -> tuple[Bind, ...]:
    return tuple(value)


def _each_absolute(_: object, attribute: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    for i, path in enumerate(value):
        if not isinstance(path, str):
            raise ConfigError(f"{attribute.name}[{i}]", "expected a path string")
        if not path.startswith("/") or ".." in path.split("/") or "\0" in path:
            raise ConfigError(f"{attribute.name}[{i}]", f"{path!r} is not an absolute path")


def _each_bind(_: object, attribute: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    for i, bind in enumerate(value):
        if not isinstance(bind, Bind):
            raise ConfigError(f"{attribute.name}[{i}]", f"expected a Bind, got {bind!r}")


def _switch(default: bool) -> bool:
    """A ``SlotIsolation`` field that is true or false."""
    return attrs.field(default=default, validator=validators.flag)


@attrs.frozen(kw_only=True)
class SlotIsolation:
    """Everything a slot server and its sandboxes may and may not do; the env's or the
    operator's, never the model's. The same value configures the server in process (the
    runtime), on its command line (``slot_server_flags.isolation_argv``) and in a Nomad job.

    Attributes:
        allow_network: Share the host's network namespace (otherwise only a private loopback).
        require_sandbox: Refuse to run anything when bubblewrap is unusable (fail closed);
            otherwise calls run unsandboxed and say so.
        read_only_root: Remount the sandbox's root read-only once it is assembled.
        workspace_path: Where the slot's workspace appears inside the sandbox.
        system_paths: Host directories bound read-only (missing ones are skipped).
        extra_binds: Further binds, in order, after the system paths.
        max_processes: Processes (and threads) a slot may hold at once, or ``None``.
        memory_bytes: Memory a slot may use (cgroup) or a process may map (rlimit), or ``None``.
        cpu_seconds: CPU seconds a process of the slot may use (rlimit), or ``None``.
        max_file_bytes: Largest file a process of the slot may write (rlimit; 1 GiB by default,
            so a runaway ``yes > out`` stops there instead of filling the host's disk), or
            ``None``.
        disk_bytes: Disk space one lease may fill in its writable area (its workspace, or its
            workspace's and root's writable layers over a task environment), counted in
            allocated blocks as ``du`` counts them; a lease past it is ended with a named
            failure and its space comes back at its reset. 10 GiB by default; ``None``: no
            budget.
        disk_files: Files (inodes: directories, links and the rest too) one lease may keep in
            the same area; 1,000,000 by default; ``None``: no budget.
        output_cap_bytes: Bytes kept per stream (stdout, stderr) of one call: head plus tail.
        file_cap_bytes: Largest file ``read_file`` returns and ``write_file`` accepts.
        min_timeout_s: Shortest limit a call gets.
        default_timeout_s: The limit when the request gives none.
        max_timeout_s: Longest limit a call gets.
        use_cgroups: Try per-slot cgroups for the limits before rlimits.
        bwrap: The bubblewrap executable, as the server's host names it.
        slot_uid_base: When the server runs as root, slot ``i`` runs as host uid and gid
            ``slot_uid_base + i`` (never as root); ignored by a server that is not root.
    """

    allow_network: bool = _switch(False)
    require_sandbox: bool = _switch(False)
    read_only_root: bool = _switch(True)
    workspace_path: str = attrs.field(
        default="/workspace",
        validator=_absolute,
    )
    system_paths: tuple[str, ...] = attrs.field(
        default=DEFAULT_SYSTEM_PATHS,
        converter=_paths,
        validator=_each_absolute,
    )
    extra_binds: tuple[Bind, ...] = attrs.field(
        default=(),
        converter=_binds,
        validator=_each_bind,
    )
    max_processes: int | None = attrs.field(
        default=256,
        validator=validators.optional_positive_int,
    )
    memory_bytes: int | None = attrs.field(
        default=2 << 30,
        validator=validators.optional_positive_int,
    )
    cpu_seconds: int | None = attrs.field(
        default=None,
        validator=validators.optional_positive_int,
    )
    max_file_bytes: int | None = attrs.field(
        default=1 << 30,
        validator=validators.optional_positive_int,
    )
    disk_bytes: int | None = attrs.field(
        default=10 << 30,
        validator=validators.optional_positive_int,
    )
    disk_files: int | None = attrs.field(
        default=1_000_000,
        validator=validators.optional_positive_int,
    )
    output_cap_bytes: int = attrs.field(
        default=64 << 10,
        validator=validators.positive_int,
    )
    file_cap_bytes: int = attrs.field(
        default=10 << 20,
        validator=validators.positive_int,
    )
    min_timeout_s: float = attrs.field(
        default=1.0,
        validator=validators.positive_seconds,
    )
    default_timeout_s: float = attrs.field(
        default=120.0,
        validator=validators.positive_seconds,
    )
    max_timeout_s: float = attrs.field(
        default=3600.0,
        validator=validators.positive_seconds,
    )
    use_cgroups: bool = _switch(True)
    bwrap: str = attrs.field(
        default="bwrap",
        validator=_executable,
    )
    slot_uid_base: int = attrs.field(
        default=DEFAULT_SLOT_UID_BASE,
        validator=_slot_uid_base,
    )

    def __attrs_post_init__(self) -> None:
        if self.workspace_path in ("/", SANDBOX_TMP, "/proc", "/dev"):
            raise ConfigError("workspace_path", f"{self.workspace_path!r} is reserved")
        if not self.min_timeout_s <= self.default_timeout_s <= self.max_timeout_s:
            raise ConfigError(
                "default_timeout_s",
                f"must lie in [min_timeout_s, max_timeout_s] = "
                f"[{self.min_timeout_s}, {self.max_timeout_s}], got {self.default_timeout_s}",
            )


def clamp_timeout(
    isolation: SlotIsolation, requested_s: float | None, model_s: object = None
) -> float:
    """The limit a call runs under.

    ``requested_s`` is the env's figure for the call (``None``: the isolation's default).
    ``model_s`` is whatever the model wrote as a timeout argument: honoured only when it is a
    positive finite number, and only to shorten the env's figure. The result always lies in
    ``[isolation.min_timeout_s, isolation.max_timeout_s]``. Never raises.
    """
    limit = isolation.default_timeout_s
    requested = positive_seconds(requested_s)
    if requested is not None:
        limit = requested
    model = positive_seconds(model_s)
    if model is not None:
        limit = min(limit, model)
    return min(max(limit, isolation.min_timeout_s), isolation.max_timeout_s)


def positive_seconds(value: object) -> float | None:
    """``value`` as seconds when it is a positive finite number (not a bool), else ``None``;
    an integer too large for a float is not finite. Never raises."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int past a float's range (10**400): not a finite number
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None
