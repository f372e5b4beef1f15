"""The floor of a Python asyncio env per tool call, beside the machine's compiled spawn limit.

Whatever a slot server does, the env (an Atropos env: Python, on the same cores in the
benchmarks) spends some CPU on every tool call. This measures the least any asyncio env can
spend, to say which of the per-call targets a Python env allows physically:

- N trajectories (1, 8, 64) are asyncio tasks, each awaiting one call at a time; trajectory i
  belongs to container i % 4, as in ``bench/call_path.py``;
- each container holds one loopback TCP connection (an ``asyncio.Protocol``, no streams) to
  ``bench/responder.c``, a compiled responder that answers each call with a fixed small result
  (a slot server's result of ``true``) and spawns nothing;
- the calls of a container are batched the way the dispatcher's group commit batches them: a
  lone call goes at once; while a batch is in flight, the container's further calls wait and go
  together when it returns (one request per batch, as many calls as are waiting);
- so the only Python on the path is the env side's minimum: a coroutine resumption and a future
  per call, the call's JSON object, one ``write`` and one read per batch, ``json.dumps`` of the
  batch and ``json.loads`` of its results, with a length-prefixed frame (no HTTP).

Levels: 1, 8 and 64 trajectories with the responder answering at once (the latency floor, and
small batches), and 64 trajectories with each answer held back so that the calls arrive at 0.85
of (a) in full batches of 16, the operating point of the calls target (the hold costs no CPU).
Then the same env against a Python server at its own floor (``--serve``: ``json.loads`` of the
batch, per call one exchange with a compiled agent over the slot's own Unix socket, as a lease has
its agent, ``json.dumps`` of the results, one write; the agent is ``bench/responder.c`` and holds
the answers instead) at 1 and at 64 held: the least a Python slot server could add.

Beside them, in the same run: ``bench/call_path.py pool 64`` (trajcore's env process: pool,
dispatcher, client; and its slot servers), and the compiled reference (``bench/reference.py``):
(a) the all-core spawn limit before and after, the higher taken, with the CPU one spawn costs
(user + sys of the reference's whole process tree, from ``getrusage``). CPU of this process comes
from ``getrusage`` and of the responders from ``/proc/<pid>/schedstat``, so it holds beside other
load on a shared machine. The bounds: with ``c`` the CPU of one compiled spawn and ``e`` the env's
floor per call at the target's operating point, a Python env at the floor with a zero-cost server
reaches at most ``c / (c + e)`` of (a) (all cores busy, the env's CPU displacing spawns), and 0.85
of (a) leaves ``c * (1 / 0.85 - 1)`` of CPU per call to everything beside the spawn. For the
added p50 at one trajectory, the floor's round trip is what a zero-cost server still costs.

Run: ``.venv/bin/python bench/env_floor.py [--seconds 1.5] [--rounds 3] [--loop asyncio|uvloop]
[--unix] [--no-trajcore]`` (about 45 s; ``./dev bench`` runs it with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reference import (
    Measured,
    ReferenceUnavailable,
    build_c,
    workers,
)
from bench.reference import build as build_reference

SELF = Path(__file__).resolve()
SOURCE = SELF.with_name("responder.c")
CALL_PATH = Path(__file__).with_name("call_path.py")
CONTAINERS = 4
SLOTS = 16
TARGET_OF_A = 0.85
TARGET_ADDED_P50_S = 0.5e-3
UNIX_SOCKET = False  # --unix
_HEADER = struct.Struct(">II")  # body length, calls
_LENGTH = struct.Struct(">I")


def build_responder() -> Path:
    """``bench/responder.c``, built as the compiled reference is, when its source changed."""
    return build_c(SOURCE, "responder")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """``pid``'s time on a CPU, user and sys (``/proc/<pid>/schedstat``: nanoseconds, where
    ``/proc/<pid>/stat`` counts 10 ms ticks, too coarse for the responder's few milliseconds)."""
    with open(f"/proc/{pid}/schedstat") as schedstat:
        return int(schedstat.read().split()[0]) / 1e9


