"""One call-path measurement against whatever trajcore is importable: ``bench/trees.py`` runs it
with each tree's ``src`` on ``PYTHONPATH`` to compare two revisions on the same machine.

Every trajectory runs ``true`` through the ``bash`` tool in a loop, in its own slot of four
sandboxed slot servers (16 slots each), one of two ways:

- ``pool``: leases from ``LocalSandboxPool`` and calls through the ``ToolDispatcher`` (5 ms
  batching window), the path users run;
- ``direct``: ``SlotServerClient.execute`` with one call per request, to four slot servers
  started here.

After every slot has run one call (its start is not measured), ``--rounds`` rounds of
``--seconds`` each print one JSON line: calls per second, and the CPU seconds per call of this
process (the env side: pool, dispatcher, client), of the slot servers' own processes (their
Python), of everything those servers started (bubblewrap, keepers, lease agents and the commands
they reaped), and of the whole machine (``/proc/stat``); this process's CPU also split into user
and system time, with its involuntary context switches per call (a sampling profiler's samples
in a socket write are mostly the woken slot server running first, not the write's own CPU).
The per-process figures come from ``/proc/<pid>/stat`` and so hold beside other load on a shared
machine, where the machine's figure does not. Only names that every revision since the
containment work has are used, so that older trees run it unchanged.

With ``--reference``, (a), the compiled all-core spawn limit (``bench/reference.c``), and (a'),
the same limit inside a lease's isolation (``bench/reference.py``), run before and after the
rounds, each printed as one JSON line with its spawns per second and the CPU one spawn costs
(its process tree, ``sh`` included), so the rounds' rate and CPU per call read against the
machine's limits measured in the same minutes. A last line gives every round's calls per second
as ratios to (a) and to (a') (the higher of each's two runs), and its sandbox and machine CPU per
call as ratios to (a')'s CPU per spawn (the lower of its runs): what a perfect sandboxed path
would cost.

Run: ``.venv/bin/python bench/call_path.py [pool|direct] [TRAJECTORIES] [--seconds 3]
[--rounds 3] [--reference]`` (the pool at 64 trajectories by default).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

from trajcore.adapters.event_loops import asyncio_hooks
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE, SlotIsolation
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall
from trajcore.rollout.dispatcher import ToolDispatcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc_cpu import below_s, children_by_parent, user_sys_s
from bench.reference import (
    Measured,
    Reference,
    ReferenceUnavailable,
    isolated_limit,
    workers,
)

SERVERS = 4
SLOTS = 16
TOKEN = "call-path-bench-token-0123456789ab"


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core, idle and iowait left out)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def own_usage() -> tuple[float, float, int]:
    """This process's user and system CPU seconds and its involuntary context switches."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_nivcsw


