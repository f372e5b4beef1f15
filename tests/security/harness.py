"""What the red-team tests share: the slot server they attack, the attack kit, the host's view.

Rules it keeps (the suite's standard, see README.md here):

- The server is a real ``trajcore slot-server`` over TCP with a bearer token, network off,
  ``--require-sandbox``, started by the test as a child process; the attacks run inside its
  leased slots, as a bash call or a program written into the workspace with ``write_file``.
- Every check reads the host: ``/proc`` of the host pids, the workspace as a host directory,
  the server's answers (the server is the host side). Nothing the sandbox prints is trusted.
- The kit (``kit.c``) is compiled once with the host's C compiler; it runs unchanged inside a
  slot and, for each test's control, as a plain subprocess of the test.
- Everything started here is ended by its pid; keys are added only to this process's own
  session keyring and removed by their serial.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import attrs
import pytest

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolResult
from trajcore.testing.processes import stat_fields

TOKEN = "security-suite-token"
KIT_SOURCE = Path(__file__).with_name("kit.c")
MAX_PROCESSES = 64
MEMORY_MB = 256


def compiler() -> str | None:
    """The host's C compiler, or ``None``."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def bwrap_missing() -> bool:
    return shutil.which("bwrap") is None


def build_kit(into: Path) -> Path:
    """Compile ``kit.c`` into ``into/kit``. Raises ``subprocess.CalledProcessError``."""
    cc = compiler()
    assert cc is not None
    out = into / "kit"
    subprocess.run([cc, "-O2", "-o", str(out), str(KIT_SOURCE)], check=True, timeout=120)
    return out


def token() -> str:
    """A fresh marker for one attacker process's command line."""
    return f"tok{secrets.token_hex(8)}"


# ----------------------------------------------------------------------------- the server


