"""The slot-server protocol's values: what a pool and a slot server say to each other.

A slot server (``trajcore slot-server``) owns N slot workspaces and runs tool calls in them; the
local pool and the Nomad pool talk to it with JSON over HTTP. This module holds the protocol's
values, one frozen type per message, independent of how they travel: the cattrs codec in
``trajcore.adapters.slot_server.codec`` turns them into JSON and back and reports malformed input as
``reason @ $.path``.

Endpoints (all under ``/v1``, bodies JSON; ``PROTOCOL_VERSION`` names this set):

==========================  ============================  ==========================
``GET  /v1/health``         --                            ``Health``
``POST /v1/execute``        ``ExecuteRequest``            ``ExecuteResponse``
``POST /v1/reset``          ``ResetRequest``              ``ResetResult``
``POST /v1/lease``          ``LeaseRequest``              ``LeaseAnswer``
``POST /v1/lease/fork``     ``ForkRequest``               ``ForkAnswer``
``POST /v1/snapshot``       ``SnapshotRequest``           ``SnapshotAnswer``
``POST /v1/snapshot/drop``  ``DropSnapshotRequest``       ``DropSnapshotAnswer``
``GET  /v1/slots``          --                            ``SlotListing``
``POST /v1/artifacts/read`` ``ReadArtifactRequest``       ``ArtifactFile``
``POST /v1/artifacts/list`` ``ListArtifactsRequest``      ``DirectoryListing``
``POST /v1/artifacts/archive`` ``ArchiveArtifactsRequest`` ``ArtifactArchive``
==========================  ============================  ==========================

Any 4xx/5xx answer carries an ``ErrorBody``. No request body exceeds ``MAX_REQUEST_BYTES``.

Rules the values keep:

- An execute response holds exactly one ``ToolResult`` per call, in the order of the calls; a
  call's failure (unknown tool, bad arguments, timeout, a dead sandbox) is its result, never a
  failed request.
- Every call carries a ``call_id``; a slot server that has seen the id on that slot under the same
  lease epoch answers with the first result and does not run the call again.
- A call's ``epoch`` is its lease's; once a slot was reset for epoch E, calls with an epoch <= E are
  refused as stale.
- A call runs within its ``timeout_s`` and, when it carries one, within its ``time_left_s`` counted
  from the request's arrival: a slot's calls run one after another, so a turn's calls share the
  time their turn has left, and one left no time is answered ``TIMEOUT`` without running.
- Nothing the model writes can change the isolation: ``allow_network``, ``require_sandbox`` and the
  timeout range belong to the server's configuration, reported in ``Health``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs

from trajcore.domain import converters, validators
from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSONObject, check_json
from trajcore.domain.slots import SlotCall
from trajcore.domain.task_environments import ImageCacheStatistics, LeaseLayerStatistics
from trajcore.domain.tools import ToolResult, ToolSpec

__all__ = [
    "MAX_REQUEST_BYTES",
    "PROTOCOL_VERSION",
    "SLOT_TOOLS",
    "SLOT_TOOL_SPECS",
    "ArchiveArtifactsRequest",
    "ArtifactArchive",
    "ArtifactFile",
    "Capabilities",
    "DirectoryEntry",
    "DirectoryListing",
    "DropSnapshotAnswer",
    "DropSnapshotRequest",
    "EntryKind",
    "ErrorBody",
    "ExecuteCall",
    "ExecuteRequest",
    "ExecuteResponse",
    "ForkAnswer",
    "ForkLease",
    "ForkRequest",
    "Health",
    "LeaseAnswer",
    "LeaseRequest",
    "ListArtifactsRequest",
    "ReadArtifactRequest",
    "ResetRequest",
    "ResetResult",
    "SlotInfo",
    "SlotListing",
    "SnapshotAnswer",
    "SnapshotRequest",
    "execute_call",
    "home_relative",
    "workspace_path_problem",
]

PROTOCOL_VERSION = 1
"""This set of endpoints and fields. A server refuses a request key it does not know, so a
field added to a request comes with a new version (a client refuses a server of another one)."""
MAX_REQUEST_BYTES = 64 << 20
"""The largest request body a slot server accepts (413 beyond it); a pool sends no larger one."""

_TIMEOUT: JSONObject = {
    "type": "number",
    "description": "Seconds; may only shorten the limit the environment sets.",
}
# What ``bash`` and ``bash_stateful`` take: a command, and optionally a shorter timeout.
_COMMAND: JSONObject = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": _TIMEOUT},
    "required": ["command"],
}

# The tools a slot server runs itself, as the model sees them; any other tool name belongs to an
# external tool server. Keys the model adds (allow_network, require_sandbox, ...) are ignored.
SLOT_TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="bash",
        description="Run a command with /bin/sh in the workspace, in a fresh shell.",
        parameters=_COMMAND,
    ),
    ToolSpec(
        name="bash_stateful",
        description=(
            "Run a command in the slot's persistent shell (directory and variables persist)."
        ),
        parameters=_COMMAND,
    ),
    ToolSpec(
        name="tmux",
        description="Send keys to the persistent shell's terminal and return what it shows.",
        parameters={
            "type": "object",
            "properties": {
                "keys": {"type": ["string", "array"], "items": {"type": "string"}},
                "literal": {"type": "boolean"},
                "enter": {"type": "boolean"},
                "wait_s": {"type": "number"},
                "lines": {"type": "integer"},
            },
            "required": ["keys"],
        },
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file of the workspace (path relative to the workspace).",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_bytes": {"type": "integer"}},
            "required": ["path"],
        },
    ),
    ToolSpec(
        name="write_file",
        description="Write a text file in the workspace, creating parent directories.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "append": {"type": "boolean"},
            },
            "required": ["path", "content"],
        },
    ),
)
SLOT_TOOLS: tuple[str, ...] = tuple(spec.name for spec in SLOT_TOOL_SPECS)


def home_relative(path: str) -> str:
    """A file tool's ``path`` as the slot's shell reads it: ``HOME`` is the workspace, so
    ``~/notes.txt`` is ``notes.txt``, ``~`` is ``.``, and ``~//notes.txt`` (``$HOME//notes.txt``,
    slashes after the home as one) is ``notes.txt`` too; any other path is returned as it is
    (``~user/x`` is a name like any other)."""
    if path == "~" or path.startswith("~/"):
        return path[1:].lstrip("/") or "."
    return path


def workspace_path_problem(path: str) -> str | None:
    """Why a file tool's ``path`` (after ``home_relative``) can name nothing in a workspace,
    whatever the workspace holds, or ``None``: empty, a NUL byte, a lone surrogate that stands
    for no byte of a name, absolute, or a ``..`` component. The slot server refuses such a
    request (``REJECTED`` at ``$.path``) before it looks at a file; ``SlotTools`` raises for it
    before it sends one (the hook's own mistake, not the model's file)."""
    if not path or "\0" in path:
        return "must be a non-empty path without NUL bytes"
    try:
        path.encode("utf-8", "surrogateescape")  # what os.fsencode does with a UTF-8 locale
    except UnicodeEncodeError as error:
        return (
            f"{path!r} holds a lone surrogate at {error.start} that stands for no byte "
            "(only U+DC80..U+DCFF may appear, each for one byte 0x80..0xFF of a name)"
        )
    if path.startswith("/"):
        return f"{path!r} is absolute; give a path relative to the workspace"
    if ".." in path.split("/"):
        return f"{path!r} contains '..'; paths must stay inside the workspace"
    return None


_index = validators.whole_number(0, error=WireError)
_positive_count = validators.whole_number(1, error=WireError)


_nonempty = validators.nonempty_string(error=WireError)
_flag = validators.instance_of(bool, error=WireError)


_positive_seconds = validators.finite_number(0.0, unit="seconds", error=WireError)
_optional_seconds = validators.finite_number(0.0, optional=True, unit="seconds", error=WireError)


def _json_object(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, dict):
        raise WireError(attribute.name, f"expected a JSON object, got {type(value).__name__}")
    problem = check_json(value, f"$.{attribute.name}")
    if problem:
        raise WireError(attribute.name, problem)


@attrs.frozen(kw_only=True)
class Capabilities:
    """What this slot server's host can do.

    Attributes:
        bwrap: bubblewrap starts a sandbox with every namespace the isolation asks for.
        tmux: tmux runs (inside the sandbox when there is one).
        network_isolation: a sandbox can get its own network namespace.
        cgroups: per-slot limits use cgroups (otherwise rlimits per process).
        slot_helper: What runs the slots' keepers and lease agents: ``"native"`` (the compiled
            helper) or ``"python"``.
        slot_helper_origin: Where the compiled helper came from: ``"shipped"`` (built into the
            install's wheel) or ``"built at start"`` (the host's compiler); empty for Python.
        detail: Why a capability is missing, for operators; empty when all are present.
    """

    bwrap: bool
    tmux: bool
    network_isolation: bool
    cgroups: bool
    slot_helper: str = "python"
    slot_helper_origin: str = ""
    detail: str = ""


@attrs.frozen(kw_only=True)
class Health:
    """A slot server's answer to ``GET /v1/health``.

    Attributes:
        protocol_version: The protocol this server speaks (``PROTOCOL_VERSION``).
        slots: How many slots it serves, indexed ``0 .. slots-1``.
        capabilities: What its host can do.
        sandboxed: Calls run inside bubblewrap (``False``: unsandboxed, and results say so).
        allow_network: The isolation's network setting.
        require_sandbox: The isolation refuses to run calls without a sandbox.
        tools: The tools it runs.
        min_timeout_s: The shortest limit a call gets.
        max_timeout_s: The longest limit a call gets.
        broken_slots: The slots a failed reset left broken (never leased again by this server).
        workspaces_set_aside: Workspaces resets moved to the trash because they could not be
            wiped in time (each slot went on with a new, empty one).
        trash_left: What the last sweep of the trash could not remove, one line each.
        snapshots: The snapshots this server holds (dropped ones still in use included).
        snapshot_bytes: What they hold on disk.
        forks: The leases started from a snapshot since the server started.
        fork_requests: The ``POST /v1/lease/fork`` requests answered since the server started
            (each starting one or more of those leases).
        fork_workspaces: How a forked lease's workspace starts: ``overlay`` (copy-on-write
            over the snapshot's), or ``copy: <why>`` (empty: the server has no snapshots).
        image_cache: The image cache's figures (``None``: the server has no image cache).
        lease_layers: What its leases over environments wrote (their writable layers, each
            measured after its reset; a server that predates them reads as none).
        boot: Drawn at random when the server starts: a server restarted in place (the same
            address and token) answers with another, and its slots' state is gone (``None``:
            a server that predates it).
        hook_process_reserve: How many of each slot's processes only the env's hooks' commands
            may use (the process limit less the model's commands' share; 0: none, also from a
            server that predates it).
    """

    protocol_version: int
    slots: int
    capabilities: Capabilities
    sandboxed: bool
    allow_network: bool
    require_sandbox: bool
    tools: tuple[str, ...] = SLOT_TOOLS
    min_timeout_s: float = 1.0
    max_timeout_s: float = 3600.0
    broken_slots: tuple[int, ...] = ()
    workspaces_set_aside: int = 0
    trash_left: tuple[str, ...] = ()
    snapshots: int = 0
    snapshot_bytes: int = 0
    forks: int = 0
    fork_requests: int = 0
    fork_workspaces: str = ""
    image_cache: ImageCacheStatistics | None = None
    lease_layers: LeaseLayerStatistics = attrs.field(factory=LeaseLayerStatistics)
    boot: str | None = None
    hook_process_reserve: int = 0


@attrs.frozen(kw_only=True)
class ExecuteCall:
    """One tool call addressed to one slot of a server.

    Attributes:
        slot: The slot's index on this server.
        epoch: The lease epoch the call runs under.
        call_id: The idempotency key: a repeated id returns the first result.
        tool: The tool's name.
        arguments: The tool's arguments as the model wrote them ((isolation keys are ignored)).
        timeout_s: The limit the env gives the call; the server clamps it to its range.
        hook: The env's hooks sent it, not the model: a command it starts may use the lease's
            process reserve, which the model's commands leave free (docs/sandbox.md).
        time_left_s: Its turn's time left, in seconds from the request's arrival: it runs
            under what remains when it starts (its limit cut to that), and is answered
            ``TIMEOUT`` unrun with none left (``slots.time_left_spent``); ``None``: no such cut.
    """

    slot: int = attrs.field(validator=_index)
    epoch: int = attrs.field(validator=_index)
    call_id: str = attrs.field(validator=_nonempty)
    tool: str = attrs.field(validator=_nonempty)
    arguments: JSONObject = attrs.field(factory=dict, validator=_json_object)
    timeout_s: float = attrs.field(validator=_positive_seconds)
    time_left_s: float | None = attrs.field(default=None, validator=_optional_seconds)
    hook: bool = attrs.field(default=False, validator=_flag)


def execute_call(slot_call: SlotCall) -> ExecuteCall:
    """The wire form of a ``SlotCall`` (its lease's slot index and epoch, its call, its limits)."""
    return ExecuteCall(
        slot=slot_call.lease.slot.index,
        epoch=slot_call.lease.epoch,
        call_id=slot_call.call.id,
        tool=slot_call.call.name,
        arguments=slot_call.call.arguments,
        timeout_s=slot_call.timeout_s,
        time_left_s=slot_call.time_left_s,
        hook=slot_call.hook,
    )


@attrs.frozen(kw_only=True)
class ExecuteRequest:
    """A batch of calls for one server; calls of one slot run in this order."""

    calls: tuple[ExecuteCall, ...] = attrs.field(converter=converters.execute_calls)

    def deadline_s(self, grace_s: float) -> float:
        """How long the batch may take at most: the slowest slot's calls one after another.

        A client waits this long (plus ``grace_s``) before it gives the server up.
        """
        per_slot: dict[int, float] = {}
        for call in self.calls:
            per_slot[call.slot] = per_slot.get(call.slot, 0.0) + call.timeout_s
        return max(per_slot.values(), default=0.0) + grace_s


@attrs.frozen(kw_only=True)
class ExecuteResponse:
    """The batch's results, one per call, in the order of the calls, and the server's ``boot``
    (``Health.boot``): results from another boot than the one a client joined answer calls of
    leases that server never held."""

    results: tuple[ToolResult, ...] = attrs.field(converter=converters.tool_results)
    boot: str | None = None


@attrs.frozen(kw_only=True)
class ResetRequest:
    """End a slot's lease: kill its sandbox, wipe its workspace, retire ``epoch`` and older.

    ``timeout_s``: how long the reset may take, the pool's ``reset_timeout_s`` (``None``: the
    server's own); a workspace whose wipe takes half of it is set aside instead.
    """

    slot: int = attrs.field(validator=_index)
    epoch: int = attrs.field(validator=_index)
    timeout_s: float | None = attrs.field(default=None, validator=_optional_seconds)


@attrs.frozen(kw_only=True)
class LeaseRequest:
    """Run the slot's lease ``epoch`` over an environment (``POST /v1/lease``).

    Sent before the epoch's first call: the lease then runs with the image's tree as its root
    and a writable layer of its own, which the epoch's reset discards. ``environment`` is an
    ``EnvironmentRef`` text (``oci:/path``, ``containers-storage:NAME``, ...). ``snapshot``,
    when given, names a snapshot of this server (``POST /v1/snapshot``) to start from.
    """

    slot: int = attrs.field(validator=_index)
    epoch: int = attrs.field(validator=_index)
    environment: str
    snapshot: str | None = None


@attrs.frozen(kw_only=True)
class LeaseAnswer:
    """How a lease request went: ``ok`` false fails that lease only.

    Attributes:
        slot: The slot's index.
        epoch: The lease's epoch.
        ok: The image is ready and held for the lease's life.
        error: Why not (the image and the reason), when ``ok`` is false.
        field: What the error is about (``environment``, ``epoch``, the cache's own field).
        image_id: The cached image's id.
        hit: The image was in the cache already.
        duration_s: How long the request took (the image's unpacking, or the copy of a
            snapshot's workspace, included).
        snapshot: The snapshot the lease starts from, when it named one.
    """

    slot: int
    epoch: int
    ok: bool
    error: str | None = None
    field: str | None = None
    image_id: str | None = None
    hit: bool = False
    duration_s: float = 0.0
    snapshot: str | None = None


@attrs.frozen(kw_only=True)
class ForkLease:
    """One lease of a ``ForkRequest``: the slot and its lease's epoch."""

    slot: int = attrs.field(validator=_index)
    epoch: int = attrs.field(validator=_index)


def _fork_leases(leases: Iterable[ForkLease]) -> tuple[ForkLease, ...]:
    return tuple(leases)


def _lease_answers(answers: Iterable[LeaseAnswer]) -> tuple[LeaseAnswer, ...]:
    return tuple(answers)


def _distinct_leases(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    leases = value if isinstance(value, tuple) else ()
    if not leases:
        raise WireError(attribute.name, "must name at least one lease")
    slots = [lease.slot for lease in leases if isinstance(lease, ForkLease)]
    if len(set(slots)) != len(slots):
        raise WireError(attribute.name, f"names a slot twice: {sorted(slots)}")


@attrs.frozen(kw_only=True)
class ForkRequest:
    """Start several leases from one snapshot in one request (``POST /v1/lease/fork``): each as
    a ``LeaseRequest`` naming ``snapshot`` would, the server starting them together (their
    clones and mounts in one worker thread). Each lease is answered on its own: a refusal
    fails that lease only."""

    environment: str
    snapshot: str = attrs.field(validator=_nonempty)
    leases: tuple[ForkLease, ...] = attrs.field(converter=_fork_leases, validator=_distinct_leases)


@attrs.frozen(kw_only=True)
class ForkAnswer:
    """One ``LeaseAnswer`` per lease of a ``ForkRequest``, in its order."""

    leases: tuple[LeaseAnswer, ...] = attrs.field(converter=_lease_answers)


@attrs.frozen(kw_only=True)
class SnapshotRequest:
    """Freeze the slot's running lease ``epoch`` (over an image) into a read-only snapshot
    (``POST /v1/snapshot``): what it wrote over the image and its workspace. Leases named
    with ``LeaseRequest.snapshot`` then start from it copy-on-write."""

    slot: int = attrs.field(validator=_index)
    epoch: int = attrs.field(validator=_index)


@attrs.frozen(kw_only=True)
class SnapshotAnswer:
    """How a snapshot request went: ``ok`` false leaves the lease as it was (its processes
    may have ended: a snapshot holds files, not processes).

    Attributes:
        slot: The slot's index.
        epoch: The lease's epoch.
        ok: The snapshot exists and the lease now runs over it.
        snapshot: Its id, the value of ``LeaseRequest.snapshot``.
        error: Why not, when ``ok`` is false.
        field: What the error is about (``epoch``, ``slot``, ``snapshot``).
        image_id: The image it was taken over.
        bytes: What it holds: the lease's layer over the image and its workspace.
        files: How many entries it holds.
        duration_s: How long the request took.
    """

    slot: int
    epoch: int
    ok: bool
    snapshot: str | None = None
    error: str | None = None
    field: str | None = None
    image_id: str | None = None
    bytes: int = 0
    files: int = 0
    duration_s: float = 0.0


@attrs.frozen(kw_only=True)
class DropSnapshotRequest:
    """Release a snapshot (``POST /v1/snapshot/drop``): no new lease may start from it, and it
    is removed once no lease runs over it."""

    snapshot: str = attrs.field(validator=_nonempty)


@attrs.frozen(kw_only=True)
class DropSnapshotAnswer:
    """How a drop went.

    Attributes:
        snapshot: The snapshot's id.
        ok: It is dropped (``False``: no such snapshot; ``error`` says so).
        removed: Its files are gone already (else when its last lease resets).
        leases: The leases that still run over it.
        error: Why not, when ``ok`` is false.
        field: What the error is about (``snapshot``).
    """

    snapshot: str
    ok: bool
    removed: bool = False
    leases: int = 0
    error: str | None = None
    field: str | None = None


@attrs.frozen(kw_only=True)
class ResetResult:
    """How a reset went. ``ok`` false means the slot may be dirty: quarantine it.

    Attributes:
        slot: The slot's index.
        ok: Every process of the slot is gone and its workspace is empty.
        error: Why not, when ``ok`` is false.
        duration_s: How long the reset took.
    """

    slot: int
    ok: bool
    error: str | None = None
    duration_s: float = 0.0


@attrs.frozen(kw_only=True)
class SlotInfo:
    """One slot as ``GET /v1/slots`` reports it.

    Attributes:
        index: The slot's index.
        sandbox_running: Its sandbox (exec agent) is alive.
        busy: A call is running in it now.
        retired_epoch: The newest epoch a reset has ended (calls at or below it are stale).
        calls_run: Calls run since the server started.
        broken: Why the slot cannot be used (a failed reset), or ``None``.
        sandbox_pid: The host pid of the sandbox's outermost process, while it runs.
        sandbox_start_s: How long the current (or last) sandbox took to become ready.
        set_aside: Workspaces of this slot that resets moved to the trash instead of wiping.
        readied_lost: Readied lease processes found dead or hung by the lease they were
            handed (each lease was started again in a fresh process; docs/sandbox.md).
    """

    index: int
    sandbox_running: bool
    busy: bool
    retired_epoch: int
    calls_run: int
    broken: str | None = None
    sandbox_pid: int | None = None
    sandbox_start_s: float | None = None
    set_aside: int = 0
    readied_lost: int = 0


@attrs.frozen(kw_only=True)
class SlotListing:
    """Every slot of a server, by index."""

    slots: tuple[SlotInfo, ...]


@attrs.frozen(kw_only=True)
class ReadArtifactRequest:
    """Read one file of a slot's workspace (``path`` relative to it), at most ``max_bytes``."""

    slot: int = attrs.field(validator=_index)
    path: str = attrs.field(validator=_nonempty)
    max_bytes: int = attrs.field(default=1 << 20, validator=_positive_count)


@attrs.frozen(kw_only=True)
class ArtifactFile:
    """A file read from a workspace.

    Attributes:
        path: The path asked for.
        size: The file's full size in bytes.
        sha256: Hex digest of ``data`` (so of the whole file exactly when not ``truncated``;
            a capped read never reads past its cap).
        data: The first ``max_bytes`` bytes.
        truncated: ``data`` is shorter than the file.
    """

    path: str
    size: int
    sha256: str
    data: bytes
    truncated: bool = False


@attrs.frozen(kw_only=True)
class ListArtifactsRequest:
    """List a directory of a slot's workspace (``"."`` is the workspace itself)."""

    slot: int = attrs.field(validator=_index)
    path: str = attrs.field(default=".", validator=_nonempty)
    max_entries: int = attrs.field(default=1000, validator=_positive_count)


class EntryKind(enum.Enum):
    """What a directory entry is (symlinks are reported, never followed)."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


@attrs.frozen(kw_only=True)
class DirectoryEntry:
    """One entry of a listed directory: its name, kind and size in bytes."""

    name: str
    kind: EntryKind
    size: int = 0


@attrs.frozen(kw_only=True)
class DirectoryListing:
    """A directory's entries, sorted by name; ``truncated`` when ``max_entries`` cut it."""

    path: str
    entries: tuple[DirectoryEntry, ...]
    truncated: bool = False


@attrs.frozen(kw_only=True)
class ArchiveArtifactsRequest:
    """A tar.gz of a workspace directory, at most ``max_files`` regular files, ``max_bytes`` big."""

    slot: int = attrs.field(validator=_index)
    path: str = attrs.field(default=".", validator=_nonempty)
    max_bytes: int = attrs.field(default=64 << 20, validator=_positive_count)
    max_files: int = attrs.field(default=10_000, validator=_positive_count)


@attrs.frozen(kw_only=True)
class ArtifactArchive:
    """A tar.gz archive of part of a workspace.

    Attributes:
        path: The directory archived.
        data: The archive (gzip-compressed tar; symlinks stored as links, never followed).
        sha256: Hex digest of ``data``.
        files: Regular files in the archive.
        truncated: Files were left out because a cap was reached.
    """

    path: str
    data: bytes
    sha256: str
    files: int
    truncated: bool = False


@attrs.frozen(kw_only=True)
class ErrorBody:
    """The body of every 4xx/5xx answer: ``error`` says why, ``field`` where (``$`` if nowhere)."""

    error: str
    field: str = "$"
