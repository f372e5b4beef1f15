"""A real OpenSSH ``sshd`` on 127.0.0.1 in a temporary directory, for the SSH pool's tests.

``LoopbackSshd.start(directory)`` writes its own config file, host key, user key,
``authorized_keys`` and ``known_hosts`` under ``directory``, picks a free port and runs
``/usr/sbin/sshd -D -e -f CONFIG``; nothing is written to the system's configuration and
``~/.ssh`` is never read (the client gets ``-F`` with an empty config, ``-i`` and its own
``UserKnownHostsFile`` through ``host()`` and ``settings()``). Run as root, sshd insists on its
privilege-separation directory ``/run/sshd``; when that is missing, sshd runs in a private mount
namespace (``unshare --mount``) with a tmpfs over ``/run`` holding it, so nothing on the host
changes. Faults, each on processes this object started: ``drop()`` kills the listener and every
session process (the host went away), ``stall()`` stops the session processes (SIGSTOP: a
connection that stalls), ``restart()`` starts a listener again on the same port. ``close()`` ends
every process by pid.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from trajcore.adapters.removal import remove_tree
from trajcore.domain.ssh_hosts import SshHost, SshSettings
from trajcore.testing.processes import stat_fields

__all__ = ["SSHD", "LoopbackSshd", "sshd_problem"]

SSHD = "/usr/sbin/sshd"


def sshd_problem() -> str | None:
    """Why no loopback sshd can run here, or ``None``."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    for program in ("ssh", "ssh-keygen"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install openssh-client)"
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd") and shutil.which("unshare") is None:
        return "sshd needs /run/sshd as root, and unshare (util-linux) is missing to provide it"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _remote_dir() -> Path:
    # Slot uids must reach their workspaces through every parent: a directory of its own under
    # /tmp, searchable by all (a test's tmp_path is not).
    path = Path(tempfile.mkdtemp(prefix="trajcore-ssh-host-"))
    path.chmod(0o711)
    return path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        if (fields := stat_fields(int(entry))) is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    tree = _children()
    found: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


def _command(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


@attrs.define(eq=False)
class LoopbackSshd:
    """One loopback sshd and the files that trust it (see the module docstring)."""

    directory: Path
    port: int
    extra_config: tuple[str, ...] = ()
    remote_dir: Path = attrs.field(factory=_remote_dir)
    process: subprocess.Popen[bytes] | None = None
    _stopped: list[int] = attrs.field(factory=list)

    @classmethod
    def start(cls, directory: Path, extra_config: Sequence[str] = ()) -> LoopbackSshd:
        """Keys, config and a running sshd under ``directory`` (which must exist, empty)."""
        directory.chmod(0o700)
        _keygen(directory / "host_key")
        _keygen(directory / "user_key")
        shutil.copy(directory / "user_key.pub", directory / "authorized_keys")
        (directory / "ssh_config").write_text("")  # the client reads nothing of ~/.ssh/config
        sshd = cls(directory=directory, port=_free_port(), extra_config=tuple(extra_config))
        host_key = (directory / "host_key.pub").read_text().split()[:2]
        (directory / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {' '.join(host_key)}\n")
        sshd.restart()
        return sshd

    @property
    def config_file(self) -> Path:
        return self.directory / "sshd_config"

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.directory / 'host_key'}",
            f"PidFile {self.directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.directory / 'authorized_keys'}",
            "StrictModes no",  # (the directory lies under the world-writable /tmp)
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "MaxStartups 200",
            "MaxSessions 200",
            "LogLevel ERROR",
            *self.extra_config,
        ]
        self.config_file.write_text("\n".join(lines) + "\n")

    def restart(self, timeout_s: float = 20.0) -> None:
        """Start the listener (again, on the same port); returns once it accepts connections."""
        self._write_config()
        argv = [SSHD, "-D", "-e", "-f", str(self.config_file)]
        if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
            inner = 'mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd && exec "$@"'
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                inner,
                "sh",
                *argv,
            ]
        log = (self.directory / "sshd.log").open("ab")
        with log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"sshd exited: {(self.directory / 'sshd.log').read_text()[-800:]}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port} within {timeout_s} s")

    # ------------------------------------------------------------------ clients' settings

    def host(self, **overrides: object) -> SshHost:
        """An ``SshHost`` for this sshd: root (this user) on 127.0.0.1, this interpreter."""
        settings: dict[str, object] = {
            "address": "127.0.0.1",
            "user": getpass.getuser(),
            "port": self.port,
            "identity_file": str(self.directory / "user_key"),
            "known_hosts": str(self.directory / "known_hosts"),
            "python": sys.executable,
            "remote_dir": str(self.remote_dir),
        }
        return SshHost(**(settings | overrides))  # type: ignore[arg-type]

    def settings(self, **overrides: object) -> SshSettings:
        """``SshSettings`` reading only this directory's empty client config."""
        return SshSettings(config_file=str(self.directory / "ssh_config"), **overrides)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ faults

    def sessions(self) -> list[int]:
        """The pids of the sshd processes serving connections (not the listener)."""
        if self.process is None:
            return []
        return [pid for pid in descendants(self.process.pid) if _command(pid).startswith("sshd")]

    def drop(self) -> None:
        """The host goes away: SIGKILL every session process, then the listener."""
        for pid in self.sessions():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stop_listener()

    def stop_listener(self) -> None:
        """SIGKILL the listener alone (sessions live on); new connections are refused."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stall(self) -> list[int]:
        """SIGSTOP every session process (a connection that stalls); returns their pids."""
        pids = self.sessions()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self._stopped.extend(pids)
        return pids

    def close(self) -> None:
        """End every process this sshd started (sessions and what they run), then itself."""
        for pid in self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.process is not None:
            for pid in reversed(descendants(self.process.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.stop_listener()
        remove_tree(self.remote_dir, timeout_s=60.0)


@contextlib.contextmanager
def loopback_sshd(directory: Path, extra_config: Sequence[str] = ()) -> Iterator[LoopbackSshd]:
    """``with loopback_sshd(tmp_path) as sshd``: a started sshd, closed at the end."""
    sshd = LoopbackSshd.start(directory, extra_config)
    try:
        yield sshd
    finally:
        sshd.close()
