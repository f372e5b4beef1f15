"""The slot runtime: N slots, one sandbox per slot started on first use, and the slot tools.

This is the slot server without its HTTP face. It owns N workspaces under a root directory and
runs ``ExecuteCall`` values in them:

- ``bash`` is one ``/bin/sh -c`` per call, forked by the slot's exec agent inside the slot's
  bubblewrap sandbox; ``bash_stateful`` and ``tmux`` use one persistent tmux session per slot in
  the same sandbox; ``read_file`` and ``write_file`` run here, confined by ``Workspace``.
- A server run as root runs slot ``i``'s sandbox as host uid/gid ``slot_uid_base + i`` (never as
  root; ``slot_ids``), gives it the slot's workspace and stages what the sandbox binds from
  private places as world-readable copies under ``root/runtime``; every lease also gets the
  kernel masks, its own session keyring (and network namespace when network is off), and the
  seccomp filter this server compiled once at start (``seccomp``). Replies over the channel are
  capped (``reply_cap``) and checked; one that is not a reply ends the lease.
- A slot's sandbox (bubblewrap, started on the slot's first command) runs the slot's *keeper* (the
  compiled ``slot_helper.c`` when the host can build it, else ``exec_agent.keep``; see
  ``RuntimeConfig.slot_helper``), which stays for the life of the server. Each lease gets its own
  exec agent from the keeper: a fork that enters new pid, mount, ipc and uts namespaces, mounts a
  fresh ``/proc``, ``/tmp`` and ``/dev/shm``, drops every capability and then serves the lease's
  calls over its own socket. Starting a lease is therefore one fork, not a new sandbox and a new
  interpreter. Background processes survive between the calls of one lease; reset ends the lease
  (its pid namespace takes every process with it, tmux included; the keeper waits until the kernel
  has reaped them, and the slot's cgroup, when there is one, must hold nothing but the keeper's
  own processes), then wipes the workspace. A reset that cannot prove this reports ``ok=False``
  and marks the slot broken: the pool quarantines it. A keeper that fails or stops answering is
  killed with its whole sandbox and started again on the next lease.
- Without bubblewrap (and without ``require_sandbox``) there is no keeper: each lease starts a
  bare agent process, and reset kills its process group (and its cgroup, when there is one).
- Calls for one slot run one at a time in arrival order (a chain of futures built synchronously
  as requests arrive, so no await can reorder them); different slots run in parallel.
- ``(epoch, call_id)`` is remembered per slot: a repeat gets the first call's result, also while
  the first is still running. A call whose epoch a reset has retired is refused as stale.
- Policy is the server's: the model's ``allow_network`` or ``require_sandbox`` arguments are
  ignored and its ``timeout`` may only shorten the limit. With ``require_sandbox`` and no usable
  bubblewrap every call fails closed as ``INFRA_ERROR`` naming the reason; without it commands
  run bare and their ``ExecReport`` says ``sandboxed=False``.
- A call's failure is its result, never an exception: unknown tools and bad arguments are
  ``REJECTED`` with ``reason @ $.path``; a sandbox that dies mid-call is ``INFRA_ERROR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip  # noqa: F401 - loaded now: the archive runs as the slot, which cannot read /root
import json
import marshal
import os
import shutil
import signal
import socket
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import attrs

from trajcore.adapters.sandbox.exec_agent import encode_request
from trajcore.adapters.sandbox.limits import (
    CgroupPlan,
    SlotCgroup,
    detect_cgroups,
    remove_parent,
    rlimits_for,
)
from trajcore.adapters.sandbox.native_helper import (
    SHIPPED_SLOT_HELPER,
    NativeBuildError,
    build_slot_helper,
)
from trajcore.adapters.sandbox.seccomp import SeccompUnavailable, compile_filter
from trajcore.adapters.sandbox.slot_ids import (
    shared_python,
    stage_file,
    stage_python,
    unmapped,
    unreachable,
)
from trajcore.adapters.sandbox.workspace import Workspace
from trajcore.domain.errors import ConfigError, ToolArgumentError, UnknownSlot
from trajcore.domain.messages import JSON, ExecReport, ToolOutcome, ToolResult, ToolSpec
from trajcore.domain.sandbox_policy import (
    DEFAULT_SLOT_UID_BASE,
    KEEPER_CAPABILITIES,
    MASKED_PATHS,
    READ_ONLY_PATHS,
    SANDBOX_TMP,
    SECCOMP_RULES,
    SLOT_HELPERS,
    Bind,
    SandboxPolicy,
    bwrap_argv,
    check_slot_uid_range,
    clamp_timeout,
    private_tmp_binds,
)
from trajcore.domain.slot_protocol import (
    PROTOCOL_VERSION,
    SLOT_TOOL_SPECS,
    ArtifactArchive,
    ArtifactFile,
    Capabilities,
    DirectoryListing,
    ExecuteCall,
    Health,
    ResetResult,
    SlotInfo,
    SlotListing,
)

__all__ = ["AGENT_SOURCE", "RuntimeConfig", "SlotRuntime"]

AGENT_SOURCE = Path(__file__).with_name("exec_agent.py").read_text(encoding="utf-8")
# The agent as a code object, for a sandbox that runs this very interpreter: loading it is
# ~50 us, compiling the source ~2 ms of every sandbox start. Docstrings and asserts stripped.
_AGENT_CODE = marshal.dumps(compile(AGENT_SOURCE, "<trajcore exec agent>", "exec", optimize=2))
_AGENT_BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv[1])))"
_HEADER = struct.Struct(">I")
_SANDBOX_STATE = "/tmp/.trajcore"  # noqa: S108 - inside the sandbox's private tmpfs
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in SLOT_TOOL_SPECS}
_EXEC_TOOLS = frozenset({"bash", "bash_stateful", "tmux"})
# Where the compiled helper appears in every sandbox: a fixed path outside the private /tmp, so
# a helper cached anywhere on the host (under /tmp, under a private home) is bound the same way.
HELPER_PATH = "/run/trajcore/slot-helper"
# The sandbox's first program waits for a line on its stdout (the read end of a pipe) while the
# server moves it into the slot's cgroup (a process started as the slot's uid cannot move itself
# there), then starts bubblewrap with stdout on /dev/null.
_CGROUP_GATE = 'read -r _ <&1 || exit 125; exec "$@" >/dev/null'


def _default_python() -> str:
    return os.path.realpath(sys.executable)


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """How a slot server runs its slots.

    Attributes:
        slots: How many slots (workspaces ``root/slots/0 .. slots-1``).
        root: The server's directory: workspaces and per-slot state live under it.
        policy: The sandbox policy every slot gets.
        bwrap: The bubblewrap executable.
        python: The interpreter that runs the exec agent (bound into the sandbox if needed).
        agent_grace_s: Extra time an agent gets past a call's limit before it counts as hung.
        start_timeout_s: How long a sandbox may take to become ready.
        reset_timeout_s: How long a reset may take before it counts as failed.
        dedup_per_slot: Results remembered per slot for ``call_id`` repeats.
        use_cgroups: Try per-slot cgroups before falling back to rlimits.
        slot_helper: What runs a sandboxed slot's keeper and its leases' agents: ``"native"``
            (the compiled helper, ``slot_helper.c``, built with the host's C compiler on first
            use; the server does not start without it), ``"python"`` (``exec_agent.py``), or
            ``"auto"`` (native when it builds and works in a sandbox, else Python, and
            ``health()`` says why). Unsandboxed slots always use the Python agent.
        slot_uid_base: When the server runs as root, slot ``i``'s sandbox runs as host uid and
            gid ``slot_uid_base + i`` (``slot_ids``); a server that is not root runs every
            slot as itself.
    """

    slots: int = attrs.field(validator=attrs.validators.gt(0))
    root: Path
    policy: SandboxPolicy = attrs.field(factory=SandboxPolicy)
    bwrap: str = "bwrap"
    python: str = attrs.field(factory=_default_python)
    agent_grace_s: float = 5.0
    start_timeout_s: float = 10.0
    reset_timeout_s: float = 15.0
    dedup_per_slot: int = 4096
    use_cgroups: bool = True
    slot_helper: str = attrs.field(default="auto", validator=attrs.validators.in_(SLOT_HELPERS))
    slot_uid_base: int = DEFAULT_SLOT_UID_BASE

    def __attrs_post_init__(self) -> None:
        check_slot_uid_range("slot_uid_base", self.slot_uid_base, self.slots)


class _AgentLost(Exception):
    """The slot's agent ended or stopped answering."""


