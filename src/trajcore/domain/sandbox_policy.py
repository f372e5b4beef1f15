"""The slot policy: what a slot server and its sandboxes may do, how it travels on the server's
command line, and the bubblewrap command line that enforces it.

A slot server runs every slot's commands inside one bubblewrap (``bwrap``) sandbox per slot. This
module is the pure half of that: a frozen ``SlotPolicy`` that the *server's configuration* fills
in (never the model: a model that writes ``allow_network`` or ``timeout`` into its call's
arguments changes nothing here), and ``bwrap_argv`` which turns the policy plus a few facts about
the host into the exact argument vector. Keeping the vector a pure function lets the tests state
its properties (no network namespace is ever missing when network is off, the workspace is the
only writable host path, capabilities are always dropped) without starting a process.

The policy is one value wherever it goes: the runtime reads it in process, the local pool and the
Nomad job pass it to ``trajcore slot-server`` as ``SlotPolicy.argv()``, and the server's parser
is built from the same fields (``POLICY_FLAGS``), so a flag cannot mean one thing to a pool and
another to the server. Memory is in bytes everywhere.

Rules this module keeps:

- New user, pid, ipc and uts namespaces always; a new network namespace unless
  ``allow_network``; a new cgroup namespace where the kernel has one (``--unshare-cgroup-try``).
- The root is bubblewrap's own tmpfs holding read-only binds of the system directories, then
  remounted read-only; the host's root is never bound whole, so ``/root``, ``/home`` and the other
  slots' workspaces are simply absent. Host top-level paths that are symlinks (``/bin -> usr/bin``)
  are recreated as symlinks, not bound.
- The slot's workspace is the only host path bound read-write, at ``workspace_path``; ``/tmp`` is
  a private tmpfs, and anything the agent needs that lives under ``/tmp`` on the host (a virtual
  environment, say) is bound back read-only *after* the tmpfs, or it would be hidden.
- ``--die-with-parent`` (the sandbox cannot outlive its slot server), ``--new-session`` (no
  terminal injection), ``--cap-drop ALL``, ``--chdir`` into the workspace. The only capabilities
  ever kept are ``KEEPER_CAPABILITIES``, and only when the caller asks for them: the slot's
  keeper needs them, inside the sandbox's own user namespace, to give every lease new pid,
  mount, ipc and uts namespaces; each lease drops every capability before it runs anything
  (the slot helper, ``trajcore/adapters/sandbox/slot_helper.c``).
- Every setting is checked when the value is built; a bad one is a ``ConfigError`` naming the
  field, so a pool never starts a server that would exit on its flags.
  ``min_timeout_s <= default_timeout_s <= max_timeout_s``.
- Timeouts: a call's limit is clamped into ``[min_timeout_s, max_timeout_s]``; a model-given figure
  may only shorten the env's limit, never lengthen it (``clamp_timeout``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError
from trajcore.domain.seccomp_rules import SECCOMP_RULES, SyscallRule

__all__ = [
    "DEFAULT_SLOT_UID_BASE",
    "DEFAULT_SYSTEM_PATHS",
    "KEEPER_CAPABILITIES",
    "MASKED_PATHS",
    "MAX_SLOT_UID",
    "MIN_SLOT_UID_BASE",
    "POLICY_FLAGS",
    "READ_ONLY_PATHS",
    "SECCOMP_RULES",
    "Bind",
    "PolicyFlag",
    "SlotPolicy",
    "SyscallRule",
    "bwrap_argv",
    "check_slot_uid_range",
    "clamp_timeout",
    "private_tmp_binds",
]

# The sandbox's private /tmp: a path inside the sandbox, not the host's shared one.
SANDBOX_TMP = "/tmp"  # noqa: S108 - names the sandbox's own tmpfs, created fresh per slot

# What a slot's keeper keeps, within the sandbox's user namespace only: CAP_SYS_ADMIN to make a
# lease's namespaces and mounts, CAP_SETPCAP to empty its own bounding set (its leases inherit it),
# CAP_NET_ADMIN to bring up the loopback of a lease's own network namespace.
KEEPER_CAPABILITIES: tuple[str, ...] = ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_NET_ADMIN")

# Kernel interfaces every lease hides after it mounts its fresh /proc (runc's masked paths): a
# file gets /dev/null bound over it, a directory an empty read-only tmpfs; a path the kernel does
# not have is skipped.
MASKED_PATHS: tuple[str, ...] = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)

# Kernel interfaces every lease sees read-only (runc's read-only paths): bound onto themselves
# and remounted read-only, so no sysctl (the host's network ones included, with
# ``allow_network``) can be written whatever the file modes say.
READ_ONLY_PATHS: tuple[str, ...] = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)

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


# ------------------------------------------------------------------ the policy on a command line
#
# Every field of ``SlotPolicy`` carries its slot-server flag in its metadata: the flag's name,
# its help, and how its value is written as one word and read back. A field whose default is a
# bool is a switch: the flag's presence flips the default. ``SlotPolicy.argv`` writes the words;
# ``trajcore slot-server`` builds its parser from ``POLICY_FLAGS``; neither restates a field.

_FLAG = "trajcore.slot_server_flag"


@attrs.frozen
class _Codec:
    """How a value is written as one command-line word (``show``) and read back (``read``,
    raising ``ValueError`` on a malformed word; the field's validator judges the value)."""

    show: Callable[[Any], str]
    read: Callable[[str], Any]
    metavar: str


def _read_optional_int(word: str) -> int | None:
    return None if word == "none" else int(word)


def _show_optional_int(value: int | None) -> str:
    return "none" if value is None else str(value)


def _read_paths(word: str) -> tuple[str, ...]:
    value = json.loads(word)
    if not isinstance(value, list) or not all(isinstance(path, str) for path in value):
        msg = "expected a JSON list of paths"
        raise ValueError(msg)
    return tuple(value)


def _read_binds(word: str) -> tuple[Bind, ...]:
    value = json.loads(word)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        msg = "expected a JSON list of objects"
        raise ValueError(msg)
    try:
        return tuple(Bind(**item) for item in value)
    except (TypeError, ConfigError) as error:
        raise ValueError(str(error)) from None


def _show_binds(value: tuple[Bind, ...]) -> str:
    return json.dumps([attrs.asdict(bind) for bind in value], separators=(",", ":"))


_INT = _Codec(show=str, read=int, metavar="N")
_OPTIONAL_INT = _Codec(show=_show_optional_int, read=_read_optional_int, metavar="N|none")
_SECONDS = _Codec(show=lambda value: repr(float(value)), read=float, metavar="SECONDS")
_PATH = _Codec(show=str, read=str, metavar="PATH")
_PATHS = _Codec(
    show=lambda value: json.dumps(list(value), separators=(",", ":")),
    read=_read_paths,
    metavar="JSON",
)
_BINDS = _Codec(show=_show_binds, read=_read_binds, metavar="JSON")


def _flag(name: str, help_text: str, codec: _Codec | None = None) -> dict[str, Any]:
    return {_FLAG: (name, help_text, codec)}


def _switch(default: bool, name: str, help_text: str) -> bool:
    """A ``SlotPolicy`` field that is true or false; its flag means ``not default``."""
    return attrs.field(default=default, validator=validators.flag, metadata=_flag(name, help_text))


@attrs.frozen(kw_only=True)
class SlotPolicy:
    """Everything a slot server and its sandboxes may and may not do; the env's or the
    operator's, never the model's. The same value configures the server in process (the
    runtime), on its command line (``argv``) and in a Nomad job.

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
        max_file_bytes: Largest file a process of the slot may write (rlimit), or ``None``.
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

    allow_network: bool = _switch(False, "--allow-network", "share the host network")
    require_sandbox: bool = _switch(
        False, "--require-sandbox", "refuse every call when bwrap is unusable"
    )
    read_only_root: bool = _switch(True, "--writable-root", "leave the sandbox's root writable")
    workspace_path: str = attrs.field(
        default="/workspace",
        validator=_absolute,
        metadata=_flag("--workspace-path", "where a slot's workspace appears inside", _PATH),
    )
    system_paths: tuple[str, ...] = attrs.field(
        default=DEFAULT_SYSTEM_PATHS,
        converter=_paths,
        validator=_each_absolute,
        metadata=_flag("--system-paths", "host directories bound read-only", _PATHS),
    )
    extra_binds: tuple[Bind, ...] = attrs.field(
        default=(),
        converter=_binds,
        validator=_each_bind,
        metadata=_flag(
            "--extra-binds",
            'further binds: [{"source": ..., "dest": ..., "writable": ..., "optional": ...}]',
            _BINDS,
        ),
    )
    max_processes: int | None = attrs.field(
        default=256,
        validator=validators.optional_positive_int,
        metadata=_flag("--max-processes", "processes per slot", _OPTIONAL_INT),
    )
    memory_bytes: int | None = attrs.field(
        default=2 << 30,
        validator=validators.optional_positive_int,
        metadata=_flag("--memory-bytes", "memory per slot, in bytes", _OPTIONAL_INT),
    )
    cpu_seconds: int | None = attrs.field(
        default=None,
        validator=validators.optional_positive_int,
        metadata=_flag("--cpu-seconds", "CPU seconds per process", _OPTIONAL_INT),
    )
    max_file_bytes: int | None = attrs.field(
        default=None,
        validator=validators.optional_positive_int,
        metadata=_flag("--max-file-bytes", "largest file a process may write", _OPTIONAL_INT),
    )
    output_cap_bytes: int = attrs.field(
        default=64 << 10,
        validator=validators.positive_int,
        metadata=_flag("--output-cap-bytes", "bytes kept per stream of a call", _INT),
    )
    file_cap_bytes: int = attrs.field(
        default=10 << 20,
        validator=validators.positive_int,
        metadata=_flag("--file-cap-bytes", "largest file read or written by a call", _INT),
    )
    min_timeout_s: float = attrs.field(
        default=1.0,
        validator=validators.positive_seconds,
        metadata=_flag("--min-timeout-s", "shortest limit a call gets", _SECONDS),
    )
    default_timeout_s: float = attrs.field(
        default=120.0,
        validator=validators.positive_seconds,
        metadata=_flag("--default-timeout-s", "a call's limit when it gives none", _SECONDS),
    )
    max_timeout_s: float = attrs.field(
        default=3600.0,
        validator=validators.positive_seconds,
        metadata=_flag("--max-timeout-s", "longest limit a call gets", _SECONDS),
    )
    use_cgroups: bool = _switch(True, "--no-cgroups", "use rlimits only")
    bwrap: str = attrs.field(
        default="bwrap",
        validator=_executable,
        metadata=_flag("--bwrap", "bubblewrap executable", _PATH),
    )
    slot_uid_base: int = attrs.field(
        default=DEFAULT_SLOT_UID_BASE,
        validator=_slot_uid_base,
        metadata=_flag(
            "--slot-uid-base",
            "when run as root, slot i's sandbox runs as host uid/gid BASE+i; a server that is "
            "not root runs every slot as itself",
            _INT,
        ),
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

    def argv(self) -> list[str]:
        """The policy as ``trajcore slot-server`` flags, in field order.

        Every valued flag is one word, ``--name=value`` (a path may start with ``-``), and is
        always written, so a server whose defaults differ still gets this policy; a switch
        appears only when the field differs from its default. Floats are written by ``repr``,
        so they read back exactly.
        """
        words: list[str] = []
        for flag in POLICY_FLAGS:
            value = getattr(self, flag.field)
            if flag.codec is None:
                if value != flag.default:
                    words.append(flag.name)
            else:
                words.append(f"{flag.name}={flag.codec.show(value)}")
        return words


@attrs.frozen
class PolicyFlag:
    """One ``SlotPolicy`` field as a slot-server flag.

    Attributes:
        field: The field's name (the parser's ``dest``).
        name: The flag (``--memory-bytes``).
        help: What the flag does, for ``--help``.
        default: The field's default.
        codec: How the value is written and read; ``None`` for a switch, whose presence means
            the opposite of ``default``.
    """

    field: str
    name: str
    help: str
    default: object
    codec: _Codec | None

    @property
    def metavar(self) -> str | None:
        """The value's placeholder in ``--help`` (``None`` for a switch)."""
        return None if self.codec is None else self.codec.metavar

    def read(self, word: str) -> object:
        """The value a word on the command line stands for.

        Raises:
            ValueError: The word is malformed (not a number, not JSON), or this is a switch.
        """
        if self.codec is None:
            msg = f"{self.name} is a switch and takes no value"
            raise ValueError(msg)
        return self.codec.read(word)


