"""Rollout throughput and memory: many concurrent trajectories through the real local pool.

256 trajectories run at once, each for 8 turns. Every turn asks a fake chat server that answers
after 50 ms with one ``bash`` call of ``true``; the call runs in the trajectory's own slot of a
``LocalSandboxPool`` (real slot servers, real bubblewrap) through the batching
``ToolDispatcher``. After the 8th turn the loop stops at ``max_turns`` and a score hook (no tool
call) scores the trajectory. Each of the 256 workers runs ``--rounds`` trajectories back to back,
so slot resets and fresh leases between trajectories are part of what is measured: every
trajectory gets new pid, mount, ipc and uts namespaces from its slot's keeper. The keepers
themselves (one sandbox per slot, kept for the pool's life) start before the run, as the slot
servers do: a long run starts each once.

Printed, every figure measured in this run:

- trajectories per second;
- the ideal from the raw limits: the slower of the model-bound rate
  ``concurrency / (turns * latency)`` and the spawn-bound rate ``raw spawns per second / turns``,
  where raw spawns are ``/bin/sh -c true`` started from asyncio in this process, with the pool up
  and idle (the best of 8 and 64 concurrent spawners, measured before the run and again after
  it, the higher taken, so noise can only lower the ratio); and the ratio of the two (target
  >= 0.75);
- the compiled reference (``bench/reference.py``), run as this process's child before and after
  the run, the higher taken: (b) the kernel work of one sandboxed trajectory without trajcore
  (the lease's namespaces, its seccomp filter, a slot uid, eight ``/bin/sh -c true``), one worker
  per core. The target (>= 0.75) is the measured rate's ratio to the compiled ideal, the slower
  of (b) and the model-bound rate: on many cores (b) outruns the model (16 cores ran (b) at
  1,470-1,530 traj/s, while 256 trajectories of 8 turns at 50 ms cannot pass 640). The ratios
  to (b) and to the asyncio ideal above are printed beside it;
- lease start under ``concurrency`` trajectories: the slot servers' ``GET /v1/slots`` are read
  (all at once) every 100 ms during the run and every new ``sandbox_start_s`` (a lease's fresh
  namespaces, timed by the server) is kept; a trajectory lasts at least ``turns * latency``
  (400 ms), so no lease is missed; p50, p99 and max (target p99 <= 10 ms). Each reading costs
  the servers and this process about 0.25 ms of CPU apiece, so it is not read more often;
- the peak RSS of this process (the env side: trajectories, dispatcher, pool clients; the slot
  servers and sandboxes are other processes and are excluded) per concurrent trajectory, as
  ``(VmHWM during the run - VmRSS before it) / concurrency`` (target < 100 KiB). The high-water
  mark is reset through ``/proc/self/clear_refs`` just before the run;
- beside them, what the ideal leaves out: this process's CPU time during the run, the keepers'
  start before it, and the lease start time the slot servers report (each trajectory gets fresh
  namespaces after a reset);
- the load average (1 minute) at the run's start and end (the run's own sandboxes raise the
  second): the lease start's tail and the ratios move with other work on a shared machine;
- where the machine's CPU went during the run (``/proc/stat``, every core), per trajectory: this
  process, the slot servers' own processes, and the rest (keepers, lease agents, commands, the
  kernel's threads, and any other load on the machine), beside (b)'s CPU per trajectory (cores
  over its rate): with every core busy, the ratio to (b) is about the second over the first.

The chat server is a small class here, not ``FakeChatServer``: the fake keeps every request for
inspection, which would charge the trajectories memory that no real client holds.

The env process's garbage collector runs at the threshold an env's ``serve``/``process`` run
sets (``gc_young_threshold``, ``trajcore.entrypoints.gc_tuning``); ``--gc-young-threshold 0``
measures with Python's own.

Pool size: 4 slot servers x 64 slots = 256 slots, one per concurrent trajectory; on a 2-core
machine more servers only add processes competing for the same cores.

``--env-processes K`` spreads the run over K env processes (children of this one, each with its
own event loop, dispatcher and local pool of ``servers / K`` slot servers, running
``concurrency / K`` trajectories), as K env processes of one env would run on a host: they
start the timed run together once every one is warm, each reports its figures, and the rows
sum them (trajectories over the slowest one's wall time; the env processes' CPU added up, each
one's share of a core printed). The limits are measured in this process while the children's
pools are up and idle. One env process tops out near one core on a many-core host
(docs/benchmarks.md, "Rollouts on 16 cores"); this row shows what several do there.

Run: ``.venv/bin/python bench/rollouts.py [--concurrency 256] [--turns 8] [--rounds 4]
[--env-processes K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.call_path import machine_cpu_s
from bench.proc_cpu import cpu_s as process_cpu_s
from bench.reference import Reference, ReferenceUnavailable
from trajcore.adapters.event_loops import asyncio_hooks
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolSpec
from trajcore.entrypoints.gc_tuning import DEFAULT_YOUNG_GC_THRESHOLD, young_gc_threshold
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    run_trajectory,
)

TASK = (Message.system("You run commands."), Message.user("Run true, eight times."))
BASH = tuple(spec for spec in SLOT_TOOL_SPECS if spec.name == "bash")
CHILD_TIMEOUT_S = 1800.0
"""How long the env processes of ``--env-processes`` get to warm up, run and report."""


@attrs.define
class LatencyChatServer:
    """A ``ChatServer`` that answers every turn with ``bash true`` after ``latency_s``."""

    latency_s: float
    requests: int = 0

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        self.requests += 1
        await anyio.sleep(self.latency_s)
        turn = sum(1 for m in messages if m.role == "assistant")
        call = ToolCall(id=f"call_{turn}", name="bash", arguments={"command": "true"})
        return ChatTurn(
            message=Message.assistant("", tool_calls=[call]), finish_reason=FinishReason.TOOL_CALLS
        )

    async def aclose(self) -> None:
        return None


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 1.0


HOOKS = TrajectoryHooks(prepare=_prepare, score=_score)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def status_kib(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS; False when the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def spawn_rate(workers: int, seconds: float) -> float:
    """Raw ``/bin/sh -c true`` spawns per second from ``workers`` concurrent asyncio tasks."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while loop.time() < stop_at:
            process = await asyncio.create_subprocess_exec("/bin/sh", "-c", "true")
            await process.wait()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return done / (time.perf_counter() - started)


