"""What the SSH pool runs on a host: the start check, and the tether around one slot server.

The pool sends this module's source as ``python -c SOURCE check|serve ...`` over ``ssh``, so it
runs on the host with the host's own interpreter before anything of trajcore is known to be
there. It therefore imports the standard library only, and works on any Python 3 that can say
what it lacks.

``check`` prints one JSON line: the interpreter's version, trajcore's version (or why it does not
import), where ``bwrap`` and ``tmux`` are, and whether bubblewrap can make a sandbox. With
``--remote-dir D`` it says why ``D`` cannot hold the servers' directories (``remote_dir_error``:
missing, not a directory, not writable). With ``--probe-socket PATH`` it then listens on the
Unix socket ``PATH`` for one connection and greets it, so the pool can tell whether the host's
sshd forwards Unix sockets; a socket that cannot be made there (a path too long for a Unix
socket) is reported as ``probe_error`` instead.

``serve --dir D --stall-s S [--token-stdin] -- ARGS`` makes the private directory ``D`` (mode
0711; refused when it exists), runs ``python -m trajcore.entrypoints.slot_server ARGS`` in a
process group of its own, and passes the server's ready line on. It stops the server's whole
group (SIGTERM, then SIGKILL after 5 s), removes ``D`` and exits when:

- its stdin ends (the ssh session is gone: the pool closed it, or the connection dropped);
- no line came on stdin for ``S`` seconds after the server was ready (the pool writes a
  heartbeat line more often than that, so a stalled connection ends the server on the host too,
  whatever the host's sshd does about idle sessions);
- the server ends on its own (its exit status is the tether's).

With ``--token-stdin`` the first stdin line is the bearer token of a TCP server: written to
``D/token`` (mode 0600) for ``--token-file``, never on a command line.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["check", "main", "serve"]

_STOP_GRACE_S = 5.0
_PROBE_GREETING = b"trajcore-forward-ok\n"


def check(probe_socket: str | None, probe_wait_s: float, remote_dir: str | None = None) -> int:
    """Print the host's report; with ``probe_socket``, greet one connection on it (listening
    before the report is printed, so the pool may connect as soon as it reads it)."""
    report = _report()
    listener = None
    if remote_dir is not None:
        report["remote_dir_error"] = _directory_problem(remote_dir)
    if probe_socket is not None and report.get("remote_dir_error") is None:
        try:
            listener = _listen(probe_socket)
        except OSError as error:  # a path too long for a Unix socket, a full disk
            report["probe_error"] = f"cannot listen on {probe_socket}: {error}"
    try:
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        if listener is not None:
            _greet_one(listener, probe_wait_s)
    finally:
        if listener is not None:
            listener.close()
            if probe_socket is not None and os.path.lexists(probe_socket):
                os.unlink(probe_socket)
    return 0


def _report() -> dict[str, object]:
    report: dict[str, object] = {"python": list(sys.version_info[:3])}
    try:
        # (found through importlib: this module names no trajcore module it would import)
        if importlib.util.find_spec("trajcore.entrypoints.slot_server") is None:
            raise ImportError("trajcore.entrypoints.slot_server is not there")
        report["trajcore"] = importlib.metadata.version("trajcore")
    except Exception as error:  # noqa: BLE001 - any failure to find it is reported
        report["trajcore"] = None
        report["trajcore_error"] = f"{type(error).__name__}: {error}"
    bwrap = shutil.which("bwrap")
    report["bwrap"] = bwrap
    report["tmux"] = shutil.which("tmux")
    report["bwrap_error"] = None if bwrap is None else _bwrap_problem(bwrap)
    return report


def _directory_problem(path: str) -> str | None:
    if not os.path.exists(path):
        return "it does not exist"
    if not os.path.isdir(path):
        return "it is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return "this user may not make directories in it"
    return None


def _bwrap_problem(bwrap: str) -> str | None:
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode != 0:
        return done.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit {done.returncode}"
    return None


def _listen(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.lexists(path):
        os.unlink(path)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(1)
    return listener


def _greet_one(listener: socket.socket, wait_s: float) -> None:
    listener.settimeout(wait_s)
    try:
        peer, _ = listener.accept()
    except socket.timeout:  # noqa: UP041 - TimeoutError only from 3.10; this runs on older ones
        return
    with peer:
        peer.sendall(_PROBE_GREETING)


def serve(directory: str, stall_s: float, token_stdin: bool, server_args: Sequence[str]) -> int:
    """Run the slot server under the tether's rules (see the module docstring)."""
    try:
        os.mkdir(directory, 0o711)
    except OSError as error:
        sys.stderr.write(f"trajcore ssh: cannot make the server's directory {directory}: {error}\n")
        return 2
    os.chmod(directory, 0o711)  # noqa: S103 - slot uids must reach their workspaces below it
    try:
        if token_stdin:
            token = sys.stdin.buffer.readline().strip()
            if not token:
                sys.stderr.write("trajcore ssh: no token came on stdin\n")
                return 2
            path = os.path.join(directory, "token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(token)
        argv = [sys.executable, "-m", "trajcore.entrypoints.slot_server", *server_args]
        server = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True
        )
        try:
            return _tether(server, stall_s)
        finally:
            _stop_group(server)
    finally:
        _remove(directory)


