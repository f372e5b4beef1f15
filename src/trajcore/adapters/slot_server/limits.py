"""Per-slot resource limits: a cgroup per slot where the host lets us make one, rlimits otherwise.

With cgroups, a slot's sandbox is started inside its own cgroup (the process that execs bubblewrap
enters it first, so nothing of the slot is ever outside), ``pids.max`` bounds the slot's process
count and ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) its memory; a fork bomb or a
memory hog in one slot cannot starve another. cgroup v2 is used when ``/sys/fs/cgroup`` is the
unified hierarchy and the server's own cgroup can delegate ``pids`` and ``memory`` to children
(the server moves itself into a leaf child to satisfy the no-internal-processes rule); cgroup v1
when the ``pids`` hierarchy is writable. Otherwise the exec agent sets rlimits on itself and so on
everything it starts: ``RLIMIT_AS`` per process, ``RLIMIT_NPROC`` (which the kernel does not apply
to processes whose real user is root on the host; the sandbox then relies on the server not
running as root for that bound).

A sandboxed lease's ``/tmp`` and ``/dev/shm`` are two folders of one tmpfs, sized by
``tmpfs_budget``: a quarter of the slot's memory, with one inode per 4 KiB of it. With a memory
cgroup the files' pages are charged to the slot like any other memory, and the size only turns
"the slot is out of memory" into "the disk is full" for a writer that fills them. Without one,
the budget is carved out of the memory limit: every process gets ``RLIMIT_AS`` of the limit less
the budget, so the files plus any one process stay within the slot's memory
(``rlimits_for``). ``RLIMIT_NICE`` is always 0: no process of a slot may lower its nice value,
whatever limit the server was started with. ``RLIMIT_CORE`` is always 0 too (soft and hard): no
process of a slot writes a core file (the kernel does not apply it to a ``core_pattern`` that pipes
to a program; docs/sandbox.md).

The hooks' reserve. A quarter of the process limit is kept for the env's hooks (the prepare and
score hooks' ``bash`` calls: ``verify`` requests): every other command runs with
``RLIMIT_NPROC`` of the limit less that reserve (``command_process_limit``), so the processes a
model leaves behind (a fork loop, a thousand background sleepers) cannot take the slots a check
needs; nothing of theirs is ended. That rlimit counts the processes of the command's user in its
user namespace, which is the lease's alone in a sandbox (a user namespace per slot, its own uid
per slot when the server is root); an unsandboxed agent shares its user with the server, so with
a cgroup counting its processes it gets no reserve. Before Linux 5.14 the count is host-wide per
user, and a server that is not root (every slot under its uid) gets no reserve either.

A slot's cgroup is also a second way to find every process of the slot: ``kill_all`` empties it
and ``pids`` proves it empty, which reset uses before it wipes the workspace. Its memory cgroup
counts the processes the kernel's out-of-memory killer ended for the slot's limit
(``oom_kills``): a command's result says so when that count rose while it ran.

Cost. Making a cgroup (a ``mkdir`` and a few limit files per hierarchy; a memory cgroup is the
slow one) is kept off the path of a sandbox's start: the runtime makes every slot's cgroup when it
starts, and a slot keeps its (empty) cgroup from one lease to the next; ``create`` on a cgroup
that already exists does nothing. The cgroups are removed when the runtime closes. A server that
cannot close them (killed with SIGKILL) leaves them to its watcher: a small shell in a session of
its own, started beside the cgroups, that waits for the server's end of a pipe to close (however
the server ended), kills what is left in the slots' groups and removes them, then the server's
folder, trying busy ones again for up to 10 s. Where no watcher could run (or it was killed too),
the next server that starts beside them sweeps them (``sweep_stale``: a ``trajcore-PID-...``
folder whose PID is gone, and its slots' groups).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path

import attrs

from trajcore.domain.isolation import SlotIsolation

__all__ = [
    "CgroupPlan",
    "SlotCgroup",
    "TmpfsBudget",
    "command_process_limit",
    "detect_cgroups",
    "remove_parent",
    "rlimits_for",
    "sweep_stale",
    "tmpfs_budget",
    "ucounts_per_namespace",
]

_CGROUP_ROOT = Path("/sys/fs/cgroup")
# tmpfs sizes are kept in whole units of this (a multiple of every page size Linux uses)
_TMPFS_UNIT = 64 << 10
_BYTES_PER_INODE = 4096
# The folder a slot server makes for its slots' cgroups: ``trajcore-PID-NAME`` (runtime.py)
_SERVER_CGROUP = re.compile(r"trajcore-([0-9]+)-.+")


@attrs.frozen(kw_only=True)
class CgroupPlan:
    """Where slot cgroups go: one parent directory per hierarchy (one for v2, two for v1)."""

    version: int
    pids_parent: Path
    memory_parent: Path | None
    watcher: subprocess.Popen[bytes] | None = attrs.field(default=None, eq=False, repr=False)

    def parents(self) -> list[Path]:
        """The server's cgroup folders, one per hierarchy."""
        return list(dict.fromkeys(p for p in (self.pids_parent, self.memory_parent) if p))