async def start_keepers(pool: LocalSandboxPool, slots: int) -> float:
    """Lease every slot at once and run ``true`` in each, so every slot's keeper (its long-lived
    sandbox) is up before the measured run, as it is in any run past its first trajectories.
    Returns the seconds it took."""
    started = time.perf_counter()

    async def once(index: int) -> None:
        async with pool.lease(f"keeper-{index}", timeout_s=300.0) as lease:
            call = ToolCall(id=f"keeper-{index}", name="bash", arguments={"command": "true"})
            (result,) = await pool.execute(
                lease.slot.container, [SlotCall(lease=lease, call=call, timeout_s=60.0)]
            )
            if result.outcome is not ToolOutcome.OK:
                raise RuntimeError(f"slot {lease.slot} did not start: {result.content}")

    async with anyio.create_task_group() as group:
        for index in range(slots):
            group.start_soon(once, index)
    return time.perf_counter() - started


async def watch_lease_starts(pool: LocalSandboxPool, into: list[float], every_s: float) -> None:
    """Until cancelled, read every server's slot listing each ``every_s`` (the servers at once)
    and keep each new ``sandbox_start_s`` (one per lease started since the last reading)."""
    last: dict[tuple[str, int], float | None] = {}

    async def read(name: str) -> None:
        for info in (await pool.client(name).list_slots()).slots:
            key = (name, info.index)
            if key in last and info.sandbox_start_s != last[key] and info.sandbox_start_s:
                into.append(info.sandbox_start_s)
            last[key] = info.sandbox_start_s

    while True:
        async with anyio.create_task_group() as group:
            for name in pool.container_names():
                group.start_soon(read, name)
        await anyio.sleep(every_s)


