"""``SshSandboxPool``: slot servers on a list of hosts, started and reached over SSH.

The pool core (``pool_core``) over a supervised source (``supervision``) whose launcher starts
each slot server with the system ``ssh`` client: one ``ssh`` process per server, running this
package's tether (``ssh_remote``, sent as ``python -c``) around ``trajcore slot-server`` on the
host. Why the system client rather than asyncssh: it is on every machine already (no new
dependency, no second SSH implementation to trust), it honours the operator's ``~/.ssh/config``
(jump hosts, certificates, agents, ``Match`` blocks) as every other tool does, and each server's
connection being a process makes supervision the local pool's: the server ends when its ``ssh``
ends, in either direction.

Per host (``SshHost``): ``servers`` slot servers of ``slots`` slots each, run by ``python``.

- **Start check.** Before any server starts, every host runs ``ssh_remote check`` (in
  parallel, within ``check_timeout_s``): the pool refuses to start, naming each host and what it
  lacks (Python >= 3.11, trajcore, a usable bubblewrap when the isolation requires a sandbox, tmux
  when a persistent shell is required, a ``remote_dir`` that exists and is writable), or why ssh
  could not log in (an unknown or changed host key, a refused key).
- **Transport.** ``unix``: ssh forwards a local Unix socket (mode 0600, in the pool's private
  directory) to the server's socket in its private host directory (mode 0711, socket 0600), so
  the server opens no port on the host's network. ``tcp``: the server listens on ``tcp_bind``
  with a random bearer token, sent over the ssh session's stdin (never on a command line).
  ``auto`` (the default) probes at the start check whether the host's sshd forwards Unix sockets
  and falls back to ``tcp`` when it refuses, or when no Unix socket can be made in ``remote_dir``
  (a path too long for one: ``unix`` then refuses the host naming ``remote_dir``);
  ``transport_of`` says which was chosen.
- **Deadlines.** A server that dies ends its tether and then its ``ssh``: noticed at once. A
  host that drops or a connection that stalls ends ``ssh`` within ``SshSettings.
  stall_deadline_s`` (keepalives); on the host the tether stops the server when its session
  ends or when the pool's heartbeat (every ``keepalive_s / 2``) has not come for as long. Either
  way the server is gone from the pool: its slots leave the book, its leases turn stale, its
  batch in flight is answered ``INFRA_ERROR`` (never scored), and a replacement is tried as the
  config's ``restart`` says: ``restart_attempts`` times with a backoff doubling from
  ``backoff_s`` to ``backoff_max_s``.
- **Stopping.** Closing a server's stdin lets the tether stop the server's process group and
  remove its directory; ssh's process group is killed after ``stop_timeout_s`` if it lingers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import anyio.abc
import attrs
from anyio.streams.buffered import BufferedByteReceiveStream

from trajcore.adapters.pools import ssh_remote
from trajcore.adapters.pools.pool_core import Endpoint, SlotServerPool
from trajcore.adapters.pools.reconciled import composed_settings, part
from trajcore.adapters.pools.server_processes import log_tail, signal_group
from trajcore.adapters.pools.supervision import RestartSettings, SupervisedSource
from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, SandboxUnavailable, SlotServerError
from trajcore.domain.isolation import SlotIsolation, check_slot_uid_range
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.ssh_hosts import SshHost, SshSettings, host_lacks, ssh_argv

__all__ = ["SshPoolConfig", "SshSandboxPool", "start_ssh_pool", "sweep_stale_run_dirs"]

_DEVNULL = -3  # subprocess.DEVNULL
_PIPE = -1  # subprocess.PIPE
_SOURCE = Path(ssh_remote.__file__).read_text(encoding="utf-8")
_RUN_DIR_PREFIX = "trajcore-ssh-"  # then the pool's pid: trajcore-ssh-<pid>-<random>
_SOCKET_PATH_MAX = 107  # bytes of a Unix socket path (sun_path, less its NUL) on Linux
_GREETING = b"trajcore-forward-ok\n"


def _hosts(value: object) -> tuple[SshHost, ...]:
    if isinstance(value, SshHost):
        return (value,)
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ConfigError("hosts", f"must be a non-empty list of SshHost, got {value!r}")
    for index, host in enumerate(value):
        if not isinstance(host, SshHost):
            raise ConfigError(f"hosts[{index}]", f"expected an SshHost, got {host!r}")
    return tuple(value)


@composed_settings
@attrs.frozen(kw_only=True)
class SshPoolConfig:
    """The SSH pool's settings.

    Attributes:
        hosts: The hosts, each with its servers and slots.
        server: The slot servers' settings (``SlotServerSettings``: isolation, tmux, start,
            reset and lease timeouts; a start includes the login). Each server serves its own
            host's ``slots``, not ``server.slots_per_container``. On each host, server ``k``
            runs its slot ``i`` as uid ``server.isolation.slot_uid_base + k * slots + i`` (when
            run as root).
        ssh: What every connection shares (the client, its config file, keepalives).
        restart: How a server that ended or failed is replaced (``RestartSettings``; by
            default 8 tries, from 0.5 s apart up to 30 s: a host may take a while to return).
        check_timeout_s: Longest a host's start check may take (login included).
        stop_timeout_s: Grace for a server to stop after its session closes, then ssh is killed.
    """

    hosts: tuple[SshHost, ...] = attrs.field(converter=_hosts)
    server: SlotServerSettings = part(SlotServerSettings)
    ssh: SshSettings = part(SshSettings)
    restart: RestartSettings = part(
        RestartSettings,
        lambda: RestartSettings(restart_attempts=8, backoff_s=0.5, backoff_max_s=30.0),
    )
    check_timeout_s: float = attrs.field(default=30.0, validator=validators.positive_seconds)
    stop_timeout_s: float = attrs.field(default=10.0, validator=validators.positive_seconds)

    def __attrs_post_init__(self) -> None:
        for index, host in enumerate(self.hosts):
            check_slot_uid_range(
                f"hosts[{index}]: server.isolation.slot_uid_base",
                self.server.isolation.slot_uid_base,
                host.servers * host.slots,
            )

    def placements(self) -> list[tuple[SshHost, int]]:
        """Every server as ``(host, k)``: its host and its number there, hosts in order."""
        return [(host, k) for host in self.hosts for k in range(host.servers)]

    def server_isolation(self, host: SshHost, k: int) -> SlotIsolation:
        """Server ``k`` of ``host``'s isolation: the pool's, with its own range of slot uids."""
        isolation = self.server.isolation
        return attrs.evolve(isolation, slot_uid_base=isolation.slot_uid_base + k * host.slots)


@attrs.define(eq=False)
class _Connection:
    """One server's ssh process, its stdout, its log, and where it runs."""

    name: str
    host: SshHost
    process: anyio.abc.Process
    stdout: BufferedByteReceiveStream
    log: Path
    remote_dir: str
    ready: dict[str, object] = attrs.field(factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid


@attrs.define(eq=False)
class _SshServers:
    """The ``Launcher`` of the SSH pool: one ssh session per slot server."""

    config: SshPoolConfig
    run_dir: Path | None = None
    run_id: str = attrs.field(factory=lambda: secrets.token_hex(4))
    transports: dict[str, str] = attrs.field(factory=dict)  # host label -> "unix" | "tcp"
    _token: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))
    _starts: int = 0

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        sweep_stale_run_dirs(Path(tempfile.gettempdir()))
        run_dir = Path(tempfile.mkdtemp(prefix=f"{_RUN_DIR_PREFIX}{os.getpid()}-"))
        self.run_dir = run_dir
        stack.callback(shutil.rmtree, run_dir, True)
        problems: dict[str, list[str]] = {}

        async def check(index: int, host: SshHost) -> None:
            problems[host.label] = await self._check(index, host)

        async with anyio.create_task_group() as group:
            for index, host in enumerate(self.config.hosts):
                group.start_soon(check, index, host)
        found = [f"host {label}: " + "; ".join(lacks) for label, lacks in problems.items() if lacks]
        if found:
            raise SandboxUnavailable("the SSH pool cannot start: " + " | ".join(found))

    def _ssh(
        self, host: SshHost, words: Sequence[str], forward: tuple[str, str] | None = None
    ) -> list[str]:
        return ssh_argv(
            host, self.config.ssh, [host.python, "-c", _SOURCE, *words], forward=forward
        )

    async def _check(self, index: int, host: SshHost) -> list[str]:
        """What ``host`` lacks ([]: nothing), and its transport chosen (``transports``)."""
        assert self.run_dir is not None
        # the longest Unix socket path a server of this host may get (starts up to 10**6)
        longest = f"{host.remote_dir}/trajcore-{self.run_id}-999999/server.sock"
        fits = len(longest.encode()) <= _SOCKET_PATH_MAX
        probe = host.transport in ("auto", "unix") and fits
        local = str(self.run_dir / f"probe-{index}.sock")
        remote = f"{host.remote_dir}/trajcore-{self.run_id}-probe-{index}.sock"
        words = ["check", "--remote-dir", host.remote_dir]
        if probe:
            words += ["--probe-socket", remote, "--probe-wait-s", "10"]
        argv = self._ssh(host, words, (local, remote) if probe else None)
        process = await anyio.open_process(
            argv, stdin=_DEVNULL, stdout=_PIPE, stderr=_PIPE, start_new_session=True
        )
        try:
            with anyio.move_on_after(self.config.check_timeout_s) as waited:
                lacks = await self._read_check(host, process, local if probe else None)
                if not fits and host.transport == "unix":
                    lacks.append(
                        f"remote_dir {host.remote_dir!r} cannot hold the servers' Unix sockets "
                        f"({longest!r} is longer than {_SOCKET_PATH_MAX} bytes); choose a "
                        "shorter remote_dir or transport 'tcp'"
                    )
                return lacks
            if waited.cancelled_caught:
                return [f"its start check took longer than {self.config.check_timeout_s} s"]
            return []  # pragma: no cover - (move_on_after returns inside or times out)
        finally:
            with anyio.CancelScope(shield=True):
                signal_group(process.pid, signal.SIGKILL)
                await process.wait()
                for stream in (process.stdout, process.stderr):
                    if stream is not None:
                        await stream.aclose()

    async def _read_check(
        self, host: SshHost, process: anyio.abc.Process, probe: str | None
    ) -> list[str]:
        assert process.stdout is not None
        assert process.stderr is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        try:
            line = await stdout.receive_until(b"\n", 1 << 16)
        except (anyio.EndOfStream, anyio.IncompleteRead):
            await process.wait()
            errors = await _read_all(process.stderr)
            return [_login_problem(host, process.returncode, errors)]
        try:
            report = json.loads(line)
        except json.JSONDecodeError:
            return [f"its python printed {line[:200]!r}, not a report"]
        if not isinstance(report, dict):
            return [f"its python printed {line[:200]!r}, not a report"]
        lacks = host_lacks(
            report,
            python=host.python,
            need_bwrap=self.config.server.isolation.require_sandbox,
            need_tmux=self.config.server.require_tmux,
        )
        unusable = report.get("remote_dir_error")
        if unusable is not None:
            return [*lacks, f"remote_dir {host.remote_dir!r}: {unusable}"]
        no_socket = report.get("probe_error")
        if probe is None:
            self.transports[host.label] = "tcp"
        elif no_socket is not None and host.transport == "unix":
            lacks.append(
                f"remote_dir {host.remote_dir!r} cannot hold the servers' Unix sockets "
                f"({no_socket}); choose a shorter remote_dir or transport 'tcp'"
            )
        elif no_socket is not None:
            self.transports[host.label] = "tcp"  # auto: no Unix socket there
        elif await _forwarded(probe):
            self.transports[host.label] = "unix"
        elif host.transport == "auto":
            self.transports[host.label] = "tcp"
        else:
            lacks.append(
                "Unix-socket forwarding (its sshd refuses it: AllowStreamLocalForwarding or "
                "DisableForwarding); set transport to 'tcp' or 'auto' for this host"
            )
        return lacks

    async def launch(self, index: int, name: str) -> tuple[Endpoint, _Connection]:
        assert self.run_dir is not None
        host, k = self.config.placements()[index]
        self._starts += 1
        remote_dir = f"{host.remote_dir}/trajcore-{self.run_id}-{self._starts}"
        transport = self.transports.get(host.label, "tcp")
        if transport == "unix":
            listen = ["--unix", f"{remote_dir}/server.sock"]
            forward: tuple[str, str] | None = (
                str(self.run_dir / f"{self._starts}.sock"),
                f"{remote_dir}/server.sock",
            )
        else:
            listen = ["--listen", f"{host.tcp_bind}:0", "--token-file", f"{remote_dir}/token"]
            forward = None
        server = [
            "--slots", str(host.slots), "--root", f"{remote_dir}/slots", *listen,
            *isolation_argv(self.config.server_isolation(host, k)),
        ]  # fmt: skip
        stall = str(self.config.ssh.stall_deadline_s)
        words = ["serve", "--dir", remote_dir, "--stall-s", stall]
        words += [*(["--token-stdin"] if forward is None else []), "--", *server]
        log = self.run_dir / f"{self._starts}.log"
        with log.open("wb") as log_file:
            process = await anyio.open_process(
                self._ssh(host, words, forward),
                stdin=_PIPE,
                stdout=_PIPE,
                stderr=log_file,
                start_new_session=True,
            )
        assert process.stdout is not None
        connection = _Connection(
            name, host, process, BufferedByteReceiveStream(process.stdout), log, remote_dir
        )
        try:
            if forward is None:
                assert process.stdin is not None
                await process.stdin.send(self._token.encode() + b"\n")
            connection.ready = await _ready_line(connection)
            if forward is not None:
                endpoint = Endpoint("unix", forward[0])
            else:
                port = str(connection.ready.get("address", "")).rpartition(":")[2]
                if not port.isdigit():
                    raise SlotServerError(
                        f"slot server {name} named no TCP port: {connection.ready}"
                    )
                endpoint = Endpoint(
                    "tcp", f"{host.tcp_address or host.address}:{port}", self._token
                )
        except BaseException:
            await self.stop(connection)
            raise
        return endpoint, connection

    async def wait(self, handle: _Connection) -> None:
        async def drain() -> None:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                while True:
                    await handle.stdout.receive()

        async def heartbeat() -> None:
            stdin = handle.process.stdin
            assert stdin is not None
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                while True:
                    await stdin.send(b"\n")
                    await anyio.sleep(self.config.ssh.keepalive_s / 2)

        async with anyio.create_task_group() as group:
            group.start_soon(drain)
            group.start_soon(heartbeat)
            await handle.process.wait()
            group.cancel_scope.cancel()

    async def kill(self, handle: _Connection) -> None:
        if handle.process.returncode is None:
            signal_group(handle.pid, signal.SIGKILL)

    async def stop(self, handle: _Connection) -> None:
        with anyio.CancelScope(shield=True):
            process = handle.process
            if process.stdin is not None:
                with contextlib.suppress(Exception):
                    await process.stdin.aclose()  # the tether stops the server, then exits
            with anyio.move_on_after(self.config.stop_timeout_s):
                await process.wait()
            signal_group(process.pid, signal.SIGKILL)
            with anyio.move_on_after(self.config.stop_timeout_s):
                await process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()

    async def describe(self, handle: _Connection) -> str:
        return log_tail(handle.log)


