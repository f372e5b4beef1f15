"""Tool-call throughput and latency through slot servers, beside the raw limits of this machine.

With 1, 8 and 64 concurrent trajectories, each in its own slot (the slots spread over a few slot
servers), every trajectory runs ``true`` through the ``bash`` tool in a loop, two ways:

- the path users run: each trajectory leases a slot from ``LocalSandboxPool`` and sends its calls
  through the ``ToolDispatcher`` (batching window, one request per container per batch);
- the direct path: ``SlotServerClient.execute`` with one call per request, to separately started
  slot servers (what the pool and dispatcher add is the difference between the two rows).

Printed beside them, measured in the same run and at the same concurrency:

- raw ``/bin/sh -c true`` spawned directly from asyncio (what one asyncio process can spawn);
- a fresh ``bwrap ... /bin/sh -c true`` per call (the upstream's way), with the same policy;

and, before and after everything, the compiled reference (``bench/reference.py``): (a) the
all-core spawn limit of a compiled spawner, one worker per core, and (a'), the same inside a
lease's isolation (namespaces, filter, slot uid, and the lease agent's way of spawning), each the
higher of its two runs. Every throughput row prints its ratio to (a) first, to (a') second (what
a perfect sandboxed path could reach is (a'), not (a)) and to raw asyncio third.

Also: start times as the servers report them (p50): a slot's first start (its keeper's sandbox
and first lease) and a later lease's start (fresh namespaces from the keeper), and the memory (RSS
and PSS) of an idle leased slot's sandbox (bwrap, its pid 1, the keeper and the lease agent).

Targets (ratios in one run, docs/benchmarks.md): at 64 trajectories, sandboxed calls through the
pool >= 0.85 of (a); at 1, the pool's added p50 per call <= 0.5 ms over one compiled spawn (the
reference's p50 at one worker); sandbox start p50 <= 50 ms; an idle leased slot's PSS < 1 MiB.
Nothing here is hard-coded: every figure is measured in this run. Run: ``.venv/bin/python
bench/tools.py [--seconds 3]``.

Every row also prints this process's CPU per call (``env CPU``: the env's side of a call, or for
the raw rows asyncio's side of a spawn). At one trajectory that CPU lies on the call's path, so
it is why the pool's added p50 here reads above ``bench/one_call.py``'s: that benchmark drives
one slot server with a raw HTTP client (no trajcore on the env's side) and so measures the
server's path alone, while the users' row here also carries ``SlotServerClient`` (HTTP/1.1
client, the batch written and its results read by ``pools.batch_wire``), the pool's batch rules
and the dispatcher's turns (a courier task between the caller and the request; the loop's
turn too where other calls are outstanding). The direct row adds TCP and the general codec
instead of the dispatcher. ``one_call.py --client`` measures the client's share beside the raw
client; docs/benchmarks.md has the split.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reference import Reference, ReferenceUnavailable
from trajcore.adapters.event_loops import asyncio_hooks
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.bwrap import bwrap_argv
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE, SlotIsolation
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall
from trajcore.rollout.dispatcher import DispatcherStatistics, ToolDispatcher

TOKEN = "bench-token"


class Measured:
    """Latencies of one run, its rate and this process's CPU per call (the env's side)."""

    def __init__(self, latencies: list[float], elapsed: float, cpu_s: float = 0.0) -> None:
        self.latencies = sorted(latencies)
        self.rate = len(latencies) / elapsed if elapsed > 0 else 0.0
        self.env_cpu_s = cpu_s / len(latencies) if latencies else float("nan")

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        return self.latencies[min(len(self.latencies) - 1, int(q * len(self.latencies)))]

    def row(self, name: str) -> str:
        return (
            f"  {name:<26} {self.rate:9.0f} calls/s   p50 {self.quantile(0.5) * 1e3:7.2f} ms"
            f"   p99 {self.quantile(0.99) * 1e3:7.2f} ms   n={len(self.latencies)}"
            f"   env CPU {self.env_cpu_s * 1e6:4.0f} us/call"
        )


async def drive(workers: int, seconds: float, once: Callable[[int], Awaitable[None]]) -> Measured:
    """Run ``once(worker)`` in a loop on ``workers`` tasks for ``seconds``."""
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def worker(index: int) -> None:
        while loop.time() < stop_at:
            started = time.perf_counter()
            await once(index)
            latencies.append(time.perf_counter() - started)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return Measured(latencies, time.perf_counter() - started, time.process_time() - cpu)


def start_servers(
    root: Path, servers: int, slots: int
) -> list[tuple[subprocess.Popen[bytes], str]]:
    token_file = root / "token"
    token_file.write_text(TOKEN)
    started = []
    for index in range(servers):
        # slot uids of their own (servers run as root): past the pool's, which start at the
        # default base
        base = DEFAULT_SLOT_UID_BASE + (1 << 16) + index * slots
        argv = [
            sys.executable, "-m", "trajcore.entrypoints.slot_server",
            "--slots", str(slots), "--root", str(root / f"server-{index}"),
            "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--require-sandbox",
            "--slot-uid-base", str(base),
        ]  # fmt: skip
        process = subprocess.Popen(argv, stdout=subprocess.PIPE)
        started.append(process)
    out = []
    for process in started:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        out.append((process, str(ready["address"])))
    return out


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def memory_of(pid: int) -> tuple[int, int]:
    """RSS and PSS in bytes of ``pid`` and all its descendants."""
    rss = pss = 0
    for member in _descendants(pid):
        try:
            text = Path(f"/proc/{member}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "Rss":
                rss += int(value.split()[0]) * 1024
            elif key == "Pss":
                pss += int(value.split()[0]) * 1024
    return rss, pss


def per_call_bwrap_argv(root: Path) -> list[str]:
    """The upstream's way: a whole bwrap sandbox (same policy) around one ``sh -c true``."""
    symlinks = {p: os.readlink(p) for p in SlotIsolation().system_paths if os.path.islink(p)}
    workspace = root / "per-call"
    workspace.mkdir()
    return bwrap_argv(
        SlotIsolation(), workspace=str(workspace), command=["/bin/sh", "-c", "true"],
        host_symlinks=symlinks,
    )  # fmt: skip


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