class Container(asyncio.Protocol):
    """One container's connection: group commit, one batch in flight, results by position."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.WriteTransport | None = None
        self.waiting: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self.in_flight: list[asyncio.Future[dict[str, Any]]] = []
        self.flush_due = False
        self.buffer = bytearray()
        self.batches = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.WriteTransport", transport)  # uvloop's is not a subclass

    def call(self, call: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.waiting.append((call, future))
        if not self.in_flight and not self.flush_due:
            # after the callbacks already due: the trajectories resumed with this one join it
            self.flush_due = True
            self.loop.call_soon(self.flush)
        return future

    def flush(self) -> None:
        self.flush_due = False
        if self.in_flight or not self.waiting:
            return
        batch, self.waiting = self.waiting, []
        body = json.dumps({"calls": [call for call, _ in batch]}, separators=(",", ":")).encode()
        assert self.transport is not None
        self.transport.write(_HEADER.pack(len(body), len(batch)) + body)
        self.in_flight = [future for _, future in batch]
        self.batches += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self.buffer)
            if len(self.buffer) < _LENGTH.size + length:
                break
            results = json.loads(self.buffer[_LENGTH.size : _LENGTH.size + length])["results"]
            del self.buffer[: _LENGTH.size + length]
            futures, self.in_flight = self.in_flight, []
            if len(results) != len(futures):
                raise RuntimeError(f"{len(results)} results for {len(futures)} calls")
            for future, result in zip(futures, results, strict=True):
                future.set_result(result)
        if self.waiting and not self.in_flight:
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self.in_flight:
            if not future.done():
                future.set_exception(ConnectionError(f"the responder left: {exc}"))


@attrs.frozen(kw_only=True)
class Round:
    """One round at one level: calls, seconds, CPU seconds of the env and of the responder,
    batches sent, the latencies' p50 and p99, the 1-minute load average at its end."""

    server: str
    trajectories: int
    hold_s: float
    calls: int
    seconds: float
    env_cpu_s: float
    responder_cpu_s: float
    batches: int
    p50_s: float
    p99_s: float
    load: float

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @property
    def env_per_call_s(self) -> float:
        return self.env_cpu_s / self.calls

    @property
    def responder_per_call_s(self) -> float:
        return self.responder_cpu_s / self.calls


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def stop(responder: asyncio.subprocess.Process) -> None:
    """End of file on its standard input ends a responder; a stuck one is terminated."""
    if responder.stdin is not None:
        responder.stdin.close()
    try:
        await asyncio.wait_for(responder.wait(), 10)
    except TimeoutError:
        responder.terminate()
        await asyncio.wait_for(responder.wait(), 10)


async def connect(count: int, port: int, path: str | None) -> list[Container]:
    """``count`` containers' connections, to ``path`` (a Unix socket) or else to ``port``."""
    loop = asyncio.get_running_loop()
    containers = []
    for _ in range(count):
        if path is None:
            _, container = await loop.create_connection(lambda: Container(loop), "127.0.0.1", port)
        else:
            _, container = await loop.create_unix_connection(lambda: Container(loop), path)
        containers.append(container)
    return containers


