"""``LocalSandboxPool``: K slot servers as child processes of this one, leased slot by slot.

The embedded default pool. It starts K slot servers
(``python -m trajcore.entrypoints.slot_server``), each serving ``slots_per_container`` slots on a
Unix socket in a private temporary directory (or on loopback TCP with a bearer token), and
implements the ``SandboxPool`` port over them: the very program and protocol the Nomad pool
schedules on a cluster, minus the scheduling.

The pool is the pool core (``trajcore.adapters.pools.pool_core``) over a supervised source
(``supervision``) whose launcher starts child processes; the container pool is the same core
over a launcher of containers. Leasing is the domain slot book's (``trajcore.domain.slot_book``),
driven by ``SlotLeasing`` (``trajcore.adapters.pools.leasing``), which adds only waiting: the
book decides who gets the next free slot, when a deadline has passed, and which epoch a lease
carries. The fake pool leases through the same class, so both pools share one policy.

Rules this module keeps:

- Leaving a ``lease`` block, however it ends, releases the slot exactly once: the slot server
  resets it (kills its sandbox, wipes its workspace) under a shielded scope with its own timeout;
  a reset that fails or times out quarantines the slot. A cancelled waiter leaves the queue.
- ``execute`` never raises for a call's failure. Calls whose lease is not current in the book
  are ``REJECTED`` before anything is sent. A ``SlotServerError`` or a malformed answer makes every
  call of the batch an ``INFRA_ERROR`` naming the cause; the container is then *lost*: the book
  drops its slots (their leases turn stale), its process group is killed, and its supervisor
  starts a replacement under a new container name (``local-0``, ``local-0~1``, ...) whose slots
  join the book fresh. A server that dies on its own is noticed by its supervisor and replaced
  the same way. Once the ended server's group is gone, its folder of slots (the workspaces, with
  whatever its leases left) and its socket are removed, so replacements over a long run do not
  pile up under the pool's directory until it closes; its log stays until then.
- Every slot server runs in its own process group (``start_new_session``); stopping one is
  SIGTERM to the group, then SIGKILL to the group after ``stop_timeout_s``. The sandboxes run
  with ``--die-with-parent`` inside that group, so ``aclose`` leaves no child or grandchild.
- A slot server dies with this process however it dies: it is started with ``--parent-pid``, so
  Linux sends it SIGHUP when its parent ends (a SIGKILL included) and it closes its sandboxes;
  with ``--parent-dir`` it then removes the pool's directory, which nobody else is left to do.
  A process that must exit without running the pools' close (a second Ctrl-C) calls
  ``abandon_local_pools()``: every open pool's servers are ended and its directory removed,
  synchronously.
- The directory also outlives no killed pool whose servers had already stopped (a SIGKILL in
  the middle of the close, after the servers, before the removal ended): a small guard process
  (``guard_directory``), started with the directory and told each server's process group,
  removes it when this process ends without saying its close is done, once those groups are
  gone.
- Waiting is bounded everywhere: server start (``start_timeout_s``), reset (``reset_timeout_s``),
  stop (``stop_timeout_s``), lease (``timeout_s`` or ``acquire_timeout_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Literal

import anyio
import anyio.abc
import attrs
from anyio.streams.buffered import BufferedByteReceiveStream

from trajcore.adapters.pools.guard_process import GuardProcess, guard_says
from trajcore.adapters.pools.pool_core import Endpoint
from trajcore.adapters.pools.reconciled import composed_settings
from trajcore.adapters.pools.server_processes import abandon_each
from trajcore.adapters.pools.server_processes import log_tail as _tail
from trajcore.adapters.pools.server_processes import signal_group as _signal_group
from trajcore.adapters.pools.supervision import (
    SupervisedPool,
    SupervisedPoolConfig,
    hold_slot_uids,
)
from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_uid_locks import SlotUidReservation
from trajcore.domain.errors import SlotServerError
from trajcore.domain.slot_server_flags import isolation_argv

__all__ = [
    "LocalPoolConfig",
    "LocalSandboxPool",
    "abandon_local_pools",
    "guard_directory",
    "start_local_pool",
]

# ============================================================================ config


def _optional_path(value: object) -> Path | None:
    return None if value is None else Path(str(value))


@composed_settings
@attrs.frozen(kw_only=True)
class LocalPoolConfig(SupervisedPoolConfig):
    """How the local pool runs its slot servers: ``SupervisedPoolConfig``'s settings (``server``
    among them) and these.

    Attributes:
        root: Directory for the servers' workspaces; ``None``: inside the pool's private
            temporary directory (removed on close). A given root is left in place: the pool
            works in a folder of its own inside it (``trajcore-pool-*``, so that two pools
            given one root, two env processes started with one config, never share a server's
            folder nor remove another's), each server's folder in it removed once that server
            has stopped, and the pool's own at close.
        transport: ``"unix"`` (a socket in the private directory) or ``"tcp"`` (loopback, a
            random bearer token).
        python: The interpreter that runs the slot servers.

    Its servers stop on SIGTERM, then SIGKILL of their process group after ``stop_timeout_s``.
    """

    root: Path | None = attrs.field(default=None, converter=_optional_path)
    transport: Literal["unix", "tcp"] = attrs.field(
        default="unix", validator=attrs.validators.in_(("unix", "tcp"))
    )
    python: str = attrs.field(factory=lambda: sys.executable)

    def server_argv(self, *, root: Path, listen: Sequence[str], index: int = 0) -> list[str]:
        """The slot server's command line for container ``index`` (``listen``: its ``--unix``/
        ``--listen ... --token-file`` words)."""
        argv = [
            self.python, "-m", "trajcore.entrypoints.slot_server",
            "--slots", str(self.server.slots_per_container), "--root", str(root),
        ]  # fmt: skip
        return [
            *argv, *listen, *isolation_argv(self.server_isolation(index)),
            "--slot-uid-lock", "none", *self.image_cache_argv(),
        ]  # fmt: skip


# ============================================================================ processes


@attrs.define(eq=False)
class _Process:
    """One slot server process (its group's leader), its stdout and its log; ``left``: what it
    keeps under the pool's directory (its root, its socket), removed once it has stopped."""

    name: str
    process: anyio.abc.Process
    stdout: BufferedByteReceiveStream
    log: Path
    left: tuple[Path, ...] = ()

    @property
    def pid(self) -> int:
        return self.process.pid


async def _stop_process(process: anyio.abc.Process, grace_s: float) -> None:
    """SIGTERM the process's group, SIGKILL it after ``grace_s``; reap the leader. Shielded."""
    with anyio.CancelScope(shield=True):
        pid = process.pid
        if process.returncode is None:
            _signal_group(pid, signal.SIGTERM)
            with anyio.move_on_after(grace_s):
                await process.wait()
        # The leader may be gone while members of its group (sandboxes) linger: kill them too.
        _signal_group(pid, signal.SIGKILL)
        with anyio.move_on_after(grace_s):
            await process.wait()
        for _ in range(100):
            if not _signal_group(pid, 0):
                break
            _signal_group(pid, signal.SIGKILL)
            await anyio.sleep(0.01)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()


@attrs.define(eq=False)
class _LocalProcesses:
    """The ``Launcher`` of the local pool: slot servers as child processes in their own groups."""

    config: LocalPoolConfig
    run_dir: Path | None = None
    _root: Path | None = None
    _token: str | None = None
    _starts: int = 0
    servers: set[int] = attrs.field(factory=set)  # pids (= process groups) not yet stopped
    _guard: GuardProcess = attrs.field(factory=GuardProcess)
    _uids: SlotUidReservation | None = None  # the servers' slot uids, held on the host

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        self.config, self._uids = hold_slot_uids(self.config, stack)
        run_dir = self.run_dir = Path(tempfile.mkdtemp(prefix="trajcore-pool-"))
        _OPEN.add(self)
        stack.push_async_callback(self._remove_run_dir, run_dir)
        self._prepare(run_dir)
        if self.config.root is not None:  # the pool's own folder in the given root
            stack.push_async_callback(self._remove_own_root)
        await self._start_guard(run_dir)

    async def _start_guard(self, run_dir: Path) -> None:
        """The guard of ``run_dir`` (``guard_directory``): told each server's process group
        (``+pid``, ``-pid``), then ``done``."""
        code = f"from {__name__} import guard_directory as g; g()"
        await self._guard.start([self.config.python, "-c", code, str(run_dir)])

    def _prepare(self, run_dir: Path) -> None:
        # Searchable, not listable: a server run as root runs its slots as other uids, which
        # must reach their workspaces below it; the token file stays the owner's alone (0600).
        run_dir.chmod(0o711)
        if self.config.root is None:
            self._root = run_dir / "slots"
            self._root.mkdir(parents=True, exist_ok=True)
        else:
            self.config.root.mkdir(parents=True, exist_ok=True)
            self._root = Path(tempfile.mkdtemp(prefix="trajcore-pool-", dir=self.config.root))
            self._root.chmod(0o711)
        if self.config.transport == "tcp":
            self._token = secrets.token_urlsafe(24)
            token_file = run_dir / "token"
            token_file.write_text(self._token, encoding="utf-8")
            token_file.chmod(0o600)

    async def _remove_own_root(self) -> None:
        """The pool's folder in a given root, once its servers stopped (``LocalPoolConfig``)."""
        assert self._root is not None
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(_remove, self._root)
            except OSError as error:
                warnings.warn(
                    f"the local pool could not remove its folder {self._root}: {error}",
                    ResourceWarning,
                    stacklevel=1,
                )

    async def _remove_run_dir(self, run_dir: Path) -> None:
        with anyio.CancelScope(shield=True):
            try:
                # iterative: whatever tree a lease left in a workspace (any depth) goes too
                await anyio.to_thread.run_sync(
                    lambda: remove_tree(run_dir, timeout_s=_REMOVE_TIMEOUT_S)
                )
            except OSError as error:
                warnings.warn(
                    f"the local pool could not remove its directory {run_dir}: {error}",
                    ResourceWarning,
                    stacklevel=1,
                )
            await self._guard.release()
        self.run_dir = None
        _OPEN.discard(self)

    def _socket(self, index: int) -> Path:
        assert self.run_dir is not None
        return self.run_dir / f"{index}-{self._starts}.sock"

    def _argv(self, index: int, name: str) -> list[str]:
        assert self.run_dir is not None
        assert self._root is not None
        self._starts += 1
        if self.config.transport == "unix":
            listen = ["--unix", str(self._socket(index))]
        else:
            listen = ["--listen", "127.0.0.1:0", "--token-file", str(self.run_dir / "token")]
        argv = self.config.server_argv(root=self._root / name, listen=listen, index=index)
        # Dies with this process (Linux's parent-death signal), however this process ends, and
        # then removes the directory this process could not.
        return [*argv, "--parent-pid", str(os.getpid()), "--parent-dir", str(self.run_dir)]

    def _left(self, index: int, name: str) -> tuple[Path, ...]:
        """What the server that ``_argv`` just described keeps under the pool's directory."""
        assert self._root is not None
        root = self._root / name
        return (root, self._socket(index)) if self.config.transport == "unix" else (root,)

    async def launch(self, index: int, name: str) -> tuple[Endpoint, _Process]:
        assert self.run_dir is not None
        log = self.run_dir / f"{name}.log"
        argv = self._argv(index, name)
        left = self._left(index, name)
        # each server keeps the pool's reservation of slot uids open: held while one runs
        held = () if self._uids is None else (self._uids.fileno(),)
        with log.open("wb") as log_file:
            process = await anyio.open_process(
                argv, stdin=_DEVNULL, stdout=_PIPE, stderr=log_file, start_new_session=True,
                pass_fds=held,
            )  # fmt: skip
        assert process.stdout is not None
        self.servers.add(process.pid)
        self._guard.tell(f"+{process.pid}")
        server = _Process(name, process, BufferedByteReceiveStream(process.stdout), log, left)
        try:
            try:
                line = await server.stdout.receive_until(b"\n", 1 << 16)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                await process.wait()
                raise SlotServerError(
                    f"slot server {name} exited with {process.returncode} before it was "
                    f"ready: {_tail(log)}"
                ) from None
            try:
                ready = json.loads(line)
            except json.JSONDecodeError:
                raise SlotServerError(f"slot server {name} printed no ready line") from None
            if not isinstance(ready, dict) or ready.get("ready") is not True:
                raise SlotServerError(f"slot server {name} printed {line[:200]!r}")
            if self.config.transport == "unix":
                endpoint = Endpoint("unix", str(ready["unix"]))
            else:
                endpoint = Endpoint("tcp", str(ready["address"]), self._token)
        except BaseException:
            await _stop_process(process, self.config.stop_timeout_s)
            self.servers.discard(process.pid)
            self._guard.tell(f"-{process.pid}")
            raise
        return endpoint, server

    async def wait(self, handle: _Process) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while True:  # drain stdout so the server never blocks on it
                await handle.stdout.receive()
        await handle.process.wait()

    async def kill(self, handle: _Process) -> None:
        if handle.process.returncode is None:
            _signal_group(handle.pid, signal.SIGKILL)

    async def stop(self, handle: _Process) -> None:
        """Stop the server's group, then remove its root (its slots' workspaces, with whatever
        a lease it was killed in left there) and its socket: a server that was killed and
        replaced leaves nothing piling up under the pool's directory over a long run (its log
        stays, for the pool's messages, and goes with the directory at close)."""
        await _stop_process(handle.process, self.config.stop_timeout_s)
        self.servers.discard(handle.pid)
        self._guard.tell(f"-{handle.pid}")
        with anyio.CancelScope(shield=True):
            for path in handle.left:
                try:
                    await anyio.to_thread.run_sync(_remove, path)
                except OSError as error:
                    warnings.warn(
                        f"the local pool could not remove {path} of the stopped slot server "
                        f"{handle.name}: {error}",
                        ResourceWarning,
                        stacklevel=1,
                    )

    def abandon(self, grace_s: float) -> None:
        """End every server now and remove the directory, synchronously (see the module doc)."""
        groups = set(self.servers)
        for pid in groups:
            _signal_group(pid, signal.SIGTERM)  # they close their sandboxes
        deadline = time.monotonic() + grace_s
        while groups and time.monotonic() < deadline:
            for pid in groups:  # reap an ended server, so its group no longer counts
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            groups = {pid for pid in groups if _signal_group(pid, 0)}
            time.sleep(0.02)
        for pid in groups:
            _signal_group(pid, signal.SIGKILL)
        self.servers.clear()
        if self.config.root is not None and self._root is not None:
            with contextlib.suppress(OSError):
                remove_tree(self._root, timeout_s=_ABANDON_REMOVE_TIMEOUT_S)
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                remove_tree(self.run_dir, timeout_s=_ABANDON_REMOVE_TIMEOUT_S)
        _OPEN.discard(self)

    async def describe(self, handle: _Process) -> str:
        return _tail(handle.log)


_REMOVE_TIMEOUT_S = 120.0  # the pool's directory, slot workspaces and all, at close


def _remove(path: Path) -> None:
    remove_tree(path, timeout_s=_REMOVE_TIMEOUT_S)


_GUARD_SERVERS_S = 30.0  # a guard whose pool died waits this long for the servers' groups
_ABANDON_REMOVE_TIMEOUT_S = 10.0  # the same when the process must stop now
_DEVNULL = -3  # subprocess.DEVNULL, without importing subprocess into the async code
_PIPE = -1  # subprocess.PIPE

_OPEN: set[_LocalProcesses] = set()
"""The launchers of this process's open local pools, for ``abandon_local_pools``."""


def abandon_local_pools(grace_s: float = 2.0) -> int:
    """End every open local pool's slot servers and remove its directory, synchronously.

    For a process that must exit now, without running the pools' close (a forced stop, a
    second signal): each server's group gets SIGTERM (it closes its sandboxes), then SIGKILL
    after ``grace_s``. The pools are unusable afterwards. Safe to call from a signal handler
    or another thread. Returns how many pools it ended.
    """
    return abandon_each(_OPEN, grace_s)


def guard_directory() -> None:
    """The guard process of a local pool's directory (``sys.argv[1]``); see the module doc.

    Reads lines from stdin: ``+PID`` (a server's process group started), ``-PID`` (stopped),
    ``done`` (the pool removed its directory: exit). At the end of stdin without ``done`` (the
    pool's process ended), it waits up to ``_GUARD_SERVERS_S`` for the groups still listed to
    end (they close their sandboxes and may remove the directory themselves), kills what is
    left of them, and removes the directory, within ``_REMOVE_TIMEOUT_S``.
    """
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # it ends with the pool's pipe, not a signal
    run_dir = Path(sys.argv[1])
    groups: set[int] = set()
    for line in sys.stdin:
        word = line.strip()
        if word == "done":
            return
        if word[:1] in ("+", "-") and word[1:].isdigit():
            (groups.add if word[0] == "+" else groups.discard)(int(word[1:]))
    deadline = time.monotonic() + _GUARD_SERVERS_S
    while time.monotonic() < deadline and any(_signal_group(pid, 0) for pid in groups):
        time.sleep(0.05)
    killed = sorted(pid for pid in groups if _signal_group(pid, signal.SIGKILL))
    said = f"trajcore local pool {run_dir}: its process ended without closing it"
    if killed:
        said += f"; killed its slot servers' groups {killed} (there after {_GUARD_SERVERS_S:g} s)"
    found = run_dir.exists()
    deadline = time.monotonic() + _REMOVE_TIMEOUT_S
    while run_dir.exists():  # (a server may still be writing below it: try again)
        try:
            remove_tree(run_dir, timeout_s=max(0.1, deadline - time.monotonic()))
        except OSError as error:
            if time.monotonic() >= deadline:
                guard_says(f"{said}; cannot remove its directory: {error}")
                return
            time.sleep(0.1)
    guard_says(f"{said}; {'removed' if found else 'its slot servers removed'} its directory")


# ============================================================================ the pool


class LocalSandboxPool(SupervisedPool[_Process]):
    """The SandboxPool port over K local slot servers. ``async with LocalSandboxPool(config)``.

    Entering starts every server and waits until each is healthy (``SlotServerError`` when one
    does not start in time, ``SandboxUnavailable`` when ``require_sandbox`` and bubblewrap is
    unusable; nothing is left running either way). Leaving closes it (``aclose``).

    Attributes:
        config: The pool's settings.
    """

    def __init__(self, config: LocalPoolConfig | None = None) -> None:
        self.config = config = config or LocalPoolConfig()
        self._processes = _LocalProcesses(config)
        super().__init__(self._processes, config, label="local")

    def server_pid(self, container: str) -> int:
        """The pid (and process group) of ``container``'s slot server. Raises ``KeyError``."""
        return self._supervised.launched[container].pid

    @property
    def run_dir(self) -> Path | None:
        """The pool's private directory (sockets, logs, default workspaces) while it runs."""
        return self._processes.run_dir


@contextlib.asynccontextmanager
async def start_local_pool(
    config: LocalPoolConfig | None = None,
) -> AsyncIterator[LocalSandboxPool]:
    """``async with start_local_pool(config) as pool``: a started pool, closed on exit.

    Raises on entry what ``LocalSandboxPool.__aenter__`` raises.
    """
    async with LocalSandboxPool(config or LocalPoolConfig()) as pool:
        yield pool
