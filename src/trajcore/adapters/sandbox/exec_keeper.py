"""The keeper: a sandboxed slot's first program, which starts and ends its leases.

``exec_agent``'s docstring is the reference for the keeper's protocol and what each lease gets
(``slot_helper.c`` is the same keeper compiled). This module holds the keeper's side: the few
system calls Python's ``os`` lacks (``_Libc``), the lease's namespaces, mounts, capabilities and
seccomp filter (``_lease_main``), and the request loop (``keep``).

It travels inside the sandbox as one program with ``exec_agent`` (its code first, then that
module's; ``sandboxes.AGENT_SOURCE``), since the sandbox has neither module to import: the
names it takes from ``exec_agent`` are imported only when the slot server imports this module.
"""

from __future__ import annotations

import posix
import sys

if __name__ != "__main__":  # imported by the server; in the sandbox's program they are defined
    from trajcore.adapters.sandbox.exec_agent import (
        _SIGKILL,
        _apply_limits,
        _exists,
        _json,
        _make_dirs,
        _send,
        _which,
        batch_scheduling,
        name_process,
        serve,
    )

__all__ = ["keep"]

# Linux constants (the same on every architecture trajcore runs on).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_SIGCHLD = 17
# clone(2)'s number where the agent runs (Python's ``os`` has no clone).
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
# Flags a read-only remount must repeat (nosuid, nodev, noexec and the atime flags).
_MS_KEPT = 0x2 | 0x4 | 0x8 | 0x400 | 0x800 | 0x1000
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_SET_NAME = 15
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_KEYCTL_JOIN_SESSION_KEYRING = 1
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
# keyctl(2)'s number where the agent runs
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_LEASE_FD = 3
_DEV_SHM = "/dev/shm"  # noqa: S108 - the lease's own shared-memory mount, made fresh per lease
_FD_LIMIT = 1 << 16


class _Libc:
    """The few system calls Python 3.11's ``os`` lacks, each raising ``OSError`` on failure."""

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            number = self._ctypes.get_errno()
            raise OSError(number, f"{what}: {posix.strerror(number)}")

    def unshare(self, flags: int) -> None:
        self._check(self._libc.unshare(flags), "unshare")

    def mount(
        self, source: str | None, target: str, kind: str | None, flags: int, data: str | None
    ) -> None:
        def raw(text: str | None) -> bytes | None:
            return None if text is None else text.encode()

        self._check(
            self._libc.mount(raw(source), raw(target), raw(kind), flags, raw(data)),
            f"mount {target}",
        )

    def clone_pid_namespace(self) -> int:
        """``fork`` into a new pid namespace: 0 in the child, its pid in the parent. Only for a
        process with one thread (the keeper): Python's own fork hooks do not run."""
        number = _SYS_CLONE.get(posix.uname().machine)
        if number is None:
            raise OSError(38, f"clone: no syscall number for {posix.uname().machine}")
        c_long = self._ctypes.c_long
        pid = int(
            self._libc.syscall(c_long(number), c_long(_CLONE_NEWPID | _SIGCHLD), c_long(0),
                               c_long(0), c_long(0), c_long(0))
        )  # fmt: skip
        if pid < 0:
            number = self._ctypes.get_errno()
            raise OSError(number, f"clone: {posix.strerror(number)}")
        return pid

    def prctl(self, option: int, value: int, what: str) -> None:
        self._check(self._libc.prctl(option, value, 0, 0, 0), what)

    def set_name(self, name: str) -> None:
        """This process's name (``ps``), without ``/proc``: a process that is not dumpable
        cannot open its own ``/proc/self/comm``."""
        self._check(self._libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0), "set name")

    def join_session_keyring(self) -> None:
        """A new, empty session keyring for this process (nothing inherited)."""
        number = _SYS_KEYCTL.get(posix.uname().machine)
        if number is None:
            raise OSError(38, f"keyctl: no syscall number for {posix.uname().machine}")
        c_long = self._ctypes.c_long
        if self._libc.syscall(c_long(number), c_long(_KEYCTL_JOIN_SESSION_KEYRING), c_long(0)) < 0:
            error = self._ctypes.get_errno()
            if error != 38:  # ENOSYS: a kernel without keyrings has none to inherit
                raise OSError(error, f"keyctl: {posix.strerror(error)}")

    def loopback_up(self) -> None:
        """Bring up ``lo`` in this process's (new) network namespace."""
        import _socket
        import fcntl

        probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        try:
            request = b"lo".ljust(16, b"\0") + _IFF_UP_LOOPBACK_RUNNING.to_bytes(2, sys.byteorder)
            fcntl.ioctl(probe.fileno(), _SIOCSIFFLAGS, request.ljust(40, b"\0"))
        finally:
            probe.close()

    def install_filter(self, program: bytes) -> None:
        """Install the seccomp filter ``program`` (``struct sock_filter`` array) on this
        process and all it starts; ``no_new_privs`` must be set."""
        ctypes = self._ctypes
        instructions = ctypes.create_string_buffer(program, len(program))
        # struct sock_fprog: an unsigned short count, padded to a pointer, then the pointer
        pointer = ctypes.sizeof(ctypes.c_void_p)
        fprog = ctypes.create_string_buffer(
            (len(program) // 8).to_bytes(pointer, sys.byteorder)
            + ctypes.addressof(instructions).to_bytes(pointer, sys.byteorder),
            2 * pointer,
        )
        self._check(self._libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0), "seccomp")

    def clear_capabilities(self) -> None:
        ctypes = self._ctypes
        header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        self._check(self._libc.capset(header, data), "capset")


