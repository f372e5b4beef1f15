"""``UnisolatedSandboxPool``: real commands and real files, in plain directories, WITHOUT ISOLATION.

For testing an env whose work or verification needs real commands (``pytest``, ``git``,
``python``, a compiler) where the shipped ``FakeSandboxPool`` only answers a few scripted
commands, without starting slot servers. Each slot is a directory under one private temporary
directory; ``bash`` runs ``/bin/sh -c`` there as a child of this process, as this process's
user. It passes the same ``SandboxPool`` contract suite as the fake and the local pool.

It is NOT a sandbox: a command can read, write and kill anything this process's user can, reach
the network, and leave a double-forked daemon behind. Run only trusted commands through it (an
env's own scripted policy, its verification), never a model's. The local pool
(``LocalSandboxPool``) is the pool that isolates; the contract is the same, so an env tested
here runs there unchanged.

Rules it keeps (as the slot server does, where a plain process can):

- A slot's workspace is its directory: ``read_file``/``write_file`` refuse a path as the slot
  server does, by the same rule (``slot_protocol.workspace_path_problem``): ``REJECTED`` with
  its reason at ``$.path``. A symlink that leads out and anything but a regular file (a FIFO,
  a socket, a directory, a file asked for as a directory: ``file/``) is the call's
  ``TOOL_ERROR`` (what the model left there, as the slot server answers it); the path is
  opened as it is spelled, so the system answers a trailing slash as the slot server's does.
  They create parent directories on write.
- ``bash`` runs in the workspace with stdin from ``/dev/null``, in a new process group, with
  ``HOME`` set to the workspace and this process's ``PATH`` (nothing else of its environment).
  Output is capped at ``output_limit_bytes`` per stream (head and tail kept). Past the call's
  timeout the group is killed and the result is ``TIMEOUT``. Background processes live on
  until the lease ends: the reset kills every process group the slot's commands started, then
  empties the directory. ``bash_stateful`` and ``tmux`` (a persistent shell) are refused, with
  a reason: use the local pool for them.
- ``aclose`` kills every group still running and removes the temporary directory.

Faults and the record are the fake's (``crash_container``, ``hang_container``,
``fail_next_reset``, ``executed``, ``batches``, ``resets``): see
``trajcore.adapters.fakes.sandbox``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Self

import anyio
import anyio.to_thread
import attrs

from trajcore.adapters.fakes.sandbox import InProcessSlotPool
from trajcore.adapters.fakes.slot_results import command_result, file_error, wrote
from trajcore.domain.errors import StateError
from trajcore.domain.slots import SlotCall, SlotId
from trajcore.domain.tools import ExecReport, ToolOutcome, ToolResult
from trajcore.domain.validators import positive_int

__all__ = ["UnisolatedSandboxPool"]

_DEVNULL = -3  # subprocess.DEVNULL, without importing subprocess into async code
_READ_LIMIT = 16 << 20  # read_file refuses larger files, as the slot server caps its reads
_STOP_WAIT_S = 5.0


def _capped(data: bytes, limit: int) -> tuple[str, int]:
    """``data`` as text, the head and tail kept when it is over ``limit``; and bytes dropped."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), 0
    half = limit // 2
    dropped = len(data) - 2 * half
    text = data[:half].decode("utf-8", "replace") + data[-half:].decode("utf-8", "replace")
    return text, dropped


