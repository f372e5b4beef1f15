"""Sandbox policy: what a slot's sandbox may do, and the bubblewrap command line that enforces it.

A slot server runs every slot's commands inside one bubblewrap (``bwrap``) sandbox per slot. This
module is the pure half of that: a frozen ``SandboxPolicy`` that the *server's configuration*
fills in (never the model: a model that writes ``allow_network`` or ``timeout`` into its call's
arguments changes nothing here), and ``bwrap_argv`` which turns the policy plus a few facts about
the host into the exact argument vector. Keeping the vector a pure function lets the tests state
its properties (no network namespace is ever missing when network is off, the workspace is the
only writable host path, capabilities are always dropped) without starting a process.

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
  (``trajcore.adapters.sandbox.exec_agent``).
- Timeouts: a call's limit is clamped into ``[min_timeout_s, max_timeout_s]``; a model-given figure
  may only shorten the env's limit, never lengthen it (``clamp_timeout``).
"""

from __future__ import annotations

import errno as _errno
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from trajcore.domain.errors import ConfigError

__all__ = [
    "DEFAULT_SYSTEM_PATHS",
    "KEEPER_CAPABILITIES",
    "MASKED_PATHS",
    "READ_ONLY_PATHS",
    "SECCOMP_RULES",
    "Bind",
    "SandboxPolicy",
    "SyscallRule",
    "bwrap_argv",
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


def _absolute(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value.startswith("/") or "\0" in value:
        raise ConfigError(attribute.name, f"{value!r} is not an absolute path")
    if any(part == ".." for part in value.split("/")):
        raise ConfigError(attribute.name, f"{value!r} must not contain '..'")


def _positive(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(attribute.name, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(attribute.name, f"must be a positive finite number, got {value!r}")


def _optional_positive_int(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(attribute.name, f"must be a positive integer or None, got {value!r}")


def _positive_int(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(attribute.name, f"must be a positive integer, got {value!r}")


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
    writable: bool = False
    optional: bool = False


def _paths(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _binds(value: Sequence[Bind]) -> tuple[Bind, ...]:
    return tuple(value)


def _each_absolute(_: object, attribute: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    for i, path in enumerate(value):
        if not isinstance(path, str):
            raise ConfigError(f"{attribute.name}[{i}]", "expected a path string")
        if not path.startswith("/") or ".." in path.split("/"):
            raise ConfigError(f"{attribute.name}[{i}]", f"{path!r} is not an absolute path")


@attrs.frozen(kw_only=True)
class SandboxPolicy:
    """Everything a slot's sandbox may and may not do; set by the env or operator, never the model.

    Attributes:
        allow_network: Share the host's network namespace (otherwise only a private loopback).
        require_sandbox: Refuse to run anything when bubblewrap is unusable (fail closed).
        read_only_root: Remount the sandbox's root read-only once it is assembled.
        workspace_path: Where the slot's workspace appears inside the sandbox.
        system_paths: Host directories bound read-only (missing ones are skipped).
        extra_binds: Further binds, in order, after the system paths.
        max_processes: Processes (and threads) a slot may hold at once.
        memory_bytes: Memory a slot may use (cgroup) or a process may map (rlimit).
        cpu_seconds: CPU seconds a process of the slot may use (rlimit), or ``None``.
        max_file_bytes: Largest file a process of the slot may write (rlimit), or ``None``.
        output_cap_bytes: Bytes kept per stream (stdout, stderr) of one call: head plus tail.
        file_cap_bytes: Largest file ``read_file`` returns and ``write_file`` accepts.
        min_timeout_s: Shortest limit a call gets.
        default_timeout_s: The limit when the request gives none.
        max_timeout_s: Longest limit a call gets.
    """

    allow_network: bool = False
    require_sandbox: bool = True
    read_only_root: bool = True
    workspace_path: str = attrs.field(default="/workspace", validator=_absolute)
    system_paths: tuple[str, ...] = attrs.field(
        default=DEFAULT_SYSTEM_PATHS, converter=_paths, validator=_each_absolute
    )
    extra_binds: tuple[Bind, ...] = attrs.field(default=(), converter=_binds)
    max_processes: int | None = attrs.field(default=256, validator=_optional_positive_int)
    memory_bytes: int | None = attrs.field(default=2 << 30, validator=_optional_positive_int)
    cpu_seconds: int | None = attrs.field(default=None, validator=_optional_positive_int)
    max_file_bytes: int | None = attrs.field(default=None, validator=_optional_positive_int)
    output_cap_bytes: int = attrs.field(default=64 << 10, validator=_positive_int)
    file_cap_bytes: int = attrs.field(default=10 << 20, validator=_positive_int)
    min_timeout_s: float = attrs.field(default=1.0, validator=_positive)
    default_timeout_s: float = attrs.field(default=120.0, validator=_positive)
    max_timeout_s: float = attrs.field(default=3600.0, validator=_positive)

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
    policy: SandboxPolicy, requested_s: float | None, model_s: object = None
) -> float:
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
    policy: SandboxPolicy,
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
    policy: SandboxPolicy, *, rebind: Sequence[str | Bind] = ()
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


# ------------------------------------------------------------------------------------ seccomp


@attrs.frozen
class SyscallRule:
    """One rule of every lease's seccomp filter: the system call ``name`` fails with ``errno``
    (when ``arg`` is given: only where ``(argument arg & mask) == value``). A name the host's
    architecture lacks is skipped when the filter is built.

    The filter allows everything no rule names (a deny list, as Flatpak's): a sandbox runs
    whatever a task needs, and the rules refuse what only an escape or a cross-lease attack
    needs.
    """

    name: str
    errno: int = _errno.EPERM
    arg: int | None = None
    mask: int = 0
    value: int = 0


_CLONE_NEWUSER = 0x10000000
# personality(2) flags that weaken the address space (ADDR_NO_RANDOMIZE, FDPIC_FUNCPTRS,
# MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT, READ_IMPLIES_EXEC, ADDR_LIMIT_32BIT, SHORT_INODE,
# WHOLE_SECONDS, STICKY_TIMEOUTS, ADDR_LIMIT_3GB); the execution domains stay free. The query
# value 0xffffffff has them all set, so it is refused too.
_PERSONALITY_FLAGS = tuple(1 << bit for bit in range(18, 28))
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_REFUSED = (
    # keyrings: nothing shared between leases or with whoever started the server
    "add_key", "keyctl", "request_key",
    # other processes' memory and descriptors (the lease agent's channel among them)
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # kernel attack surface no task needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "kexec_load", "kexec_file_load", "open_by_handle_at",
    "name_to_handle_at", "init_module", "finit_module", "delete_module", "create_module",
    "get_kernel_syms", "query_module", "lookup_dcookie", "nfsservctl", "uselib", "ustat",
    "sysfs", "_sysctl", "syslog", "vm86", "vm86old", "iopl", "ioperm", "swapon", "swapoff",
    "reboot", "acct", "quotactl", "quotactl_fd", "settimeofday", "stime", "clock_settime",
    "clock_adjtime", "adjtimex",
    # mounts and namespaces
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr", "setns",
)  # fmt: skip

# Every lease's seccomp filter (after Docker's default profile and Flatpak's deny list).
SECCOMP_RULES: tuple[SyscallRule, ...] = (
    *(SyscallRule(name) for name in _REFUSED),
    # no new user namespace (a nested one would hand back every capability)
    SyscallRule("unshare", arg=0, mask=_CLONE_NEWUSER, value=_CLONE_NEWUSER),
    SyscallRule("clone", arg=0, mask=_CLONE_NEWUSER, value=_CLONE_NEWUSER),
    # clone3's flags live in memory a filter cannot read: refused as absent, libc falls back
    SyscallRule("clone3", errno=_errno.ENOSYS),
    # no typing into the terminal of another session
    *(SyscallRule("ioctl", arg=1, mask=0xFFFFFFFF, value=cmd) for cmd in (_TIOCSTI, _TIOCLINUX)),
    *(SyscallRule("personality", arg=0, mask=flag, value=flag) for flag in _PERSONALITY_FLAGS),
)