@attrs.frozen(kw_only=True)
class Level:
    """One concurrency level's four measurements and the dispatcher's counts around the first."""

    level: int
    users: Measured
    ours: Measured
    sh: Measured
    fresh: Measured
    before: DispatcherStatistics
    after: DispatcherStatistics


def report_level(measured: Level, reference: Reference) -> None:
    """Print one concurrency level: the four rows with their ratios to (a), to (a') and to raw
    asyncio, the batching, the added latencies and the targets."""
    level, users, ours, sh = measured.level, measured.users, measured.ours, measured.sh
    limit, isolated = reference.spawn_rate, reference.isolated_rate
    print(f"{level} concurrent trajector{'y' if level == 1 else 'ies'}:")
    for name, row in (
        ("pool + dispatcher (users)", users),
        ("slot server, direct client", ours),
        ("raw /bin/sh from asyncio", sh),
        ("bwrap per call", measured.fresh),
    ):
        print(f"{row.row(name)}   / (a) {row.rate / limit:.2f}   / (a') {row.rate / isolated:.2f}"
              f"   / raw sh {row.rate / sh.rate:.2f}")  # fmt: skip
    batches = measured.after.batches - measured.before.batches
    print(
        f"  pool: {(measured.after.calls - measured.before.calls) / max(batches, 1):.1f} calls"
        f" per request, largest batch so far {measured.after.largest_batch}"
    )
    compiled_p50 = reference.spawn_p50_s
    for name, row in (("pool", users), ("direct", ours)):
        print(
            f"  {name:<6} added p50 = {(row.quantile(0.5) - sh.quantile(0.5)) * 1e3:+.2f} ms"
            f" over raw sh, {(row.quantile(0.5) - compiled_p50) * 1e3:+.2f} ms over a compiled"
            f" spawn   added p99 over raw sh ="
            f" {(row.quantile(0.99) - sh.quantile(0.99)) * 1e3:+.2f} ms"
        )
    if level == 64:
        ratio = users.rate / limit
        print(f"  TARGET sandboxed calls at 64 >= 0.85 of (a): {ratio:.2f}  "
              f"{verdict(ratio >= 0.85)}   (direct client {ours.rate / limit:.2f}); of (a'), "
              f"the limit inside a lease's isolation ({isolated / limit:.2f} of (a)): "
              f"{users.rate / isolated:.2f} (direct {ours.rate / isolated:.2f})")  # fmt: skip
    if level == 1:
        added = (users.quantile(0.5) - compiled_p50) * 1e3
        print(f"  TARGET added p50 at 1 <= 0.5 ms over a compiled spawn: {added:+.2f} ms  "
              f"{verdict(added <= 0.5)}   (direct client "
              f"{(ours.quantile(0.5) - compiled_p50) * 1e3:+.2f} ms)")  # fmt: skip