# The largest request a server sends an agent (the agents refuse larger ones: slot_helper.c's
# MAX_REQUEST, exec_agent's _MAX_REQUEST).
MAX_REQUEST_BYTES = 16 << 20


def reply_cap(policy: SandboxPolicy) -> int:
    """The largest reply an agent may send: two streams of at most ``output_cap_bytes`` each (a
    tmux capture: at most 1 MiB), every byte escaped to at most six in JSON, and room for the
    rest. A length above it is refused before anything is allocated for it."""
    return 12 * max(policy.output_cap_bytes, 1 << 20) + (1 << 16)


_REPLY_TYPES: dict[str, tuple[type, ...]] = {
    "exit": (int, type(None)),
    "signal": (int, type(None)),
    "stdout": (str,),
    "stderr": (str,),
    "stdout_dropped": (int,),
    "stderr_dropped": (int,),
    "timed_out": (bool,),
    "duration": (int, float),
    "error": (str,),
}


def _check_reply(reply: object) -> dict[str, JSON]:
    """``reply`` when it is what an agent answers a request with, else ``_AgentLost``: a reply
    that does not parse as one never becomes a result."""
    if not isinstance(reply, dict) or "exit" not in reply:
        raise _AgentLost(f"the slot's agent sent a malformed reply ({type(reply).__name__})")
    for key, value in reply.items():
        kinds = _REPLY_TYPES.get(key)
        if kinds is None or not isinstance(value, kinds):
            raise _AgentLost(f"the slot's agent sent a malformed reply (field {key!r})")
        if isinstance(value, bool) and bool not in kinds:
            raise _AgentLost(f"the slot's agent sent a malformed reply (field {key!r})")
    return cast("dict[str, JSON]", reply)


@attrs.define(eq=False)
class _Agent:
    """One lease's exec agent: the channel to it, and (for a bare agent) its own process.

    ``cap``: the largest reply it may send (``reply_cap``); a length above it, or a reply that
    does not parse as one, ends the lease (``_AgentLost``), never becomes a result."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    sandboxed: bool
    started_s: float
    pid: int | None
    cap: int
    process: asyncio.subprocess.Process | None = None

    async def _frame(self) -> bytes:
        size = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))[0]
        if size > self.cap:
            raise _AgentLost(
                f"the slot's agent sent a frame of {size} bytes, over the cap of {self.cap}"
            )
        return await self.reader.readexactly(size)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.returncode is None
        return not self.reader.at_eof()

    def close_channel(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.close()

    async def greeting(self, timeout_s: float) -> dict[str, JSON]:
        """The agent's first message (``{"ready": true, ...}``). Raises ``_AgentLost``."""
        try:
            async with asyncio.timeout(timeout_s):
                hello = json.loads(await self._frame())
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            raise _AgentLost("the agent ended before it was ready") from None
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            detail = hello.get("error") if isinstance(hello, dict) else None
            raise _AgentLost(str(detail) if detail else f"unexpected greeting {hello!r}")
        return cast("dict[str, JSON]", hello)

    async def request(self, payload: bytes, timeout_s: float) -> dict[str, JSON]:
        """One request (made by ``exec_agent.encode_request``) and its reply. The reply is
        JSON: bytes from inside the sandbox are not trusted."""
        try:
            self.writer.write(_HEADER.pack(len(payload)) + payload)
            await self.writer.drain()
            async with asyncio.timeout(timeout_s):
                body = await self._frame()
        except (OSError, asyncio.IncompleteReadError) as error:
            raise _AgentLost(f"the slot's sandbox ended ({type(error).__name__})") from None
        except TimeoutError:
            raise _AgentLost(f"the slot's agent did not answer within {timeout_s:.1f} s") from None
        try:
            reply = json.loads(body)
        except ValueError:
            raise _AgentLost("the slot's agent sent a reply that is not JSON") from None
        return _check_reply(reply)


@attrs.define(eq=False)
class _Keeper:
    """A slot's long-lived sandbox and the keeper in it, which starts and ends its leases.

    ``pids`` are the processes of the slot's cgroup once the keeper was ready (bubblewrap and
    the keeper): a slot whose cgroup holds anything else after a lease ended is not clean.
    """

    process: asyncio.subprocess.Process
    control: socket.socket
    pids: frozenset[int] = frozenset()
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)

    def alive(self) -> bool:
        return self.process.returncode is None

    async def receive(self, timeout_s: float) -> dict[str, JSON]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                packet = await loop.sock_recv(self.control, 1 << 16)
        except OSError as error:
            raise _AgentLost(f"the slot's keeper is gone ({type(error).__name__})") from None
        except TimeoutError:
            raise _AgentLost(f"the slot's keeper did not answer within {timeout_s:.1f} s") from None
        if not packet:
            raise _AgentLost("the slot's keeper ended")
        try:
            reply = json.loads(packet)
        except ValueError:
            raise _AgentLost("the slot's keeper sent malformed JSON") from None
        if not isinstance(reply, dict):
            raise _AgentLost(f"the slot's keeper sent {reply!r}")
        failure = reply.get("error")
        if isinstance(failure, str):
            raise _AgentLost(failure)
        return cast("dict[str, JSON]", reply)

    async def ask(
        self, op: str, timeout_s: float, channel: socket.socket | None = None
    ) -> dict[str, JSON]:
        """Send one request (``lease`` or ``end``; with ``channel`` passed along) and return the
        answer. Raises ``_AgentLost`` when the keeper is gone, answers an error, or is late."""
        payload = op.encode()
        async with self.lock:
            try:
                if channel is None:
                    self.control.send(payload)
                else:
                    socket.send_fds(self.control, [payload], [channel.fileno()])
            except OSError as error:
                raise _AgentLost(f"the slot's keeper is gone ({type(error).__name__})") from None
            return await self.receive(timeout_s)


