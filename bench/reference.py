"""The machine's compiled reference: what this host does with no Python and no trajcore.

``bench/reference.c`` is built once per source version into the cache directory
(``$TRAJCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/trajcore``, else ``~/.cache/trajcore``) with the
host's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``); ``./dev bench`` builds it first.
The benchmarks run it as a child process (the same process tree as their measurement), before
and after what they measure, and divide by the higher of the two runs, so noise from anything
else on the machine can only lower a ratio:

- (a) the all-core spawn limit: one worker per core, each ``posix_spawn`` of ``/bin/sh -c
  true`` and ``waitpid`` in a loop (spawns/s; at one worker, the p50 of one spawn);
- (b) the kernel work of one sandboxed trajectory without trajcore: a fork that switches to a
  slot uid (when root), enters new user, mount, pid, ipc, uts and network namespaces (loopback
  up), mounts a fresh ``/proc``, installs the very seccomp filter every lease gets (compiled
  here by ``trajcore.adapters.slot_server.seccomp`` from ``SECCOMP_RULES`` and passed as a file),
  then runs eight ``/bin/sh -c true``; one worker per core (trajectories/s);
- (a') the all-core spawn limit inside a lease's isolation (each run right after one of (a); the
  higher of its best run and of (a)'s best times the best ratio of such a pair, so that a run
  slowed by other load cannot raise a ratio read against it): (a), but each worker first enters
  what a lease has (the slot uid, the namespaces of (b) twice nested, as a lease's pid namespace
  sits in its slot's bubblewrap sandbox, and the filter), then spawns as the compiled lease agent
  does: two pipes read to their end, stdin from ``/dev/null``, signals reset, a new process
  group, or a new session where the agent's source (``slot_helper.c``) still makes one
  (``POSIX_SPAWN_SETSID``: on a kernel with ``sched_autogroup_enabled`` a scheduler autogroup
  per command), and the command 10 nicer (spawns/s). What no user-space change to trajcore can
  go below: the best a sandboxed call can cost.

Every run also reports the CPU its process tree used (``getrusage`` of its reaped children,
``sh`` included), so each rate comes with its CPU per spawn.

Run alone (``.venv/bin/python bench/reference.py``) it builds the program and prints (a), (b)
and (a'), then the breakdown of (a'): (a) with one of the lease's controls at a time, then all of
them, each as its rate and CPU per spawn and their ratios to (a) measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from trajcore.adapters import slot_server
from trajcore.adapters.slot_server.seccomp import compile_filter
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE
from trajcore.domain.seccomp_rules import SECCOMP_RULES

SOURCE = Path(__file__).with_name("reference.c")
SPAWNS_PER_TRAJECTORY = 8
# (a') and its breakdown: a label and the controls of ``reference isolated`` (bench/reference.c).
# (a') itself is all of them, less setsid where the lease agent makes no session per command.
FULL_ISOLATION = "agent,setsid,nice,filter,namespaces,nested"
AGENT_SOURCE = Path(slot_server.__file__).with_name("slot_helper.c")
ISOLATION_STEPS: tuple[tuple[str, str], ...] = (
    ("+ the agent's spawn (pipes, /dev/null, signals, group)", "agent"),
    ("+ a new session (setsid: an autogroup)", "setsid"),
    ("+ nice +10 (setpriority)", "nice"),
    ("+ the seccomp filter only", "filter"),
    ("+ slot uid and namespaces only", "namespaces"),
    ("+ slot uid and namespaces, nested as a lease's", "namespaces,nested"),
    ("all of them", FULL_ISOLATION),
)
# slot uids of the reference's own, past those of the pools and servers the benchmarks start
UID_BASE = DEFAULT_SLOT_UID_BASE + (1 << 18)
NO_COMPILER = (
    "bench/reference.c needs a C compiler to measure this machine's compiled reference: set $CC "
    "or install cc, gcc or clang (Debian and Ubuntu: gcc and libc6-dev)"
)


class ReferenceUnavailable(Exception):
    """The compiled reference cannot be built or run here; the message says why."""


@attrs.frozen(kw_only=True)
class Measured:
    """One run of the reference: ``count`` spawns or trajectories in ``seconds``, the p50
    and p99 of one spawn (spawn, isolated) or of one trajectory's set-up before its first
    command, and ``cpu_s``, the user and system CPU of every process the run started."""

    count: int
    seconds: float
    p50_s: float
    p99_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_one_s(self) -> float:
        """CPU seconds per spawn (or trajectory), every process of the run counted."""
        return self.cpu_s / self.count if self.count else float("nan")

    @property
    def busy(self) -> float:
        """For a run at one worker per core: the share of the cores it kept busy (CPU over
        wall time); below 1, the spawns waited for something other than a core, or other load
        had it."""
        return self.cpu_s / (self.seconds * workers())


@attrs.frozen(kw_only=True)
class Step:
    """One row of (a')'s breakdown: (a) with ``controls``, run in ``pairs`` with plain (a) (the
    isolated run first, then (a); (a) first, then the isolated run; and so on), so that each
    ratio is taken between two runs a few seconds apart."""

    label: str
    controls: str
    pairs: tuple[tuple[Measured, Measured], ...]

    @property
    def rate(self) -> float:
        return statistics.median(isolated.rate for isolated, _ in self.pairs)

    @property
    def cpu_per_one_s(self) -> float:
        return statistics.median(isolated.cpu_per_one_s for isolated, _ in self.pairs)

    @property
    def p50_s(self) -> float:
        return statistics.median(isolated.p50_s for isolated, _ in self.pairs)

    @property
    def rate_ratios(self) -> list[float]:
        return sorted(isolated.rate / plain.rate for isolated, plain in self.pairs)

    @property
    def cpu_ratios(self) -> list[float]:
        return sorted(
            isolated.cpu_per_one_s / plain.cpu_per_one_s for isolated, plain in self.pairs
        )

    @property
    def busy(self) -> float:
        """The median share of the cores the isolated runs kept busy (``Measured.busy``)."""
        return statistics.median(isolated.busy for isolated, _ in self.pairs)


def agent_controls(source: Path = AGENT_SOURCE) -> str:
    """(a')'s controls: every one of a lease's, the new session per command only where the
    compiled lease agent's spawn makes one (``POSIX_SPAWN_SETSID`` in its source). Raises
    ``ReferenceUnavailable`` when the source cannot be read."""
    try:
        text = source.read_text()
    except OSError as error:
        raise ReferenceUnavailable(f"cannot read the lease agent's source: {error}") from None
    if "POSIX_SPAWN_SETSID" in text:
        return FULL_ISOLATION
    return ",".join(c for c in FULL_ISOLATION.split(",") if c != "setsid")


def cache_dir() -> Path:
    if "TRAJCORE_CACHE_DIR" in os.environ:
        return Path(os.environ["TRAJCORE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trajcore"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def build_c(source: Path, name: str) -> Path:
    """``source`` compiled into the cache as ``bench-NAME-<hash of the source>``, built when the
    source changed. Raises ``ReferenceUnavailable`` (no compiler, or it failed)."""
    text = source.read_bytes()
    binary = cache_dir() / f"bench-{name}-{hashlib.sha256(text).hexdigest()[:16]}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    cc = compiler()
    if cc is None:
        raise ReferenceUnavailable(NO_COMPILER.replace("reference.c", source.name))
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    done = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(partial), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ReferenceUnavailable(f"{cc} could not build bench/{source.name}:\n{done.stderr}")
    partial.replace(binary)
    return binary


def build() -> Path:
    """The compiled reference, built when its source changed. Raises ``ReferenceUnavailable``."""
    return build_c(SOURCE, "reference")


def workers() -> int:
    return max(1, min(os.cpu_count() or 1, 64))


@attrs.define
class Reference:
    """The compiled reference, run as this process's child; ``spawns`` and ``trajectories``
    keep every run, and ``best_*`` the higher rate of them."""

    binary: Path
    filter_file: Path
    controls: str
    spawns: list[Measured] = attrs.field(factory=list)
    trajectories: list[Measured] = attrs.field(factory=list)
    single: list[Measured] = attrs.field(factory=list)
    isolated: list[Measured] = attrs.field(factory=list)

    @classmethod
    def prepare(cls, folder: Path) -> Reference:
        """Build the program and write the leases' seccomp filter into ``folder``. Raises
        ``ReferenceUnavailable``."""
        binary = build()
        filter_file = folder / "reference-filter.bpf"
        filter_file.write_bytes(compile_filter(SECCOMP_RULES))
        return cls(binary=binary, filter_file=filter_file, controls=agent_controls())

    async def _run(self, *argv: str) -> Measured:
        process = await asyncio.create_subprocess_exec(
            str(self.binary), *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise ReferenceUnavailable(f"reference {argv[0]} failed: {err.decode().strip()}")
        return Measured(**json.loads(out))

    async def _isolated(self, seconds: float, controls: str) -> Measured:
        return await self._run(
            "isolated", str(workers()), str(seconds), str(self.filter_file), str(UID_BASE),
            controls,
        )  # fmt: skip

    async def limits(self, seconds: float) -> tuple[Measured, Measured]:
        """One run of (a), then one of (a') right after it, at one worker per core (kept by
        nobody: ``measure`` keeps its own)."""
        plain = await self._run("spawn", str(workers()), str(seconds))
        return plain, await self._isolated(seconds, self.controls)

    async def measure(self, seconds: float) -> None:
        """One run of each: (a) at one worker per core and (a') right after it, (a) at one
        worker, (b)."""
        plain, isolated = await self.limits(seconds)
        self.spawns.append(plain)
        self.isolated.append(isolated)
        self.single.append(await self._run("spawn", "1", str(seconds)))
        self.trajectories.append(
            await self._run(
                "trajectory", str(workers()), str(seconds), str(self.filter_file), str(UID_BASE)
            )
        )

    async def breakdown(self, seconds: float, rounds: int) -> list[Step]:
        """(a) with each of ``ISOLATION_STEPS`` and (a'), ``rounds`` times, each run paired with
        a run of plain (a) next to it (in alternating order)."""
        steps = [step for step in ISOLATION_STEPS if step[1] != self.controls]
        steps.append((f"(a') a lease's spawn: {self.controls}", self.controls))
        pairs: dict[str, list[tuple[Measured, Measured]]] = {c: [] for _, c in steps}
        for round_ in range(rounds):
            for _, controls in steps:
                if round_ % 2:
                    plain = await self._run("spawn", str(workers()), str(seconds))
                    isolated = await self._isolated(seconds, controls)
                else:
                    isolated = await self._isolated(seconds, controls)
                    plain = await self._run("spawn", str(workers()), str(seconds))
                pairs[controls].append((isolated, plain))
        return [
            Step(label=label, controls=controls, pairs=tuple(pairs[controls]))
            for label, controls in steps
        ]

    @property
    def spawn_rate(self) -> float:
        """(a): all-core spawns per second, the higher of the runs."""
        return max(m.rate for m in self.spawns)

    @property
    def spawn_p50_s(self) -> float:
        """One compiled spawn's p50 at one worker, the lower of the runs."""
        return min(m.p50_s for m in self.single)

    @property
    def isolated_rate(self) -> float:
        """(a'): all-core spawns per second inside a lease's isolation (``isolated_limit``)."""
        return isolated_limit(self.pairs())

    def pairs(self) -> list[tuple[Measured, Measured]]:
        """Each run of (a) with the run of (a') right after it."""
        return list(zip(self.spawns, self.isolated, strict=True))

    @property
    def trajectory_rate(self) -> float:
        """(b): sandboxed trajectories (eight spawns each) per second, the higher of the runs."""
        return max(m.rate for m in self.trajectories)

    def describe(self) -> list[str]:
        def runs(measured: list[Measured]) -> str:
            return " and ".join(f"{m.rate:,.0f}" for m in measured)

        return [
            f"compiled reference (bench/reference.c, {workers()} workers, one per core; runs "
            f"before and after, the higher taken):",
            f"  (a) all-core spawn limit: {self.spawn_rate:,.0f} spawns/s ({runs(self.spawns)});"
            f" one spawn at 1 worker p50 {self.spawn_p50_s * 1e3:.2f} ms",
            f"  (b) sandboxed trajectory, 8 spawns: {self.trajectory_rate:,.1f} traj/s "
            f"({runs(self.trajectories)}); namespaces+filter set-up p50 "
            f"{min(m.p50_s for m in self.trajectories) * 1e3:.2f} ms",
            f"  (a') all-core spawn limit inside a lease's isolation ({self.controls}):"
            f" {self.isolated_rate:,.0f} spawns/s, {self.isolated_rate / self.spawn_rate:.2f} of"
            f" (a) (its runs {runs(self.isolated)}: "
            + " and ".join(f"{i.rate / a.rate:.2f}" for a, i in self.pairs())
            + f" of the (a) just before); CPU per spawn {cpu_us(self.isolated)} us vs (a)"
            f" {cpu_us(self.spawns)} us",
        ]


def isolated_limit(pairs: list[tuple[Measured, Measured]]) -> float:
    """(a') from runs of (a) each followed by one of (a'): the higher of (a')'s best run and of
    (a)'s best run times the highest ratio of a pair (at most 1: the controls only add work).
    A run slowed by other load so only lowers the ratios read against (a'), as against (a)."""
    best_plain = max(plain.rate for plain, _ in pairs)
    share = min(1.0, max(isolated.rate / plain.rate for plain, isolated in pairs))
    return max(*(isolated.rate for _, isolated in pairs), best_plain * share)


def cpu_us(measured: list[Measured]) -> str:
    """The lowest CPU per spawn of the runs, in microseconds."""
    return f"{min(m.cpu_per_one_s for m in measured) * 1e6:.0f}"


def describe_breakdown(steps: list[Step]) -> list[str]:
    """The breakdown as a table: each row's rate and CPU per spawn (medians of its runs) and
    their ratios to (a) (the median, and the range, of the ratios to the run of (a) beside
    each), and the share of the cores its runs kept busy."""

    def spread(ratios: list[float]) -> str:
        return f"{statistics.median(ratios):5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"

    width = max(len(step.label) for step in steps)
    plain = [p for step in steps for _, p in step.pairs]
    runs = len(steps[0].pairs) if steps else 0
    lines = [
        f"what a lease's isolation costs a spawn ({workers()} workers, one per core; {runs} runs"
        f" of each, each beside a run of (a); medians, and the ratios' range):",
        f"  {'':<{width}}  spawns/s  / (a)              CPU/spawn  / (a)              "
        f"cores busy  p50 ms",
    ]
    lines.extend(
        f"  {step.label:<{width}}  {step.rate:8,.0f}  {spread(step.rate_ratios)}"
        f"  {step.cpu_per_one_s * 1e6:6.0f} us  {spread(step.cpu_ratios)}"
        f"  {step.busy:10.2f}  {step.p50_s * 1e3:6.2f}"
        for step in steps
    )
    if plain:
        busy = statistics.median(m.busy for m in plain)
        lines.append(
            f"  {'(a) plain, the runs beside them':<{width}}"
            f"  {statistics.median(m.rate for m in plain):8,.0f}  {'1.00':<16}"
            f"  {statistics.median(m.cpu_per_one_s for m in plain) * 1e6:6.0f} us  {'1.00':<16}"
            f"  {busy:10.2f}  {statistics.median(m.p50_s for m in plain) * 1e3:6.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--build-only", action="store_true", help="build it and say where")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each row of the breakdown (0: none)"
    )
    args = parser.parse_args()
    try:
        if args.build_only:
            print(f"compiled reference: {build()}")
            return
        with tempfile.TemporaryDirectory(prefix="trajcore-reference-") as folder:
            reference = Reference.prepare(Path(folder))
            asyncio.run(reference.measure(args.seconds))
            print("\n".join(reference.describe()))
            if args.rounds > 0:
                steps = asyncio.run(reference.breakdown(args.seconds, args.rounds))
                print("\n".join(describe_breakdown(steps)), flush=True)
    except ReferenceUnavailable as error:
        sys.exit(f"reference: {error}")


if __name__ == "__main__":
    main()
