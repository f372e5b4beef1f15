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
  then runs eight ``/bin/sh -c true``; one worker per core (trajectories/s).

Run alone (``.venv/bin/python bench/reference.py``) it builds the program and prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.seccomp import compile_filter
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE
from trajcore.domain.seccomp_rules import SECCOMP_RULES

SOURCE = Path(__file__).with_name("reference.c")
SPAWNS_PER_TRAJECTORY = 8
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
    """One run of the reference: ``count`` spawns or trajectories in ``seconds``, and the p50
    and p99 of one spawn (spawn) or of one trajectory's set-up before its first command."""

    count: int
    seconds: float
    p50_s: float
    p99_s: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


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
    spawns: list[Measured] = attrs.field(factory=list)
    trajectories: list[Measured] = attrs.field(factory=list)
    single: list[Measured] = attrs.field(factory=list)

    @classmethod
    def prepare(cls, folder: Path) -> Reference:
        """Build the program and write the leases' seccomp filter into ``folder``. Raises
        ``ReferenceUnavailable``."""
        binary = build()
        filter_file = folder / "reference-filter.bpf"
        filter_file.write_bytes(compile_filter(SECCOMP_RULES))
        return cls(binary=binary, filter_file=filter_file)

    async def _run(self, *argv: str) -> Measured:
        process = await asyncio.create_subprocess_exec(
            str(self.binary), *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise ReferenceUnavailable(f"reference {argv[0]} failed: {err.decode().strip()}")
        return Measured(**json.loads(out))

    async def measure(self, seconds: float) -> None:
        """One run of each: (a) at one worker per core, (a) at one worker, (b)."""
        self.spawns.append(await self._run("spawn", str(workers()), str(seconds)))
        self.single.append(await self._run("spawn", "1", str(seconds)))
        self.trajectories.append(
            await self._run(
                "trajectory", str(workers()), str(seconds), str(self.filter_file), str(UID_BASE)
            )
        )

    @property
    def spawn_rate(self) -> float:
        """(a): all-core spawns per second, the higher of the runs."""
        return max(m.rate for m in self.spawns)

    @property
    def spawn_p50_s(self) -> float:
        """One compiled spawn's p50 at one worker, the lower of the runs."""
        return min(m.p50_s for m in self.single)

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
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--build-only", action="store_true", help="build it and say where")
    args = parser.parse_args()
    try:
        if args.build_only:
            print(f"compiled reference: {build()}")
            return
        with tempfile.TemporaryDirectory(prefix="trajcore-reference-") as folder:
            reference = Reference.prepare(Path(folder))
            asyncio.run(reference.measure(args.seconds))
            print("\n".join(reference.describe()))
    except ReferenceUnavailable as error:
        sys.exit(f"reference: {error}")


if __name__ == "__main__":
    main()
