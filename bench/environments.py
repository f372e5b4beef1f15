"""Task environments: images, leases over them and group preparation, beside their limits.

Every figure is printed beside a limit measured in the same run, as a ratio, with the target's
verdict (met or NOT met):

- **first use** of an image of podman's store (``ImageCache.acquire`` on an empty cache:
  ``podman create`` + ``export`` streamed through the entry checks into the cache) against the
  engine's own ``create`` + ``export | tar -x`` of the same image (target: at most 1.5x); also
  ``cp -a`` of the unpacked tree and a cache hit. Skipped by ``--short``.
- **(a) lease and reset over an image** against today's lease and reset, through
  ``SlotServerClient`` to a real slot server started with ``--image-cache``: a lease's start
  (``lease`` for the image, then its first ``true``) and its reset, p50 of ``--leases`` each,
  the kinds interleaved, each measured lease after a lease and reset of its own kind (as in a
  run of one kind), after a warm-up (target: at most 2x, start and reset each). The image
  is named two ways: in podman's store (``containers-storage:``, whose hit costs one
  ``podman image inspect``) and as an OCI layout of it (``oci:``, ``podman save``); the lease
  request's round trip and the server's own figure for it are printed beside each. Two more
  rows measure a slot's change of environment, against the same limit and target: a lease
  over another image of the store (the example's second task's) and one over no image, each
  right after a lease and reset over the first image (what a slot's readied lease costs a
  lease it does not match).
- **(b) disk per member**: after a typical edit (the SWE-style example's preparation, its fix
  and a pytest run), the member's writable layer and workspace on disk, against the image's
  unpacked size (what a copy of the image per member would take; no target); **memory per idle
  slot over an image**: the PSS of the slot's processes (``/proc/PID/smaps_rollup`` of its
  sandbox and every descendant) against an idle slot without an environment in the same server
  (target: at most 1 MiB).
- **(c) a group of 16 on a realistic task**: a repository generated here (``--repo-files``
  files, ``--repo-mb`` MB: sources and vendored binaries), built into an image with podman;
  a member's preparation copies it into its workspace (as ``examples/swe_style.py`` does).
  Preparing every member (16 leases over the image, each copying) against one member's
  preparation alone: each member's start (lease request to prepared) p50 (target: at most
  50 ms) and the group's total (target: at most 1.25x one member's). Fork (prepare once,
  snapshot, start each member from the snapshot) is measured when the slot server's client has
  snapshots; until then the row says fork is not available and prints the baseline.
  ``--fork-rounds N`` forks every slot from the snapshot N-1 more times (the trash settled
  before each) and prints each such round's member start p50 and their median, beside the
  verdict's first round (one round's p50 moves with the minute's load).

``--short`` (CI): (a) and (b) with fewer leases, (c) over a smaller repository (prepared
into the layer and into the workspace, as the full profile); the first-use row is skipped.
Needs podman, bubblewrap, and the example's image (``./dev images``); a missing one is
named and the rows that need it are NOT RUN.
Run: ``.venv/bin/python bench/environments.py [--short]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.swe_style import SOLUTIONS, TASKS, image_problem

from bench.tools import memory_of
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.task_environments import parse_environment_ref

PODMAN = ["podman", "--runtime", "runc"]
TOKEN = "bench-environments-token"
TARGET_FIRST_USE = 1.5
TARGET_LEASE_RATIO = 2.0
TARGET_IDLE_PSS_MIB = 1.0
TARGET_MEMBER_START_MS = 50.0
TARGET_GROUP_RATIO = 1.25
GROUP = 16
SETTLE_TIMEOUT_S = 300.0  # the most a part waits for the previous part's trash
# Past bench/tools.py's slot uids (servers run as root: every slot has a host uid of its own).
UID_BASE = DEFAULT_SLOT_UID_BASE + (1 << 16) + 4096
_ids = itertools.count()


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


# ------------------------------------------------------------------------- first use


def _export(image: str, into: Path) -> float:
    started = time.perf_counter()
    created = subprocess.run(
        [*PODMAN, "create", image, "/bin/true"],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout.strip()  # fmt: skip
    try:
        into.mkdir()
        export = subprocess.Popen([*PODMAN, "export", created], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(into)], stdin=export.stdout, check=True, timeout=900)
        if export.wait(timeout=900) != 0:
            raise SystemExit("podman export failed")
    finally:
        subprocess.run(
            [*PODMAN, "rm", "-f", created], capture_output=True, timeout=300, check=False
        )
    return time.perf_counter() - started


def first_use(image: str, root: Path) -> None:
    """The first-use row: materialization against the engine's export, copy and hit."""
    export_s = _export(image, root / "export")
    cache = ImageCache(root / "cache", max_bytes=64 << 30)
    ref = parse_environment_ref(f"containers-storage:{image}")
    with cache.acquire(ref) as first:
        first_s = first.image.seconds
        size, entries = first.image.bytes, first.image.entries
        rootfs = first.image.rootfs
    started = time.perf_counter()
    subprocess.run(["cp", "-a", str(rootfs), str(root / "copy")], check=True, timeout=900)
    copy_s = time.perf_counter() - started
    with cache.acquire(ref) as again:
        hit_s = again.image.seconds
    for tree in (root / "export", root / "copy", root / "cache"):
        remove_tree(tree)
    print(f"first use of {image}: {size / 1e6:.0f} MB in {entries} entries")
    print(f"  engine export (create + export | tar -x)  {export_s:7.2f} s   1.00")
    print(f"  first use (export + check + unpack)        {first_s:7.2f} s   "
          f"{first_s / export_s:.2f}")  # fmt: skip
    print(f"  copy of the unpacked tree (cp -a)          {copy_s:7.2f} s   "
          f"{copy_s / export_s:.2f}")  # fmt: skip
    print(f"  hit (inspect, no unpack)                   {hit_s:7.2f} s   "
          f"{hit_s / export_s:.3f}")  # fmt: skip
    print(
        f"  TARGET first use <= {TARGET_FIRST_USE} x the engine export: "
        f"{verdict(first_s <= TARGET_FIRST_USE * export_s)}"
    )