@attrs.define(eq=False)
class _Slot:
    index: int
    workspace: Workspace
    state_dir: Path
    cgroup: SlotCgroup | None
    agent: _Agent | None = None
    keeper: _Keeper | None = None
    tail: asyncio.Future[None] | None = None
    retired_epoch: int = 0
    results: OrderedDict[tuple[int, str], asyncio.Future[ToolResult]] = attrs.field(
        factory=OrderedDict
    )
    busy: bool = False
    calls_run: int = 0
    broken: str | None = None
    sandbox_start_s: float | None = None
    # the lease epoch whose calls started the current (or last) agent: an agent lost during an
    # epoch is not replaced silently, since the lease's processes, shell and /tmp went with it
    agent_epoch: int | None = None


def _result(
    call: ExecuteCall, outcome: ToolOutcome, content: str, *, error: str | None = None,
    exec_report: ExecReport | None = None,
) -> ToolResult:  # fmt: skip
    return ToolResult(
        call_id=call.call_id,
        name=call.tool,
        outcome=outcome,
        content=content,
        error=error,
        exec=exec_report,
    )


def _failure(
    call: ExecuteCall, outcome: ToolOutcome, reason: str, exec_report: ExecReport | None = None
) -> ToolResult:
    return _result(call, outcome, f"Error: {reason}", error=reason, exec_report=exec_report)


