"""The exec agent: the program inside a slot's sandbox that runs each call as a fork.

The slot server starts it with ``python -I -S`` in one of two roles, named by its config:

- **keeper** (``keep``; sandboxed slots): the first program of the slot's bubblewrap sandbox,
  kept for the server's life. It holds ``CAP_SYS_ADMIN``, ``CAP_SETPCAP`` and ``CAP_NET_ADMIN``
  inside the sandbox's own user namespace, is not dumpable, and uses them for one thing: on each
  ``lease`` request it clones the lease's agent into a new pid namespace (the child is that
  namespace's pid 1); the child enters new mount, ipc and uts namespaces (and a network namespace
  of its own, loopback up, when the config says ``own_network``), joins a fresh session keyring,
  mounts a fresh ``/proc`` (masking ``MASKED_PATHS`` and making
  ``READ_ONLY_PATHS`` read-only), ``/tmp`` and ``/dev/shm`` (binding back
  what the sandbox had bound under ``/tmp``), remounts ``/dev`` read-only, drops every capability
  (ambient, permitted, effective; ``no_new_privs``; its bounding set comes empty from the keeper,
  which emptied its own at start), makes itself not dumpable, sets its resource limits, installs
  the config's seccomp filter (classic BPF, ``adapters/sandbox/seccomp.py``) as its last step,
  and only then serves the lease on the socket it was handed.
  ``end`` kills that pid 1 and reaps it: the kernel lets it be reaped only after every other
  process of its namespace is gone. The keeper never reads anything a lease writes, and a lease
  cannot see the keeper (it is outside the lease's pid namespace) nor signal it.
- **bare agent** (``serve`` on fds 0/1; unsandboxed slots): one process per lease, as the lease
  agent but without namespaces.

The code travels with the command line (as a code object when the sandbox runs the server's own
interpreter, as source text otherwise), so it needs nothing from the host's file system but a
Python interpreter.

A lease agent inherits the keeper's loaded modules; a bare agent starts cold, so this module
imports at the top only what is built into the interpreter or already loaded when it starts
(``posix``, ``marshal``, ``time``, ``sys``; ``select`` and ``resource`` are small extension
modules, the latter imported only when there are limits to set). ``os``, ``json``, ``signal``,
``selectors``, ``shutil``, ``struct`` and ``contextlib`` would each cost milliseconds of imports
(``signal`` and ``json`` pull in ``enum`` and ``re``). The keeper alone imports ``ctypes`` (for
``unshare``, ``setns``, ``mount``, ``prctl`` and ``capset``, which Python 3.11's ``os`` lacks),
``_socket``, ``fcntl`` and ``gc``, once per slot.

``slot_helper.c`` is the same keeper and agent compiled, speaking the same protocols; a slot
server uses it when the host can build it, and this module otherwise.

Framing: every message, both ways, is a 4-byte big-endian length followed by that many bytes.
A request is a sequence of fields (``encode_request``), each a 4-byte big-endian length and its
UTF-8 bytes, the op first; numbers are decimal text. Responses are UTF-8 JSON, written by a small
encoder below, because the slot server must not trust bytes that come from inside the sandbox (a
command in the sandbox can reach the agent's channel through ``/proc``). The config (the first
command-line argument after the code) is ``marshal`` data in hex, from the slot server, which the
agent trusts. The agent first sends ``{"ready": true, "pid": ...}``; afterwards it answers each
request with exactly one response, in order, one request at a time (the slot server already runs
a slot's calls one after another). A request the agent cannot read is answered with an
``error``. End of input makes the agent exit; when a lease agent exits, its pid namespace ends
and every process of the lease dies with it.

Requests (the op, then its fields):

- ``exec TIMEOUT CAP ARGV0 [ARGV1 ...]``. The program runs via ``posix_spawn`` in a new session
  (so a new process group), stdin from ``/dev/null``, stdout and stderr through pipes read with
  ``poll``; of each stream the first and last ``cap/2`` bytes are kept and the bytes in between
  counted. On timeout the whole process group is killed. The answer carries the exit code (or the
  signal), both streams decoded as UTF-8 with replacement, the dropped byte counts, ``timed_out``
  and the duration.
- ``stateful TIMEOUT CAP COMMAND``. Runs ``COMMAND`` in the slot's persistent shell, a tmux
  session started on first use: the command is written to a file and sourced with its output
  redirected to files and its exit status written to a marker file by a rename, so the exit code
  is recovered exactly and the shell's state (directory, variables) carries over. On timeout the
  pane gets Ctrl-C.
- ``tmux LITERAL ENTER WAIT LINES KEY...`` (``LITERAL`` and ``ENTER``: ``"1"`` or ``"0"``). Sends
  the keys to that session and returns a capture of the pane, for interactive programs.

Rules: the agent never runs more than one request at a time; it never lets a call's process
inherit its own pipes to the slot server; signals Python ignores (SIGPIPE, SIGXFSZ) are reset to
their defaults in every child; resource limits from the config apply to the agent and everything
it starts.
"""