# ------------------------------------------------------------------------ the server


@attrs.define
class Server:
    process: subprocess.Popen[bytes]
    root: Path
    client: SlotServerClient
    epochs: dict[int, int] = attrs.field(factory=dict)

    def next_epoch(self, slot: int) -> int:
        self.epochs[slot] = self.epochs.get(slot, 0) + 1
        return self.epochs[slot]


@contextlib.contextmanager
def slot_server(root: Path, slots: int) -> Iterator[Server]:
    """A slot server with an image cache under ``root``, ``slots`` slots, sandbox required."""
    token_file = root / "token"
    token_file.write_text(TOKEN)
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.slot_server",
        "--slots", str(slots), "--root", str(root / "server"), "--listen", "127.0.0.1:0",
        "--token-file", str(token_file), "--require-sandbox", "--slot-uid-base", str(UID_BASE),
        "--image-cache", str(root / "cache"),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"the slot server did not start (exit {process.wait(30)})")
        address = str(json.loads(line)["address"])
        client = SlotServerClient.tcp(address, TOKEN)
        yield Server(process=process, root=root / "server", client=client)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


async def run(server: Server, slot: int, epoch: int, command: str, timeout_s: float = 600.0) -> str:
    """``command`` in the slot's lease ``epoch``; its stdout. Raises SystemExit when it fails."""
    asked = ExecuteCall(
        slot=slot, epoch=epoch, call_id=f"bench-{next(_ids)}", tool="bash",
        arguments={"command": command}, timeout_s=timeout_s,
    )  # fmt: skip
    (result,) = await server.client.execute([asked])
    code = result.exec.exit_code if result.exec is not None else None
    if code != 0:
        raise SystemExit(f"slot {slot}: {command!r} failed ({result.outcome}): {result.content}")
    return result.content


@attrs.frozen
class Started:
    """A lease's start: its epoch, the whole start (lease request and first call), the lease
    request's round trip and what the server says the request took."""

    epoch: int
    seconds: float
    request_s: float = 0.0
    server_s: float = 0.0


