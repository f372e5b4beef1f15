"""``FakeSandboxPool``: the SandboxPool port in memory, with scripted commands, a record and faults.

It passes the same contract suite as the local pool (``trajcore.testing.sandbox_pool_contract``)
and leases through the same domain slot book (``trajcore.domain.slot_book``, driven by
``SlotLeasing`` from ``trajcore.adapters.pools.leasing``): first come first served, a deadline
per request, an epoch per lease, release exactly once. What differs is where calls run: each
slot's workspace is a ``dict`` of paths to text, and ``bash`` commands are answered by a
*command handler*, a plain function of the command and the workspace.

Rules the fake keeps, so tests written against it hold against the real pool:

- One result per call, in the order of the calls; the calls of one slot run one after another in
  that order, different slots concurrently (each slot has its own lock). A call's turn's time
  left (``SlotCall.time_left_s``) counts from the batch's arrival: the call runs under what
  remains when it starts, and one left none is ``TIMEOUT``, not run, as in a slot server.
- A call whose lease is not the slot's current one is ``REJECTED``; a call id seen before under the
  same lease returns the first result and does not run again.
- ``read_file``/``write_file`` answer a path as the slot server does (the cases:
  ``trajcore.testing.workspace_paths``): one its rule refuses (``workspace_path_problem``) is
  ``REJECTED`` with its reason at ``$.path``, a write whose text no UTF-8 carries at
  ``$.content`` (``file_calls``); one that names no regular file (a directory, ``file/``) is a
  ``TOOL_ERROR``. Unknown tools and bad arguments are ``REJECTED`` too.
- Release ends the call running in the slot at once, as a slot server's reset does (an
  ``INFRA_ERROR``: a ``sleep`` never runs to its timeout), refuses the lease's calls still
  queued for the slot (``REJECTED``, stale), then wipes the slot's workspace (reset), or
  quarantines the slot when a reset failure was injected.

Commands. ``handler(command, workspace)`` returns an ``ExecReport``, an exit code, the stdout
text, or ``None`` to fall through to the default handler, which knows ``true``, ``false``,
``exit N``, ``echo ...``, ``cat FILE``, ``ls``, ``pwd`` and ``sleep S`` (which really waits, so
timeouts, hangs and slow slots can be staged); anything else exits 127.

Faults (all one-shot unless said otherwise):

- ``crash_container(name)``: the next batch for ``name`` fails mid-way; each of its calls is an
  ``INFRA_ERROR``, the container is lost (its slots leave the book, its leases turn stale)
  and, unless ``restart_crashed`` is off, replaced by a fresh container named ``name~N``.
- ``hang_container(name)``: batches for ``name`` never answer until ``unhang`` (or cancellation).
- ``fail_next_reset()``: the next reset fails, so that slot is quarantined.
- ``start_delay_s``: entering the pool (``async with``) takes this long (a slow start).

Task environments. ``images`` maps image references (``oci:/images/task-1``, any reference
``domain.task_environments`` accepts) to the files each image holds, by absolute path. A lease
that names one of them runs over it: its slot's files hold the image's at their absolute paths
(``cat /etc/os-release`` in the default handler reads them; ``read_file`` stays confined to the
workspace, as in a slot server), and the reset discards them with the rest. A lease that names
any other image is refused on entry with ``EnvironmentUnavailable`` naming it, and its slot is
released. ``environment_leases`` records every lease that named an environment (holder, slot,
epoch, environment, or the refusal), so an env's ``task_environment`` hook can be tested here;
``environment_statistics()`` counts them (a first use of an image in a container is a miss).
``snapshot(lease, environment)`` freezes a slot's files under a new id; ``lease_from`` a slot of
the same container starts from them (recorded as ``forked``), any other slot from the image.

Inspection: ``executed`` lists every call that ran (not repeats, not refusals) in the order it
started, with its container, slot index, epoch, tool and arguments; ``batches`` lists each
request's container and call ids; ``resets`` each slot reset and whether it succeeded.
"""

from __future__ import annotations