def _policy_flags() -> tuple[PolicyFlag, ...]:
    flags = []
    for field in attrs.fields(SlotPolicy):
        name, help_text, codec = field.metadata[_FLAG]
        flags.append(PolicyFlag(field.name, name, help_text, field.default, codec))
    return tuple(flags)


POLICY_FLAGS: tuple[PolicyFlag, ...] = _policy_flags()
"""Every ``SlotPolicy`` field as its slot-server flag, in field order."""


def clamp_timeout(policy: SlotPolicy, requested_s: float | None, model_s: object = None) -> float:
    """The limit a call runs under.

    ``requested_s`` is the env's figure for the call (``None``: the policy's default). ``model_s``
    is whatever the model wrote as a timeout argument: honoured only when it is a positive finite
    number, and only to shorten the env's figure. The result always lies in
    ``[policy.min_timeout_s, policy.max_timeout_s]``. Never raises.
    """
    limit = policy.default_timeout_s
    if (
        requested_s is not None
        and not isinstance(requested_s, bool)
        and math.isfinite(requested_s)
        and requested_s > 0
    ):
        limit = float(requested_s)
    if (
        not isinstance(model_s, bool)
        and isinstance(model_s, int | float)
        and math.isfinite(model_s)
        and model_s > 0
    ):
        limit = min(limit, float(model_s))
    return min(max(limit, policy.min_timeout_s), policy.max_timeout_s)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def bwrap_argv(
    policy: SlotPolicy,
    *,
    workspace: str,
    command: Sequence[str],
    bwrap: str = "bwrap",
    host_symlinks: Mapping[str, str] | None = None,
    rebind: Sequence[str | Bind] = (),
    keep_capabilities: Sequence[str] = (),
) -> list[str]:
    """The full ``bwrap`` argument vector that runs ``command`` in a sandbox for one slot.

    Args:
        policy: The slot's policy.
        workspace: The slot's workspace on the host, bound read-write at ``policy.workspace_path``.
        command: The program (and its arguments) to start as the sandbox's first process.
        bwrap: The bubblewrap executable.
        host_symlinks: Which of ``policy.system_paths`` are symlinks on the host, and their
            targets; those are recreated with ``--symlink`` instead of bound.
        rebind: Host paths the command needs (the Python it runs on, say) that the system binds
            or the private ``/tmp`` would leave out; bound read-only at the same place. Paths
            already covered by a system bind and not under ``/tmp`` are skipped. A ``Bind``
            instead names a different host source (a staged copy) for its ``dest``; it is
            always bound, read-only.
        keep_capabilities: Capabilities the command keeps inside the sandbox's user namespace
            (``--cap-add`` after ``--cap-drop ALL``); only ``KEEPER_CAPABILITIES`` are accepted.

    Returns the vector, starting with ``bwrap`` and ending with ``command``.

    Raises:
        ConfigError: ``workspace`` is not absolute, ``command`` is empty, or a capability to keep
            is not one of ``KEEPER_CAPABILITIES``.
    """
    if not workspace.startswith("/"):
        raise ConfigError("workspace", f"{workspace!r} is not an absolute path")
    if not command:
        raise ConfigError("command", "must name a program")
    for capability in keep_capabilities:
        if capability not in KEEPER_CAPABILITIES:
            raise ConfigError(
                "keep_capabilities",
                f"{capability!r} is not one a keeper may keep ({', '.join(KEEPER_CAPABILITIES)})",
            )
    links = dict(host_symlinks or {})
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if not policy.allow_network:
        argv.append("--unshare-net")
    argv += ["--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for capability in keep_capabilities:
        argv += ["--cap-add", capability]
    argv += ["--hostname", "slot"]
    for path in policy.system_paths:
        if path in links:
            argv += ["--symlink", links[path], path]
        else:
            argv += ["--ro-bind-try", path, path]
    argv += ["--tmpfs", SANDBOX_TMP, "--proc", "/proc", "--dev", "/dev"]
    for wanted in rebind:
        if isinstance(wanted, Bind):
            argv += ["--ro-bind", wanted.source, wanted.dest]
            continue
        path = wanted
        covered = any(_under(path, p) for p in policy.system_paths if p not in links)
        if covered and not _under(path, SANDBOX_TMP):
            continue
        argv += ["--ro-bind", path, path]
    for bind in policy.extra_binds:
        flag = "--bind" if bind.writable else "--ro-bind"
        argv += [flag + ("-try" if bind.optional else ""), bind.source, bind.dest]
    argv += ["--bind", workspace, policy.workspace_path]
    if policy.read_only_root:
        argv += ["--remount-ro", "/"]
    argv += ["--chdir", policy.workspace_path, "--", *command]
    return argv


def private_tmp_binds(
    policy: SlotPolicy, *, rebind: Sequence[str | Bind] = ()
) -> list[tuple[str, bool]]:
    """The sandbox paths ``bwrap_argv`` (given the same ``rebind``) binds *under* the private
    ``/tmp``, in bind order, each with whether it is writable: a lease that mounts a fresh
    ``/tmp`` must bind these back as they were."""
    dests = [path.dest if isinstance(path, Bind) else path for path in rebind]
    found = [(path, False) for path in dests if _under(path, SANDBOX_TMP)]
    found += [
        (bind.dest, bind.writable) for bind in policy.extra_binds if _under(bind.dest, SANDBOX_TMP)
    ]
    if _under(policy.workspace_path, SANDBOX_TMP):
        found.append((policy.workspace_path, True))
    return found