async def start(server: Server, slot: int, environment: str | None) -> Started:
    """A new lease of ``slot`` (over ``environment`` when given) started with ``true``."""
    epoch = server.next_epoch(slot)
    started = time.perf_counter()
    request_s = server_s = 0.0
    if environment is not None:
        answer = await server.client.lease(slot, epoch, environment)
        if not answer.ok:
            raise SystemExit(f"lease over {environment} refused: {answer.field}: {answer.error}")
        request_s, server_s = time.perf_counter() - started, answer.duration_s
    await run(server, slot, epoch, "true")
    return Started(epoch, time.perf_counter() - started, request_s, server_s)


async def lease(server: Server, slot: int, environment: str | None) -> tuple[int, float]:
    """A new lease of ``slot`` (over ``environment`` when given) started with ``true``: its
    epoch and its start's seconds."""
    started = await start(server, slot, environment)
    return started.epoch, started.seconds


async def reset(server: Server, slot: int, epoch: int) -> float:
    started = time.perf_counter()
    done = await server.client.reset(slot, epoch)
    if not done.ok:
        raise SystemExit(f"reset of slot {slot} failed: {done.error}")
    return time.perf_counter() - started


# ------------------------------------------------------------------- (a) lease, reset


Kind = tuple[str | None, str | None]
"""A measured lease's environment, and that of the unmeasured lease and reset before it."""


async def lease_and_reset(server: Server, kinds: dict[str, Kind], leases: int) -> None:
    """(a): ``leases`` starts and resets of each kind (a name, the environment of the lease
    before and of the measured lease), interleaved on slot 0 after three of each as a
    warm-up; the first kind is the limit. Each measured lease follows an unmeasured lease and
    reset of its own kind, as in a run whose leases are all of one kind, unless the kind says
    otherwise: a reset readies the slot's next lease after the lease it ended (a lease over
    the server's root after one without an environment, which a lease over an image must end
    first: 3-4 ms that, in a plain interleaving, fell on whichever kind came after the
    limit's, and on no other)."""
    starts: dict[str, list[Started]] = {kind: [] for kind in kinds}
    resets: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(leases + 3):
        for kind, (previous, environment) in kinds.items():
            before = await start(server, 0, previous)  # the slot as that lease leaves it
            await reset(server, 0, before.epoch)
            started = await start(server, 0, environment)
            reset_s = await reset(server, 0, started.epoch)
            if i >= 3:
                starts[kind].append(started)
                resets[kind].append(reset_s)
    limit = next(iter(kinds))
    limit_start = p50_ms([s.seconds for s in starts[limit]])
    limit_reset = p50_ms(resets[limit])
    print(f"(a) lease and reset, one slot, p50 of {leases} each, against {limit}:")
    print("                                    start   ratio     reset   ratio   lease request"
          " (server)")  # fmt: skip
    verdicts = []
    for kind in kinds:
        start_ms = p50_ms([s.seconds for s in starts[kind]])
        reset_ms = p50_ms(resets[kind])
        request = p50_ms([s.request_s for s in starts[kind]])
        server_ms = p50_ms([s.server_s for s in starts[kind]])
        start_ratio, reset_ratio = start_ms / limit_start, reset_ms / limit_reset
        print(f"  {kind:<30} {start_ms:7.1f} ms {start_ratio:6.2f}  {reset_ms:7.1f} ms "
              f"{reset_ratio:6.2f}   {request:6.1f} ms ({server_ms:.1f} ms)")  # fmt: skip
        if kind != limit:
            verdicts.append(
                f"{kind}: start {verdict(start_ratio <= TARGET_LEASE_RATIO)}, "
                f"reset {verdict(reset_ratio <= TARGET_LEASE_RATIO)}"
            )
    print(f"  TARGET start and reset <= {TARGET_LEASE_RATIO} x {limit}'s: {'; '.join(verdicts)}")


# ------------------------------------------------------------ (b) disk and memory