def _tether(server: subprocess.Popen[bytes], stall_s: float) -> int:
    assert server.stdout is not None
    selector = selectors.DefaultSelector()
    stdin = sys.stdin.buffer.fileno()
    selector.register(stdin, selectors.EVENT_READ, "stdin")
    selector.register(server.stdout.fileno(), selectors.EVENT_READ, "server")
    deadline: float | None = None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        events = selector.select(timeout)
        if not events and deadline is not None and time.monotonic() >= deadline:
            sys.stderr.write(f"trajcore ssh: no heartbeat for {stall_s} s; stopping the server\n")
            return 3
        for key, _ in events:
            data = os.read(key.fd, 65536)
            if key.data == "stdin":
                if not data:
                    return 0  # the session is gone: stop the server
                if deadline is not None:
                    deadline = time.monotonic() + stall_s
                continue
            if not data:
                return server.wait()
            try:
                os.write(sys.stdout.fileno(), data)
            except OSError:
                return 0
            if deadline is None and b"\n" in data:
                deadline = time.monotonic() + stall_s


def _stop_group(server: subprocess.Popen[bytes]) -> None:
    for signum, wait_s in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, _STOP_GRACE_S)):
        try:
            os.killpg(server.pid, signum)
        except (ProcessLookupError, PermissionError):
            break
        try:
            server.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        if signum == signal.SIGTERM:
            # The leader ended; what lingers of its group (sandboxes) goes now.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)
            break
    if server.returncode is None:
        server.wait()


def _remove(directory: str) -> None:
    try:
        from pathlib import Path

        from trajcore.adapters.removal import remove_tree

        remove_tree(Path(directory), timeout_s=60.0)
    except Exception:  # noqa: BLE001 - fall back to the standard library's removal
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    """``check [--remote-dir D] [--probe-socket PATH --probe-wait-s S]`` or ``serve --dir D
    --stall-s S [--token-stdin] -- ARGS``; exit 2 on a malformed command line."""
    words = list(argv)
    if words[:1] == ["check"]:
        probe = _option(words, "--probe-socket")
        wait = float(_option(words, "--probe-wait-s") or "10")
        return check(probe, wait, _option(words, "--remote-dir"))
    if words[:1] == ["serve"] and "--" in words:
        split = words.index("--")
        head, rest = words[:split], words[split + 1 :]
        directory = _option(head, "--dir")
        stall = _option(head, "--stall-s")
        if directory is not None and stall is not None:
            return serve(directory, float(stall), "--token-stdin" in head, rest)
    sys.stderr.write(f"trajcore ssh: bad command line {words!r}\n")
    return 2


def _option(words: list[str], name: str) -> str | None:
    if name in words and words.index(name) + 1 < len(words):
        return words[words.index(name) + 1]
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