async def bench(  # noqa: PLR0915 - one linear script of measurements
    *,
    seconds: float,
    root: Path,
    addresses: list[str],
    slots_per_server: int,
    window_ms: float,
    reference: Reference,
) -> None:
    levels = [1, 8, 64]
    servers = len(addresses)
    clients = [SlotServerClient.tcp(address, TOKEN) for address in addresses]
    counter = iter(range(1, 1 << 62))
    pool_config = LocalPoolConfig(
        containers=servers,
        server=SlotServerSettings(
            slots_per_container=slots_per_server, isolation=SlotIsolation(require_sandbox=True)
        ),
    )
    pool = LocalSandboxPool(pool_config)
    dispatcher = ToolDispatcher(pool, BatchConfig(window_ms=window_ms), loop_hooks=asyncio_hooks)
    try:
        await pool.__aenter__()
        await dispatcher.__aenter__()
        await reference.measure(min(seconds, 2.0))
        health = await clients[0].health()
        print(f"slot servers: {servers} x {health.slots} slots, sandboxed={health.sandboxed}, "
              f"cgroups={health.capabilities.cgroups}, cpus={os.cpu_count()}")  # fmt: skip

        def where(trajectory: int) -> tuple[SlotServerClient, int]:
            return clients[trajectory % servers], trajectory // servers

        epoch = 1

        async def sandboxed(trajectory: int) -> None:
            client, slot = where(trajectory)
            call = ExecuteCall(
                slot=slot, epoch=epoch, call_id=f"b{next(counter)}", tool="bash",
                arguments={"command": "true"}, timeout_s=30,
            )  # fmt: skip
            (result,) = await client.execute([call])
            if result.exec is None or result.exec.exit_code != 0:
                raise RuntimeError(f"call failed: {result}")

        async def raw_sh(_: int) -> None:
            process = await asyncio.create_subprocess_exec("/bin/sh", "-c", "true")
            await process.wait()

        per_call_argv = per_call_bwrap_argv(root)
        leases: list[Lease] = []

        async def through_pool(trajectory: int) -> None:
            lease = leases[trajectory]
            call = ToolCall(id=f"p{next(counter)}", name="bash", arguments={"command": "true"})
            (result,) = await dispatcher.run([SlotCall(lease=lease, call=call, timeout_s=30)])
            if result.exec is None or result.exec.exit_code != 0:
                raise RuntimeError(f"call failed: {result}")

        async def per_call_bwrap(_: int) -> None:
            process = await asyncio.create_subprocess_exec(*per_call_argv)
            await process.wait()

        async def start_times() -> list[float]:
            return [
                info.sandbox_start_s
                for client in clients
                for info in (await client.list_slots()).slots
                if info.sandbox_start_s is not None
            ]

        # Start every slot, one at a time (a slot's own start, not 64 contending), then read the
        # start times the servers measured: a slot's first start is its keeper's sandbox and the
        # first lease. Then reset each and start a second lease: what every later lease costs.
        for trajectory in range(max(levels)):
            await sandboxed(trajectory)
        starts = await start_times()
        for trajectory in range(max(levels)):
            client, slot = where(trajectory)
            if not (await client.reset(slot, epoch)).ok:
                raise RuntimeError(f"reset of slot {slot} failed")
        epoch += 1
        for trajectory in range(max(levels)):
            await sandboxed(trajectory)
        lease_starts = await start_times()
        measured: list[Level] = []
        for level in levels:
            async with AsyncExitStack() as held:
                leases[:] = [
                    await held.enter_async_context(pool.lease(f"bench-{i}")) for i in range(level)
                ]
                for i in range(level):  # start each leased slot's sandbox before timing
                    await through_pool(i)
                before = dispatcher.statistics()
                users = await drive(level, seconds, through_pool)
                after = dispatcher.statistics()
            ours = await drive(level, seconds, sandboxed)
            sh = await drive(level, seconds, raw_sh)
            fresh = await drive(level, seconds, per_call_bwrap)
            measured.append(
                Level(level=level, users=users, ours=ours, sh=sh, fresh=fresh, before=before,
                      after=after)
            )  # fmt: skip
        await reference.measure(min(seconds, 2.0))
        print("\n".join(reference.describe()))
        print()
        for level_measured in measured:
            report_level(level_measured, reference)
        print()
        for what, times in (
            ("slot start (keeper sandbox + first lease)", starts),
            ("lease start on its path (every later lease, warmed after its reset)", lease_starts),
        ):
            p50_start = statistics.median(times) * 1e3
            print(f"{what}: p50 {p50_start:.1f} ms over {len(times)} slots "
                  f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}); "
                  f"target <= 50 ms: {'met' if p50_start <= 50 else 'NOT met'}")  # fmt: skip
        memory: list[tuple[int, int]] = []
        for client in clients:
            listing = await client.list_slots()
            memory.extend(memory_of(i.sandbox_pid) for i in listing.slots if i.sandbox_pid)
        if memory:
            rss = statistics.median(m[0] for m in memory) / (1 << 20)
            pss = statistics.median(m[1] for m in memory) / (1 << 20)
            print(f"memory per idle leased slot (bwrap, its pid 1, keeper, lease agent): "
                  f"RSS {rss:.1f} MiB, PSS {pss:.2f} MiB (median of {len(memory)})   "
                  f"TARGET PSS < 1 MiB: {verdict(pss < 1)}")  # fmt: skip
    finally:
        for client in clients:
            await client.aclose()
        await dispatcher.__aexit__(None, None, None)
        await pool.__aexit__(None, None, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots-per-server", type=int, default=16)
    parser.add_argument("--window-ms", type=float, default=5.0, help="dispatcher batch window")
    args = parser.parse_args()
    if args.servers * args.slots_per_server < 64:
        parser.error("need at least 64 slots in all (one per trajectory)")
    root = Path(tempfile.mkdtemp(prefix="trajcore-bench-"))
    root.chmod(0o711)  # slots run as their own uids (servers run as root) must reach it
    try:
        reference = Reference.prepare(root)
    except ReferenceUnavailable as error:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        sys.exit(f"bench/tools.py: {error}")
    processes = start_servers(root, args.servers, args.slots_per_server)
    try:
        addresses = [address for _, address in processes]
        asyncio.run(
            bench(
                seconds=args.seconds,
                root=root,
                addresses=addresses,
                slots_per_server=args.slots_per_server,
                window_ms=args.window_ms,
                reference=reference,
            )
        )
    finally:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            process.wait(30)
            if process.stdout is not None:
                process.stdout.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