def _read_only_remount(path: str) -> int:
    """The ``mount`` flags that remount ``path``'s bind mount read-only, keeping its other flags."""
    return _MS_REMOUNT | _MS_BIND | _MS_RDONLY | (posix.statvfs(path).f_flag & _MS_KEPT)


class _Plan:
    """What every lease of a keeper mounts, worked out once by the keeper so that a lease's
    first process (a fresh fork) runs as little Python as it can."""

    def __init__(self, config: dict[str, object]) -> None:
        self.tmp = str(config["tmp"])
        carry = config["carry"]
        assert isinstance(carry, list)
        # (path, its read-only remount flags or None when it stays writable)
        self.carried = [
            (str(path), None if writable is True else _read_only_remount(str(path)))
            for path, writable in carry
        ]
        self.dev_shm = _exists(_DEV_SHM)
        options = config.get("tmpfs")  # the tmpfs's size and inodes, or None: the defaults
        self.tmpfs = "mode=0700" + (f",{options}" if isinstance(options, str) else "")
        self.dev_read_only = _read_only_remount("/dev")
        self.own_network = config.get("own_network") is True
        program = config.get("seccomp")  # hex text
        self.filter = bytes.fromhex(program) if isinstance(program, str) else None
        # (path, how): "file" or "dir" to mask, "ro" to make read-only; absent ones left out
        self.kernel: list[tuple[str, str]] = []
        for key, masked in (("masked", True), ("read_only", False)):
            paths = config.get(key, [])
            assert isinstance(paths, list)
            for path in paths:
                try:
                    mode = posix.stat(str(path)).st_mode
                except OSError:
                    continue  # this kernel has no such interface
                kind = "dir" if mode & 0o170000 == 0o040000 else "file"
                self.kernel.append((str(path), kind if masked else "ro"))


def _cover_kernel(libc: _Libc, plan: _Plan) -> None:
    """Mask the fresh /proc's kernel interfaces, or make them read-only (the host's sysctls
    too): ``sandbox_policy.MASKED_PATHS`` and ``READ_ONLY_PATHS``."""
    locked = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    for path, how in plan.kernel:
        if how == "file":
            libc.mount("/dev/null", path, None, _MS_BIND, None)
        elif how == "dir":
            libc.mount("tmpfs", path, "tmpfs", _MS_RDONLY | locked, "size=0,mode=0555")
        else:
            libc.mount(path, path, None, _MS_BIND | _MS_REC, None)
            libc.mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | locked, None)