def servers_cpu_s() -> tuple[float, float, float]:
    """User and system CPU seconds of this process's slot servers (their own Python, reaped
    children left out), and CPU seconds of every process below them (with what each reaped:
    the commands)."""
    tree = children_by_parent()
    user, system, below = 0.0, 0.0, 0.0
    stack = list(tree.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                is_server = b"trajcore.entrypoints.slot_server" in cmdline.read()
        except OSError:
            continue
        if is_server:
            server_user, server_sys = user_sys_s(pid)
            user, system = user + server_user, system + server_sys
            below += below_s(pid, tree)
        else:
            stack += tree.get(pid, [])
    return user, system, below


async def rounds(
    path: str, workers: int, seconds: float, count: int, once: Callable[[int], Awaitable[None]]
) -> list[dict[str, float]]:
    """Run the rounds, print each as one JSON line and return their figures."""
    await asyncio.gather(*(once(worker) for worker in range(workers)))  # every slot started
    loop = asyncio.get_running_loop()

    async def worker(index: int, stop_at: float, done: list[int]) -> None:
        while loop.time() < stop_at:
            await once(index)
            done[index] += 1

    printed: list[dict[str, float]] = []
    for _ in range(count):
        done = [0] * workers
        own, whole, started = own_cpu_s(), machine_cpu_s(), time.perf_counter()
        user, system, preempted = own_usage()
        servers_user, servers_sys, below = servers_cpu_s()
        stop_at = loop.time() + seconds
        await asyncio.gather(*(worker(i, stop_at, done) for i in range(workers)))
        elapsed = time.perf_counter() - started
        servers_user_after, servers_sys_after, below_after = servers_cpu_s()
        servers_user_after -= servers_user
        servers_sys_after -= servers_sys
        calls = sum(done)
        user_after, system_after, preempted_after = own_usage()
        printed.append({
            "calls_per_s": calls / elapsed,
            "process_cpu_per_call_s": (own_cpu_s() - own) / calls,
            "process_user_per_call_s": (user_after - user) / calls,
            "process_sys_per_call_s": (system_after - system) / calls,
            "process_preempted_per_call": (preempted_after - preempted) / calls,
            "server_cpu_per_call_s": (servers_user_after + servers_sys_after) / calls,
            "server_user_per_call_s": servers_user_after / calls,
            "server_sys_per_call_s": servers_sys_after / calls,
            "sandbox_cpu_per_call_s": (below_after - below) / calls,
            "machine_cpu_per_call_s": (machine_cpu_s() - whole) / calls,
            "load_1m": os.getloadavg()[0],
        })  # fmt: skip
        print(json.dumps({"path": path, "trajectories": workers, **printed[-1]}), flush=True)
    return printed


async def through_pool(workers: int, seconds: float, count: int) -> list[dict[str, float]]:
    config = LocalPoolConfig(
        containers=SERVERS,
        server=SlotServerSettings(
            slots_per_container=SLOTS, isolation=SlotIsolation(require_sandbox=True)
        ),
    )
    ids = itertools.count()
    batching = BatchConfig(window_ms=5.0)
    async with (
        LocalSandboxPool(config) as pool,
        ToolDispatcher(pool, batching, loop_hooks=asyncio_hooks) as dispatcher,
        AsyncExitStack() as held,
    ):
        leases = [await held.enter_async_context(pool.lease(f"t{i}")) for i in range(workers)]

        async def once(index: int) -> None:
            call = ToolCall(id=f"p{next(ids)}", name="bash", arguments={"command": "true"})
            slot_call = SlotCall(lease=leases[index], call=call, timeout_s=30)
            (result,) = await dispatcher.run([slot_call])
            if result.exec is None or result.exec.exit_code != 0:
                raise RuntimeError(f"call failed: {result}")

        return await rounds("pool", workers, seconds, count, once)


def start_servers(root: Path) -> list[subprocess.Popen[bytes]]:
    """Four sandboxed slot servers on loopback, each with slot uids of its own."""
    token_file = root / "token"
    token_file.write_text(TOKEN)
    servers = []
    for index in range(SERVERS):
        uid_base = DEFAULT_SLOT_UID_BASE + (1 << 16) + index * SLOTS
        argv = [
            sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", str(SLOTS),
            "--root", str(root / f"server-{index}"), "--listen", "127.0.0.1:0",
            "--token-file", str(token_file), "--require-sandbox", "--slot-uid-base", str(uid_base),
        ]  # fmt: skip
        servers.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
    return servers


def addresses(servers: list[subprocess.Popen[bytes]]) -> list[str]:
    out = []
    for server in servers:
        assert server.stdout is not None
        ready = server.stdout.readline()
        if not ready:
            raise RuntimeError("a slot server exited before it was ready")
        out.append(str(json.loads(ready)["address"]))
    return out


async def direct(
    workers: int, seconds: float, count: int, listening: list[str]
) -> list[dict[str, float]]:
    clients = [SlotServerClient.tcp(address, TOKEN) for address in listening]
    try:
        ids = itertools.count()

        async def once(index: int) -> None:
            call = ExecuteCall(
                slot=index // SERVERS, epoch=1, call_id=f"d{next(ids)}", tool="bash",
                arguments={"command": "true"}, timeout_s=30,
            )  # fmt: skip
            (result,) = await clients[index % SERVERS].execute([call])
            if result.exec is None or result.exec.exit_code != 0:
                raise RuntimeError(f"call failed: {result}")

        return await rounds("direct", workers, seconds, count, once)
    finally:
        for client in clients:
            await client.aclose()


def reference_spawns(reference: Reference, seconds: float) -> tuple[Measured, Measured]:
    """(a), the all-core compiled spawn limit (``bench/reference.c``, one worker per core), and
    (a'), the same inside a lease's isolation, each as one JSON line: spawns per second and the
    CPU seconds of one spawn (the reference's process tree, ``sh`` included)."""
    try:
        plain, isolated = asyncio.run(reference.limits(seconds))
    except ReferenceUnavailable as error:
        sys.exit(f"bench/call_path.py: {error}")
    for name, measured, extra in (
        ("reference (a)", plain, {}),
        ("reference (a')", isolated, {"controls": reference.controls}),
    ):
        print(json.dumps({
            "path": name, "workers": workers(), "spawns_per_s": measured.rate, **extra,
            "cpu_per_spawn_s": measured.cpu_per_one_s, "load_1m": os.getloadavg()[0],
        }), flush=True)  # fmt: skip
    return plain, isolated


def ratios(printed: list[dict[str, float]], references: list[tuple[Measured, Measured]]) -> None:
    """One JSON line: each round's calls per second over (a) (the higher of its runs) and over
    (a') (``isolated_limit``), and its sandbox and machine CPU per call over (a')'s CPU per spawn
    (the lower of its runs)."""
    plain = max(pair[0].rate for pair in references)
    isolated = isolated_limit(references)
    isolated_cpu = min(pair[1].cpu_per_one_s for pair in references)
    print(json.dumps({
        "path": "ratios", "a_spawns_per_s": plain, "a_prime_spawns_per_s": isolated,
        "a_prime_over_a": isolated / plain, "a_prime_cpu_per_spawn_s": isolated_cpu,
        "calls_over_a": [round(p["calls_per_s"] / plain, 3) for p in printed],
        "calls_over_a_prime": [round(p["calls_per_s"] / isolated, 3) for p in printed],
        "sandbox_cpu_over_a_prime": [
            round(p["sandbox_cpu_per_call_s"] / isolated_cpu, 3) for p in printed
        ],
        "machine_cpu_over_a_prime": [
            round(p["machine_cpu_per_call_s"] / isolated_cpu, 3) for p in printed
        ],
        "load_1m": os.getloadavg()[0],
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("path", nargs="?", default="pool", choices=("pool", "direct"))
    parser.add_argument(
        "trajectories", nargs="?", type=int, default=SERVERS * SLOTS,
        choices=range(1, SERVERS * SLOTS + 1), metavar=f"1..{SERVERS * SLOTS}",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=3.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--servers", type=int, default=SERVERS, choices=range(1, SERVERS + 1),
        metavar=f"1..{SERVERS}", help="slot servers (one to profile a single server's process)",
    )  # fmt: skip
    parser.add_argument(
        "--reference", action="store_true",
        help="run (a) and (a'), the compiled all-core spawn limits, before and after the rounds",
    )  # fmt: skip
    args = parser.parse_args()
    if args.trajectories > args.servers * SLOTS:
        parser.error(f"{args.servers} servers hold at most {args.servers * SLOTS} trajectories")
    globals()["SERVERS"] = args.servers
    if not args.reference:
        measure(args)
        return
    with tempfile.TemporaryDirectory(prefix="trajcore-call-path-reference-") as folder:
        try:
            reference = Reference.prepare(Path(folder))
        except ReferenceUnavailable as error:
            sys.exit(f"bench/call_path.py: {error}")
        before = reference_spawns(reference, args.seconds)
        printed = measure(args)
        ratios(printed, [before, reference_spawns(reference, args.seconds)])


def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    if args.path == "pool":
        return asyncio.run(through_pool(args.trajectories, args.seconds, args.rounds))
    with tempfile.TemporaryDirectory(prefix="trajcore-call-path-") as folder:
        os.chmod(folder, 0o755)  # the slots' uids reach their workspaces below it
        servers = start_servers(Path(folder))
        try:
            return asyncio.run(
                direct(args.trajectories, args.seconds, args.rounds, addresses(servers))
            )
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(30)


if __name__ == "__main__":
    main()