def disk_bytes(path: Path) -> int:
    """What the tree at ``path`` takes on disk (allocated blocks; each inode once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


async def disk_and_memory(server: Server, environment: str, image_id: str) -> None:
    task = TASKS[0]
    edited, idle = 1, 2
    epoch, _ = await lease(server, edited, environment)
    await run(server, edited, epoch, f"cp -R {task.repo}/. . && chmod -R u+w .")
    await run(server, edited, epoch, str(SOLUTIONS[task.name].arguments["command"]))
    await run(server, edited, epoch, "python3 -m pytest -q -p no:cacheprovider tests")
    plain_epoch, _ = await lease(server, idle, None)
    layer = disk_bytes(server.root / "layers" / str(edited))
    workspace = disk_bytes(server.root / "slots" / str(edited))
    image = disk_bytes(server.root.parent / "cache" / "images" / image_id / "rootfs")
    member = layer + workspace
    print(f"(b) disk per member after a typical edit ({task.name}: its preparation, its fix, "
          f"pytest):")  # fmt: skip
    print(f"  writable layer {layer / 1024:8.0f} KiB   workspace {workspace / 1024:8.0f} KiB   "
          f"member {member / 1024:8.0f} KiB")  # fmt: skip
    print(f"  a copy of the image  {image / 1e6:8.1f} MB   member / copy {member / image:.4f}   "
          f"(no target)")  # fmt: skip
    await asyncio.sleep(1.0)  # idle: nothing runs in either slot
    listing = {info.index: info for info in (await server.client.list_slots()).slots}
    pss: dict[int, float] = {}
    for slot in (edited, idle):
        pid = listing[slot].sandbox_pid
        if pid is None:
            raise SystemExit(f"slot {slot} has no sandbox to measure")
        rss_bytes, pss_bytes = memory_of(pid)
        pss[slot] = pss_bytes / (1 << 20)
        print(f"  idle slot {'over the image' if slot == edited else 'without one   '}: "
              f"RSS {rss_bytes / (1 << 20):5.1f} MiB  PSS {pss[slot]:5.2f} MiB")  # fmt: skip
    print(f"  memory per idle slot over an image: PSS {pss[edited]:.2f} MiB = "
          f"{pss[edited] / pss[idle]:.2f} x an idle slot without one; TARGET PSS <= "
          f"{TARGET_IDLE_PSS_MIB} MiB: {verdict(pss[edited] <= TARGET_IDLE_PSS_MIB)}")  # fmt: skip
    await reset(server, edited, epoch)
    await reset(server, idle, plain_epoch)


# ---------------------------------------------------------------- (c) a group of 16


def write_repository(root: Path, files: int, megabytes: int) -> tuple[int, int]:
    """A repository of ``files`` files, ``megabytes`` MB in all: Python sources in packages
    (a tenth of the bytes) and vendored binaries (the rest), from a seeded generator.
    Returns (files, bytes) written."""
    rng = random.Random(17)  # content, not secrets
    binaries = max(1, files // 50)
    sources = files - binaries
    source_bytes = megabytes * 100_000 // sources
    written = 0
    for i in range(sources):
        folder = root / "src" / f"pkg{i // 100:03d}" / f"mod{i // 20 % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        line = f"def f{i}(x: int) -> int:\n    return x + {i}\n\n\n"
        text = line * max(1, source_bytes // len(line))
        (folder / f"m{i:05d}.py").write_text(text)
        written += len(text)
    blob = (megabytes * 1_000_000 - written) // binaries
    for i in range(binaries):
        folder = root / "vendor" / f"lib{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"_native{i:03d}.so").write_bytes(rng.randbytes(max(blob, 1)))
        written += max(blob, 1)
    return files, written


def build_repository_image(root: Path, tag: str, files: int, megabytes: int) -> tuple[int, int]:
    context = root / "context"
    counted = write_repository(context / "repo", files, megabytes)
    (context / "Containerfile").write_text("FROM trajcore-base:bookworm\nCOPY repo /repo\n")
    subprocess.run(
        [*PODMAN, "build", "--network", "none", "-q", "-t", tag, str(context)],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    remove_tree(context)
    return counted


PREPARATIONS = {
    "layer": "cp -R /repo /src",
    "workspace": "cp -R /repo/. . && chmod -R u+w .",
}
"""A member's preparation: the repository copied out of the image into the lease's writable
layer (``/src``, a new entry at the lease's root) or into its workspace (as
``examples/swe_style.py`` prepares)."""


async def settle(server: Server) -> None:
    """The server's trash emptied and the file systems' dirty pages written out before a timed
    part begins. Preparing every member of (c) writes 16 copies of the repository, which their
    resets set aside for the server to remove in the background, and that removal and the
    kernel's writeback would otherwise fall on whichever part came next (the fork's own
    preparation ran 3-8x slower than a lone one beside them). Before (a), the image's first
    use and its OCI layout have written about 0.5 GB: their writeback stalled the journal
    under the image leases' folder moves (resets 1.9-3.2x the limit's, against 1.5-1.7x after a
    sync), and the limit's leases move no folder. Each part starts from the same state."""
    trash = server.root / "trash"
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while trash.exists() and any(trash.iterdir()):
        if time.monotonic() > deadline:
            print(f"  (the slot server's trash was not empty after {SETTLE_TIMEOUT_S:.0f} s)")
            break
        await asyncio.sleep(0.2)
    await asyncio.to_thread(os.sync)