async def floor_rounds(
    server: list[str], trajectories: int, hold_s: float, seconds: float, count: int
) -> list[Round]:
    """``count`` rounds of ``seconds`` at one level, against a responder of its own (``server``:
    its command line, to which the hold in microseconds is added), over loopback TCP or, with
    ``UNIX_SOCKET`` set (``--unix``), a Unix socket (the local pool's default transport)."""
    folder = tempfile.TemporaryDirectory(prefix="trajcore-env-floor-")
    path = f"{folder.name}/server" if UNIX_SOCKET else None
    where = (
        [] if path is None else [path] if server[0] != sys.executable else ["--serve-unix", path]
    )
    responder = await asyncio.create_subprocess_exec(
        *server, str(round(hold_s * 1e6)), *where, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert responder.stdout is not None
        ready = await asyncio.wait_for(responder.stdout.readline(), 30)
        if not ready:
            raise ReferenceUnavailable(f"{server[-1]} exited before it listened")
        port = int(json.loads(ready)["port"])
        loop = asyncio.get_running_loop()
        containers = await connect(min(CONTAINERS, trajectories), port, path)
        stop_at = 0.0
        latencies: list[float] = []
        done = [0]

        async def trajectory(index: int, measured: bool) -> None:
            container = containers[index % len(containers)]
            slot, sent = index // len(containers), 0
            while True:
                call = {
                    "slot": slot, "epoch": 1, "call_id": f"f{index}-{sent}", "tool": "bash",
                    "arguments": {"command": "true"}, "timeout_s": 30,
                }  # fmt: skip
                started = time.perf_counter()
                result = await container.call(call)
                if result["exec"]["exit_code"] != 0:
                    raise RuntimeError(f"call failed: {result}")
                sent += 1
                if not measured:
                    return
                latencies.append(time.perf_counter() - started)
                done[0] += 1
                if loop.time() >= stop_at:
                    return

        await asyncio.wait_for(
            asyncio.gather(*(trajectory(i, False) for i in range(trajectories))), hold_s + 30
        )
        rounds = []
        for _ in range(count):
            latencies.clear()
            done[0] = 0
            batches = sum(c.batches for c in containers)
            own, served = own_cpu_s(), process_cpu_s(responder.pid)
            started = time.perf_counter()
            stop_at = loop.time() + seconds
            await asyncio.wait_for(
                asyncio.gather(*(trajectory(i, True) for i in range(trajectories))),
                seconds + hold_s + 30,
            )
            elapsed = time.perf_counter() - started
            rounds.append(
                Round(
                    server="python" if server[0] == sys.executable else "compiled",
                    trajectories=trajectories,
                    hold_s=hold_s,
                    calls=done[0],
                    seconds=elapsed,
                    env_cpu_s=own_cpu_s() - own,
                    responder_cpu_s=process_cpu_s(responder.pid) - served,
                    batches=sum(c.batches for c in containers) - batches,
                    p50_s=quantile(latencies, 0.5),
                    p99_s=quantile(latencies, 0.99),
                    load=os.getloadavg()[0],
                )
            )
        for container in containers:
            assert container.transport is not None
            container.transport.close()
        return rounds
    finally:
        await stop(responder)
        folder.cleanup()


@attrs.frozen(kw_only=True)
class Spawns:
    """One run of (a) with the CPU its process tree used (user + sys of everything reaped)."""

    measured: Measured
    cpu_s: float


def spawn_limit(binary: Path, spawners: int, seconds: float) -> Spawns:
    before = children_cpu_s()
    done = subprocess.run(
        [str(binary), "spawn", str(spawners), str(seconds)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ReferenceUnavailable(f"reference spawn failed: {done.stderr.strip()}")
    return Spawns(measured=Measured(**json.loads(done.stdout)), cpu_s=children_cpu_s() - before)


def trajcore_call_path(trajectories: int, seconds: float, count: int) -> list[dict[str, Any]]:
    """``bench/call_path.py pool TRAJECTORIES`` as a child process: its JSON lines."""
    done = subprocess.run(
        [sys.executable, str(CALL_PATH), "pool", str(trajectories), "--seconds", str(seconds),
         "--rounds", str(count)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench/call_path.py failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def spread(values: list[float], scale: float, fmt: str = ".0f") -> str:
    low, high = min(values) * scale, max(values) * scale
    return f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}-{high:{fmt}}"


def describe_level(rounds: list[Round], spawn_cpu_s: float) -> str:
    first = rounds[0]
    hold = f", answers held {first.hold_s * 1e3:.1f} ms" if first.hold_s else ""
    if first.server == "python":
        hold += ", Python server + compiled agent"
    batch = [r.calls / r.batches for r in rounds if r.batches]
    env = [r.env_per_call_s for r in rounds]
    return (
        f"  {first.trajectories:>2} trajectories{hold}: {spread([r.rate for r in rounds], 1)} "
        f"calls/s, {spread(batch, 1, '.1f')} calls/batch; env CPU/call "
        f"{spread(env, 1e6)} us (/ one spawn's CPU "
        f"{spread(env, 1 / spawn_cpu_s, '.3f')}), "
        f"responder {spread([r.responder_per_call_s for r in rounds], 1e6, '.1f')} us; "
        f"latency p50 {spread([r.p50_s for r in rounds], 1e6)} us, "
        f"p99 {spread([r.p99_s for r in rounds], 1e6)} us; "
        f"load {spread([r.load for r in rounds], 1, '.1f')}"
    )


async def measure(
    responder: Path, seconds: float, count: int, hold_s: float
) -> tuple[list[list[Round]], list[list[Round]]]:
    """The compiled responder's levels, then the Python responder's (1, and 64 held)."""
    compiled = [str(responder)]
    levels = [await floor_rounds(compiled, n, 0.0, seconds, count) for n in (1, 8, SLOTS * 4)]
    levels.append(await floor_rounds(compiled, SLOTS * 4, hold_s, seconds, count))
    python = [sys.executable, str(SELF), "--serve"]
    beside = [
        await floor_rounds(python, 1, 0.0, seconds, count),
        await floor_rounds(python, SLOTS * 4, hold_s, seconds, count),
    ]
    return levels, beside


class PythonResponder(asyncio.Protocol):
    """The least a Python slot server does per batch: the frame, ``json.loads`` of the calls;
    per call one exchange with a compiled agent (``bench/responder.c`` again, one Unix socket
    connection per slot, as a lease has its agent) whose answer becomes the call's result;
    ``json.dumps`` of the results, one write. One task per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop, agent_path: str) -> None:
        self.loop = loop
        self.agent_path = agent_path
        self.transport: asyncio.WriteTransport | None = None
        self.buffer = bytearray()
        self.agents: dict[int, Container] = {}
        self.batches: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.WriteTransport", transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            length, _ = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + length:
                break
            calls = json.loads(self.buffer[_HEADER.size : _HEADER.size + length])["calls"]
            del self.buffer[: _HEADER.size + length]
            task = self.loop.create_task(self.answer(calls))
            self.batches.add(task)
            task.add_done_callback(self.batches.discard)

    async def agent(self, slot: int) -> Container:
        agent = self.agents.get(slot)
        if agent is None:
            loop = self.loop
            _, agent = await loop.create_unix_connection(lambda: Container(loop), self.agent_path)
            self.agents[slot] = agent
        return agent

    async def answer(self, calls: list[dict[str, Any]]) -> None:
        asked = []
        for call in calls:
            agent = await self.agent(call["slot"])
            asked.append(agent.call({"argv": call["arguments"]["command"]}))
        results = []
        for call, result in zip(calls, await asyncio.gather(*asked), strict=True):
            result["call_id"] = call["call_id"]
            results.append(result)
        body = json.dumps({"results": results}, separators=(",", ":")).encode()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_LENGTH.pack(len(body)) + body)


async def serve(hold_us: int, unix_path: str | None) -> None:
    """``--serve HOLD_US``: the Python responder on loopback, until standard input ends; its
    agent, the compiled responder, holds each answer ``HOLD_US``."""
    folder = tempfile.TemporaryDirectory(prefix="trajcore-env-floor-")
    agent_path = f"{folder.name}/agent"
    agent = await asyncio.create_subprocess_exec(
        str(build_responder()), str(hold_us), agent_path,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert agent.stdout is not None
    await asyncio.wait_for(agent.stdout.readline(), 30)
    loop = asyncio.get_running_loop()
    if unix_path is None:
        server = await loop.create_server(lambda: PythonResponder(loop, agent_path), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    else:
        server = await loop.create_unix_server(lambda: PythonResponder(loop, agent_path), unix_path)
        port = 0
    print(json.dumps({"port": port}), flush=True)
    ended = loop.create_future()

    def stdin_ready() -> None:
        if not os.read(0, 64) and not ended.done():
            ended.set_result(None)

    loop.add_reader(0, stdin_ready)
    await ended
    server.close()
    agent.terminate()
    await asyncio.wait_for(agent.wait(), 10)
    folder.cleanup()


def run_loop(kind: str) -> Callable[[Any], Any]:
    if kind == "uvloop":
        import uvloop

        return lambda main: asyncio.Runner(loop_factory=uvloop.new_event_loop).run(main)
    return asyncio.run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per round")
    parser.add_argument("--rounds", type=int, default=3, help="per level")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--no-trajcore", action="store_true", help="leave out bench/call_path.py's comparison"
    )
    parser.add_argument(
        "--unix", action="store_true",
        help="the env reaches its servers over a Unix socket (the local pool's default), not TCP",
    )  # fmt: skip
    parser.add_argument("--serve", type=int, metavar="HOLD_US", help=argparse.SUPPRESS)
    parser.add_argument("--serve-unix", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    globals()["UNIX_SOCKET"] = args.unix
    if args.serve is not None:
        run_loop(args.loop)(serve(args.serve, args.serve_unix))
        return
    load_at_start = os.getloadavg()
    try:
        reference, responder = build_reference(), build_responder()
        before = spawn_limit(reference, workers(), 2.0)
        single = spawn_limit(reference, 1, 1.0)
    except ReferenceUnavailable as error:
        sys.exit(f"env_floor: {error}")
    # the calls target's operating point: 64 trajectories at 0.85 of (a), 16 calls a batch
    hold_s = SLOTS * 4 / (TARGET_OF_A * before.measured.rate)
    levels, python = run_loop(args.loop)(measure(responder, args.seconds, args.rounds, hold_s))
    ours = [] if args.no_trajcore else trajcore_call_path(SLOTS * 4, 2.0, args.rounds)
    after = spawn_limit(reference, workers(), 2.0)
    report(
        args.loop, load_at_start=load_at_start, spawns=(before, after, single), levels=levels,
        python=python, ours=ours,
    )  # fmt: skip


def report(
    loop: str,
    *,
    load_at_start: tuple[float, float, float],
    spawns: tuple[Spawns, Spawns, Spawns],
    levels: list[list[Round]],
    python: list[list[Round]],
    ours: list[dict[str, Any]],
) -> None:
    """Every figure beside its limit from the same run, then the bounds on the two targets."""
    before, after, single = spawns
    best = max((before, after), key=lambda s: s.measured.rate)
    rate, cores = best.measured.rate, workers()
    # What one compiled spawn costs: its user + sys, measured (it holds beside other load), and
    # what it occupies of the cores at the limit (cores / (a): the same on a quiet machine,
    # more where other work takes cores from the reference).
    cost = best.cpu_s / best.measured.count
    occupied = cores / rate
    print(
        f"load average at start {load_at_start[0]:.2f} {load_at_start[1]:.2f} "
        f"{load_at_start[2]:.2f}; {cores} cores; event loop: {loop}; env to server: "
        f"{'Unix socket' if UNIX_SOCKET else 'loopback TCP'}"
    )
    print(
        f"(a) all-core spawn limit: {rate:,.0f} spawns/s ({before.measured.rate:,.0f} before, "
        f"{after.measured.rate:,.0f} after); one spawn uses {cost * 1e6:.0f} us CPU (user+sys) "
        f"and occupies {occupied * 1e6:.0f} us of the cores (cores / (a)); one spawn at 1 worker "
        f"p50 {single.measured.p50_s * 1e6:.0f} us"
    )
    print("Python env floor (asyncio tasks, futures, json, one write and one read per batch):")
    for rounds in levels + python:
        print(describe_level(rounds, cost))
    floor = statistics.median(r.env_per_call_s for r in levels[-1])
    floor_responder = statistics.median(r.responder_per_call_s for r in levels[-1])
    # at 0.85 of (a), every call may cost (1/0.85 - 1) of a spawn beyond its own spawn
    budget = cost * (1 / TARGET_OF_A - 1)
    print(
        f"calls at 64 >= {TARGET_OF_A} of (a) leaves {budget * 1e6:.0f} us of CPU per call "
        f"outside the spawn; the env floor (64, held) takes {floor * 1e6:.0f} us of it "
        f"({floor / budget:.2f}), leaving {(budget - floor) * 1e6:.0f} us for the server"
    )
    bound = cost / (cost + floor)
    print(
        f"BOUND calls at 64, a Python env at the floor and a zero-cost server: {bound:.2f} of "
        f"(a) (target {TARGET_OF_A}: "
        f"{'physically reachable' if bound >= TARGET_OF_A else 'out of reach'}; by cores / (a) "
        f"{occupied / (occupied + floor):.2f}); with this responder's CPU too "
        f"{cost / (cost + floor + floor_responder):.2f}; the env's one core allows "
        f"{1 / (floor * rate):.1f}x (a)"
    )
    if ours:
        env = [float(line["process_cpu_per_call_s"]) for line in ours]
        server = [float(line["server_cpu_per_call_s"]) for line in ours]
        calls = [float(line["calls_per_s"]) for line in ours]
        pair = [e + s for e, s in zip(env, server, strict=True)]
        print(
            f"trajcore (bench/call_path.py pool 64, same run): {spread(calls, 1)} calls/s = "
            f"{spread(calls, 1 / rate, '.2f')} of (a); env process {spread(env, 1e6)} us/call "
            f"({spread(env, 1 / floor, '.1f')}x the floor), slot servers {spread(server, 1e6)} "
            f"us/call; the two {spread(pair, 1e6)} us/call = {spread(pair, 1 / budget, '.1f')}x "
            f"the budget; trajcore's env with a zero-cost server would reach "
            f"{cost / (cost + statistics.median(env)):.2f} of (a)"
        )
    both = floor + statistics.median(r.responder_per_call_s for r in python[1])
    print(
        f"with a Python server at its own floor too (json in and out, one exchange per call "
        f"with a compiled agent, no spawn): "
        f"{both * 1e6:.0f} us/call for the two processes = {both / budget:.2f} of the budget; "
        f"calls at 64 at most {cost / (cost + both):.2f} of (a)"
    )
    latency = statistics.median(r.p50_s for r in levels[0])
    print(
        f"BOUND added p50 at 1 trajectory, a zero-cost server: the floor's round trip "
        f"{latency * 1e6:.0f} us = {latency / TARGET_ADDED_P50_S:.2f} of the "
        f"{TARGET_ADDED_P50_S * 1e3:.1f} ms target ("
        f"{'physically reachable' if latency < TARGET_ADDED_P50_S else 'out of reach'}), leaving "
        f"{(TARGET_ADDED_P50_S - latency) * 1e6:.0f} us for the server's own latency per call; "
        f"with a Python server at its floor the round trip is "
        f"{statistics.median(r.p50_s for r in python[0]) * 1e6:.0f} us = "
        f"{statistics.median(r.p50_s for r in python[0]) / TARGET_ADDED_P50_S:.2f} of it"
    )


if __name__ == "__main__":
    main()