@attrs.define(eq=False)
class SlotRuntime:
    """N slots and their sandboxes. Create, ``await start()``, use, ``await aclose()``."""

    config: RuntimeConfig
    capabilities: Capabilities = attrs.field(
        init=False,
        factory=lambda: Capabilities(
            bwrap=False, tmux=False, network_isolation=False, cgroups=False
        ),
    )
    sandboxed: bool = attrs.field(init=False, default=False)
    _slots: list[_Slot] = attrs.field(init=False, factory=list)
    _tasks: set[asyncio.Task[None]] = attrs.field(init=False, factory=set)
    _cgroups: CgroupPlan | None = attrs.field(init=False, default=None)
    _symlinks: dict[str, str] = attrs.field(init=False, factory=dict)
    _closed: bool = attrs.field(init=False, default=False)
    _agent_program: list[str] = attrs.field(init=False, factory=list)
    # the compiled slot helper in use (keeper and lease agent), or None for the Python ones
    _native: Path | None = attrs.field(init=False, default=None)
    # where that helper came from: "shipped" (with this install) or "built at start"
    _native_origin: str = attrs.field(init=False, default="")
    # the first slot uid when slots run as their own uids (the server is root), else None
    _uid_base: int | None = attrs.field(init=False, default=None)
    # what every sandbox binds for the Python agent (the interpreter's installation, or a
    # staged copy of it bound at the same place)
    _python_binds: list[str | Bind] = attrs.field(init=False, factory=list)
    # every lease's seccomp filter (classic BPF), or None when none can be built (and why)
    _seccomp: bytes | None = attrs.field(init=False, default=None)
    _seccomp_problem: str | None = attrs.field(init=False, default=None)
    # what health's detail says about this host besides its problems
    _notes: list[str] = attrs.field(init=False, factory=list)

    # ------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Create the workspaces and probe what the host can do. Never raises for a missing
        capability (``health()`` reports it); raises ``OSError`` when ``root`` is unusable."""
        root = self.config.root
        (root / "slots").mkdir(parents=True, exist_ok=True)
        (root / "state").mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self._uid_base = self.config.slot_uid_base
            uid_map = Path("/proc/self/uid_map").read_text()  # noqa: ASYNC240 - one small read
            problem = unmapped(self._uid_base, self.config.slots, uid_map)
            if problem is not None:
                raise ConfigError(
                    "slot_uid_base", f"{problem}: choose a base inside this namespace's range"
                )
            blocked = unreachable(root / "slots")
            if blocked is not None:
                raise ConfigError(
                    "root",
                    f"slots run as uids {self._uid_base}.. and cannot reach their workspaces "
                    f"under {root / 'slots'}: {blocked} is not searchable by others",
                )
        for path in self.config.policy.system_paths:
            if os.path.islink(path):  # noqa: ASYNC240 - a handful of lstat calls at start
                self._symlinks[path] = os.readlink(path)
        if self.config.use_cgroups:
            self._cgroups = await asyncio.to_thread(
                detect_cgroups, f"trajcore-{os.getpid()}-{root.name}"
            )
        self._agent_program = _agent_program(self.config.python)
        native_problem: str | None = None
        if self.config.slot_helper != "python":
            try:
                self._native = await asyncio.to_thread(build_slot_helper)
                self._native_origin = (
                    "shipped" if self._native == SHIPPED_SLOT_HELPER else "built at start"
                )
            except NativeBuildError as error:
                native_problem = str(error)
        self._python_binds = await asyncio.to_thread(self._stage_python)
        try:
            self._seccomp = await asyncio.to_thread(compile_filter, SECCOMP_RULES)
        except SeccompUnavailable as error:
            self._seccomp_problem = str(error)
        if self._native is not None and self._uid_base is not None:
            self._native = await asyncio.to_thread(
                stage_file, self._native, self._runtime_dir() / "slot-helper"
            )
        self.capabilities = await self._probe(native_problem)
        if self.config.slot_helper == "native" and self.capabilities.slot_helper != "native":
            raise ConfigError(
                "slot_helper",
                f"the compiled slot helper is unusable here: {self.capabilities.detail}",
            )
        self.sandboxed = self.capabilities.bwrap
        for index in range(self.config.slots):
            cgroup = SlotCgroup(self._cgroups, f"slot-{index}") if self._cgroups else None
            # The file tools run with the slot's file-system ids (``Workspace.owner``): what
            # they create belongs to the slot, and every permission check is the slot's.
            slot = _Slot(
                index=index,
                workspace=Workspace(root / "slots" / str(index), owner=self._ids(index)),
                state_dir=root / "state" / str(index),
                cgroup=cgroup,
            )
            self._own_workspace(slot)
            self._slots.append(slot)
        # Each slot's cgroup is made once, here, off the first call's path, and kept (empty)
        # across resets; a slot whose cgroup cannot be made now tries again when first used.
        cgroups = [slot.cgroup for slot in self._slots if slot.cgroup is not None]
        if cgroups:
            await asyncio.to_thread(_prepare_cgroups, cgroups, self.config.policy)

    def _ids(self, index: int) -> tuple[int, int] | None:
        """The host uid and gid slot ``index``'s sandbox runs as, or ``None``: the server's."""
        if self._uid_base is None:
            return None
        uid = self._uid_base + max(index, 0)
        return uid, uid

    def _own_workspace(self, slot: _Slot) -> None:
        """Give the slot's workspace to the slot's uid (mode 0700: no other slot reads it)."""
        ids = self._ids(slot.index)
        if ids is not None:
            os.chown(slot.workspace.root, *ids)
            os.chmod(slot.workspace.root, 0o700)

    def _runtime_dir(self) -> Path:
        folder = self.config.root / "runtime"
        folder.mkdir(mode=0o755, exist_ok=True)
        return folder

    def _stage_python(self) -> list[str | Bind]:
        """The binds that give a sandbox the agent's interpreter: its installation where every
        slot uid can read it, else a staged copy of it bound at the same place."""
        python = Path(self.config.python)
        prefix = Path(os.path.realpath(sys.base_prefix))
        plain: list[str | Bind] = [str(prefix), str(python.parent)]
        if self._uid_base is None or unreachable(python) is None:
            return plain
        if not python.is_relative_to(prefix):
            return plain  # the probe reports that the slots cannot start it
        try:
            staged = shared_python(prefix, python)
        except OSError as error:
            self._notes.append(
                f"the sandbox's Python has its standard library only, copied ({error})"
            )
            staged = stage_python(prefix, python, self._runtime_dir() / "python")
        return [Bind(source=str(staged), dest=str(prefix))]

    async def _probe(self, native_problem: str | None) -> Capabilities:
        policy = self.config.policy
        probe_dir = self.config.root / "state" / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        probe_ids = self._ids(0)
        if probe_ids is not None:
            os.chown(probe_dir, *probe_ids)
        problems: list[str] = list(self._notes)
        if self._seccomp_problem is not None:
            problems.append(f"leases run without a seccomp filter: {self._seccomp_problem}")
        if self._uid_base is None:
            problems.append(
                f"the slot server is not root: every slot runs as its uid {os.geteuid()}"
            )
        if native_problem is not None:
            problems.append(f"the compiled slot helper is not in use: {native_problem}")
        bwrap_ok = net_ok = False
        if shutil.which(self.config.bwrap) is None:
            problems.append(f"bubblewrap ({self.config.bwrap}) is not installed")
        else:
            isolated = attrs.evolve(policy, allow_network=False)
            net_ok, detail = await _run_ok(
                self._sandbox_argv(isolated, probe_dir, ["/bin/true"]), probe_ids
            )
            if not net_ok:
                problems.append(f"bwrap with a network namespace failed: {detail}")
            if policy.allow_network:
                bwrap_ok, detail = await _run_ok(
                    self._sandbox_argv(policy, probe_dir, ["/bin/true"]), probe_ids
                )
                if not bwrap_ok:
                    problems.append(f"bwrap failed: {detail}")
            else:
                bwrap_ok = net_ok
            if bwrap_ok and self._seccomp is None and policy.require_sandbox:
                bwrap_ok = net_ok = False  # fails closed: a sandbox needs its filter
            if bwrap_ok:
                problem = await self._probe_lease(probe_dir)
                if problem is not None and self._native is not None:
                    problems.append(f"the compiled slot helper failed in a lease: {problem}")
                    self._native = None  # the Python agent gets its own chance
                    problem = await self._probe_lease(probe_dir)
                if problem is not None:
                    bwrap_ok = net_ok = False
                    problems.append(f"a lease in the slot sandbox failed: {problem}")
        tmux_ok = False
        tmux = shutil.which("tmux")
        if tmux is None:
            problems.append("tmux is not installed")
        else:
            argv = [tmux, "-V"]
            tmux_ok, detail = await _run_ok(
                self._sandbox_argv(policy, probe_dir, argv) if bwrap_ok else argv,
                probe_ids if bwrap_ok else None,
            )
            if not tmux_ok:
                problems.append(f"tmux failed: {detail}")
        if self._cgroups is None and self.config.use_cgroups:
            problems.append("no writable cgroup hierarchy: per-process rlimits only")
        return Capabilities(
            bwrap=bwrap_ok,
            tmux=tmux_ok,
            network_isolation=net_ok,
            cgroups=self._cgroups is not None,
            slot_helper="native" if bwrap_ok and self._native is not None else "python",
            slot_helper_origin=self._native_origin if bwrap_ok and self._native is not None else "",
            detail="; ".join(problems),
        )

    async def _probe_lease(self, probe_dir: Path) -> str | None:
        """Start a keeper and one lease in ``probe_dir`` and check, from inside the lease, that
        it holds no capability and is its pid namespace's first user. ``None`` when it works,
        else what failed: a host where this fails must not count as sandboxed."""
        probe = _Slot(
            index=-1,
            workspace=Workspace(probe_dir, owner=self._ids(-1)),
            state_dir=probe_dir / "state",
            cgroup=None,
        )
        script = (
            "while read -r key value; do case $key in Cap*|Seccomp:) echo $key $value;; esac; done"
        )
        try:
            agent = await self._lease_agent(probe, started=time.monotonic())
            command = f"{script} </proc/self/status; echo $$"
            reply = await agent.request(
                encode_request(["exec", "10.0", "4096", "/bin/sh", "-c", command]),
                10.0 + self.config.agent_grace_s,
            )
        except _AgentLost as error:
            return str(error)
        finally:
            await self._stop_agent(probe)
            await self._stop_keeper(probe)
        lines = str(reply.get("stdout") or "").split()
        capabilities = dict(zip(lines[:-1:2], lines[1:-1:2], strict=True))
        seccomp = capabilities.pop("Seccomp:", None)
        if self._seccomp is not None and seccomp != "2":
            return f"a lease runs without its seccomp filter (Seccomp: {seccomp})"
        held = {key: value for key, value in capabilities.items() if int(value, 16) != 0}
        if len(capabilities) < 4 or held:
            return f"a lease kept capabilities {held or capabilities}"
        if not lines or not lines[-1].isdigit() or int(lines[-1]) > 8:
            return f"a lease's shell is not in a fresh pid namespace (pid {lines[-1:]})"
        return None

    def _sandbox_argv(
        self, policy: SandboxPolicy, workspace: Path, command: list[str],
        keep_capabilities: Sequence[str] = (),
    ) -> list[str]:  # fmt: skip
        return bwrap_argv(
            policy,
            workspace=str(workspace),
            command=command,
            bwrap=self.config.bwrap,
            host_symlinks=self._symlinks,
            rebind=self._rebind(),
            keep_capabilities=keep_capabilities,
        )

    def _rebind(self) -> list[str | Bind]:
        paths = list(self._python_binds)
        if self._native is not None:
            paths.append(Bind(source=str(self._native), dest=HELPER_PATH))
        return paths

    async def aclose(self) -> None:
        """End every sandbox and pending call. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for slot in self._slots:
            await self._stop_agent(slot)
            await self._stop_keeper(slot)
            if slot.cgroup is not None:
                with contextlib.suppress(OSError):
                    slot.cgroup.remove()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._cgroups is not None:
            remove_parent(self._cgroups)

    # ------------------------------------------------------------------------- queries

    def health(self) -> Health:
        """The server's health and capabilities."""
        policy = self.config.policy
        return Health(
            protocol_version=PROTOCOL_VERSION,
            slots=self.config.slots,
            capabilities=self.capabilities,
            sandboxed=self.sandboxed,
            allow_network=policy.allow_network,
            require_sandbox=policy.require_sandbox,
            min_timeout_s=policy.min_timeout_s,
            max_timeout_s=policy.max_timeout_s,
        )

    def listing(self) -> SlotListing:
        """Every slot's state."""
        return SlotListing(
            slots=tuple(
                SlotInfo(
                    index=slot.index,
                    sandbox_running=slot.agent is not None,
                    busy=slot.busy,
                    retired_epoch=slot.retired_epoch,
                    calls_run=slot.calls_run,
                    broken=slot.broken,
                    sandbox_pid=_sandbox_pid(slot),
                    sandbox_start_s=slot.sandbox_start_s,
                )
                for slot in self._slots
            )
        )

    def slot(self, index: int) -> _Slot:
        """The slot at ``index``. Raises ``UnknownSlot``."""
        if not 0 <= index < len(self._slots):
            raise UnknownSlot(
                f"slot {index} does not exist; this server has 0..{len(self._slots) - 1}"
            )
        return self._slots[index]

    # ------------------------------------------------------------------------- execute

    async def execute(self, calls: Sequence[ExecuteCall]) -> list[ToolResult]:
        """Run a batch; one result per call, in order. Never raises for a call's failure."""
        futures = [self._submit(call) for call in calls]
        return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))

    def _submit(self, call: ExecuteCall) -> asyncio.Future[ToolResult]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[ToolResult] = loop.create_future()
        if self._closed:
            done.set_result(_failure(call, ToolOutcome.INFRA_ERROR, "the slot server is closing"))
            return done
        if not 0 <= call.slot < len(self._slots):
            reason = f"slot {call.slot} does not exist @ $.slot"
            done.set_result(_failure(call, ToolOutcome.REJECTED, reason))
            return done
        slot = self._slots[call.slot]
        key = (call.epoch, call.call_id)
        seen = slot.results.get(key)
        if seen is not None:
            return seen
        if call.epoch <= slot.retired_epoch:
            done.set_result(_stale(call, slot.retired_epoch))
            return done
        slot.results[key] = done
        while len(slot.results) > self.config.dedup_per_slot:
            slot.results.popitem(last=False)
        previous = slot.tail
        turn: asyncio.Future[None] = loop.create_future()
        slot.tail = turn
        task = loop.create_task(self._run_in_turn(slot, call, previous, done, turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return done

    async def _run_in_turn(
        self,
        slot: _Slot,
        call: ExecuteCall,
        previous: asyncio.Future[None] | None,
        done: asyncio.Future[ToolResult],
        turn: asyncio.Future[None],
    ) -> None:
        result: ToolResult
        try:
            if previous is not None and not previous.done():
                await previous
            if call.epoch <= slot.retired_epoch:
                result = _stale(call, slot.retired_epoch)
            elif slot.broken is not None:
                result = _failure(call, ToolOutcome.INFRA_ERROR, f"slot is broken: {slot.broken}")
            else:
                slot.busy = True
                slot.calls_run += 1
                result = await self._run_call(slot, call)
        except asyncio.CancelledError:
            result = _failure(call, ToolOutcome.INFRA_ERROR, "the slot server is closing")
        except Exception as error:  # noqa: BLE001 - every call gets a result, whatever failed
            reason = f"slot server fault: {type(error).__name__}: {error}"
            result = _failure(call, ToolOutcome.INFRA_ERROR, reason)
        finally:
            slot.busy = False
            if not turn.done():
                turn.set_result(None)
        if not done.done():
            done.set_result(result)

    async def _run_call(self, slot: _Slot, call: ExecuteCall) -> ToolResult:
        spec = _TOOLS.get(call.tool)
        if spec is None:
            known = ", ".join(_TOOLS)
            return _failure(
                call,
                ToolOutcome.REJECTED,
                f"unknown tool {call.tool!r} (this slot runs {known}) @ $.tool",
            )
        problems = spec.validate_arguments(call.arguments)
        if problems:
            return _failure(call, ToolOutcome.REJECTED, f"{problems[0]} (tool {call.tool})")
        policy = self.config.policy
        if policy.require_sandbox and not self.sandboxed:
            reason = f"a sandbox is required and bubblewrap is unusable: {self.capabilities.detail}"
            return _failure(call, ToolOutcome.INFRA_ERROR, reason)
        timeout = clamp_timeout(policy, call.timeout_s, call.arguments.get("timeout"))
        if call.tool == "read_file":
            return await self._read_file(slot, call)
        if call.tool == "write_file":
            return await self._write_file(slot, call)
        return await self._run_command(slot, call, timeout)

    # ------------------------------------------------------------------------- commands

    async def _run_command(self, slot: _Slot, call: ExecuteCall, limit_s: float) -> ToolResult:
        timeout = limit_s
        cap = self.config.policy.output_cap_bytes
        args = call.arguments
        fields: list[str]
        if call.tool == "bash":
            fields = ["exec", repr(timeout), str(cap), "/bin/sh", "-c", str(args["command"])]
        elif call.tool == "bash_stateful":
            fields = ["stateful", repr(timeout), str(cap), str(args["command"])]
        else:
            keys = args["keys"]
            wait = args.get("wait_s", 0.3)
            lines = args.get("lines", 50)
            fields = [
                "tmux",
                "1" if args.get("literal", True) is True else "0",
                "1" if args.get("enter", True) is True else "0",
                repr(min(max(float(wait), 0.0), timeout) if isinstance(wait, int | float) else 0.3),
                str(min(max(int(lines), 1), 10_000) if isinstance(lines, int) else 50),
                *([keys] if isinstance(keys, str) else [str(k) for k in cast("list[JSON]", keys)]),
            ]
        try:
            payload = encode_request(fields)
        except UnicodeEncodeError as error:
            name = "keys" if call.tool == "tmux" else "command"
            reason = f"not valid Unicode text (a lone surrogate at {error.start}) @ $.{name}"
            return _failure(call, ToolOutcome.REJECTED, reason)
        if len(payload) > MAX_REQUEST_BYTES:
            name = "keys" if call.tool == "tmux" else "command"
            reason = f"{len(payload)} bytes, over the limit of {MAX_REQUEST_BYTES} @ $.{name}"
            return _failure(call, ToolOutcome.REJECTED, reason)
        if slot.agent_epoch == call.epoch and (slot.agent is None or not slot.agent.alive()):
            if slot.agent is not None:
                await self._stop_agent(slot)
            reason = (
                f"the slot's sandbox ended during lease epoch {call.epoch}, and its processes, "
                "shell and /tmp with it; reset the slot to start a new lease"
            )
            return _failure(call, ToolOutcome.INFRA_ERROR, reason)
        try:
            agent = await self._ensure_agent(slot)
        except _AgentLost as error:
            return _failure(
                call, ToolOutcome.INFRA_ERROR, f"the slot's sandbox did not start: {error}"
            )
        slot.agent_epoch = call.epoch
        try:
            reply = await agent.request(payload, timeout + self.config.agent_grace_s)
        except _AgentLost as error:
            await self._stop_agent(slot)
            return _failure(call, ToolOutcome.INFRA_ERROR, str(error))
        return _command_result(call, reply, timeout, sandboxed=agent.sandboxed)

    async def _ensure_agent(self, slot: _Slot) -> _Agent:
        if slot.agent is not None and slot.agent.alive():
            return slot.agent
        if slot.agent is not None:
            await self._stop_agent(slot)
        started = time.monotonic()
        if self.sandboxed:
            agent = await self._lease_agent(slot, started=started)
        else:
            agent = await self._bare_agent(slot, started=started)
        slot.sandbox_start_s = time.monotonic() - started
        return agent

    def _agent_config(self, slot: _Slot, *, sandboxed: bool) -> dict[str, JSON]:
        policy = self.config.policy
        cgroup = slot.cgroup
        has_memory = (
            cgroup is not None
            and self._cgroups is not None
            and (self._cgroups.memory_parent is not None)
        )
        limits: dict[str, JSON] = dict(
            rlimits_for(policy, cgroup_pids=cgroup is not None, cgroup_memory=has_memory)
        )
        if sandboxed:
            return {"workspace": policy.workspace_path, "state_dir": _SANDBOX_STATE,
                    "limits": limits}  # fmt: skip
        slot.state_dir.mkdir(parents=True, exist_ok=True)
        return {"workspace": str(slot.workspace.root), "state_dir": str(slot.state_dir),
                "limits": limits}  # fmt: skip

    def _environment(self, workspace: str, tmp: str) -> dict[str, str]:
        return {
            "PATH": _PATH,
            "HOME": workspace,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "TMPDIR": tmp,
        }

    def _create_cgroup(self, slot: _Slot) -> None:
        if slot.cgroup is not None:
            try:
                slot.cgroup.create(self.config.policy)
            except OSError as error:
                raise _AgentLost(f"cannot create the slot's cgroup: {error}") from None

    async def _bare_agent(self, slot: _Slot, *, started: float) -> _Agent:
        """A lease's agent as its own process, outside any sandbox (no bubblewrap here)."""
        self._create_cgroup(slot)
        config = self._agent_config(slot, sandboxed=False)
        argv = [self.config.python, "-I", "-S", "-c", *self._agent_program,
                marshal.dumps(config).hex()]  # fmt: skip
        if slot.cgroup is not None:
            argv = slot.cgroup.enter_prefix() + argv
        environment = self._environment(str(config["workspace"]), str(config["state_dir"]))
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        assert process.stdout is not None
        assert process.stdin is not None
        agent = _Agent(
            reader=process.stdout, writer=process.stdin, sandboxed=False, started_s=started,
            pid=process.pid, process=process, cap=reply_cap(self.config.policy),
        )  # fmt: skip
        slot.agent = agent
        try:
            await agent.greeting(self.config.start_timeout_s)
        except _AgentLost as error:
            detail = await _stderr_of(process)
            await self._stop_agent(slot)
            raise _AgentLost(detail or str(error)) from None
        return agent

    async def _ensure_keeper(self, slot: _Slot) -> _Keeper:
        """The slot's keeper, started (in a new sandbox) when there is none or it died."""
        if slot.keeper is not None and slot.keeper.alive():
            return slot.keeper
        await self._stop_keeper(slot)
        self._create_cgroup(slot)
        policy = self.config.policy
        config = self._agent_config(slot, sandboxed=True)
        config["keeper"] = True
        config["tmp"] = SANDBOX_TMP
        carry = private_tmp_binds(policy, rebind=self._rebind())
        config["carry"] = [[path, writable] for path, writable in carry]
        config["own_network"] = not policy.allow_network
        if self._seccomp is not None:
            config["seccomp"] = self._seccomp.hex()
        config["masked"] = list(MASKED_PATHS)
        config["read_only"] = list(READ_ONLY_PATHS)
        inner: list[str]
        if self._native is not None:
            inner = [HELPER_PATH, "keep", "--workspace", policy.workspace_path,
                     "--state-dir", _SANDBOX_STATE, "--tmp", SANDBOX_TMP]  # fmt: skip
            for name, value in cast("dict[str, int]", config["limits"]).items():
                inner += ["--limit", name, str(value)]
            for path, writable in carry:
                inner += ["--carry-rw" if writable else "--carry-ro", path]
            for path in MASKED_PATHS:
                inner += ["--mask", path]
            for path in READ_ONLY_PATHS:
                inner += ["--read-only", path]
            if not policy.allow_network:
                inner.append("--own-network")
            if self._seccomp is not None:
                inner += ["--seccomp", self._seccomp.hex()]
        else:
            inner = [self.config.python, "-I", "-S", "-c", *self._agent_program,
                     marshal.dumps(config).hex()]  # fmt: skip
        argv = self._sandbox_argv(
            policy, slot.workspace.root, inner, keep_capabilities=KEEPER_CAPABILITIES
        )
        keeper = await self._spawn_keeper(slot, argv)
        try:
            await keeper.receive(self.config.start_timeout_s)
        except _AgentLost as error:
            detail = await _stderr_of(keeper.process)
            await self._stop_keeper(slot)
            raise _AgentLost(detail or str(error)) from None
        if slot.cgroup is not None:
            keeper.pids = frozenset(await asyncio.to_thread(slot.cgroup.pids))
        return keeper

    async def _spawn_keeper(self, slot: _Slot, argv: list[str]) -> _Keeper:
        """Start ``argv`` (the slot's bubblewrap) as the slot's uid, inside its cgroup."""
        policy = self.config.policy
        ids = self._ids(slot.index)
        gate: tuple[int, int] | None = None
        if slot.cgroup is not None and ids is None:
            argv = slot.cgroup.enter_prefix() + argv
        elif slot.cgroup is not None:
            gate = os.pipe()
            argv = ["/bin/sh", "-c", _CGROUP_GATE, "slot-cgroup", *argv]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=theirs.fileno(),
                stdout=asyncio.subprocess.DEVNULL if gate is None else gate[0],
                stderr=asyncio.subprocess.PIPE,
                env=self._environment(policy.workspace_path, SANDBOX_TMP),
                start_new_session=True,
                **_as_ids(ids),
            )
        except OSError as error:
            ours.close()
            raise _AgentLost(f"cannot start the slot's sandbox: {error}") from None
        finally:
            theirs.close()
            if gate is not None:
                os.close(gate[0])
        keeper = _Keeper(process=process, control=ours)
        slot.keeper = keeper
        if gate is not None:
            assert slot.cgroup is not None
            try:
                slot.cgroup.enter(process.pid)
                os.write(gate[1], b"go\n")
            except OSError as error:
                await self._stop_keeper(slot)
                raise _AgentLost(f"cannot move the sandbox into its cgroup: {error}") from None
            finally:
                os.close(gate[1])
        return keeper

    async def _lease_agent(self, slot: _Slot, *, started: float) -> _Agent:
        """A new lease from the slot's keeper: fresh namespaces, its own agent and channel."""
        keeper = await self._ensure_keeper(slot)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            reply = await keeper.ask("lease", self.config.start_timeout_s, theirs)
        except _AgentLost:
            ours.close()
            await self._stop_keeper(slot)
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        pid = reply.get("pid")
        agent = _Agent(
            reader=reader, writer=writer, sandboxed=True, started_s=started,
            pid=pid if isinstance(pid, int) else None, cap=reply_cap(self.config.policy),
        )  # fmt: skip
        slot.agent = agent
        try:
            await agent.greeting(self.config.start_timeout_s)
        except _AgentLost:
            await self._stop_agent(slot)
            raise
        return agent

    async def _stop_agent(self, slot: _Slot) -> None:
        """End the slot's lease: its agent and every process it started."""
        agent, slot.agent = slot.agent, None
        if agent is None:
            if slot.keeper is None and slot.cgroup is not None:
                slot.cgroup.kill_all()  # what a bare agent left behind
            return
        agent.close_channel()
        process = agent.process
        if process is not None:
            if process.returncode is None:
                _kill_session(process)
            if slot.cgroup is not None:
                slot.cgroup.kill_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await process.wait()
            return
        keeper = slot.keeper
        if keeper is not None:
            try:
                await keeper.ask("end", self.config.start_timeout_s)
            except _AgentLost:
                await self._stop_keeper(slot)

    async def _stop_keeper(self, slot: _Slot) -> None:
        """Kill the slot's sandbox (keeper, lease and all) and reap it."""
        keeper, slot.keeper = slot.keeper, None
        if keeper is None:
            return
        process = keeper.process
        if process.returncode is None:
            _kill_session(process)
        if slot.cgroup is not None:
            slot.cgroup.kill_all()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await process.wait()
        keeper.control.close()

    # ------------------------------------------------------------------------- files

    async def _read_file(self, slot: _Slot, call: ExecuteCall) -> ToolResult:
        cap = self.config.policy.file_cap_bytes
        asked = call.arguments.get("max_bytes")
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
            cap = min(cap, asked)
        path = cast("str", call.arguments["path"])
        try:
            found = await asyncio.to_thread(slot.workspace.read, path, cap)
        except ToolArgumentError as error:
            return _failure(call, ToolOutcome.REJECTED, f"{error.reason} @ $.{error.field}")
        except OSError as error:
            return _failure(call, ToolOutcome.TOOL_ERROR, f"cannot read {path!r}: {error.strerror}")
        text = found.data.decode("utf-8", "replace")
        if found.truncated:
            text += f"\n[... truncated: showing {len(found.data)} of {found.size} bytes]"
        return _result(call, ToolOutcome.OK, text)

    async def _write_file(self, slot: _Slot, call: ExecuteCall) -> ToolResult:
        path = cast("str", call.arguments["path"])
        data = cast("str", call.arguments["content"]).encode("utf-8", "surrogatepass")
        append = call.arguments.get("append") is True
        try:
            limit = self.config.policy.file_cap_bytes
            written = await asyncio.to_thread(
                lambda: slot.workspace.write(path, data, append=append, max_bytes=limit)
            )
        except ToolArgumentError as error:
            return _failure(call, ToolOutcome.REJECTED, f"{error.reason} @ $.{error.field}")
        except OSError as error:
            return _failure(
                call, ToolOutcome.TOOL_ERROR, f"cannot write {path!r}: {error.strerror}"
            )
        return _result(call, ToolOutcome.OK, f"wrote {written} bytes to {path}")

    # ------------------------------------------------------------------------- reset

    async def reset(self, index: int, epoch: int) -> ResetResult:
        """End the slot's lease ``epoch``: kill its sandbox, wipe its workspace.

        Returns ``ok=False`` (and marks the slot broken) when the slot could not be proven
        clean. Raises ``UnknownSlot`` for a bad index.
        """
        started = time.monotonic()
        slot = self.slot(index)
        slot.retired_epoch = max(slot.retired_epoch, epoch)
        loop = asyncio.get_running_loop()
        previous = slot.tail
        turn: asyncio.Future[None] = loop.create_future()
        slot.tail = turn
        error: str | None = None
        try:
            async with asyncio.timeout(self.config.reset_timeout_s):
                await self._stop_agent(slot)  # interrupts a running call at once
                if previous is not None and not previous.done():
                    await previous
                await self._stop_agent(slot)
                error = await self._prove_empty(slot)
                if error is None:
                    # Most workspaces end a lease small: an empty one costs one directory read
                    # here, not a trip through the thread pool.
                    if _holds_anything(slot.workspace.root):
                        await asyncio.to_thread(slot.workspace.wipe)
                    self._own_workspace(slot)
                    if slot.state_dir.exists():  # bare agents only
                        await asyncio.to_thread(_wipe_dir, slot.state_dir)
        except TimeoutError:
            error = f"reset took longer than {self.config.reset_timeout_s} s"
        except OSError as failure:
            error = f"cannot wipe the workspace: {failure}"
        finally:
            if not turn.done():
                turn.set_result(None)
        for key in [k for k in slot.results if k[0] <= slot.retired_epoch]:
            del slot.results[key]
        if error is not None:
            slot.broken = error
        return ResetResult(
            slot=index, ok=error is None, error=error, duration_s=time.monotonic() - started
        )

    async def _prove_empty(self, slot: _Slot) -> str | None:
        """``None`` once the slot's cgroup holds no process but its keeper's (the cgroup is kept
        for the next lease)."""
        if slot.cgroup is None:
            return None
        keeper = slot.keeper
        expected = keeper.pids if keeper is not None and keeper.alive() else frozenset()
        extra: list[int] = []
        for _ in range(200):
            extra = [pid for pid in slot.cgroup.pids() if pid not in expected]
            if not extra:
                return None
            if expected:
                for pid in extra:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            else:
                slot.cgroup.kill_all()
            await asyncio.sleep(0.01)
        return f"processes {extra[:5]} of the slot survived SIGKILL"

    # ------------------------------------------------------------------------- artifacts

    async def read_artifact(self, index: int, path: str, max_bytes: int) -> ArtifactFile:
        """See ``Workspace.read``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.read, path, max_bytes)

    async def list_artifacts(self, index: int, path: str, max_entries: int) -> DirectoryListing:
        """See ``Workspace.listing``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.listing, path, max_entries)

    async def archive_artifacts(
        self, index: int, path: str, max_bytes: int, max_files: int
    ) -> ArtifactArchive:
        """See ``Workspace.archive``; also raises ``UnknownSlot``."""
        workspace = self.slot(index).workspace
        return await asyncio.to_thread(workspace.archive, path, max_bytes, max_files)