def _scratch(libc: _Libc, plan: _Plan) -> None:
    """Mount the lease's ``/tmp`` and ``/dev/shm``: two folders of one fresh tmpfs, so that
    one size bounds what both hold together. The tmpfs is mounted at ``/tmp``, each folder bound
    where it belongs, ``/tmp``'s over the tmpfs's own root, which no lease sees again."""
    libc.mount("tmpfs", plan.tmp, "tmpfs", _MS_NOSUID | _MS_NODEV, plan.tmpfs)
    folders = [(plan.tmp + "/shm", _DEV_SHM)] if plan.dev_shm else []
    folders.append(("/".join((plan.tmp, "tmp")), plan.tmp))  # last: it covers the others' source
    for folder, target in folders:
        posix.mkdir(folder, 0o700)
        posix.chmod(folder, 0o1777)
        libc.mount(folder, target, None, _MS_BIND, None)


def _refuse(channel: int, error: BaseException) -> None:
    """Tell the slot server why a lease could not start, and exit; never returns."""
    try:  # noqa: SIM105 - contextlib would cost an import here
        _send(channel, {"ready": False, "error": f"lease setup failed: {error!r}"})
    except OSError:
        pass
    posix._exit(126)


def _lease_main(libc: _Libc, channel: int, config: dict[str, object], plan: _Plan) -> None:
    """Become a lease's first process (pid 1 of its new pid namespace) and serve it; never
    returns. Runs with the keeper's capabilities until it drops them all, before it reads a
    single request."""
    reply_to = channel
    try:
        if plan.own_network:
            libc.loopback_up()
        # a session keyring of its own (the filter then refuses every keyring call)
        libc.join_session_keyring()
        libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
        libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        _cover_kernel(libc, plan)
        # The carried paths, held open before the fresh tmpfs hides them: descriptors opened
        # here, in the lease's own mount namespace (a bind from another namespace's mount is
        # refused).
        held = [posix.open(path, posix.O_PATH | posix.O_CLOEXEC) for path, _ in plan.carried]
        _scratch(libc, plan)
        for (path, read_only), fd in zip(plan.carried, held, strict=True):
            _make_dirs(path)
            libc.mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            if read_only is not None:
                libc.mount(None, path, None, read_only, None)
            posix.close(fd)
        libc.mount(None, "/dev", None, plan.dev_read_only, None)
        # The bounding set is empty already (the keeper emptied its own): what is left is
        # the keeper's ambient, permitted and effective sets.
        try:  # noqa: SIM105 - contextlib would cost an import here
            libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "clear ambient capabilities")
        except OSError:
            pass  # a kernel without ambient capabilities has none to clear
        libc.clear_capabilities()
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
        # no one of the lease (same uid) may read its memory or take its channel via /proc
        libc.prctl(_PR_SET_DUMPABLE, 0, "dumpable")
        # the channel first: a descriptor below 3 would be overwritten by /dev/null
        if channel != _LEASE_FD:  # dup3 refuses a descriptor onto itself
            posix.dup2(channel, _LEASE_FD, inheritable=False)
        posix.set_inheritable(_LEASE_FD, False)
        reply_to = _LEASE_FD
        null = posix.open("/dev/null", posix.O_RDWR | posix.O_CLOEXEC)
        for target in (0, 1, 2):
            posix.dup2(null, target)
        posix.closerange(_LEASE_FD + 1, _FD_LIMIT)
        libc.set_name("slot-lease")
        _apply_limits(config)
        # the last step of the setup: the seccomp filter
        if plan.filter is not None:
            libc.install_filter(plan.filter)
    except BaseException as error:  # noqa: BLE001 - reported to the slot server, then exit
        _refuse(reply_to, error)
    status = 1
    try:
        status = serve({**config, "limits": {}}, _LEASE_FD, _LEASE_FD)
    finally:
        posix._exit(status)