async def group_preparation(
    server: Server, environment: str, described: str, into: str, files: int, *, rounds: int
) -> None:
    prepare = PREPARATIONS[into]
    for slot in range(GROUP):  # every slot's sandbox started, the image in the cache
        epoch, _ = await lease(server, slot, environment)
        await reset(server, slot, epoch)

    async def member(slot: int) -> tuple[int, float]:
        started = time.perf_counter()
        epoch, _ = await lease(server, slot, environment)
        await run(server, slot, epoch, prepare)
        return epoch, time.perf_counter() - started

    await settle(server)
    epoch, one_s = await member(0)  # the limit: one member's preparation, alone
    await reset(server, 0, epoch)
    await settle(server)
    started = time.perf_counter()
    members = await asyncio.gather(*(member(slot) for slot in range(GROUP)))
    every_s = time.perf_counter() - started
    for slot, (epoch, _) in enumerate(members):
        await reset(server, slot, epoch)
    every = [seconds for _, seconds in members]
    print(f"(c) a group of {GROUP} on {described}, prepared into the {into}: {prepare}")
    print(f"  one member's preparation alone (lease, copy)   {one_s:7.2f} s   1.00")
    print(f"  prepare every member: group total              {every_s:7.2f} s   "
          f"{every_s / one_s:.2f}   member start p50 {p50_ms(every):8.1f} ms")  # fmt: skip
    await settle(server)
    forked = await fork_group(
        server, environment, prepare, files if into == "layer" else None, rounds
    )
    if forked is None:
        starts, total_s, how = every, every_s, "prepare every member (fork is not available)"
    else:
        (starts, total_s), how = forked, "fork"
        print(f"  fork: group total (one preparation, snapshot, {GROUP} members started)"
              f" {total_s:7.2f} s   {total_s / one_s:.2f}   member start p50 "
              f"{p50_ms(starts):8.1f} ms (max {max(starts) * 1e3:.1f} ms)")  # fmt: skip
    group_ok = total_s <= TARGET_GROUP_RATIO * one_s
    print(f"  TARGET ({how}) member start p50 <= {TARGET_MEMBER_START_MS:.0f} ms: "
          f"{verdict(p50_ms(starts) <= TARGET_MEMBER_START_MS)}; group total <= "
          f"{TARGET_GROUP_RATIO} x one member's: {verdict(group_ok)}")  # fmt: skip