def _agent_program(python: str) -> list[str]:
    """What follows ``python -I -S -c``: the agent as a code object when ``python`` is this very
    interpreter (so the marshal format matches), else as source."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return [_AGENT_BOOT, _AGENT_CODE.hex()]
    return [AGENT_SOURCE]


def _sandbox_pid(slot: _Slot) -> int | None:
    """The host pid of the slot's outermost sandbox process (its keeper's bubblewrap, or a bare
    agent), while it runs."""
    if slot.keeper is not None:
        return slot.keeper.process.pid
    return slot.agent.pid if slot.agent is not None else None


def _prepare_cgroups(cgroups: list[SlotCgroup], policy: SandboxPolicy) -> None:
    for cgroup in cgroups:
        with contextlib.suppress(OSError):
            cgroup.create(policy)


def _stale(call: ExecuteCall, retired: int) -> ToolResult:
    reason = f"lease epoch {call.epoch} is stale: slot was reset through epoch {retired} @ $.epoch"
    return _failure(call, ToolOutcome.REJECTED, reason)


def _holds_anything(path: Path) -> bool:
    with os.scandir(path) as entries:
        return any(True for _ in entries)


def _wipe_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def _command_result(
    call: ExecuteCall, reply: dict[str, JSON], timeout: float, *, sandboxed: bool
) -> ToolResult:
    def number(key: str) -> int:
        value = reply.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    failure = reply.get("error")
    exit_code = reply.get("exit")
    exit_code = exit_code if isinstance(exit_code, int) else None
    duration = reply.get("duration")
    report = ExecReport(
        exit_code=exit_code,
        stdout=str(reply.get("stdout") or ""),
        stderr=str(reply.get("stderr") or ""),
        stdout_dropped=number("stdout_dropped"),
        stderr_dropped=number("stderr_dropped"),
        timed_out=reply.get("timed_out") is True,
        duration_s=max(float(duration), 0.0) if isinstance(duration, int | float) else 0.0,
        sandboxed=sandboxed,
    )
    if isinstance(failure, str):
        return _failure(call, ToolOutcome.TOOL_ERROR, failure, report)
    parts = [report.stdout]
    if report.stderr:
        if parts[0] and not parts[0].endswith("\n"):
            parts.append("\n")
        parts.append(f"[stderr]\n{report.stderr}")
    if report.timed_out:
        reason = f"timed out after {timeout:g} s; its process group was killed"
        return _result(
            call, ToolOutcome.TIMEOUT, "".join([*parts, f"\n[{reason}]"]), error=reason,
            exec_report=report,
        )  # fmt: skip
    signal_number = reply.get("signal")
    if exit_code is None and isinstance(signal_number, int):
        reason = f"killed by signal {signal_number}"
        return _result(
            call, ToolOutcome.TOOL_ERROR, "".join([*parts, f"\n[{reason}]"]), error=reason,
            exec_report=report,
        )  # fmt: skip
    if exit_code:
        parts.append(f"\n[exit code {exit_code}]")
    return _result(call, ToolOutcome.OK, "".join(parts), exec_report=report)


def _kill_session(process: asyncio.subprocess.Process) -> None:
    """SIGKILL a process started with ``start_new_session`` and its whole process group.

    ``process.kill()`` only where the group is gone: it polls the child first, and a poll that
    reaps it takes the exit status from the event loop's child watcher."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.kill()


def _as_ids(ids: tuple[int, int] | None) -> dict[str, Any]:
    """``create_subprocess_exec`` arguments that start a slot's sandbox as the slot's uid and
    gid with no supplementary group."""
    if ids is None:
        return {}
    return {"user": ids[0], "group": ids[1], "extra_groups": []}


async def _run_ok(argv: list[str], ids: tuple[int, int] | None = None) -> tuple[bool, str]:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            **_as_ids(ids),
        )
    except OSError as error:
        return False, str(error)
    try:
        async with asyncio.timeout(10):
            _, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return False, "timed out"
    return process.returncode == 0, err.decode("utf-8", "replace").strip()[:500]


async def _stderr_of(process: asyncio.subprocess.Process) -> str:
    if process.stderr is None:
        return ""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(1):
            return (await process.stderr.read(4096)).decode("utf-8", "replace").strip()
    return ""


def check_config(config: RuntimeConfig) -> None:
    """Raise ``ConfigError`` when the config cannot work on this host (no Python, bad root)."""
    if not os.access(config.python, os.X_OK):
        raise ConfigError("python", f"{config.python!r} is not executable")
    if config.root.exists() and not config.root.is_dir():
        raise ConfigError("root", f"{config.root} is not a directory")