import abc
import errno
import logging
import os
import posixpath
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Self, cast

import anyio
import anyio.lowlevel
import attrs

from trajcore.adapters.fakes.slot_results import command_result, file_error, wrote
from trajcore.adapters.pools.batches import refuse_stale
from trajcore.adapters.pools.environment_leasing import EnvironmentCounters
from trajcore.adapters.pools.leased_pool import DEFAULT_FORK_WAIT_S, LeasedPool
from trajcore.adapters.pools.leasing import SlotLeasing
from trajcore.domain.environment_leases import (
    EnvironmentUnavailable,
    Snapshot,
    check_environment,
)
from trajcore.domain.errors import ConfigError, PoolClosed
from trajcore.domain.file_calls import file_call_problem
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS, home_relative, workspace_path_problem
from trajcore.domain.slots import Lease, SlotCall, SlotId, time_left_spent
from trajcore.domain.tools import ExecReport, ToolOutcome, ToolResult, ToolSpec
from trajcore.domain.validators import positive_int

__all__ = [
    "CommandHandler",
    "CommandOutcome",
    "EnvironmentLeaseRecord",
    "ExecutedCall",
    "FakeSandboxPool",
    "FakeWorkspace",
    "InProcessSlotPool",
    "ResetRecord",
    "default_command",
    "workspace_path",
]

_log = logging.getLogger(__name__)

_TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in SLOT_TOOL_SPECS}

FakeWorkspace = dict[str, str]
"""A slot's files: workspace-relative path (``workspace_path``: no ``.`` components, no empty
ones) to text; a task environment's files by absolute path."""

CommandOutcome = ExecReport | int | str | None
"""What a handler answers: a full report, an exit code, stdout (exit 0), or ``None``: not mine."""

CommandHandler = Callable[[str, FakeWorkspace], CommandOutcome]


@attrs.frozen(kw_only=True)
class ExecutedCall:
    """One call the fake ran: where, under which lease epoch, what, and whether a hook sent it
    (``SlotCall.hook``)."""

    container: str
    slot: int
    epoch: int
    call_id: str
    tool: str
    arguments: dict[str, object]
    hook: bool = False


@attrs.frozen(kw_only=True)
class EnvironmentLeaseRecord:
    """One lease that named a task environment: granted (its slot and epoch) or refused.

    Attributes:
        holder: The lease's holder (a trajectory's id).
        environment: The image reference it named.
        slot: The slot it ran in; ``None`` when it was refused before a slot was leased.
        epoch: The lease's epoch, with ``slot``.
        refusal: The ``EnvironmentUnavailable`` message when it was refused, else ``None``.
        forked: It started from a snapshot (``lease_from``) instead of the plain image.
    """

    holder: str
    environment: str
    slot: SlotId | None = None
    epoch: int | None = None
    refusal: str | None = None
    forked: bool = False


@attrs.frozen(kw_only=True)
class ResetRecord:
    """One reset of a slot at the end of a lease, and whether it succeeded."""

    slot: SlotId
    epoch: int
    ok: bool


def workspace_path(path: object) -> str | None:
    """The key in a ``FakeWorkspace`` of the file a file tool's ``path`` names (``~`` is the
    workspace, as ``HOME`` is; ``.`` components and repeated slashes dropped; ``""`` is the
    workspace itself), or ``None`` when the slot server refuses the path whatever the workspace
    holds (``workspace_path_problem``), or it is not text."""
    if not isinstance(path, str):
        return None
    relative = home_relative(path)
    if workspace_path_problem(relative) is not None:
        return None
    return "/".join(_components(relative))


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _file_key(files: FakeWorkspace, path: str, *, write: bool) -> tuple[str, str | None]:
    """The key of ``path`` (relative, well-formed) in ``files``, and why it names no regular
    file to read (``write``: to write) there, worded as the slot server's system words it, or
    ``None``. Directories are the workspace itself and those the files' paths imply."""
    parts = _components(path)
    key = "/".join(parts)
    if any("/".join(parts[:end]) in files for end in range(1, len(parts))):
        return key, os.strerror(errno.ENOTDIR)  # a file where a directory is on the way
    if not key or any(name.startswith(f"{key}/") for name in files):
        return key, os.strerror(errno.EISDIR) if write else "is a directory"
    if path.endswith(("/", "/.")):  # a directory by its spelling
        if write and path.endswith("/"):
            return key, os.strerror(errno.EISDIR)  # what creating a file so named answers
        if key in files:
            return key, os.strerror(errno.ENOTDIR)
        return key, os.strerror(errno.EISDIR if write else errno.ENOENT)
    if not write and key not in files:
        return key, os.strerror(errno.ENOENT)
    return key, None