from __future__ import annotations

import marshal
import posix
import select
import sys
import time

_HEADER_SIZE = 4
# runtime.MAX_REQUEST_BYTES: a larger request ends the agent (and so the lease)
_MAX_REQUEST = 16 << 20
_READ_CHUNK = 1 << 16
_DRAIN_AFTER_EXIT_S = 0.05
# Linux signal numbers (the same on every architecture trajcore runs on); ``signal`` costs an
# ``enum`` import.
_SIGKILL = 9
_SIGPIPE = 13
_SIGXFSZ = 25
_DEFAULT_SIGNALS = (_SIGPIPE, _SIGXFSZ)
_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
# JSON string escapes: quote, backslash and the control characters.
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({34: '\\"', 92: "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"})


def _json(value: object) -> str:
    """``value`` (None, bool, int, finite float, str, list, dict with str keys) as JSON text."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value - value == 0 else "null"  # NaN and infinities: null
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(_json(str(k)) + ":" + _json(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join([_json(v) for v in value]) + "]"
    return _json(repr(value))


def _exists(path: str) -> bool:
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def name_process(name: str) -> None:
    """Set this process's name as ``ps`` and ``top`` show it (at most 15 bytes kept)."""
    try:
        fd = posix.open("/proc/self/comm", posix.O_WRONLY)
    except OSError:
        return
    try:
        posix.write(fd, name.encode()[:15])
    except OSError:
        pass
    finally:
        posix.close(fd)


def batch_scheduling() -> None:
    """Run this process, and all it starts, under ``SCHED_BATCH``: the kernel then never lets
    it preempt the task that woke it. A slot server that sends a batch of calls to its agents
    finishes sending before they run, instead of trading the CPU back and forth per call;
    commands are batch work, and still get their fair share of the CPU."""
    try:  # noqa: SIM105 - contextlib would cost an import at every sandbox start
        posix.sched_setscheduler(0, posix.SCHED_BATCH, posix.sched_param(0))
    except OSError:
        pass  # a host that refuses it runs the sandbox under the default policy


def _unlink_quietly(path: str) -> None:
    try:  # noqa: SIM105 - contextlib would cost an import at every sandbox start
        posix.unlink(path)
    except OSError:
        pass


def _make_dirs(path: str) -> None:
    """``mkdir -p``."""
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        partial = "/".join(parts[:end])
        if partial and not _exists(partial):
            try:  # noqa: SIM105 - contextlib would cost an import at every sandbox start
                posix.mkdir(partial, 0o755)
            except FileExistsError:
                pass


def _which(name: str) -> str | None:
    raw = posix.environ.get(b"PATH", b"/usr/bin:/bin").decode("utf-8", "replace")
    for folder in raw.split(":"):
        candidate = f"{folder or '.'}/{name}"
        if posix.access(candidate, posix.X_OK) and _exists(candidate):
            return candidate
    return None


