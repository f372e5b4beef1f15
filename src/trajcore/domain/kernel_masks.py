"""The kernel interfaces every lease hides or makes read-only, as OCI runtimes do (runc's
masked and read-only paths).

A lease mounts a fresh ``/proc`` in its own pid namespace; these lists say what it then covers.
They are data: the slot helper carries them out (``adapters/slot_server/sandboxes.py`` hands them
over), and the security tests check each from inside a lease. A path the kernel does not have is
skipped. What a lease may not call is the other half, ``seccomp_rules``.
"""

from __future__ import annotations

__all__ = ["MASKED_PATHS", "READ_ONLY_PATHS"]

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