def default_command(command: str, workspace: FakeWorkspace) -> CommandOutcome:
    """The fake's shell: a few common commands, else exit 127. See the module docstring."""
    try:
        words = shlex.split(command)
    except ValueError as error:
        return ExecReport(exit_code=2, stderr=f"sh: syntax error: {error}\n")
    if not words:
        return 0
    name, args = words[0], words[1:]
    if name in ("true", ":"):
        return 0
    if name == "false":
        return 1
    if name == "exit":
        return int(args[0]) if args and args[0].isdigit() else 0
    if name == "echo":
        return " ".join(args) + "\n"
    if name == "pwd":
        return "/workspace\n"
    if name == "ls":
        return "".join(f"{path}\n" for path in sorted(workspace) if not path.startswith("/"))
    if name == "cat":
        out: list[str] = []
        for arg in args:
            shell = posixpath.normpath(home_relative(arg))  # a/../b is b
            key = arg if arg.startswith("/") else workspace_path(shell)
            if key is None or key not in workspace:
                return ExecReport(
                    exit_code=1, stdout="".join(out), stderr=f"cat: {arg}: No such file\n"
                )
            out.append(workspace[key])
        return "".join(out)
    return ExecReport(exit_code=127, stderr=f"sh: 1: {name}: not found\n")


def _sleep_seconds(command: str) -> float | None:
    words = command.split()
    if len(words) == 2 and words[0] == "sleep":
        try:
            seconds = float(words[1])
        except ValueError:
            return None
        return seconds if seconds >= 0 else None
    return None


def _report(outcome: CommandOutcome) -> ExecReport | None:
    if outcome is None or isinstance(outcome, ExecReport):
        return outcome
    if isinstance(outcome, bool):
        return ExecReport(exit_code=int(outcome))
    if isinstance(outcome, int):
        return ExecReport(exit_code=outcome)
    return ExecReport(exit_code=0, stdout=outcome)


@attrs.define(eq=False)
class _FakeSlot:
    files: FakeWorkspace = attrs.field(factory=dict)
    lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    results: dict[tuple[int, str], ToolResult] = attrs.field(factory=dict)
    running: anyio.CancelScope | None = None  # the call running now: its lease's end ends it


@attrs.define(eq=False)
class _FakeContainer:
    name: str
    slots: list[_FakeSlot]
    crash_next: bool = False
    hang: anyio.Event | None = None