class _Capture:
    """One output stream: keeps the head and the tail, counts what falls between."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap + _READ_CHUNK:
                del self.tail[: len(self.tail) - self.tail_cap]

    def finish(self) -> tuple[str, int]:
        if len(self.tail) > self.tail_cap:
            del self.tail[: len(self.tail) - self.tail_cap]
        dropped = self.total - len(self.head) - len(self.tail)
        if not dropped:  # decoded as one: a character may straddle the two
            return (self.head + self.tail).decode("utf-8", "replace"), 0
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        return f"{head}\n[... {dropped} bytes dropped ...]\n{tail}", dropped


def _kill_group(pgid: int) -> None:
    try:  # noqa: SIM105 - contextlib would cost an import at every sandbox start
        posix.killpg(pgid, _SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(argv: list[str]) -> tuple[int, int, int]:
    """Start ``argv`` in a new session; returns its pid and the read ends of its stdout/stderr."""
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    try:
        pid = posix.posix_spawn(
            argv[0],
            argv,
            posix.environ,
            file_actions=[
                (posix.POSIX_SPAWN_OPEN, 0, "/dev/null", posix.O_RDONLY, 0),
                (posix.POSIX_SPAWN_DUP2, out_w, 1),
                (posix.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsid=True,
            setsigdef=_DEFAULT_SIGNALS,
        )
    except OSError:
        posix.close(out_r)
        posix.close(err_r)
        raise
    finally:
        posix.close(out_w)
        posix.close(err_w)
    return pid, out_r, err_r


def _pump(pid: int, captures: dict[int, _Capture], deadline: float) -> tuple[int, bool]:
    """Stream the pipes into ``captures`` until the process ends (or is killed at ``deadline``)
    and its pipes close; returns its wait status and whether it timed out."""
    pidfd = posix.pidfd_open(pid)
    poller = select.poll()
    for fd in captures:
        poller.register(fd, _POLL_IN)
    poller.register(pidfd, _POLL_IN)
    status: int | None = None
    timed_out = False
    open_pipes = len(captures)
    drain_until = 0.0
    try:
        while open_pipes or status is None:
            now = time.monotonic()
            if status is None:
                wait = deadline - now
                if wait <= 0:
                    timed_out = True
                    _kill_group(pid)
                    status = posix.waitpid(pid, 0)[1]
                    poller.unregister(pidfd)
                    drain_until = time.monotonic() + _DRAIN_AFTER_EXIT_S
                    continue
            else:
                wait = drain_until - now
                if wait <= 0:
                    break  # something the command left behind still holds its pipes
            for fd, _ in poller.poll(min(max(1, int(wait * 1000) + 1), 1_000_000_000)):
                if fd == pidfd:
                    status = posix.waitpid(pid, 0)[1]
                    poller.unregister(pidfd)
                    drain_until = time.monotonic() + _DRAIN_AFTER_EXIT_S
                    continue
                data = posix.read(fd, _READ_CHUNK)
                if data:
                    captures[fd].feed(data)
                else:
                    poller.unregister(fd)
                    open_pipes -= 1
    finally:
        posix.close(pidfd)
    return status, timed_out


def run_exec(argv: list[str], timeout: float, cap: int) -> dict[str, object]:
    """Run ``argv`` in a new session with capped output; kill its group at ``timeout``."""
    started = time.monotonic()
    try:
        pid, out_r, err_r = _spawn(argv)
    except OSError as error:
        return {"exit": None, "error": f"cannot start {argv[0]}: {error.strerror}"}
    out, err = _Capture(cap), _Capture(cap)
    try:
        status, timed_out = _pump(pid, {out_r: out, err_r: err}, started + timeout)
    finally:
        posix.close(out_r)
        posix.close(err_r)
    stdout, out_dropped = out.finish()
    stderr, err_dropped = err.finish()
    code = posix.waitstatus_to_exitcode(status)
    return {
        "exit": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_dropped": out_dropped,
        "stderr_dropped": err_dropped,
        "timed_out": timed_out,
        "duration": time.monotonic() - started,
    }


class _Shell:
    """The slot's persistent shell: one tmux session, started on first use."""

    def __init__(self, state_dir: str, workspace: str, tmux: str | None) -> None:
        self.dir = f"{state_dir}/shell"
        self.socket = f"{state_dir}/tmux.sock"
        self.workspace = workspace
        self.counter = 0
        self.tmux = tmux

    def _tmux(self, *args: str, timeout: float = 10.0) -> dict[str, object]:
        assert self.tmux is not None
        return run_exec([self.tmux, "-S", self.socket, *args], timeout, 1 << 20)

    def ensure(self) -> str | None:
        if self.tmux is None:
            return "tmux is not installed"
        if self._tmux("has-session", "-t", "main")["exit"] == 0:
            return None
        _make_dirs(self.dir)
        shell = _which("bash") or "/bin/sh"
        # exit-empty off: a shell ended by ``exit`` ends its session but not the server, so the
        # next call starts a new session on a server that is not on its way out.
        started = self._tmux(
            "new-session", "-d", "-s", "main", "-x", "200", "-y", "50",
            "-c", self.workspace, shell, ";", "set-option", "-s", "exit-empty", "off",
        )  # fmt: skip
        if started["exit"] != 0:
            return f"tmux did not start: {started.get('stderr') or started.get('error')}"
        return None

    def run(self, command: str, timeout: float, cap: int) -> dict[str, object]:
        started = time.monotonic()
        problem = self.ensure()
        if problem:
            return {"exit": None, "error": problem}
        self.counter += 1
        base = f"{self.dir}/{self.counter}"
        with open(base + ".sh", "w", encoding="utf-8") as script:
            script.write(command + "\n")
        # The EXIT trap records the status also when the command ends the shell with ``exit``,
        # and marks that it did (``.ended``), so the next call waits for that session to be gone.
        mark = f"{base}.rc.tmp; mv {base}.rc.tmp {base}.rc"
        line = (
            f"trap 's=$?; : >{base}.ended; echo $s >{mark}' EXIT; "
            f". {base}.sh >{base}.out 2>{base}.err </dev/null; "
            f"echo $? >{base}.rc.tmp; trap - EXIT; mv {base}.rc.tmp {base}.rc"
        )
        sent = self._tmux("send-keys", "-t", "main", "-l", line)
        if sent["exit"] != 0:
            why = sent.get("stderr") or sent.get("error")
            return {"exit": None, "error": f"tmux send-keys failed: {why}"}
        self._tmux("send-keys", "-t", "main", "Enter")
        timed_out = not _wait_for(base + ".rc", started + timeout)
        if timed_out:
            self._tmux("send-keys", "-t", "main", "C-c")
            _wait_for(base + ".rc", time.monotonic() + 0.2)
        code: int | None = None
        rc = _open_regular(base + ".rc")
        if rc is not None:
            try:
                code = int(posix.read(rc, 64).decode("ascii").strip())
            except (OSError, ValueError):
                code = None
            finally:
                posix.close(rc)
        stdout, out_dropped = _read_capped(base + ".out", cap)
        stderr, err_dropped = _read_capped(base + ".err", cap)
        if posix.access(base + ".ended", posix.F_OK):
            # the command ended the shell: wait (bounded) until its session is gone, so the next
            # call starts a fresh shell instead of typing into this one as it exits
            gone_by = time.monotonic() + 2.0
            while self._tmux("has-session", "-t", "main")["exit"] == 0:
                if time.monotonic() >= gone_by:
                    break
                time.sleep(0.01)
        for suffix in (".sh", ".out", ".err", ".rc", ".rc.tmp", ".ended"):
            _unlink_quietly(base + suffix)
        return {
            "exit": None if timed_out else code,
            "signal": None,
            "stdout": stdout,
            "stderr": stderr,
            "stdout_dropped": out_dropped,
            "stderr_dropped": err_dropped,
            "timed_out": timed_out,
            "duration": time.monotonic() - started,
        }

    def keys(
        self, keys: list[str], literal: bool, enter: bool, wait: float, lines: int
    ) -> dict[str, object]:
        started = time.monotonic()
        problem = self.ensure()
        if problem:
            return {"exit": None, "error": problem}
        for key in keys:
            sent = self._tmux("send-keys", "-t", "main", *(["-l"] if literal else []), key)
            if sent["exit"] != 0:
                why = sent.get("stderr") or sent.get("error")
                return {"exit": None, "error": f"tmux send-keys failed: {why}"}
        if enter:
            self._tmux("send-keys", "-t", "main", "Enter")
        if wait > 0:
            time.sleep(wait)
        shot = self._tmux("capture-pane", "-p", "-J", "-t", "main", "-S", f"-{lines}")
        shot["duration"] = time.monotonic() - started
        return shot


