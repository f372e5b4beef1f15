"""The exec agent: the program inside a slot's sandbox that runs each call as a fork.

The slot server starts it with ``python -I -S`` in one of two roles, named by its config:

- **keeper** (``keep``; sandboxed slots): the first program of the slot's bubblewrap sandbox,
  kept for the server's life. It holds ``CAP_SYS_ADMIN``, ``CAP_SETPCAP`` and ``CAP_NET_ADMIN``
  inside the sandbox's own user namespace, is not dumpable, and uses them for one thing: on each
  ``lease`` request it clones the lease's agent into a new pid namespace (the child is that
  namespace's pid 1); the child enters new mount, ipc and uts namespaces (and a network namespace
  of its own, loopback up, when the config says ``own_network``), joins a fresh session keyring,
  mounts a fresh ``/proc`` (masking ``MASKED_PATHS`` and making
  ``READ_ONLY_PATHS`` read-only), ``/tmp`` and ``/dev/shm`` as two folders of one tmpfs (so
  one size, the config's ``tmpfs`` options, bounds both; binding back what the sandbox had bound
  under ``/tmp``), remounts ``/dev`` read-only, drops every capability
  (ambient, permitted, effective; ``no_new_privs``; its bounding set comes empty from the keeper,
  which emptied its own at start), makes itself not dumpable, sets its resource limits, installs
  the config's seccomp filter (classic BPF, ``adapters/sandbox/seccomp.py``) as its last step,
  and only then serves the lease on the socket it was handed.
  ``end`` kills that pid 1 and reaps it: the kernel lets it be reaped only after every other
  process of its namespace is gone. The keeper never reads anything a lease writes, and a lease
  cannot see the keeper (it is outside the lease's pid namespace) nor signal it.
- **bare agent** (``serve`` on fds 0/1; unsandboxed slots): one process per lease, as the lease
  agent but without namespaces.

The keeper's code is in ``exec_keeper``; this module is the lease agent and the protocols. Both
travel with the command line as one program (``sandboxes.AGENT_SOURCE``: as a code object when
the sandbox runs the server's own interpreter, as source text otherwise), so they need nothing
from the host's file system but a Python interpreter. This file run alone (``python -I -S
exec_agent.py CONFIG``) is a bare agent.

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
SHELL_SOCKET = "tmux.sock"
"""The persistent shell's tmux socket, in the lease's state directory."""
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


def _spawn(argv: list[str], own_session: bool = True) -> tuple[int, int, int]:
    """Start ``argv`` in a new session (else a new process group of this session); returns its
    pid and the read ends of its stdout/stderr."""
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    try:
        actions = [
            (posix.POSIX_SPAWN_OPEN, 0, "/dev/null", posix.O_RDONLY, 0),
            (posix.POSIX_SPAWN_DUP2, out_w, 1),
            (posix.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        if own_session:
            pid = posix.posix_spawn(
                argv[0], argv, posix.environ, file_actions=actions, setsid=True,
                setsigdef=_DEFAULT_SIGNALS,
            )  # fmt: skip
        else:
            pid = posix.posix_spawn(
                argv[0], argv, posix.environ, file_actions=actions, setpgroup=0,
                setsigdef=_DEFAULT_SIGNALS,
            )  # fmt: skip
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


def run_exec(
    argv: list[str], timeout: float, cap: int, *, own_session: bool = True
) -> dict[str, object]:
    """Run ``argv`` in a new session (``own_session``; else a new process group of the agent's
    session) with capped output; kill its group at ``timeout``."""
    started = time.monotonic()
    try:
        pid, out_r, err_r = _spawn(argv, own_session)
    except OSError as error:
        return {"exit": None, "error": f"cannot start {argv[0]}: {error.strerror}"}
    out, err = _Capture(cap), _Capture(cap)
    try:
        status, timed_out = _pump(pid, {out_r: out, err_r: err}, started + timeout)
    finally:
        posix.close(out_r)
        posix.close(err_r)
    code = posix.waitstatus_to_exitcode(status)
    exit_code, signal = (code, None) if code >= 0 else (None, -code)
    return _reply(
        exit_code, signal, out.finish(), err.finish(), timed_out=timed_out, started=started
    )


def _reply(
    exit_code: int | None, signal: int | None, stdout: tuple[str, int], stderr: tuple[str, int],
    *, timed_out: bool, started: float,
) -> dict[str, object]:  # fmt: skip
    """A command's answer; each stream is its kept text and how many bytes were dropped."""
    return {
        "exit": exit_code,
        "signal": signal,
        "stdout": stdout[0],
        "stderr": stderr[0],
        "stdout_dropped": stdout[1],
        "stderr_dropped": stderr[1],
        "timed_out": timed_out,
        "duration": time.monotonic() - started,
    }


class _Shell:
    """The slot's persistent shell: one tmux session, started on first use."""

    def __init__(self, state_dir: str, workspace: str, tmux: str | None) -> None:
        self.dir = f"{state_dir}/shell"
        self.socket = f"{state_dir}/{SHELL_SOCKET}"
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
        stdout = _read_capped(base + ".out", cap)
        stderr = _read_capped(base + ".err", cap)
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
        exit_code = None if timed_out else code
        return _reply(exit_code, None, stdout, stderr, timed_out=timed_out, started=started)

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
        "nice": resource.RLIMIT_NICE,
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


def _answer(shell: _Shell, fields: list[str], own_sessions: bool = True) -> dict[str, object]:
    """The reply to one request (``encode_request``'s fields; the op first):
    ``exec TIMEOUT CAP ARGV0 [ARGV1 ...]``, ``stateful TIMEOUT CAP COMMAND`` or
    ``tmux LITERAL ENTER WAIT LINES KEY...`` (``LITERAL``, ``ENTER``: ``"0"`` or ``"1"``).
    ``own_sessions`` off keeps commands in the agent's session (see ``serve``)."""
    op = fields[0]
    if op == "exec":
        if len(fields) < 4:
            raise ValueError("an exec request needs a timeout, a cap and a program")
        timeout, cap = _number(fields, 1, "timeout"), _number(fields, 2, "cap")
        return run_exec(_plain(fields[3:], "argv"), timeout, _cap(cap), own_session=own_sessions)
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
    bare agent, one socket for a lease agent). Returns the exit status.

    A bare agent (no sandbox, config ``own_sessions`` false) keeps its commands in its own
    session, so the slot server can end every process a command left behind by that session:
    without a pid namespace or a cgroup nothing else finds them."""
    workspace = str(config["workspace"])
    own_sessions = config.get("own_sessions", True) is not False
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
            reply = _answer(shell, _decode_request(body), own_sessions)
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


if __name__ == "__main__":
    config = marshal.loads(bytes.fromhex(sys.argv[-1]))  # noqa: S302 - from the slot server
    if config.get("keeper"):
        # ``exec_keeper.keep``: the slot server's program carries that module's code before
        # this one's (``sandboxes.AGENT_SOURCE``); this file run alone is a bare agent only.
        keep = globals().get("keep")
        if keep is None:
            sys.exit("a keeper config needs the slot server's agent program, not this file alone")
        sys.exit(keep(config))
    name_process("slot-agent")
    batch_scheduling()
    sys.exit(serve(config))