@attrs.define(eq=False)
class InProcessSlotPool(LeasedPool):
    """What the pools whose slots live in this process share: containers of slots, leasing
    through the slot book, the call record, idempotent calls, argument checks, and faults.

    Subclasses say where a slot's files are and how a command runs: ``_read``, ``_write``,
    ``_command``, ``_wipe`` (a reset) and ``_drop`` (a container lost or closed).

    Attributes:
        containers: How many containers it starts with (named ``{prefix}-0``, ...).
        slots_per_container: Slots per container.
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: no limit).
        restart_crashed: Replace a crashed container with a fresh one.
        start_delay_s: How long entering the pool takes (a slow start).
        executed, batches, resets: The record (see the module docstring).
    """

    containers: int = attrs.field(default=1, validator=positive_int)
    slots_per_container: int = attrs.field(default=4, validator=positive_int)
    acquire_timeout_s: float | None = 60.0
    restart_crashed: bool = True
    start_delay_s: float = 0.0
    executed: list[ExecutedCall] = attrs.field(init=False, factory=list)
    batches: list[tuple[str, tuple[str, ...]]] = attrs.field(init=False, factory=list)
    resets: list[ResetRecord] = attrs.field(init=False, factory=list)
    _leasing: SlotLeasing = attrs.field(init=False)
    _environments: EnvironmentCounters = attrs.field(init=False, factory=EnvironmentCounters)
    _live: dict[str, _FakeContainer] = attrs.field(init=False, factory=dict)
    _fail_resets: int = attrs.field(init=False, default=0)
    _generations: dict[str, int] = attrs.field(init=False, factory=dict)
    _closed: bool = attrs.field(init=False, default=False)

    prefix: ClassVar[str] = "fake"

    def __attrs_post_init__(self) -> None:
        self._leasing = SlotLeasing(reset=self._reset, default_timeout_s=self.acquire_timeout_s)
        for index in range(self.containers):
            self._add_container(f"{self.prefix}-{index}")

    async def __aenter__(self) -> Self:
        if self.start_delay_s > 0:
            await anyio.sleep(self.start_delay_s)
        return self

    # ------------------------------------------------------------------------- port

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """See ``SandboxPool.execute``; faults staged for ``container`` apply to this batch."""
        if self._closed:
            raise PoolClosed(f"the {type(self).__name__} is closed")
        self.batches.append((container, tuple(call.call.id for call in calls)))
        results, runnable = refuse_stale(self._leasing, container, calls)
        live = self._live.get(container)
        if runnable and live is not None:
            if live.crash_next:
                live.crash_next = False
                await anyio.lowlevel.checkpoint()
                await self._lose(live, "crashed mid-batch (injected)")
                reason = f"slot server {container} crashed during the batch (injected)"
                for i in runnable:
                    results[i] = ToolResult.failure(calls[i].call, ToolOutcome.INFRA_ERROR, reason)
                runnable = []
            elif live.hang is not None:
                await live.hang.wait()
        if runnable:
            assert live is not None
            by_slot: dict[int, list[int]] = {}
            for i in runnable:
                by_slot.setdefault(calls[i].lease.slot.index, []).append(i)

            now = anyio.current_time()  # the batch's arrival: its calls' turn's time counts from it

            async def run_slot(indices: list[int]) -> None:
                for i in indices:
                    results[i] = await self._run(live, calls[i], now)

            async with anyio.create_task_group() as group:
                for indices in by_slot.values():
                    group.start_soon(run_slot, indices)
        return [cast("ToolResult", result) for result in results]

    async def aclose(self) -> None:
        """See ``SandboxPool.aclose``: waiters get ``PoolClosed``; hung batches are let go."""
        if self._closed:
            return
        self._closed = True
        self._leasing.close()
        for live in self._live.values():
            if live.hang is not None:
                live.hang.set()
        with anyio.CancelScope(shield=True):
            for name in list(self._live):
                await self._drop(name)

    # ------------------------------------------------------------------------- faults

    def crash_container(self, name: str) -> None:
        """Make the next batch for ``name`` crash its container (see the module docstring)."""
        self._container(name).crash_next = True

    def hang_container(self, name: str) -> None:
        """Make batches for ``name`` wait until ``unhang(name)`` (or until they are cancelled)."""
        self._container(name).hang = anyio.Event()

    def unhang(self, name: str) -> None:
        """Let batches for ``name`` run again."""
        live = self._container(name)
        if live.hang is not None:
            live.hang.set()
            live.hang = None

    def fail_next_reset(self, count: int = 1) -> None:
        """Make the next ``count`` resets fail, so their slots are quarantined."""
        self._fail_resets += count

    def container_names(self) -> list[str]:
        """The live containers, in the order they were added."""
        return list(self._live)

    def check_valid(self) -> None:
        """The slot book's invariants (raises ``AssertionError`` naming the first broken)."""
        self._leasing.check_valid()

    # ------------------------------------------------------------------------- where slots live

    @abc.abstractmethod
    async def _read(self, slot: SlotId, call: SlotCall, path: str) -> ToolResult:
        """``read_file`` of ``path``: relative to the workspace (``home_relative`` applied) and
        well-formed (``workspace_path_problem``), spelled as the call spelled it."""

    @abc.abstractmethod
    async def _write(
        self, slot: SlotId, call: SlotCall, path: str, content: str, append: bool
    ) -> ToolResult:
        """``write_file`` of ``path`` (as ``_read``'s), its parent directories created."""

    @abc.abstractmethod
    async def _command(self, slot: SlotId, call: SlotCall, command: str) -> ToolResult:
        """``bash``: ``command`` in the slot's workspace, within ``call.timeout_s``."""

    async def _wipe(self, slot: SlotId) -> None:
        """A reset's work beyond forgetting results: end what the lease left, empty the files."""

    async def _drop(self, name: str) -> None:
        """Container ``name`` is gone (lost, or the pool closed): free what its slots hold."""

    def _refused_tool(self, name: str) -> str | None:
        """Why ``name`` (a slot tool with valid arguments) cannot run here, or ``None``."""
        if name == "tmux":
            return f"the {type(self).__name__} has no terminal @ $.tool"
        return None

    # ------------------------------------------------------------------------- internals

    def _container(self, name: str) -> _FakeContainer:
        live = self._live.get(name)
        if live is None:
            raise KeyError(f"no live container {name!r}; live: {sorted(self._live)}")
        return live

    def _add_container(self, name: str) -> None:
        slots = [_FakeSlot() for _ in range(self.slots_per_container)]
        self._live[name] = _FakeContainer(name=name, slots=slots)
        self._leasing.add_container(name, self.slots_per_container)

    async def _lose(self, live: _FakeContainer, reason: str) -> None:
        if self._live.pop(live.name, None) is None:
            return
        self._leasing.lose_container(live.name)
        with anyio.CancelScope(shield=True):
            await self._drop(live.name)
        if self.restart_crashed and not self._closed:
            base = live.name.split("~")[0]
            generation = self._generations.get(base, 0) + 1
            self._generations[base] = generation
            self._add_container(f"{base}~{generation}")

    async def _reset(self, lease: Lease) -> bool:
        live = self._live.get(lease.slot.container)
        if live is None:
            _log.warning(
                "fake pool: slot %s/%d quarantined: its container is gone",
                lease.slot.container, lease.slot.index,
            )  # fmt: skip
            return False
        slot = live.slots[lease.slot.index]
        if slot.running is not None:  # as a slot server's reset, it ends the running call at once
            slot.running.cancel()
        async with slot.lock:
            ok = self._fail_resets == 0
            if not ok:
                self._fail_resets -= 1
                _log.warning(
                    "fake pool: slot %s/%d quarantined: a scripted reset failure "
                    "(fail_next_reset)",
                    lease.slot.container, lease.slot.index,
                )  # fmt: skip
            slot.files.clear()
            slot.results.clear()
            await self._wipe(lease.slot)
        self.resets.append(ResetRecord(slot=lease.slot, epoch=lease.epoch, ok=ok))
        return ok

    async def _run(self, live: _FakeContainer, call: SlotCall, arrived: float) -> ToolResult:
        slot = live.slots[call.lease.slot.index]
        key = (call.lease.epoch, call.call.id)
        async with slot.lock:
            seen = slot.results.get(key)
            if seen is not None:
                return seen
            refusal = self._leasing.refusal(live.name, call)
            if refusal is not None:  # its lease ended while it waited for the slot
                return ToolResult.lease_refusal(call.call, refusal)
            if call.time_left_s is not None:  # what remains of its turn's time bounds it
                left = arrived + call.time_left_s - anyio.current_time()
                if left <= 0:
                    reason = time_left_spent(call.time_left_s)
                    slot.results[key] = ToolResult.failure(call.call, ToolOutcome.TIMEOUT, reason)
                    return slot.results[key]
                if left < call.timeout_s:
                    call = attrs.evolve(call, timeout_s=left)
            self.executed.append(
                ExecutedCall(
                    container=live.name,
                    slot=call.lease.slot.index,
                    epoch=call.lease.epoch,
                    call_id=call.call.id,
                    tool=call.call.name,
                    arguments=dict(call.arguments),
                    hook=call.hook,
                )
            )
            result: ToolResult | None = None
            try:
                with anyio.CancelScope() as slot.running:
                    result = await self._tool(call)
            finally:
                slot.running = None
            if result is None:  # its lease ended while it ran (``_reset``)
                lease = f"{call.lease.slot}#{call.lease.epoch}"
                reason = f"lease {lease} ended while the call ran; the call was ended with it"
                result = ToolResult.failure(call.call, ToolOutcome.INFRA_ERROR, reason)
            slot.results[key] = result
            return result

    async def _tool(self, call: SlotCall) -> ToolResult:
        name = call.call.name
        spec = _TOOLS.get(name)
        if spec is None:
            reason = f"unknown tool {name!r} (this slot runs {', '.join(_TOOLS)}) @ $.tool"
            return ToolResult.failure(call.call, ToolOutcome.REJECTED, reason)
        problems = spec.validate_arguments(call.arguments)
        if problems:
            reason = f"{problems[0]} (tool {name})"
            return ToolResult.failure(call.call, ToolOutcome.REJECTED, reason)
        args = call.arguments
        slot = call.lease.slot
        if name in ("read_file", "write_file"):
            refusal = file_call_problem(name, args)  # the slot server's rule, path then content
            if refusal is not None:
                return ToolResult.failure(call.call, ToolOutcome.REJECTED, refusal)
            path = home_relative(cast("str", args["path"]))
            if name == "read_file":
                return await self._read(slot, call, path)
            content = cast("str", args["content"])
            return await self._write(slot, call, path, content, args.get("append") is True)
        refusal = self._refused_tool(name)
        if refusal is not None:
            return ToolResult.failure(call.call, ToolOutcome.REJECTED, refusal)
        return await self._command(slot, call, cast("str", args["command"]))