@attrs.frozen(kw_only=True)
class RunFigures:
    """What one timed run of trajectories measured."""

    trajectories: int
    elapsed_s: float
    statuses: dict[str, int]
    tool_errors: int
    peak_kib: int
    cpu_s: float
    servers_cpu_s: float
    machine_cpu_s: float


async def run_wave(
    *,
    pool: LocalSandboxPool,
    dispatcher: ToolDispatcher,
    chat: LatencyChatServer,
    config: RolloutConfig,
    concurrency: int,
    rounds: int,
    tag: str,
    lease_starts: list[float] | None = None,
) -> RunFigures:
    """``concurrency`` workers, each running ``rounds`` trajectories back to back."""
    policy = ChatPolicy(chat)
    results: list[TrajectoryResult] = []

    async def worker(index: int) -> None:
        for round_ in range(rounds):
            result = await run_trajectory(
                trajectory_id=f"{tag}-{index}-{round_}",
                messages=TASK,
                tools=BASH,
                hooks=HOOKS,
                policy=policy,
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=config,
            )
            results.append(result)

    server_pids = [pool.server_pid(name) for name in pool.container_names()]

    def servers_cpu() -> float:
        return sum(process_cpu_s(pid, reaped=False) for pid in server_pids)

    servers_started, machine_started = servers_cpu(), machine_cpu_s()
    started = time.perf_counter()
    cpu_started = time.process_time()
    async with anyio.create_task_group() as outer:
        if lease_starts is not None:
            outer.start_soon(watch_lease_starts, pool, lease_starts, 0.1)
        async with anyio.create_task_group() as group:
            for index in range(concurrency):
                group.start_soon(worker, index)
        outer.cancel_scope.cancel()
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    servers_s, machine_s = servers_cpu() - servers_started, machine_cpu_s() - machine_started
    statuses: dict[str, int] = {}
    for result in results:
        statuses[result.outcome.status.value] = statuses.get(result.outcome.status.value, 0) + 1
    return RunFigures(
        trajectories=len(results),
        elapsed_s=elapsed,
        statuses=statuses,
        tool_errors=sum(r.stats.tool_errors.total for r in results),
        peak_kib=status_kib("VmHWM"),
        cpu_s=cpu_s,
        servers_cpu_s=servers_s,
        machine_cpu_s=machine_s,
    )


@attrs.frozen(kw_only=True)
class ProcessFigures:
    """What one env process measured of the timed run (all of it in one process, or one share
    of it with ``--env-processes``)."""

    run: RunFigures
    baseline_kib: int
    peak_reset: bool
    keepers_s: float
    lease_starts: list[float]
    last_starts: list[float]
    batches: int
    calls: int
    largest_batch: int
    slot_helpers: list[str]

    def as_json(self) -> str:
        return json.dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProcessFigures:
        fields = json.loads(text)
        return cls(**{**fields, "run": RunFigures(**fields["run"])})