def _own_path(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _writable_child(parent: Path, name: str, *, fresh: bool = True) -> Path | None:
    """A folder ``name`` below ``parent``. ``fresh``: made here, never one that was there (a
    server of the same pid in another pid namespace, sharing the cgroup file system, may hold
    it, and the watcher empties what it is given), so a name taken gets a suffix."""
    for suffix in ("", *(f"~{secrets.token_hex(3)}" for _ in range(3))):
        probe = parent / f"{name}{suffix}"
        try:
            probe.mkdir(exist_ok=not fresh)
        except FileExistsError:
            continue
        except OSError:
            return None
        return probe
    return None


# The watcher (see the module doc): ``read`` returns at the end of its stdin, the server's pipe;
# then each slot's group is emptied and removed, then the folder, until none is left (10 s).
_WATCHER = r"""while read -r _; do :; done
tries=0
while :; do
  left=
  for parent in "$@"; do
    [ -d "$parent" ] || continue
    for group in "$parent"/*/; do
      [ -d "$group" ] || continue
      [ -f "$group/cgroup.kill" ] && echo 1 2>/dev/null > "$group/cgroup.kill"
      while read -r pid; do kill -9 "$pid" 2>/dev/null; done 2>/dev/null < "$group/cgroup.procs"
      rmdir "$group" 2>/dev/null || left=1
    done
    rmdir "$parent" 2>/dev/null || left=1
  done
  [ -z "$left" ] && exit 0
  tries=$((tries + 1))
  [ "$tries" -ge 100 ] && exit 1
  sleep 0.1
done"""


def _start_watcher(parents: list[Path]) -> subprocess.Popen[bytes] | None:
    """Start the watcher of ``parents``; ``None`` where it cannot run (``sweep_stale`` then)."""
    try:
        return subprocess.Popen(  # its own session: a kill of the server's group spares it
            ["/bin/sh", "-c", _WATCHER, "trajcore-cgroup-watcher", *map(str, parents)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    except OSError:
        return None


def sweep_stale(parent: Path) -> int:
    """Remove the cgroups below ``parent`` that slot servers no longer running left behind
    (``trajcore-PID-...`` whose PID is gone, with their slots' groups; a server killed with
    SIGKILL cannot remove its own); returns how many. Only empty ones go (``rmdir`` refuses
    a cgroup that holds a process or a group); never raises. A PID in use again keeps its
    folder, for a later start to sweep."""
    removed = 0
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return 0
    for entry in entries:
        match = _SERVER_CGROUP.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if os.path.exists(f"/proc/{match.group(1)}"):
            continue
        folder = Path(entry.path)
        with contextlib.suppress(OSError):
            for child in [c for c in folder.iterdir() if c.is_dir()]:
                child.rmdir()
                removed += 1
            folder.rmdir()
            removed += 1
    return removed


def detect_cgroups(tag: str) -> CgroupPlan | None:
    """A plan for per-slot cgroups under a directory named ``tag``, or ``None`` when impossible.
    The plan's watcher removes them if the server ends without ``remove_parent``."""
    try:
        if (_CGROUP_ROOT / "cgroup.controllers").exists():
            plan = _detect_v2(tag)
        else:
            plan = _detect_v1(tag)
    except OSError:
        return None
    if plan is None:
        return None
    return attrs.evolve(plan, watcher=_start_watcher(plan.parents()))


def _detect_v2(tag: str) -> CgroupPlan | None:
    own = _own_path("")
    if own is None:
        return None
    mine = _CGROUP_ROOT / own.lstrip("/")
    enabled = (mine / "cgroup.subtree_control").read_text().split()
    if "pids" not in enabled:
        leaf = _writable_child(mine, "slot-server", fresh=False)  # this process's own leaf
        if leaf is None:
            return None
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (mine / "cgroup.subtree_control").write_text("+pids +memory")
    sweep_stale(mine)
    parent = _writable_child(mine, tag)
    if parent is None:
        return None
    (parent / "cgroup.subtree_control").write_text("+pids +memory")
    return CgroupPlan(version=2, pids_parent=parent, memory_parent=parent)


def _detect_v1(tag: str) -> CgroupPlan | None:
    pids_own = _own_path("pids")
    if pids_own is None or not (_CGROUP_ROOT / "pids").is_dir():
        return None
    pids_own_dir = _CGROUP_ROOT / "pids" / pids_own.lstrip("/")
    sweep_stale(pids_own_dir)
    pids_parent = _writable_child(pids_own_dir, tag)
    if pids_parent is None:
        return None
    memory_parent = None
    memory_own = _own_path("memory")
    if memory_own is not None and (_CGROUP_ROOT / "memory").is_dir():
        memory_own_dir = _CGROUP_ROOT / "memory" / memory_own.lstrip("/")
        sweep_stale(memory_own_dir)
        memory_parent = _writable_child(memory_own_dir, tag)
    return CgroupPlan(version=1, pids_parent=pids_parent, memory_parent=memory_parent)


@attrs.define
class SlotCgroup:
    """The cgroup(s) of one slot's sandbox."""

    plan: CgroupPlan
    name: str
    dirs: list[Path] = attrs.field(factory=list)
    # the ``oom_kills`` count told so far (``new_oom_kills``); ``None``: not read yet
    oom_seen: int | None = None

    def create(self, isolation: SlotIsolation) -> None:
        """Make the slot's cgroup(s) and write the isolation's limits; nothing when they exist
        already (a slot's isolation never changes). Raises ``OSError``."""
        if self.dirs and all(folder.is_dir() for folder in self.dirs):
            return
        self.dirs = []
        pids = self.plan.pids_parent / self.name
        pids.mkdir(exist_ok=True)
        self.dirs.append(pids)
        if isolation.max_processes is not None:
            (pids / "pids.max").write_text(str(isolation.max_processes))
        if self.plan.memory_parent is not None and isolation.memory_bytes is not None:
            memory = self.plan.memory_parent / self.name
            memory.mkdir(exist_ok=True)
            if memory not in self.dirs:
                self.dirs.append(memory)
            limit = "memory.max" if self.plan.version == 2 else "memory.limit_in_bytes"
            (memory / limit).write_text(str(isolation.memory_bytes))
            if self.plan.version == 2:
                with contextlib.suppress(OSError):
                    (memory / "memory.swap.max").write_text("0")

    def oom_kills(self) -> int | None:
        """How many processes of the slot the kernel's out-of-memory killer has ended, for its
        memory limit, since its memory cgroup was made: ``oom_kill`` of ``memory.events`` (v2)
        or ``memory.oom_control`` (v1, Linux 4.13 and later). ``None`` where no memory cgroup
        bounds the slot or the kernel does not count them. Never raises; a read of one small
        kernel file, cheap enough for the event loop."""
        parent = self.plan.memory_parent
        folder = None if parent is None else parent / self.name
        if folder is None or folder not in self.dirs:
            return None
        events = "memory.events" if self.plan.version == 2 else "memory.oom_control"
        try:
            text = (folder / events).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdecimal():
                return int(value)
        return None

    def new_oom_kills(self) -> int:
        """How many ``oom_kills`` came since the count was last read here (0 at the first
        read, or where nothing counts them), the count then kept as read."""
        count = self.oom_kills()
        seen, self.oom_seen = self.oom_seen, count
        return 0 if count is None or seen is None else max(0, count - seen)

    def enter_prefix(self) -> list[str]:
        """An argv prefix that moves itself into the cgroup(s), then execs the rest."""
        targets = " ".join(f"'{d}/cgroup.procs'" for d in self.dirs)
        script = f'for f in {targets}; do echo $$ > "$f" || exit 125; done; exec "$@"'
        return ["/bin/sh", "-c", script, "slot-cgroup"]

    def enter(self, pid: int) -> None:
        """Move process ``pid`` into the cgroup(s). Raises ``OSError``."""
        for folder in self.dirs:
            (folder / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        """Every process in the slot's cgroup(s)."""
        found: set[int] = set()
        for folder in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process of the slot."""
        for folder in self.dirs:
            kill = folder / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = 1.0) -> None:
        """Remove the cgroup directories (they must be empty). A process killed just now stays
        in its cgroup until the kernel has released it (``rmdir`` answers ``EBUSY`` meanwhile,
        as after a sandbox's end, its pid namespace emptied a few milliseconds later): a busy
        one is tried again for up to ``wait_s`` in all, and every directory is tried. Raises the
        first ``OSError`` left; the directories not removed stay in ``dirs``."""
        deadline = time.monotonic() + wait_s
        left: list[Path] = []
        failed: OSError | None = None
        for folder in self.dirs:
            while True:
                try:
                    if folder.exists():
                        folder.rmdir()
                    break
                except OSError as error:
                    if error.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                    left.append(folder)
                    failed = failed or error
                    break
        self.dirs = left
        if failed is not None:
            raise failed


def remove_parent(plan: CgroupPlan, wait_s: float = 1.0) -> None:
    """Remove the plan's parent directories if empty, then end its watcher (it removes what is
    left, the slots' groups included) and reap it within ``wait_s``; never raises. Blocks."""
    for folder in plan.parents():
        with contextlib.suppress(OSError):
            folder.rmdir()
    watcher = plan.watcher
    if watcher is not None and watcher.stdin is not None:
        with contextlib.suppress(OSError):
            watcher.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(wait_s)  # one that is still busy ends within 10 s; Popen reaps it later


@attrs.frozen(kw_only=True)
class TmpfsBudget:
    """The one tmpfs that holds a lease's ``/tmp`` and ``/dev/shm``.

    Attributes:
        size_bytes: Its size (``size=``): what the files in both may hold together.
        inodes: Its inode count (``nr_inodes=``): files and folders in both together.
    """

    size_bytes: int
    inodes: int

    def options(self) -> str:
        """Its size and inode count as ``mount`` options."""
        return f"size={self.size_bytes},nr_inodes={self.inodes}"


def tmpfs_budget(isolation: SlotIsolation) -> TmpfsBudget | None:
    """A lease's tmpfs budget: a quarter of the slot's memory in whole 64 KiB units (at least
    one), one inode per 4 KiB of it; ``None`` when the slot has no memory limit (the kernel's
    default, half the host's memory, then applies)."""
    if isolation.memory_bytes is None:
        return None
    size = max(isolation.memory_bytes // 4 // _TMPFS_UNIT, 1) * _TMPFS_UNIT
    return TmpfsBudget(size_bytes=size, inodes=size // _BYTES_PER_INODE)


def rlimits_for(
    isolation: SlotIsolation, *, cgroup_pids: bool, cgroup_memory: bool, tmpfs_bytes: int = 0
) -> dict[str, int]:
    """The rlimits the exec agent sets on itself (and so on every process it starts).

    Process count and memory are left to the cgroup when it bounds them (an address-space
    rlimit breaks runtimes that reserve large virtual ranges). Without a memory cgroup, each
    process may map the slot's memory less ``tmpfs_bytes``, the size of the lease's tmpfs
    (``tmpfs_budget``; 0 for an agent without one). ``nice`` and ``core`` are always 0.
    """
    limits: dict[str, int] = {"nice": 0, "core": 0}
    if isolation.max_processes is not None and not cgroup_pids:
        limits["nproc"] = isolation.max_processes
    if isolation.memory_bytes is not None and not cgroup_memory:
        limits["as"] = max(isolation.memory_bytes - tmpfs_bytes, 0)
    if isolation.cpu_seconds is not None:
        limits["cpu"] = isolation.cpu_seconds
    if isolation.max_file_bytes is not None:
        limits["fsize"] = isolation.max_file_bytes
    return limits


def command_process_limit(
    isolation: SlotIsolation, *, own_count: bool, cgroup_pids: bool
) -> int | None:
    """The ``RLIMIT_NPROC`` of a lease's commands other than its hooks' (``--command-nproc``):
    the slot's process limit less a quarter of it, the hooks' reserve (see the module doc).

    ``own_count``: whether the user the commands run as counts only this slot's processes (a
    sandboxed lease on Linux 5.14 or later, or a slot uid of its own). ``None``: no reserve, for
    a slot without a process limit, with one under 4, or whose count is not its own while a
    cgroup bounds it (an rlimit would then count other slots' processes as well)."""
    limit = isolation.max_processes
    if limit is None or limit < 4 or (cgroup_pids and not own_count):
        return None
    return limit - limit // 4


@functools.cache
def ucounts_per_namespace() -> bool:
    """Whether ``RLIMIT_NPROC`` counts a user's processes per user namespace (Linux 5.14 and
    later), so a sandbox's own count is its slot's alone."""
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)