@attrs.define(eq=False)
class Server:
    """A running slot server and what the host knows about it."""

    process: subprocess.Popen[bytes]
    ready: dict[str, JSON]
    root: Path
    epochs: dict[int, int] = attrs.field(factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> str:
        return str(self.ready["address"])

    def client(self, bearer: str | None = TOKEN) -> SlotServerClient:
        return SlotServerClient.tcp(self.address.removeprefix("http://"), bearer)

    def seen(self, path: Path) -> Path:
        """``path`` as the server sees it: through its own mount namespace (``/proc/PID/root``),
        where its mounts (a forked workspace's overlay) are; the host does not see them."""
        return Path(f"/proc/{self.process.pid}/root") / path.relative_to("/")

    def workspace(self, slot: int) -> Path:
        """The slot's workspace as a host directory."""
        return self.root / "slots" / str(slot)

    def next_epoch(self, slot: int) -> int:
        self.epochs[slot] = self.epochs.get(slot, 100) + 1
        return self.epochs[slot]


@contextmanager
def server_root(name: str) -> Iterator[Path]:
    """A directory for a slot server's workspaces that every user may search (a server run as
    root runs each slot as its own unprivileged uid, which must reach its workspace; pytest's
    own temporary directories are private to root). Removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=f"trajcore-security-{name}-"))
    try:
        folder.chmod(0o755)
        yield folder / "root"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_server(root: Path, *extra: str, prefix: Sequence[str] = ()) -> Server:
    """A slot server on loopback TCP: 4 slots, network off, sandbox required; ``prefix`` is a
    command that starts it (``prlimit ... --``, say)."""
    token_file = root.parent / f"{root.name}.token"
    token_file.write_text(TOKEN)
    argv = [
        *prefix, sys.executable, "-m", "trajcore.entrypoints.slot_server",
        "--slots", "4", "--root", str(root), "--token-file", str(token_file),
        "--listen", "127.0.0.1:0", "--require-sandbox",
        "--max-processes", str(MAX_PROCESSES), "--memory-bytes", str(MEMORY_MB << 20),
        "--output-cap-bytes", "8192", "--min-timeout-s", "0.2",
        "--file-cap-bytes", str(1 << 20), *extra,
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        assert process.stderr is not None
        reason = process.stderr.read().decode()
        process.stdout.close()
        process.stderr.close()
        pytest.fail(f"slot server did not start: {reason}")
    ready = json.loads(line)
    if not ready.get("sandboxed"):
        stop_server(Server(process=process, ready=ready, root=root))
        pytest.fail(f"the slot server is not sandboxed: {ready.get('capabilities')}")
    return Server(process=process, ready=ready, root=root)


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(5)
    for stream in (server.process.stdout, server.process.stderr):
        if stream is not None:
            stream.close()


# ----------------------------------------------------------------------------- leases

_call_ids = iter(range(1, 1 << 40))


@attrs.define(eq=False)
class Lease:
    """One lease of one slot: calls carry its epoch; the workspace is read from the host."""

    client: SlotServerClient
    slot: int
    epoch: int
    workspace: Path

    def call(self, tool: str, timeout_s: float = 15.0, **arguments: JSON) -> ExecuteCall:
        return self.call_with(tool, arguments, timeout_s)

    def call_with(
        self, tool: str, arguments: dict[str, JSON], timeout_s: float = 15.0
    ) -> ExecuteCall:
        return ExecuteCall(
            slot=self.slot, epoch=self.epoch, call_id=f"sec-{next(_call_ids)}", tool=tool,
            arguments=arguments, timeout_s=timeout_s,
        )  # fmt: skip

    async def run(self, tool: str, timeout_s: float = 15.0, **arguments: JSON) -> ToolResult:
        (result,) = await self.client.execute([self.call(tool, timeout_s, **arguments)])
        return result

    async def bash(self, command: str, timeout_s: float = 15.0) -> ToolResult:
        return await self.run("bash", timeout_s, command=command)

    async def install_kit(self, kit: Path) -> None:
        """Put the kit into the workspace as a model would: written as text, decoded by a
        command. Fails the test when it did not arrive (an attack that cannot run proves
        nothing)."""
        written = await self.run("write_file", path="kit.b64", content=as_base64(kit))
        assert written.error is None, written
        decoded = await self.bash("base64 -d kit.b64 > kit && chmod 755 kit && rm kit.b64")
        assert decoded.exec is not None
        assert decoded.exec.exit_code == 0, decoded
        assert same_size(self.workspace / "kit", kit), "the kit did not arrive whole"


def as_base64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def same_size(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size


@asynccontextmanager
async def leased(server: Server, client: SlotServerClient, slot: int) -> AsyncIterator[Lease]:
    """A fresh lease of ``slot``; reset (every process of it ended) however the block ends, and
    the reset must succeed."""
    epoch = server.next_epoch(slot)
    try:
        yield Lease(client=client, slot=slot, epoch=epoch, workspace=server.workspace(slot))
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.fail_after(60):
            await client.reset(slot, epoch)
        raise
    with anyio.CancelScope(shield=True), anyio.fail_after(60):
        outcome = await client.reset(slot, epoch)
    # a slot left broken would fail every later test that uses it, for the wrong reason
    assert outcome.ok, f"the reset after the attack failed: {outcome.error}"


# ----------------------------------------------------------------------------- host views


def host_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def argv_of(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def kit_processes(marker: str) -> list[int]:
    """Host pids of kit processes whose arguments include ``marker`` (never the shell that
    started them, whose command line holds the marker inside a longer word)."""
    found = []
    for pid in host_pids():
        args = argv_of(pid)
        if args and args[0].endswith("kit") and marker in args[1:]:
            found.append(pid)
    return found


async def kit_process(marker: str, timeout_s: float = 10.0) -> int:
    """The host pid of the kit process carrying ``marker``, once it appears."""
    with anyio.fail_after(timeout_s):
        while not (found := kit_processes(marker)):  # noqa: ASYNC110 - nothing signals a stranger starting: only /proc tells
            await anyio.sleep(0.02)
    return found[0]


async def start_sleeper(lease: Lease, marker: str) -> int:
    """Leave a process in the lease (``kit sleeper``); its host pid."""
    await lease.bash(f"(./kit sleeper {marker} 30 >/dev/null 2>&1 &)")
    return await kit_process(marker)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (read from the host)."""
    state = status_of(pid).get("State", "")
    return bool(state) and not state.startswith("Z")


def status_of(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as a mapping ({} once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` (all its threads), from ``/proc/PID/stat``."""
    fields = stat_fields(pid)
    assert fields is not None, f"process {pid} ended before its CPU time was read"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mount_types(pid: int) -> dict[str, str]:
    """Mount id to filesystem type, from ``/proc/PID/mountinfo``."""
    types = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        types[fields[0]] = fields[fields.index("-") + 1]
    return types


@attrs.frozen
class OpenFile:
    fd: int
    target: str
    writable: bool
    fstype: str


def open_files(pid: int) -> list[OpenFile]:
    """Every descriptor ``pid`` holds: where its link points, whether it was opened for writing
    (``O_WRONLY`` or ``O_RDWR`` in fdinfo's flags) and the filesystem it lives on."""
    types = mount_types(pid)
    found = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
            info = Path(f"/proc/{pid}/fdinfo/{entry.name}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in info.splitlines() if ":\t" in line)
        flags = int(fields.get("flags", "0").strip(), 8)
        found.append(
            OpenFile(
                fd=int(entry.name),
                target=target,
                writable=flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR),
                fstype=types.get(fields.get("mnt_id", "").strip(), "?"),
            )
        )
    return found


def wait_for(path: Path, timeout_s: float = 10.0) -> None:
    """Wait until ``path`` exists (a kit's "ready" file); fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the attack never signalled that it ran ({path.name} missing)")
        time.sleep(0.02)


def attack_finished(folder: Path, marker: str, timeout_s: float = 10.0) -> bool:
    """Wait for the kit started with ``ready-MARKER`` in ``folder``: ``True`` once it finished
    its attack (``ready-MARKER`` exists), ``False`` when it began (``ready-MARKER.started``) and
    is gone without finishing (stopped mid-attack: killed by a filter, say). Fails the test when
    it never began: an attack that did not run proves nothing."""
    done = folder / f"ready-{marker}"
    began = folder / f"ready-{marker}.started"
    deadline = time.monotonic() + timeout_s
    while not done.exists():
        if began.exists() and not kit_processes(marker) and not done.exists():
            return False
        if time.monotonic() > deadline:
            pytest.fail(f"the attack never signalled that it ran (ready-{marker} missing)")
        time.sleep(0.02)
    return True


def lease_init_of(pid: int) -> int:
    """The host pid of the first process (pid 1) of ``pid``'s pid namespace: a lease's agent."""
    namespace = os.readlink(f"/proc/{pid}/ns/pid")
    for candidate in host_pids():
        try:
            if os.readlink(f"/proc/{candidate}/ns/pid") != namespace:
                continue
        except OSError:
            continue
        if status_of(candidate).get("NSpid", "").split()[-1:] == ["1"]:
            return candidate
    pytest.fail(f"no pid 1 in the pid namespace of {pid}")


def needs_root(why: str) -> None:
    """Skip a test that can only run as root (the attacks it shows are host root's)."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {why}")


def ptrace_restricted() -> bool:
    """Whether Yama keeps a non-root process from tracing (or stealing descriptors from) a
    process that is not its descendant."""
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except OSError:
        return False
    return scope > 0 and os.geteuid() != 0


def end(pids: Iterable[int]) -> None:
    """SIGKILL each pid that still runs (ours only: callers pass pids they found by token)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def end_and_reap(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)
    for stream in (process.stdout, process.stderr, process.stdin):
        if stream is not None:
            stream.close()


def spawn_kit(kit: Path, args: Sequence[str], cwd: Path) -> subprocess.Popen[bytes]:
    """The kit as an unsandboxed host process (a test's control)."""
    return subprocess.Popen(
        [str(kit), *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# ----------------------------------------------------------------------------- keyrings

_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
KEY_SPEC_SESSION_KEYRING = -3
_KEYCTL_GET_KEYRING_ID = 0
_KEYCTL_UNLINK = 9
_KEYCTL_SEARCH = 10
_KEYCTL_INVALIDATE = 21


def keyrings_supported() -> bool:
    return platform.machine() in _SYSCALLS


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _keyctl(*args: int | bytes) -> int:
    keyctl = _SYSCALLS[platform.machine()][1]
    result = int(_libc().syscall(keyctl, *args))
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def own_session_keyring() -> int:
    """This process's session keyring (made if it has none, so its children inherit it)."""
    return _keyctl(_KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1)


def add_session_key(description: str, payload: bytes) -> int:
    add_key = _SYSCALLS[platform.machine()][0]
    result = int(
        _libc().syscall(
            add_key, b"user", description.encode(), payload, len(payload), KEY_SPEC_SESSION_KEYRING
        )
    )
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def find_session_key(description: str) -> int | None:
    try:
        return _keyctl(_KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description.encode(), 0)
    except OSError:
        return None


def remove_key(serial: int) -> None:
    """Invalidate a key this process added (which also takes it out of every keyring)."""
    try:
        _keyctl(_KEYCTL_INVALIDATE, serial)
    except OSError:
        with contextlib.suppress(OSError):
            _keyctl(_KEYCTL_UNLINK, serial, KEY_SPEC_SESSION_KEYRING)