def _begin_lease(libc: _Libc, channel: int, config: dict[str, object], plan: _Plan) -> int:
    """Start a lease: fork its first process straight into a new pid namespace (``clone`` with
    ``CLONE_NEWPID``; the keeper's own namespaces never change, since an unprivileged sandbox may
    not ``setns`` back into its pid namespace), which then enters new mount, ipc and uts
    namespaces. Returns that process's pid as the keeper sees it."""
    first = libc.clone_pid_namespace()
    if first == 0:
        try:
            own = _CLONE_NEWNET if plan.own_network else 0
            libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS | own)
        except BaseException as error:  # noqa: BLE001 - reported on the channel, then exit
            _refuse(channel, error)
        _lease_main(libc, channel, config, plan)
    return first


def _end_lease(first: int) -> int:
    """Kill the lease's first process, and so its whole pid namespace, and reap it: as pid 1 of
    that namespace it is reapable only once the kernel has killed and reaped every other process
    of the lease. Returns its wait status."""
    try:  # noqa: SIM105 - contextlib would cost an import here
        posix.kill(first, _SIGKILL)
    except ProcessLookupError:
        pass
    return posix.waitpid(first, 0)[1]


def _prepare(libc: _Libc, config: dict[str, object]) -> _Plan:
    """The keeper's one-time work for all its leases: empty its bounding set, which every lease
    inherits (the keeper goes on using its effective capabilities: the bounding set only limits
    what an ``execve`` may grant, and the keeper never executes anything), plan the leases'
    mounts, and look tmux up."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as last:
        cap_last = int(last.read().strip())
    for capability in range(cap_last + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, "drop a bounding capability")
    config["tmux_path"] = _which("tmux")
    return _Plan(config)


def keep(config: dict[str, object]) -> int:
    """Run as a slot's keeper: the long-lived first program of the slot's sandbox, which starts
    a fresh lease in new namespaces on request. Reads requests from fd 0, a Unix
    ``SOCK_SEQPACKET`` socket (one op per packet, ``lease`` or ``end``; ``lease`` carries the
    lease's channel as an ``SCM_RIGHTS`` file descriptor) and answers one JSON packet each.
    End of input ends the current lease and the keeper. Returns the exit status."""
    import _socket  # the C half of ``socket``: the module proper pulls in many imports
    import fcntl  # noqa: F401 - loaded before a lease hides /tmp; the lease needs it
    import gc
    import resource  # noqa: F401 - loaded before a lease hides /tmp; the lease needs it

    libc = _Libc()
    plan = _prepare(libc, config)
    batch_scheduling()
    control = _socket.socket(fileno=0)
    room = _socket.CMSG_SPACE(4)  # one descriptor
    lease: int | None = None
    name_process("slot-keeper")
    libc.prctl(_PR_SET_DUMPABLE, 0, "dumpable")  # a lease (same uid) cannot reach the keeper
    gc.freeze()  # keeps forked leases from copying pages the collector would touch
    control.send(_json({"ready": True, "pid": posix.getpid()}).encode())
    while True:
        fds: list[int] = []
        try:
            message, ancillary, _, _ = control.recvmsg(1 << 16, room, _socket.MSG_CMSG_CLOEXEC)
        except OSError:
            message, ancillary = b"", []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                whole = len(data) - len(data) % 4
                fds += [int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, whole, 4)]
        if not message:
            if lease is not None:
                _end_lease(lease)
            return 0
        reply: dict[str, object]
        try:
            op = message.decode("utf-8", "replace")
            if op == "lease":
                if len(fds) != 1:
                    raise ValueError(f"a lease needs one channel, got {len(fds)} descriptors")
                if lease is not None:
                    _end_lease(lease)
                    lease = None
                lease = _begin_lease(libc, fds[0], config, plan)
                reply = {"lease": True, "pid": lease}
            elif op == "end":
                status = _end_lease(lease) if lease is not None else None
                lease = None
                reply = {"ended": True, "status": status}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as error:  # noqa: BLE001 - the keeper must answer every request
            reply = {"error": f"keeper failed: {type(error).__name__}: {error}"}
        finally:
            for fd in fds:
                posix.close(fd)
        control.send(_json(reply).encode("utf-8", "replace"))
