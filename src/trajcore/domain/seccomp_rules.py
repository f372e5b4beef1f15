"""Every lease's seccomp filter, as data: which system calls fail, on which arguments, and how.

The adapter ``adapters/slot_server/seccomp.py`` compiles these rules with libseccomp once per slot
server; each lease installs the result as the last step of its setup. The filter allows what no
rule names (a deny list, as Flatpak's): a sandbox runs whatever a task needs (compilers,
interpreters, package managers), and the rules refuse what only an escape, a cross-lease attack
or a way around the slot's limits needs.

Rules this module keeps:

- ``SECCOMP_RULES`` is every lease's filter, after Docker's default profile and Flatpak's deny
  list, plus three things of trajcore's own: the socket families (``LEASE_SOCKET_FAMILIES``
  only: each stays inside the lease's own network namespace, or is the host's network that
  ``allow_network`` grants; vsock, packet sockets and every other family fail with
  ``EAFNOSUPPORT``), the scheduling policy (a lease never leaves ``SCHED_BATCH`` for a better
  policy: ``sched_setscheduler`` to any other policy than ``SCHED_BATCH`` or ``SCHED_IDLE``
  fails with ``EPERM``, ``sched_setattr``, whose policy lives in memory a filter cannot read,
  with ``ENOSYS``), and nothing else.
- ``UNCOUNTED_MEMORY_RULES`` are added where no cgroup counts a slot's memory: ``memfd_create``
  and ``memfd_secret`` fail with ``ENOSYS`` (as on a kernel without them, so callers fall back
  to a file in ``/dev/shm`` or ``/tmp``, which the lease's tmpfs budget bounds), since the pages
  of a memory file no process maps count against no rlimit.
- An argument is compared as the kernel reads it: a 32-bit ``int`` argument (a family, a
  policy) is matched on its low 32 bits (``mask=0xFFFFFFFF``), and an open-ended range
  (``op="ge"``) compares the whole register, so garbage in the upper bits is refused, never let
  through.
"""

from __future__ import annotations

import errno as _errno
from typing import Any

import attrs

from trajcore.domain.errors import ConfigError

__all__ = [
    "LEASE_SOCKET_FAMILIES",
    "SECCOMP_RULES",
    "UNCOUNTED_MEMORY_RULES",
    "SyscallRule",
]

_OPERATORS = ("masked_eq", "ge")


def _operator(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _OPERATORS:
        raise ConfigError(attribute.name, f"must be one of {', '.join(_OPERATORS)}, got {value!r}")


@attrs.frozen
class SyscallRule:
    """One rule of every lease's seccomp filter: the system call ``name`` fails with ``errno``;
    when ``arg`` is given, only where that argument matches: ``(argument & mask) == value``
    (``op="masked_eq"``) or ``argument >= value`` as an unsigned 64-bit number (``op="ge"``;
    ``mask`` unused). A name the host's architecture lacks is skipped when the filter is built.
    """

    name: str
    errno: int = _errno.EPERM
    arg: int | None = None
    mask: int = 0
    value: int = 0
    op: str = attrs.field(default="masked_eq", validator=_operator)


_INT = 0xFFFFFFFF  # a 32-bit argument: the kernel ignores the register's upper half
_CLONE_NEWUSER = 0x10000000
# personality(2) flags that weaken the address space (ADDR_NO_RANDOMIZE, FDPIC_FUNCPTRS,
# MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT, READ_IMPLIES_EXEC, ADDR_LIMIT_32BIT, SHORT_INODE,
# WHOLE_SECONDS, STICKY_TIMEOUTS, ADDR_LIMIT_3GB); the execution domains stay free. The query
# value 0xffffffff has them all set, so it is refused too.
_PERSONALITY_FLAGS = tuple(1 << bit for bit in range(18, 28))
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

# AF_UNIX, AF_INET, AF_INET6, AF_NETLINK: Unix sockets (abstract names belong to the network
# namespace, paths to the lease's own mounts), IP on the lease's own loopback (or the host's
# network with ``allow_network``), and netlink of the lease's network namespace (its routes,
# its interfaces). Every other family (AF_VSOCK, which no namespace confines and which reaches
# the hypervisor on a VM host; AF_PACKET; AF_ALG; AF_XDP; ...) fails with EAFNOSUPPORT.
LEASE_SOCKET_FAMILIES: tuple[int, ...] = (1, 2, 10, 16)
_FIRST_UNLISTED_FAMILY = max(LEASE_SOCKET_FAMILIES) + 1

# sched_setscheduler(2) policies a lease may not take: SCHED_OTHER, SCHED_FIFO, SCHED_RR, 4 (never
# used), SCHED_DEADLINE, SCHED_EXT. Values from 8 up are refused by one range rule: a future
# policy, and any policy with SCHED_RESET_ON_FORK (0x40000000), a flag only real-time policies
# need. What is left is SCHED_BATCH (3) and SCHED_IDLE (5).
_BETTER_POLICIES = (0, 1, 2, 4, 6, 7)
_FIRST_UNKNOWN_POLICY = 8

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


def _socket_rules() -> tuple[SyscallRule, ...]:
    refused = [f for f in range(_FIRST_UNLISTED_FAMILY) if f not in LEASE_SOCKET_FAMILIES]
    return tuple(
        rule
        for name in ("socket", "socketpair")
        for rule in (
            *(SyscallRule(name, _errno.EAFNOSUPPORT, 0, _INT, family) for family in refused),
            SyscallRule(name, _errno.EAFNOSUPPORT, 0, value=_FIRST_UNLISTED_FAMILY, op="ge"),
        )
    )


def _scheduling_rules() -> tuple[SyscallRule, ...]:
    return (
        *(SyscallRule("sched_setscheduler", arg=1, mask=_INT, value=p) for p in _BETTER_POLICIES),
        SyscallRule("sched_setscheduler", arg=1, value=_FIRST_UNKNOWN_POLICY, op="ge"),
        SyscallRule("sched_setattr", errno=_errno.ENOSYS),
    )


SECCOMP_RULES: tuple[SyscallRule, ...] = (
    *(SyscallRule(name) for name in _REFUSED),
    # no new user namespace (a nested one would hand back every capability)
    SyscallRule("unshare", arg=0, mask=_CLONE_NEWUSER, value=_CLONE_NEWUSER),
    SyscallRule("clone", arg=0, mask=_CLONE_NEWUSER, value=_CLONE_NEWUSER),
    # clone3's flags live in memory a filter cannot read: refused as absent, libc falls back
    SyscallRule("clone3", errno=_errno.ENOSYS),
    # no typing into the terminal of another session
    *(SyscallRule("ioctl", arg=1, mask=_INT, value=cmd) for cmd in (_TIOCSTI, _TIOCLINUX)),
    *(SyscallRule("personality", arg=0, mask=flag, value=flag) for flag in _PERSONALITY_FLAGS),
    *_socket_rules(),
    *_scheduling_rules(),
)
"""Every lease's seccomp filter."""

UNCOUNTED_MEMORY_RULES: tuple[SyscallRule, ...] = (
    SyscallRule("memfd_create", errno=_errno.ENOSYS),
    SyscallRule("memfd_secret", errno=_errno.ENOSYS),
)
"""Added to ``SECCOMP_RULES`` where no cgroup counts the slot's memory."""