def _images(
    _: object,
    attribute: attrs.Attribute[Mapping[str, Mapping[str, str]]],
    value: Mapping[str, Mapping[str, str]],
) -> None:
    items: object = value
    if not isinstance(items, Mapping):
        raise ConfigError(attribute.name, f"expected a mapping, got {type(items).__name__}")
    for reference, files in value.items():
        field = f"{attribute.name}[{reference!r}]"
        try:
            check_environment(reference, field=field)
        except EnvironmentUnavailable as error:
            raise ConfigError(field, error.reason) from None
        found: object = files
        if not isinstance(found, Mapping) or not all(
            isinstance(path, str) and path.startswith("/") and isinstance(text, str)
            for path, text in found.items()
        ):
            raise ConfigError(field, "expected absolute paths to text")


@attrs.define(eq=False)
class FakeSandboxPool(InProcessSlotPool):
    """An in-memory SandboxPool: ``async with FakeSandboxPool(containers=2, slots=4) as pool``.

    Attributes:
        containers: How many containers it starts with (named ``fake-0``, ``fake-1``, ...).
        slots_per_container: Slots per container.
        handler: Answers ``bash`` and ``bash_stateful`` commands (``default_command`` by default).
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: no limit).
        restart_crashed: Replace a crashed container with a fresh one.
        start_delay_s: How long entering the pool takes (a slow start).
        images: The task environments it runs: reference to the image's files by absolute path.
        fork_wait_s: How long ``lease_from`` waits for a slot of the snapshot's container
            before it takes any slot (a fallback over the plain image).
        executed, batches, resets, environment_leases: The record (see the module docstring).
    """

    handler: CommandHandler = default_command
    images: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict, validator=_images)
    fork_wait_s: float = DEFAULT_FORK_WAIT_S
    environment_leases: list[EnvironmentLeaseRecord] = attrs.field(init=False, factory=list)
    _made: set[tuple[str, str]] = attrs.field(init=False, factory=set)
    _snapshots: dict[str, FakeWorkspace] = attrs.field(init=False, factory=dict)
    _snapshot_ids: int = attrs.field(init=False, default=0)

    def workspace(self, slot: SlotId) -> FakeWorkspace:
        """The files of ``slot`` (live; mutate to prepare a workspace), its image's included
        at their absolute paths. Raises ``KeyError``."""
        return self._files(slot)

    def environment_leased(self, lease: Lease, environment: str, forked: bool) -> None:
        self.environment_leases.append(
            EnvironmentLeaseRecord(
                holder=lease.holder, environment=environment, slot=lease.slot,
                epoch=lease.epoch, forked=forked,
            )
        )  # fmt: skip

    def environment_refused(
        self, holder: str, environment: str, error: EnvironmentUnavailable
    ) -> None:
        self.environment_leases.append(
            EnvironmentLeaseRecord(holder=holder, environment=environment, refusal=str(error))
        )

    def environment_refusal(self) -> tuple[str, str] | None:
        return None

    async def enter_environment(
        self, lease: Lease, environment: str, snapshot: Snapshot | None
    ) -> bool:
        """Put the image's files in the slot (or the snapshot's, when the slot is on its
        container), or refuse an image it does not hold."""
        files = self.images.get(environment)
        if files is None:
            known = ", ".join(sorted(self.images)) or "none"
            raise EnvironmentUnavailable(
                environment,
                f"image {environment} is not one of the fake pool's images ({known})",
            )
        await anyio.lowlevel.checkpoint()
        where = lease.slot.container
        frozen = None if snapshot is None else self._snapshots.get(snapshot.snapshot)
        fork = frozen is not None and snapshot is not None and snapshot.container == where
        made = (where, environment)
        self._environments.answered(hit=made in self._made, duration_s=0.0, fork=fork)
        self._made.add(made)
        self._files(lease.slot).update(frozen if fork and frozen is not None else files)
        return fork

    async def snapshot(self, lease: Lease, environment: str) -> Snapshot:
        """Freeze the slot's files (image and workspace) under a new id."""
        await anyio.lowlevel.checkpoint()
        self._snapshot_ids += 1
        name = f"fake-snapshot-{self._snapshot_ids}"
        files = dict(self._files(lease.slot))
        self._snapshots[name] = files
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in files.values())
        self._environments.froze(duration_s=0.0, size_bytes=size)
        return Snapshot(
            environment=environment, container=lease.slot.container, snapshot=name,
            bytes=size, files=len(files),
        )  # fmt: skip

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshots.pop(snapshot.snapshot, None)

    def _files(self, slot: SlotId) -> FakeWorkspace:
        return self._container(slot.container).slots[slot.index].files

    async def _read(self, slot: SlotId, call: SlotCall, path: str) -> ToolResult:
        files = self._files(slot)
        key, no_file = _file_key(files, path, write=False)
        if no_file is not None:
            return file_error(call, no_file)
        return ToolResult(
            call_id=call.call.id, name=call.call.name, outcome=ToolOutcome.OK, content=files[key]
        )

    async def _write(
        self, slot: SlotId, call: SlotCall, path: str, content: str, append: bool
    ) -> ToolResult:
        files = self._files(slot)
        key, no_file = _file_key(files, path, write=True)
        if no_file is not None:
            return file_error(call, no_file)
        files[key] = (files.get(key, "") if append else "") + content
        return wrote(call, len(content.encode("utf-8", "surrogatepass")))

    async def _command(self, slot: SlotId, call: SlotCall, command: str) -> ToolResult:
        files = self._files(slot)
        sleep = _sleep_seconds(command)
        if sleep is not None:
            if sleep > call.timeout_s:
                await anyio.sleep(call.timeout_s)
                killed = ExecReport(exit_code=None, timed_out=True, duration_s=call.timeout_s)
                return command_result(call, killed)
            await anyio.sleep(sleep)
            return command_result(call, ExecReport(exit_code=0, duration_s=sleep))
        report = _report(self.handler(command, files)) or _report(default_command(command, files))
        return command_result(call, report or ExecReport(exit_code=127))