async def _read_all(stream: anyio.abc.ByteReceiveStream) -> bytes:
    chunks: list[bytes] = []
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        while sum(map(len, chunks)) < 1 << 16:
            chunks.append(await stream.receive())
    return b"".join(chunks)


def _login_problem(host: SshHost, status: int | None, stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace").strip()[-600:]
    if status == 127:
        return f"no Python at {host.python} ({text})"
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (
            f"its host key is not in known_hosts or has changed ({text}); add it to "
            f"{host.known_hosts or 'known_hosts'}, or set accept_new_host_key for this host"
        )
    return f"ssh to {host.destination} failed with status {status}: {text}"


def sweep_stale_run_dirs(parent: Path) -> list[Path]:
    """Remove the private directories in ``parent`` that SSH pools of this user left when their
    process was killed (``trajcore-ssh-<pid>-*`` of a pid that no longer runs; a close removes
    its own); returns them. A directory whose pid runs, or that another user owns, is kept."""
    removed: list[Path] = []
    for path in parent.glob(f"{_RUN_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_RUN_DIR_PREFIX).split("-", 1)[0]
        try:
            if not pid.isdigit() or path.lstat().st_uid != os.getuid() or not path.is_dir():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # it runs as another user, or the directory went meanwhile
            continue
    return removed


async def _forwarded(local: str) -> bool:
    """Whether a connection to ssh's forward of the probe socket reaches the greeting."""
    with anyio.move_on_after(10):
        try:
            async with await anyio.connect_unix(local) as stream:
                buffered = BufferedByteReceiveStream(stream)
                return await buffered.receive_until(b"\n", 64) + b"\n" == _GREETING
        except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            return False
    return False


async def _ready_line(connection: _Connection) -> dict[str, object]:
    try:
        line = await connection.stdout.receive_until(b"\n", 1 << 16)
    except (anyio.EndOfStream, anyio.IncompleteRead):
        await connection.process.wait()
        raise SlotServerError(
            f"slot server {connection.name} on {connection.host.label} ended (ssh status "
            f"{connection.process.returncode}) before it was ready: {log_tail(connection.log)}"
        ) from None
    try:
        ready = json.loads(line)
    except json.JSONDecodeError:
        ready = None
    if not isinstance(ready, dict) or ready.get("ready") is not True:
        raise SlotServerError(f"slot server {connection.name} printed {line[:200]!r}")
    return ready


class SshSandboxPool(SlotServerPool[_Connection]):
    """The SandboxPool port over slot servers on SSH hosts. ``async with SshSandboxPool(config)``.

    Entering checks every host, starts every server and waits until each is healthy
    (``SandboxUnavailable`` naming what each host lacks, ``SlotServerError`` when a server does
    not start in time; nothing is left running either way). Leaving closes it.

    Attributes:
        config: The pool's settings.
    """

    def __init__(self, config: SshPoolConfig) -> None:
        self.config = config
        self._servers = _SshServers(config)
        placements = config.placements()
        self._supervised: SupervisedSource[_Connection] = SupervisedSource(
            self._servers,
            prefix="ssh",
            containers=len(placements),
            restart=config.restart,
            slots=lambda index: placements[index][0].slots,
        )
        # Each server joins with its own host's slot count (``slots`` above).
        super().__init__(self._supervised, config.server, label="ssh")

    @property
    def restarts(self) -> int:
        """Servers started to replace lost ones."""
        return self._supervised.restarts

    def transport_of(self, host: SshHost) -> str:
        """``unix`` or ``tcp``: how the pool reaches ``host``'s servers (after the start)."""
        return self._servers.transports[host.label]

    def host_of(self, container: str) -> SshHost:
        """The host that runs ``container``'s server. Raises ``KeyError``."""
        return self._supervised.launched[container].host

    def ssh_pid(self, container: str) -> int:
        """The pid (and process group) of ``container``'s ssh client. Raises ``KeyError``."""
        return self._supervised.launched[container].pid

    def server_pid(self, container: str) -> int:
        """The slot server's pid on its host, as its ready line said. Raises ``KeyError``."""
        pid = self._supervised.launched[container].ready.get("pid")
        if not isinstance(pid, int):
            raise KeyError(container)
        return pid

    def remote_dir(self, container: str) -> str:
        """The server's private directory on its host. Raises ``KeyError``."""
        return self._supervised.launched[container].remote_dir


@contextlib.asynccontextmanager
async def start_ssh_pool(config: SshPoolConfig) -> AsyncIterator[SshSandboxPool]:
    """``async with start_ssh_pool(config) as pool``: a started pool, closed on exit.

    Raises on entry what ``SshSandboxPool.__aenter__`` raises.
    """
    async with SshSandboxPool(config) as pool:
        yield pool