async def fork_group(
    server: Server, environment: str, prepare: str, files: int | None, rounds: int = 1
) -> tuple[list[float], float] | None:
    """Prepare once in slot 0, snapshot it, start the other members from the snapshot (slot 0
    goes on over it too): each member's start and the group's total, or ``None`` (said why)
    when the server takes no snapshot. ``rounds`` above 1 forks every slot from the snapshot
    ``rounds - 1`` times more, each such round's member start p50 printed (not in the
    verdict)."""
    client = server.client
    started = time.perf_counter()
    first, _ = await lease(server, 0, environment)
    await run(server, 0, first, prepare)
    prepared_s = time.perf_counter()
    frozen = await client.snapshot(0, first)
    snapshotted_s = time.perf_counter()
    if not frozen.ok or frozen.snapshot is None:
        print(f"  fork: not available: {frozen.field}: {frozen.error}")
        await reset(server, 0, first)
        return None
    snapshot = frozen.snapshot

    async def goes_on() -> Started:
        begun = time.perf_counter()
        await run(server, 0, first, "true")
        return Started(first, time.perf_counter() - begun)

    async def fork(slot: int) -> Started:
        begun = time.perf_counter()
        epoch = server.next_epoch(slot)
        answer = await client.lease(slot, epoch, environment, snapshot=snapshot)
        if not answer.ok:
            raise SystemExit(f"fork refused: {answer.field}: {answer.error}")
        request_s = time.perf_counter() - begun
        await run(server, slot, epoch, "true")
        return Started(epoch, time.perf_counter() - begun, request_s, answer.duration_s)

    members = await asyncio.gather(goes_on(), *(fork(slot) for slot in range(1, GROUP)))
    total_s = time.perf_counter() - started
    if files is not None:  # a member holds the prepared repository
        counted = await run(server, GROUP - 1, members[-1].epoch, "find /src -type f | wc -l")
        if int(counted.split()[-1]) != files:
            raise SystemExit(f"a fork holds {counted.strip()} files of the repository's {files}")
    for slot, member in enumerate(members):
        await reset(server, slot, member.epoch)
    again = []  # more rounds from the same snapshot, every slot a fork (``--fork-rounds``)
    for _ in range(rounds - 1):
        await settle(server)
        more = await asyncio.gather(*(fork(slot) for slot in range(GROUP)))
        for slot, member in enumerate(more):
            await reset(server, slot, member.epoch)
        again.append(p50_ms([member.seconds for member in more]))
    await client.drop_snapshot(snapshot)
    if again:
        print(f"  fork: {len(again)} more rounds of {GROUP} forks from the snapshot (settled "
              f"between): member start p50 {' '.join(f'{p:.1f}' for p in again)} ms, median "
              f"{statistics.median(again):.1f} ms")  # fmt: skip
    forks = members[1:]
    print(f"  fork: the snapshot request {frozen.duration_s:.2f} s "
          f"({frozen.bytes / 1e6:.0f} MB, {frozen.files} entries); a fork's lease request p50 "
          f"{p50_ms([m.request_s for m in forks]):.1f} ms (server "
          f"{p50_ms([m.server_s for m in forks]):.1f} ms, max "
          f"{max(m.server_s for m in forks) * 1e3:.1f} ms), then its first call p50 "
          f"{p50_ms([m.seconds - m.request_s for m in forks]):.1f} ms")  # fmt: skip
    members_s = total_s - (snapshotted_s - started)
    print(f"  fork: preparation {prepared_s - started:.2f} s, snapshot request round trip "
          f"{snapshotted_s - prepared_s:.2f} s, members started {members_s:.2f} s")  # fmt: skip
    return [member.seconds for member in members], total_s


# ------------------------------------------------------------------------------ main


def problems(task_image: str) -> list[str]:
    found = []
    if shutil.which("podman") is None:
        found.append("podman is not installed")
    if shutil.which("bwrap") is None:
        found.append("bubblewrap is not installed")
    if os.geteuid() != 0:
        found.append("the slot server must run as root (one host uid per slot)")
    found += [problem for task in TASKS[:2] if (problem := image_problem(task)) is not None]
    return found