def _kill_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid``; False when it is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@attrs.define(eq=False)
class UnisolatedSandboxPool(InProcessSlotPool):
    """A ``SandboxPool`` of plain directories and child processes: NOT ISOLATED (module doc).

    ``async with UnisolatedSandboxPool(containers=1, slots_per_container=4) as pool``.

    Attributes:
        containers: How many containers (groups of slots) it starts with (``unisolated-0``...).
        slots_per_container: Slots per container.
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: no limit).
        output_limit_bytes: The most of each of stdout and stderr a call returns.
        restart_crashed, start_delay_s, executed, batches, resets: as ``FakeSandboxPool``'s.
    """

    output_limit_bytes: int = attrs.field(default=64 << 10, validator=positive_int)
    _base: Path | None = attrs.field(init=False, default=None)
    _groups: dict[SlotId, set[int]] = attrs.field(init=False, factory=dict)
    _entered: bool = attrs.field(init=False, default=False)

    prefix = "unisolated"

    async def __aenter__(self) -> Self:
        if self._entered:
            raise StateError("an UnisolatedSandboxPool is entered once")
        self._entered = True
        self._base = Path(tempfile.mkdtemp(prefix="trajcore-unisolated-"))
        return await super().__aenter__()

    async def aclose(self) -> None:
        """See ``SandboxPool.aclose``; also kills what the slots left and removes their files."""
        await super().aclose()
        base, self._base = self._base, None
        if base is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(base, ignore_errors=True))

    @property
    def root(self) -> Path | None:
        """The private directory holding every slot's workspace while the pool is open."""
        return self._base

    def slot_path(self, slot: SlotId) -> Path:
        """The workspace directory of ``slot`` (created on first use).

        Raises:
            StateError: the pool is not open (enter it with ``async with``).
        """
        if self._base is None:
            raise StateError("the UnisolatedSandboxPool is not open: use `async with` first")
        path = self._base / slot.container / str(slot.index)
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------------------- files

    def _inside(self, slot: SlotId, path: str) -> str | None:
        """``path`` in ``slot``'s workspace, spelled as it was (a trailing slash kept), or
        ``None`` when a symlink leads it out."""
        root = os.path.realpath(self.slot_path(slot))
        target = os.path.join(root, path)
        resolved = os.path.realpath(target)
        return target if resolved == root or resolved.startswith(root + os.sep) else None

    def _escape(self, call: SlotCall) -> ToolResult:
        verb = "read" if call.call.name == "read_file" else "write"
        reason = (
            f"cannot {verb} {call.arguments['path']!r}: a symlink leads it out of the workspace"
        )
        return ToolResult.failure(call.call, ToolOutcome.TOOL_ERROR, reason)

    async def _read(self, slot: SlotId, call: SlotCall, path: str) -> ToolResult:
        target = self._inside(slot, path)
        if target is None:
            return self._escape(call)
        try:  # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            return file_error(call, error.strerror or str(error))
        try:
            found = os.fstat(fd)
            if stat.S_ISDIR(found.st_mode):
                return file_error(call, "is a directory")
            if not stat.S_ISREG(found.st_mode):
                return file_error(call, "not a regular file")
            if found.st_size > _READ_LIMIT:
                return file_error(call, f"over {_READ_LIMIT} bytes")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            text = b"".join(chunks).decode("utf-8", "replace")
        finally:
            os.close(fd)
        return ToolResult(
            call_id=call.call.id, name=call.call.name, outcome=ToolOutcome.OK, content=text
        )

    async def _write(
        self, slot: SlotId, call: SlotCall, path: str, content: str, append: bool
    ) -> ToolResult:
        target = self._inside(slot, path)
        if target is None:
            return self._escape(call)
        data = content.encode("utf-8", "surrogatepass")
        with contextlib.suppress(OSError):  # the open below says why a path cannot be written
            found = os.stat(target)
            if not stat.S_ISDIR(found.st_mode) and not stat.S_ISREG(found.st_mode):
                return file_error(call, "not a regular file")  # never open a FIFO to write
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else 0)
        try:
            try:
                fd = os.open(target, flags, 0o644)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(target.rstrip("/")), exist_ok=True)
                fd = os.open(target, flags, 0o644)
            try:
                if not append:  # only now: the open refused what is no file to write
                    os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as error:
            return file_error(call, error.strerror or str(error))
        return wrote(call, len(data))

    # ------------------------------------------------------------------------- commands

    def environment_refusal(self) -> tuple[str, str] | None:
        return (
            "environment",
            "the UnisolatedSandboxPool runs commands on this host's own root and cannot run a "
            "task environment (the local pool does, with image_cache_dir set)",
        )

    def _refused_tool(self, name: str) -> str | None:
        if name in ("bash_stateful", "tmux"):
            return (
                f"{name} needs a persistent shell, which the UnisolatedSandboxPool does not "
                "keep (use the local pool) @ $.tool"
            )
        return super()._refused_tool(name)

    async def _command(self, slot: SlotId, call: SlotCall, command: str) -> ToolResult:
        workdir = self.slot_path(slot)
        assert self._base is not None
        io_dir = self._base / "io"
        io_dir.mkdir(exist_ok=True)
        stem = io_dir / uuid.uuid4().hex
        out_path, err_path = stem.with_suffix(".out"), stem.with_suffix(".err")
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)}
        started = anyio.current_time()
        timed_out = False
        try:
            with out_path.open("wb") as out, err_path.open("wb") as err:
                process = await anyio.open_process(
                    ["/bin/sh", "-c", command],
                    cwd=workdir,
                    env=environment,
                    stdin=_DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            self._groups.setdefault(slot, set()).add(process.pid)
            try:
                with anyio.move_on_after(call.timeout_s) as scope:
                    await process.wait()
                timed_out = scope.cancelled_caught
            finally:  # a timeout, or the caller cancelled: the command goes with it
                if process.returncode is None:
                    _kill_group(process.pid)
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_WAIT_S):
                        await process.wait()
            if not _group_alive(process.pid):
                self._groups[slot].discard(process.pid)
            stdout, stdout_dropped = _capped(out_path.read_bytes(), self.output_limit_bytes)
            stderr, stderr_dropped = _capped(err_path.read_bytes(), self.output_limit_bytes)
        finally:
            out_path.unlink(missing_ok=True)
            err_path.unlink(missing_ok=True)
        report = ExecReport(
            exit_code=None if timed_out else process.returncode,
            stdout=stdout,
            stderr=stderr,
            stdout_dropped=stdout_dropped,
            stderr_dropped=stderr_dropped,
            timed_out=timed_out,
            duration_s=max(0.0, anyio.current_time() - started),
            sandboxed=False,
        )
        return command_result(call, report)

    # ------------------------------------------------------------------------- lifetime

    def _end_groups(self, slot: SlotId) -> None:
        for pgid in self._groups.pop(slot, set()):
            _kill_group(pgid)

    async def _wipe(self, slot: SlotId) -> None:
        self._end_groups(slot)
        if self._base is None:
            return
        path = self._base / slot.container / str(slot.index)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(path, ignore_errors=True))

    async def _drop(self, name: str) -> None:
        for slot in [s for s in self._groups if s.container == name]:
            self._end_groups(slot)
        if self._base is not None:
            path = self._base / name
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(path, ignore_errors=True))