def _wait_for(path: str, deadline: float) -> bool:
    pause = 0.001
    while True:
        if _exists(path):
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 1.5, 0.02)


def _open_regular(path: str) -> int | None:
    """``path`` opened for reading if it is a regular file, else ``None``: the shell's output
    files are written by commands in the lease, which may swap them for a symlink, a FIFO or a
    device."""
    try:
        flags = posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOFOLLOW | posix.O_NONBLOCK
        fd = posix.open(path, flags)
    except OSError:
        return None
    if posix.fstat(fd).st_mode & 0o170000 != 0o100000:  # not S_IFREG
        posix.close(fd)
        return None
    return fd


def _read_capped(path: str, cap: int) -> tuple[str, int]:
    """The first and last ``cap/2`` bytes of a regular file, as a capture keeps them."""
    capture = _Capture(cap)
    fd = _open_regular(path)
    if fd is None:
        return "", 0
    try:
        size = posix.fstat(fd).st_size
        if size <= cap:
            capture.feed(posix.pread(fd, size, 0))  # as big as it was: growth is not read
        else:
            capture.feed(posix.pread(fd, capture.head_cap, 0))
            capture.total += size - capture.head_cap - capture.tail_cap
            capture.tail += posix.pread(fd, capture.tail_cap, size - capture.tail_cap)
            capture.total += capture.tail_cap
    except OSError:
        return "", 0
    finally:
        posix.close(fd)
    return capture.finish()


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        data = posix.read(fd, size - len(chunks))
        if not data:
            return None
        chunks += data
    return bytes(chunks)