async def leases_and_groups(root: Path, args: argparse.Namespace) -> None:
    environment = TASKS[0].image
    with slot_server(root, GROUP) as server:
        try:
            answer = await server.client.lease(0, server.next_epoch(0), environment)
            if not answer.ok or answer.image_id is None:
                raise SystemExit(f"lease over {environment} refused: {answer.error}")
            await run(server, 0, server.epochs[0], "true")
            await reset(server, 0, server.epochs[0])
            print(f"first use of {environment} at the slot server: {answer.duration_s:.2f} s")
            if "a" in args.rows:
                layout = root / "layout"
                saved = [*PODMAN, "save", "--format", "oci-dir", "-o", str(layout),
                         TASKS[0].image_name]  # fmt: skip
                await asyncio.to_thread(subprocess.run, saved, check=True, capture_output=True)
                first = await start(server, 0, TASKS[1].image)  # its first use, unmeasured
                await reset(server, 0, first.epoch)
                await settle(server)  # the images' first uses and the layout: 0.8 GB written
                kinds: dict[str, Kind] = {
                    "no environment": (None, None),
                    "containers-storage: (hit)": (environment, environment),
                    "oci: layout of it (hit)": (f"oci:{layout}", f"oci:{layout}"),
                    "another image after one": (environment, TASKS[1].image),
                    "no image after one": (environment, None),
                }
                await lease_and_reset(server, kinds, args.leases)
            if "b" in args.rows:
                await disk_and_memory(server, environment, answer.image_id)
            if "c" not in args.rows:
                return
            tag = f"localhost/trajcore-bench-repository:{args.repo_files}-{args.repo_mb}"
            files, written = await asyncio.to_thread(
                build_repository_image, root, tag, args.repo_files, args.repo_mb
            )
            try:
                described = (f"a repository of {files} files, {written / 1e6:.0f} MB "
                             f"(podman's {tag})")  # fmt: skip
                for into in ("layer", "workspace"):
                    await group_preparation(
                        server, f"containers-storage:{tag}", described, into, files,
                        rounds=args.fork_rounds,
                    )  # fmt: skip
            finally:
                removal = [*PODMAN, "rmi", "-f", tag]
                await asyncio.to_thread(subprocess.run, removal, capture_output=True, check=False)
        finally:
            await server.client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/trajcore-base:bookworm",
                        help="the first-use row's image")  # fmt: skip
    parser.add_argument("--short", action="store_true", help="CI's profile")
    parser.add_argument("--leases", type=int, default=None, help="(a): leases of each kind")
    parser.add_argument("--repo-files", type=int, default=None, help="(c): the repository's files")
    parser.add_argument("--repo-mb", type=int, default=None, help="(c): the repository's MB")
    parser.add_argument(
        "--fork-rounds", type=int, default=1, help="(c): fork rounds per snapshot (verdict: 1st)"
    )
    parser.add_argument("--rows", default="first,a,b,c",
                        help="the rows to run, comma-separated (first, a, b, c)")  # fmt: skip
    args = parser.parse_args()
    args.rows = set(args.rows.split(","))
    if args.fork_rounds < 1:
        parser.error(f"--fork-rounds: at least 1, not {args.fork_rounds}")
    unknown = args.rows - {"first", "a", "b", "c"}
    if unknown:
        parser.error(f"--rows: unknown rows {sorted(unknown)} (first, a, b, c)")
    args.leases = args.leases or (10 if args.short else 40)
    args.repo_files = args.repo_files or (1000 if args.short else 5000)
    args.repo_mb = args.repo_mb or (10 if args.short else 100)
    found = problems(TASKS[0].image)
    print(f"bench/environments.py{' --short' if args.short else ''}: load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")  # fmt: skip
    if found:
        print(f"NOT RUN: {'; '.join(found)}")
        return
    root = Path(tempfile.mkdtemp(prefix="trajcore-bench-env-"))
    root.chmod(0o711)  # the slots' uids reach their workspaces below it
    try:
        if args.short or "first" not in args.rows:
            print(f"first use: skipped ({'--short' if args.short else '--rows'})")
        elif subprocess.run([*PODMAN, "image", "exists", args.image], check=False).returncode:
            print(f"first use: NOT RUN: podman's store has no {args.image} (./dev image)")
        else:
            first_use(args.image, root)
        asyncio.run(leases_and_groups(root, args))
    finally:
        remove_tree(root)
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
