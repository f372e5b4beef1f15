"""Every lease's seccomp filter, compiled once per slot server with the host's libseccomp.

The rules are data (``trajcore.domain.seccomp_rules``); this module turns them
into classic BPF with libseccomp (``libseccomp.so.2``, in every Debian-based image), called
through ``ctypes``: ``seccomp_init`` with ``SCMP_ACT_ALLOW``, one ``seccomp_rule_add_array``
per rule, ``seccomp_export_bpf`` into a memfd. The bytes are an array of ``struct
sock_filter`` (8 bytes each) that a lease's agent installs on itself with
``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)`` as the last step of its setup: the compiled
helper and the Python agent install the very same bytes.

Rules it keeps:

- The filter is for the host's own architecture only: a system call made through another ABI
  (32-bit x86 on x86-64, x32) kills the process (``SCMP_FLTATR_ACT_BADARCH``).
- A rule naming a system call the architecture does not have is skipped; a rule libseccomp
  refuses is an error (``SeccompUnavailable``), never a filter with a hole.
- Without libseccomp there is no filter: ``SeccompUnavailable`` names why, and the runtime
  reports it (and fails closed with ``require_sandbox``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence

from trajcore.domain.seccomp_rules import SyscallRule

__all__ = ["SeccompUnavailable", "compile_filter"]

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_FLTATR_ACT_BADARCH = 2
# libseccomp's comparisons, by the name a ``SyscallRule`` gives them
_SCMP_CMP = {"ge": 5, "masked_eq": 7}
_NR_SCMP_ERROR = -1


class SeccompUnavailable(Exception):
    """No seccomp filter can be built on this host; the message says why."""


class _ArgCmp(ctypes.Structure):
    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        library = ctypes.CDLL(name, use_errno=True)
    except OSError as error:
        raise SeccompUnavailable(f"libseccomp is not installed ({error})") from None
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = (ctypes.c_uint32,)
    library.seccomp_release.argtypes = (ctypes.c_void_p,)
    library.seccomp_attr_set.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
    library.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    library.seccomp_rule_add_array.argtypes = (
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    )  # fmt: skip
    library.seccomp_export_bpf.argtypes = (ctypes.c_void_p, ctypes.c_int)
    return library


def compile_filter(rules: Sequence[SyscallRule]) -> bytes:
    """The classic BPF program (``struct sock_filter`` array) for ``rules`` on this host's
    architecture. Raises ``SeccompUnavailable``."""
    library = _library()
    context = library.seccomp_init(_SCMP_ACT_ALLOW)
    if not context:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        status = library.seccomp_attr_set(context, _SCMP_FLTATR_ACT_BADARCH, _SCMP_ACT_KILL_PROCESS)
        if status != 0:
            raise SeccompUnavailable(f"seccomp_attr_set failed: {os.strerror(-status)}")
        for rule in rules:
            number = library.seccomp_syscall_resolve_name(rule.name.encode())
            if number == _NR_SCMP_ERROR:
                continue  # not a system call of this architecture
            action = 0x00050000 | (rule.errno & 0xFFFF)  # SCMP_ACT_ERRNO(errno)
            count = 0 if rule.arg is None else 1
            compare = (_ArgCmp * 1)()
            if rule.arg is not None:
                if rule.op == "ge":
                    compare[0] = _ArgCmp(rule.arg, _SCMP_CMP["ge"], rule.value, 0)
                else:
                    compare[0] = _ArgCmp(rule.arg, _SCMP_CMP["masked_eq"], rule.mask, rule.value)
            status = library.seccomp_rule_add_array(context, action, number, count, compare)
            if status != 0:
                raise SeccompUnavailable(
                    f"libseccomp refused the rule for {rule.name}: {os.strerror(-status)}"
                )
        memory = os.memfd_create("trajcore-seccomp", os.MFD_CLOEXEC)
        try:
            status = library.seccomp_export_bpf(context, memory)
            if status != 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-status)}")
            size = os.fstat(memory).st_size
            program = os.pread(memory, size, 0)
        finally:
            os.close(memory)
    finally:
        library.seccomp_release(context)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported {len(program)} bytes of BPF")
    return program