def _send(fd: int, message: dict[str, object]) -> None:
    # Always valid UTF-8: a lone surrogate (from a file name, say) is replaced.
    payload = _json(message).encode("utf-8", "replace")
    view = memoryview(len(payload).to_bytes(_HEADER_SIZE, "big") + payload)
    while view:
        view = view[posix.write(fd, view) :]


def _apply_limits(config: dict[str, object]) -> None:
    """Set the config's resource limits on this process (and so on all it starts)."""
    given = config.get("limits")
    if not isinstance(given, dict) or not given:
        return
    limits = {str(k): int(v) for k, v in given.items()}
    import resource

    names = {
        "nproc": resource.RLIMIT_NPROC,
        "as": resource.RLIMIT_AS,
        "cpu": resource.RLIMIT_CPU,
        "fsize": resource.RLIMIT_FSIZE,
    }
    for name, value in limits.items():
        if name in names:
            resource.setrlimit(names[name], (value, value))


def encode_request(fields: list[str]) -> bytes:
    """A request as the agents read it: each field (the op first) as a 4-byte big-endian length
    and its UTF-8 bytes. Raises ``UnicodeEncodeError`` for text that is not valid Unicode (a
    lone surrogate)."""
    parts = []
    for field in fields:
        data = field.encode("utf-8")
        parts += [len(data).to_bytes(_HEADER_SIZE, "big"), data]
    return b"".join(parts)


def _decode_request(body: bytes) -> list[str]:
    fields = []
    at = 0
    while at < len(body):
        end = at + _HEADER_SIZE + int.from_bytes(body[at : at + _HEADER_SIZE], "big")
        if at + _HEADER_SIZE > len(body) or end > len(body):
            raise ValueError(f"a malformed request of {len(body)} bytes")
        fields.append(body[at + _HEADER_SIZE : end].decode("utf-8"))
        at = end
    if not fields:
        raise ValueError(f"a malformed request of {len(body)} bytes")
    return fields


def _number(fields: list[str], index: int, name: str) -> float:
    try:
        value = float(fields[index])
    except ValueError:
        raise TypeError(f"{name} must be a finite number, got {fields[index]}") from None
    if value - value != 0:  # NaN and the infinities, without importing math
        raise TypeError(f"{name} must be a finite number, got {fields[index]}")
    return value


