"""Each lease's disk budget: the bytes and files it may keep in its writable area, watched.

``max_file_bytes`` (an rlimit) bounds one file; a lease that writes many files could still fill
the host's disk within its timeout and fail every other slot. So each lease also has a budget
for all it writes (``SlotIsolation.disk_bytes`` and ``disk_files``), over its *writable area*:
what it writes lands on the server's storage, in plain host directories under the server's
root:

- its workspace (``ROOT/slots/<i>``), or, for a fork whose workspace is an overlay, that
  overlay's upper layer (``ROOT/forks/<i>/upper``: the snapshot's frozen files below it are
  not the lease's);
- for a lease over a task environment, also its root's upper layer (``ROOT/layers/<i>/upper``).

(``/tmp`` and ``/dev/shm`` are one tmpfs per lease, sized already: ``limits.tmpfs_budget``.)

Why a watcher and not a kernel cap: these directories must stay on disk (a workspace is a
repository checkout, a virtualenv, build output: gigabytes that a tmpfs would hold in memory,
charged to the slot's memory limit), the server often is not root or has no loop devices, and
project quotas need a file system mounted for them. So the server measures, as ``du`` does:
every entry counted once as a file (an inode: directories, links and whiteouts too), each
inode's allocated blocks once (hard links are not counted twice, holes in sparse files not at
all), walked without following a link; the walk stops as soon as the area is over either
budget, so it never looks at more than ``disk_files + 1`` entries (with ``disk_files`` set). Each
directory is opened without following a link and must be the directory listed (device and
inode), so a lease that swaps a queued directory for a link never sends the walk, or the
permission repair below, outside its area.

When: every ``interval_s`` (0.5 s by default) for each slot with a live lease (an agent: its
background processes write between calls too) or a file written by ``write_file`` since its
last measure; a slot whose measure took ``d`` seconds waits ``4 d`` before the next, and a round
that took ``t`` waits ``4 t`` before the next round, so measuring takes at most about a fifth of
one thread. One slot at a time, in a worker thread.

What a lease past its budget gets: its lease ends at once (every process of it, as a reset
ends them), the call it ran fails with ``TOOL_ERROR`` and the reason ("disk budget of N bytes
(disk_bytes) reached ..."), and every later call of that lease epoch fails with the same
reason until the slot is reset; the reset wipes the area as always, so the space comes back.
The other slots go on. The bound is a watcher's: a lease can pass its budget by what it writes
in one interval (plus one measure) before it is ended, which the file-size rlimit and the
disk's speed bound. Before the env's hooks read what the model left (the first hook's call
after a model's call: verifying, scoring), its area is measured once more at once
(``before_hook``), so a burst written just before the trajectory ended is seen by the score,
not only by the next round; the hooks' own writes (a preparation's uploads) are left to it.
A directory the walk cannot read (a server that is not root, a mode the
lease took away) is first given back its owner's rights when it is the server's own; one still
unreadable ends the lease the same way (fail closed: the budget cannot be proven).

A budget at or below the file-size limit is allowed but said at the server's start
(``budget_warnings``): the rlimit then never stops a writer before the budget is gone, so one
file can pass the whole budget before the watcher sees it. It is a warning, not a refusal:
lowering ``disk_bytes`` alone (below the 1 GiB default file limit) is a sound setting, and the
lease is still ended at its budget; only the bound on what it writes past it is lost.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.domain.isolation import SlotIsolation

__all__ = ["DiskUse", "DiskWatch", "budget_warnings", "measure_area", "over_budget", "over_for"]

_log = logging.getLogger(__name__)

_BACKOFF = 4.0  # a slot waits this many times its last measure's duration before the next


@attrs.frozen
class DiskUse:
    """What ``measure_area`` found.

    Attributes:
        bytes: Allocated bytes counted (at least this many when ``over``).
        files: Entries counted (at least this many when ``over``).
        over: The walk stopped because either budget was passed.
        unreadable: A directory the walk could not read (``None``: every one was read).
    """

    bytes: int
    files: int
    over: bool
    unreadable: str | None = None


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ONE_CALL = 3072  # bytes of a path opened in one call: well below the kernel's PATH_MAX (4096)


def _open_long(path: str, flags: int) -> int:
    """``os.open(path, flags)``, also for a path longer than the kernel takes in one call (a
    lease may nest its directories past ``PATH_MAX``, 500 levels of 10-letter names): the
    path is opened in runs of whole components, each run relative to the one before (an
    ``O_PATH`` descriptor that never follows a link at its end); the caller checks what it
    got, as for a short path."""
    rest = os.fsencode(path)
    if len(rest) < _ONE_CALL:
        return os.open(path, flags)
    parent: int | None = None
    try:
        while len(rest) >= _ONE_CALL:
            cut = rest.rindex(b"/", 1, _ONE_CALL)  # components are at most 255 bytes
            step = os.open(rest[:cut], _PATH_DIR, dir_fd=parent)
            if parent is not None:
                os.close(parent)
            parent, rest = step, rest[cut + 1 :]
        return os.open(rest, flags, dir_fd=parent)
    finally:
        if parent is not None:
            os.close(parent)


def _open_dir(path: str, seen: tuple[int, int] | None) -> int | None:
    """An open descriptor of directory ``path`` when it is still the directory the walk saw
    (``seen``: its device and inode; ``None`` for a root), else ``None`` (gone, or replaced by a
    link or another directory meanwhile: the lease may rename what the walk queued, and a
    link put in its place must never be followed into the host's files). A directory of the
    server's own that it cannot read is given its owner's rights back once, through a
    descriptor of that very directory. Raises ``PermissionError`` when that is not enough."""
    try:
        fd = _open_long(path, _OPEN_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None  # a link now stands there
        if not isinstance(error, PermissionError):
            raise
        _own_rights_back(path, seen)
        try:
            fd = _open_long(path, _OPEN_DIR)
        except (FileNotFoundError, NotADirectoryError):
            return None
    info = os.fstat(fd)
    if seen is not None and (info.st_dev, info.st_ino) != seen:
        os.close(fd)
        return None
    return fd


def _own_rights_back(path: str, seen: tuple[int, int] | None) -> None:
    """Give the directory at ``path`` its owner's rights when it is the one seen and the
    server's own; re-raises the ``PermissionError`` otherwise."""
    handle = _open_long(path, _PATH_DIR)
    try:
        info = os.fstat(handle)
        if info.st_uid != os.geteuid() or (seen is not None and (info.st_dev, info.st_ino) != seen):
            raise PermissionError(errno.EACCES, "cannot read the directory", path)
        # an O_PATH descriptor takes no fchmod; its /proc link names exactly this inode
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
    finally:
        os.close(handle)


def measure_area(roots: Sequence[Path], *, max_bytes: int | None, max_files: int | None) -> DiskUse:
    """What the directories ``roots`` hold (not counting the roots themselves), stopping once
    past ``max_bytes`` or ``max_files`` (``None``: no limit). A root or entry that is gone
    (removed meanwhile) counts nothing, nor does a directory replaced meanwhile (each is opened
    without following a link and must be the one listed). Blocking; never raises ``OSError``."""
    total = files = 0
    seen: set[tuple[int, int]] = set()
    pending: list[tuple[str, tuple[int, int] | None]] = [(str(root), None) for root in roots]
    while pending:
        path, identity = pending.pop()
        try:
            fd = _open_dir(path, identity)
        except OSError:
            return DiskUse(total, files, over=False, unreadable=path)
        if fd is None:
            continue
        try:
            with os.scandir(fd) as listing:
                for entry in _entries(listing):
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    files += 1
                    if stat.S_ISDIR(info.st_mode):
                        pending.append((os.path.join(path, entry.name), (info.st_dev, info.st_ino)))
                    elif info.st_nlink > 1:
                        key = (info.st_dev, info.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += info.st_blocks * 512
                    if (max_bytes is not None and total > max_bytes) or (
                        max_files is not None and files > max_files
                    ):
                        return DiskUse(total, files, over=True)
        finally:
            os.close(fd)
    return DiskUse(total, files, over=False)


def _entries(listing: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
    """``listing``'s entries until it ends or fails (its directory removed meanwhile)."""
    while True:
        try:
            entry = next(listing)
        except (StopIteration, OSError):
            return
        yield entry


def budget_warnings(isolation: SlotIsolation) -> list[str]:
    """What in ``isolation``'s disk budget does not do what it seems to (module doc), one line
    each naming both fields and their values; empty when nothing."""
    budget, largest = isolation.disk_bytes, isolation.max_file_bytes
    if budget is None or largest is None or budget > largest:
        return []
    return [
        f"disk_bytes ({budget}) is not above max_file_bytes ({largest}): the file-size limit "
        "never stops a writer before the disk budget is gone, so one file may pass the whole "
        "budget before the lease is ended; set max_file_bytes below disk_bytes"
    ]


def over_budget(use: DiskUse, isolation: SlotIsolation) -> str | None:
    """Why a lease whose area ``use`` describes must end (its budget, named), or ``None``."""
    if use.unreadable is not None:
        return (
            f"disk budget cannot be checked: the lease's directory {use.unreadable!r} cannot be "
            "read; the lease was ended (reset the slot to start a new one)"
        )
    if not use.over:
        return None
    if isolation.disk_files is not None and use.files > isolation.disk_files:
        what = f"disk budget of {isolation.disk_files} files (disk_files) reached"
    else:
        what = f"disk budget of {isolation.disk_bytes} bytes (disk_bytes) reached"
    return (
        f"{what}: the lease's writable area holds at least {use.bytes} bytes in {use.files} "
        "files; the lease was ended (its processes stopped) and every later call of it fails; "
        "reset the slot to start a new lease with its space given back"
    )


@attrs.define(eq=False)
class DiskWatch:
    """Measures every live lease's writable area and ends a lease past its budget.

    Attributes:
        isolation: The budgets (``disk_bytes``, ``disk_files``).
        areas: A slot's writable area (its directories).
        end_lease: Ends a slot's lease (its agent and every process).
        retired: A slot's last retired epoch (an epoch at or below it is reset or resetting).
        interval_s: The shortest time between two measures of one slot.
    """

    isolation: SlotIsolation
    areas: Callable[[Slot], list[Path]]
    end_lease: Callable[[Slot], Awaitable[None]]
    retired: Callable[[Slot], int]
    interval_s: float = 0.5
    _due: dict[int, float] = attrs.field(factory=dict)
    _round_s: float = 0.0  # the last round's measuring time

    @property
    def enabled(self) -> bool:
        return self.isolation.disk_bytes is not None or self.isolation.disk_files is not None

    async def run(self, slots: Sequence[Slot]) -> None:
        """Watch ``slots`` until cancelled."""
        while True:
            # the whole round paced as each slot is: one thread measuring N heavy slots in a
            # row would otherwise be busy N / (N + 4) of the time
            await asyncio.sleep(max(self.interval_s, _BACKOFF * self._round_s))
            try:
                await self.tick(slots)
            except Exception:  # noqa: BLE001 - a fault of one round never ends the watch
                _log.exception("cannot check the leases' disk budgets")

    async def tick(self, slots: Sequence[Slot]) -> list[str]:
        """One round: measure every slot of ``slots`` whose lease is live (or wrote a file)
        and whose turn has come, in one worker thread, one after another; end each lease past
        its budget. Returns the reasons the leases ended for."""
        now = time.monotonic()
        due: list[_Due] = []
        for slot in slots:
            agent = slot.agent
            live = agent is not None and slot.warmed is not agent
            epoch = slot.agent_epoch if live else slot.disk_written
            if epoch is None or epoch <= self.retired(slot) or over_for(slot, epoch) is not None:
                continue
            if now >= self._due.get(slot.index, 0.0):
                due.append(_Due(slot, agent, epoch, slot.disk_written, self.areas(slot)))
        if not due:
            return []
        measured = await asyncio.to_thread(self._measure, [each.area for each in due])
        self._round_s = sum(took for _, took in measured)
        reasons: list[str] = []
        for each, (use, took) in zip(due, measured, strict=True):
            self._due[each.slot.index] = time.monotonic() + max(self.interval_s, _BACKOFF * took)
            reason = await self._settle(each, use)
            if reason is not None:
                reasons.append(reason)
        return reasons

    async def before_hook(self, slot: Slot, epoch: int) -> None:
        """Measure lease ``epoch`` of ``slot`` now, as a round does (and end it past its
        budget), when the model's calls ran in it since a hook's call last did so, and it is
        neither marked already nor reset: a hook's call is about to read what the model left,
        and the watch may not have measured since its last writes."""
        if not self.enabled or slot.model_ran != epoch:
            return
        slot.model_ran = None
        if epoch <= self.retired(slot) or over_for(slot, epoch) is not None:
            return
        each = _Due(slot, slot.agent, epoch, slot.disk_written, self.areas(slot))
        ((use, took),) = await asyncio.to_thread(self._measure, [each.area])
        self._due[slot.index] = time.monotonic() + max(self.interval_s, _BACKOFF * took)
        await self._settle(each, use)

    def _measure(self, areas: list[list[Path]]) -> list[tuple[DiskUse, float]]:
        found = []
        for area in areas:
            started = time.monotonic()
            use = measure_area(
                area, max_bytes=self.isolation.disk_bytes, max_files=self.isolation.disk_files
            )
            found.append((use, time.monotonic() - started))
        return found

    async def _settle(self, each: _Due, use: DiskUse) -> str | None:
        slot, epoch = each.slot, each.epoch
        reason = over_budget(use, self.isolation)
        if reason is None:
            if slot.disk_written == each.written:  # no write_file since: nothing new to measure
                slot.disk_written = None
            return None
        if epoch <= self.retired(slot) or slot.agent is not each.agent:
            return None  # reset, or another lease, meanwhile
        slot.disk_over = (epoch, reason)
        _log.warning("slot %d, lease epoch %d: %s", slot.index, epoch, reason)
        agent = slot.agent
        # live now, not only when the round began: a first command may have taken a warmed
        # agent while the walk ran (the watch never measures a lease marked over again)
        if agent is not None and slot.warmed is not agent:
            try:
                await self.end_lease(slot)
            except Exception:  # noqa: BLE001 - logged; its calls still fail naming the budget
                _log.exception("slot %d: cannot end the lease past its disk budget", slot.index)
        return reason


@attrs.frozen
class _Due:
    """A slot measured in one round, and what it was when the round began."""

    slot: Slot
    agent: object
    epoch: int
    written: int | None
    area: list[Path]


def over_for(slot: Slot, epoch: int) -> str | None:
    """Why lease ``epoch`` of ``slot`` was ended for its disk budget, or ``None``."""
    over = slot.disk_over
    return over[1] if over is not None and over[0] == epoch else None