def pool_config(servers: int, concurrency: int) -> LocalPoolConfig:
    isolation = SlotIsolation(require_sandbox=True, max_processes=64, memory_bytes=512 << 20)
    return LocalPoolConfig(
        containers=servers,
        server=SlotServerSettings(
            slots_per_container=-(-concurrency // servers), isolation=isolation,
            acquire_timeout_s=300.0, start_timeout_s=120.0,
        ),
    )  # fmt: skip


def rollout_config(turns: int) -> RolloutConfig:
    return RolloutConfig(
        agent=AgentLoopConfig(max_turns=turns),
        sampling=SamplingParams(max_tokens=64),
        tool_timeout_s=60.0,
        deadline_s=600.0,
        acquire_timeout_s=300.0,
    )


async def one_process(
    args: argparse.Namespace,
    *,
    servers: int,
    concurrency: int,
    when_idle: Callable[[], Awaitable[None]],
    after: Callable[[], Awaitable[None]],
    measured: Callable[[ProcessFigures], Awaitable[None]] | None = None,
) -> ProcessFigures:
    """This process's pool of ``servers`` slot servers and ``concurrency`` trajectories: every
    slot's keeper started and a warm-up wave run, then ``when_idle`` (the limits measured, or
    the other env processes waited for), the timed run, then ``after`` with the pool still up,
    then ``measured`` with the figures, the pool still up (an env process reports them there:
    its pool's close is no part of the run, and the limits are measured beside idle pools)."""
    slots = -(-concurrency // servers)
    chat = LatencyChatServer(latency_s=args.latency_ms / 1000.0)
    config = rollout_config(args.turns)
    async with (
        LocalSandboxPool(pool_config(servers, concurrency)) as pool,
        ToolDispatcher(
            pool, BatchConfig(window_ms=args.window_ms), loop_hooks=asyncio_hooks
        ) as dispatcher,
    ):
        helpers = {
            (await pool.client(name).health()).capabilities.slot_helper
            for name in pool.container_names()
        }
        # Warm-up: every slot's keeper (started once per slot, then kept), imports and caches,
        # outside the memory baseline.
        keepers_s = await start_keepers(pool, servers * slots)
        await run_wave(
            pool=pool, dispatcher=dispatcher, chat=chat, config=config,
            concurrency=min(8, concurrency), rounds=1, tag="warm",
        )  # fmt: skip
        await when_idle()
        gc.collect()
        baseline_kib = status_kib("VmRSS")
        peak_reset = reset_peak()
        lease_starts: list[float] = []
        figures = await run_wave(
            pool=pool, dispatcher=dispatcher, chat=chat, config=config,
            concurrency=concurrency, rounds=args.rounds, tag="run", lease_starts=lease_starts,
        )  # fmt: skip
        stats = dispatcher.statistics()
        await after()
        last_starts = [
            info.sandbox_start_s
            for name in pool.container_names()
            for info in (await pool.client(name).list_slots()).slots
            if info.sandbox_start_s is not None
        ]
        result = ProcessFigures(
            run=figures,
            baseline_kib=baseline_kib,
            peak_reset=peak_reset,
            keepers_s=keepers_s,
            lease_starts=lease_starts,
            last_starts=last_starts,
            batches=stats.batches,
            calls=stats.calls,
            largest_batch=stats.largest_batch,
            slot_helpers=sorted(helpers),
        )
        if measured is not None:
            await measured(result)
    return result


@attrs.define
class Limits:
    """The raw asyncio spawn rate (the best of 8 and 64 spawners) and the compiled reference,
    each measured with the pools up and idle, before the run and after it."""

    args: argparse.Namespace
    reference: Reference
    raw: list[float] = attrs.field(factory=list)
    load: list[float] = attrs.field(factory=list)

    async def measure(self) -> None:
        if self.raw:  # after the run: the reference last, as before it first
            self.raw.append(await self._raw())
            await self.reference.measure(self.args.spawn_seconds)
        else:
            await self.reference.measure(self.args.spawn_seconds)
            self.raw.append(await self._raw())

    async def _raw(self) -> float:
        return max([await spawn_rate(w, self.args.spawn_seconds) for w in (8, 64)])

    async def before_run(self) -> None:
        await self.measure()
        self.load.append(os.getloadavg()[0])

    async def after_run(self) -> None:
        self.load.append(os.getloadavg()[0])
        await self.measure()


async def bench(args: argparse.Namespace, reference: Reference) -> None:
    """The timed run in this process (``--env-processes 1``), its limits measured here."""
    slots = -(-args.concurrency // args.servers)
    print(f"cpus={os.cpu_count()}  pool: {args.servers} slot servers x {slots} slots (bwrap), "
          f"concurrency={args.concurrency}, turns={args.turns}, model latency="
          f"{args.latency_ms:.0f} ms, rounds={args.rounds}, batch window="
          f"{args.window_ms} ms")  # fmt: skip
    limits = Limits(args=args, reference=reference)
    machine: list[float] = []

    async def before() -> None:
        await limits.before_run()
        machine.append(machine_cpu_s())

    async def after() -> None:
        machine.append(machine_cpu_s())
        await limits.after_run()

    figures = await one_process(
        args, servers=args.servers, concurrency=args.concurrency, when_idle=before, after=after
    )
    report(args, [figures], limits, machine[1] - machine[0], figures.run.elapsed_s)


async def bench_processes(args: argparse.Namespace, reference: Reference) -> None:
    """The timed run spread over ``--env-processes`` env processes (children of this one, each
    with its own event loop, dispatcher and pool of slot servers, a share of the trajectories
    and of the servers), started together once every one is warm; the limits measured here
    while their pools are up and idle."""
    count: int = args.env_processes
    servers = max(1, args.servers // count)
    share = -(-args.concurrency // count)
    print(f"cpus={os.cpu_count()}  {count} env processes, each: {servers} slot servers x "
          f"{-(-share // servers)} slots (bwrap), {share} trajectories; concurrency="
          f"{share * count}, turns={args.turns}, model latency={args.latency_ms:.0f} ms, "
          f"rounds={args.rounds}, batch window={args.window_ms} ms")  # fmt: skip
    argv = [
        sys.executable, __file__, "--child", "--servers", str(servers),
        "--concurrency", str(share), "--turns", str(args.turns),
        "--latency-ms", str(args.latency_ms), "--rounds", str(args.rounds),
        "--window-ms", str(args.window_ms),
        "--gc-young-threshold", str(args.gc_young_threshold),
    ]  # fmt: skip
    children = [
        await asyncio.create_subprocess_exec(*argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(count)
    ]
    try:
        with anyio.fail_after(CHILD_TIMEOUT_S):
            for child in children:
                await expect_line(child, "ready")
            limits = Limits(args=args, reference=reference)
            await limits.before_run()
            machine_before = machine_cpu_s()
            started = time.perf_counter()
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            lines = [await expect_line(child, "{") for child in children]
            elapsed = time.perf_counter() - started
            machine_s = machine_cpu_s() - machine_before
            await limits.after_run()
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"done\n")
                await child.stdin.drain()
            for child in children:
                if await child.wait():
                    raise SystemExit(f"an env process ended with {child.returncode}")
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    figures = [ProcessFigures.from_json(line) for line in lines]
    report(args, figures, limits, machine_s, elapsed)


async def expect_line(child: asyncio.subprocess.Process, start: str) -> str:
    """The next line ``child`` prints, which must start with ``start``."""
    assert child.stdout is not None
    line = (await child.stdout.readline()).decode()
    if not line.startswith(start):
        raise SystemExit(f"an env process printed {line.strip()!r}, not {start!r}...")
    return line


async def child(args: argparse.Namespace) -> None:
    """One env process of ``--env-processes``: warm up, say ``ready``, run when the parent
    says ``go``, print its figures as one JSON line, keep its pool up until ``done``."""

    async def told(word: str) -> None:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != word:
            raise SystemExit(f"env process: expected {word!r} from the parent, got {line!r}")

    async def ready() -> None:
        print("ready", flush=True)
        await told("go")

    async def after() -> None:
        return None

    async def measured(figures: ProcessFigures) -> None:
        print(figures.as_json(), flush=True)  # the run is over: the parent's clock stops
        await told("done")  # the pool stays up while the parent measures the limits

    await one_process(
        args,
        servers=args.servers,
        concurrency=args.concurrency,
        when_idle=ready,
        after=after,
        measured=measured,
    )


def report(  # noqa: PLR0915
    args: argparse.Namespace,
    processes: list[ProcessFigures],
    limits: Limits,
    machine_s: float,
    elapsed: float,
) -> None:
    """Every row, from the processes' figures (one, or each env process's share) and the
    limits measured around them; ``elapsed`` is the run's wall time (the slowest process's)."""
    reference = limits.reference
    runs = [p.run for p in processes]
    trajectories = sum(r.trajectories for r in runs)
    concurrency = -(-args.concurrency // len(processes)) * len(processes)
    turns: int = args.turns
    statuses: dict[str, int] = {}
    for r in runs:
        for status, n in r.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    cpu_s = sum(r.cpu_s for r in runs)
    servers_s = sum(r.servers_cpu_s for r in runs)
    rate = trajectories / elapsed
    model_bound = concurrency / (turns * args.latency_ms / 1000.0)
    raw_before, raw = limits.raw[0], max(limits.raw)
    spawn_bound = raw / turns
    ideal = min(model_bound, spawn_bound)
    limit = "model" if model_bound <= spawn_bound else "spawn"
    helpers = sorted({h for p in processes for h in p.slot_helpers})
    print(f"slot helper (keepers and lease agents): {', '.join(helpers)}")
    print(f"raw /bin/sh -c true from asyncio: {raw:.0f} spawns/s (the higher of {raw_before:.0f} "
          f"before the run and {limits.raw[-1]:.0f} after it)")  # fmt: skip
    print(f"model-bound rate: {model_bound:.1f} traj/s   spawn-bound rate: {spawn_bound:.1f} "
          f"traj/s   ideal (slower, {limit}-bound): {ideal:.1f} traj/s")  # fmt: skip
    print(f"measured: {trajectories} trajectories in {elapsed:.2f} s = "
          f"{rate:.1f} traj/s   statuses {statuses}   tool errors "
          f"{sum(r.tool_errors for r in runs)}")  # fmt: skip
    shares = ", ".join(f"{r.cpu_s / r.elapsed_s:.0%}" for r in runs)
    print(f"env process CPU during the run: {cpu_s:.2f} s ({shares} of one core"
          f"{' each' if len(runs) > 1 else ''}), {cpu_s / trajectories * 1e3:.2f} ms per "
          f"trajectory")  # fmt: skip
    per_ms = 1e3 / trajectories
    rest_s = machine_s - cpu_s - servers_s
    print(f"machine CPU during the run: {machine_s:.2f} s "
          f"({machine_s / elapsed / (os.cpu_count() or 1):.0%} of "
          f"{os.cpu_count()} cores), per trajectory {machine_s * per_ms:.2f} ms: "
          f"env process{'es' if len(runs) > 1 else ''} {cpu_s * per_ms:.2f}, slot servers' own "
          f"processes {servers_s * per_ms:.2f}, the rest (keepers, lease agents, commands, "
          f"the kernel's threads, any other load) {rest_s * per_ms:.2f}")  # fmt: skip
    print(f"load average (1 min): {limits.load[0]:.1f} at the run's start, {limits.load[-1]:.1f} "
          f"at its end (the run's own sandboxes raise the second)")  # fmt: skip
    batches = sum(p.batches for p in processes)
    print(f"dispatcher: {batches} requests, {sum(p.calls for p in processes) / max(batches, 1):.1f}"
          f" calls per request, largest {max(p.largest_batch for p in processes)}")  # fmt: skip
    print(f"before the run: slot keepers (one sandbox per slot, kept for the pool's life) "
          f"started in {max(p.keepers_s for p in processes):.2f} s")  # fmt: skip
    starts = [s for p in processes for s in p.last_starts]
    if starts:
        p50_ms, max_ms = statistics.median(starts) * 1e3, max(starts) * 1e3
        print(f"per trajectory, outside the ideal: one lease start (fresh namespaces from the "
              f"slot's keeper, started after the slot's reset; its first call's wait for it, "
              f"last per slot: p50 {p50_ms:.1f} ms, max {max_ms:.1f} ms over {len(starts)} "
              f"slots) and one slot reset")  # fmt: skip
    lease_starts = sorted(s for p in processes for s in p.lease_starts)
    if lease_starts:
        p99_ms = lease_starts[min(len(lease_starts) - 1, int(0.99 * len(lease_starts)))] * 1e3
        print(f"lease start under {concurrency} concurrent trajectories: p50 "
              f"{statistics.median(lease_starts) * 1e3:.1f} ms  p99 {p99_ms:.1f} ms  max "
              f"{lease_starts[-1] * 1e3:.1f} ms over {len(lease_starts)} leases   TARGET p99 <= "
              f"10 ms: {verdict(p99_ms <= 10)}")  # fmt: skip
    print("\n".join(reference.describe()))
    of_b = rate / reference.trajectory_rate
    # No run can beat the model: with many cores, (b) can outrun concurrency / (turns x latency)
    compiled_ideal = min(reference.trajectory_rate, model_bound)
    of_ideal = rate / compiled_ideal
    bound = "(b)" if reference.trajectory_rate <= model_bound else "the model-bound rate"
    b_cpu_ms = (os.cpu_count() or 1) / reference.trajectory_rate * 1e3
    print(f"measured / (b) = {of_b:.2f}   measured / asyncio ideal = {rate / ideal:.2f}   (b)'s "
          f"CPU per trajectory (cores / rate): {b_cpu_ms:.2f} ms")  # fmt: skip
    print(f"compiled ideal (the slower of (b) and the model-bound rate): {compiled_ideal:.1f} "
          f"traj/s, set by {bound}")  # fmt: skip
    print(f"TARGET rollouts >= 0.75 of the compiled ideal: {of_ideal:.2f}  "
          f"{verdict(of_ideal >= 0.75)}")  # fmt: skip
    grown_kib = sum(max(p.run.peak_kib - p.baseline_kib, 0) for p in processes)
    per_trajectory_kib = grown_kib / concurrency
    how = (
        "VmHWM reset via clear_refs"
        if all(p.peak_reset for p in processes)
        else "VmHWM since start (reset refused)"
    )
    print(f"env process RSS: baseline {sum(p.baseline_kib for p in processes) / 1024:.1f} MiB, "
          f"peak {sum(p.run.peak_kib for p in processes) / 1024:.1f} MiB ({how}"
          f"{', summed over the processes' if len(processes) > 1 else ''}); per concurrent "
          f"trajectory {per_trajectory_kib:.0f} KiB   TARGET < 100 KiB: "
          f"{verdict(per_trajectory_kib < 100)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=4, help="trajectories per worker")
    parser.add_argument("--servers", type=int, default=4, help="slot servers (containers)")
    parser.add_argument("--window-ms", type=float, default=5.0, help="dispatcher batch window")
    parser.add_argument("--spawn-seconds", type=float, default=2.0)
    parser.add_argument(
        "--gc-young-threshold",
        type=int,
        default=DEFAULT_YOUNG_GC_THRESHOLD,
        help="the collector's young threshold during the run, as an env's serve/process run "
        "sets it (gc_young_threshold); 0: Python's own",
    )
    parser.add_argument(
        "--env-processes",
        type=int,
        default=1,
        help="env processes the trajectories and slot servers are spread over, each with its "
        "own event loop and pool (children of this one, started together once all are warm)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        parser.error("bubblewrap (bwrap) is required")
    if args.env_processes < 1:
        parser.error(f"--env-processes: at least 1, not {args.env_processes}")
    if args.child:
        with young_gc_threshold(args.gc_young_threshold or None):
            anyio.run(child, args, backend="asyncio")
        return
    with tempfile.TemporaryDirectory(prefix="trajcore-rollouts-") as folder:
        try:
            reference = Reference.prepare(Path(folder))
        except ReferenceUnavailable as error:
            sys.exit(f"bench/rollouts.py: {error}")
        if args.env_processes > 1:
            anyio.run(bench_processes, args, reference, backend="asyncio")
            return
        with young_gc_threshold(args.gc_young_threshold or None):
            anyio.run(bench, args, reference, backend="asyncio")


if __name__ == "__main__":
    main()