def _cap(value: float) -> int:
    """Bytes kept per stream: at least 1, at most 64 MiB (the compiled agent's bound too)."""
    return min(max(1, int(value)), 1 << 26)


def _plain(values: list[str], name: str) -> list[str]:
    for value in values:
        if "\0" in value:
            raise ValueError(f"{name} holds a NUL byte")
    return values


def _answer(shell: _Shell, fields: list[str]) -> dict[str, object]:
    """The reply to one request (``encode_request``'s fields; the op first):
    ``exec TIMEOUT CAP ARGV0 [ARGV1 ...]``, ``stateful TIMEOUT CAP COMMAND`` or
    ``tmux LITERAL ENTER WAIT LINES KEY...`` (``LITERAL``, ``ENTER``: ``"0"`` or ``"1"``)."""
    op = fields[0]
    if op == "exec":
        if len(fields) < 4:
            raise ValueError("an exec request needs a timeout, a cap and a program")
        timeout, cap = _number(fields, 1, "timeout"), _number(fields, 2, "cap")
        return run_exec(_plain(fields[3:], "argv"), timeout, _cap(cap))
    if op == "stateful":
        if len(fields) != 4:
            raise ValueError("a stateful request needs a timeout, a cap and a command")
        timeout, cap = _number(fields, 1, "timeout"), _number(fields, 2, "cap")
        return shell.run(fields[3], timeout, _cap(cap))
    if op == "tmux":
        if len(fields) < 5:
            raise ValueError("a tmux request needs literal, enter, wait and lines")
        wait, lines = _number(fields, 3, "wait"), _number(fields, 4, "lines")
        keys = _plain(fields[5:], "keys")
        rows = min(max(int(lines), 1), 10_000)
        return shell.keys(keys, fields[1] == "1", fields[2] == "1", wait, rows)
    return {"exit": None, "error": f"unknown op {_json(op)}"}


def serve(config: dict[str, object], reader: int = 0, writer: int = 1) -> int:
    """Answer requests read from ``reader`` on ``writer`` until end of input (fds 0 and 1 for a
    bare agent, one socket for a lease agent). Returns the exit status."""
    workspace = str(config["workspace"])
    posix.chdir(workspace)
    _apply_limits(config)
    # a keeper looked tmux up once for all its leases
    tmux = config["tmux_path"] if "tmux_path" in config else _which("tmux")
    shell = _Shell(str(config["state_dir"]), workspace, tmux if isinstance(tmux, str) else None)
    _make_dirs(shell.dir)
    _send(writer, {"ready": True, "pid": posix.getpid(), "tmux": shell.tmux is not None})
    while True:
        header = _read_exact(reader, _HEADER_SIZE)
        if header is None:
            return 0
        size = int.from_bytes(header, "big")
        if size > _MAX_REQUEST:
            return 1  # the slot server never sends more: the channel is not its
        body = _read_exact(reader, size)
        if body is None:
            return 0
        try:
            reply = _answer(shell, _decode_request(body))
        except Exception as error:  # noqa: BLE001 - the agent must answer every request
            reply = {"exit": None, "error": f"agent failed: {type(error).__name__}: {error}"}
        # As pid 1 of a lease's namespace the agent inherits every orphan of the lease: reap
        # those that ended, so they hold no process slot.
        try:
            while posix.waitpid(-1, posix.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        _send(writer, reply)


# ================================================================================= the keeper
#
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
        libc.mount("tmpfs", plan.tmp, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
        for (path, read_only), fd in zip(plan.carried, held, strict=True):
            _make_dirs(path)
            libc.mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            if read_only is not None:
                libc.mount(None, path, None, read_only, None)
            posix.close(fd)
        if plan.dev_shm:
            libc.mount("tmpfs", _DEV_SHM, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
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
    import _socket  # the C half of ``socket``: the module proper costs ~9 ms of imports
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


if __name__ == "__main__":
    config = marshal.loads(bytes.fromhex(sys.argv[-1]))  # noqa: S302 - from the slot server
    if config.get("keeper"):
        sys.exit(keep(config))
    name_process("slot-agent")
    batch_scheduling()
    sys.exit(serve(config))
