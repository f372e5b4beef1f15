"""One tool call at one trajectory through one slot server, hop by hop.

The slot server under test (whatever trajcore is importable: run it with a tree's ``src`` on
``PYTHONPATH`` to compare two revisions) is started on a Unix socket with one sandboxed slot.
This process is the env at its floor: a raw HTTP/1.1 client (one ``asyncio.Protocol``, the
request's bytes written once, no trajcore code on its side), so what differs between two runs is
the server's path alone. It runs ``true`` through the ``bash`` tool in a loop, one call at a
time, and prints one JSON line per round: the round trip's p50/p90, the compiled reference's one
spawn at one worker (``bench/reference.c``, the p50 of ``posix_spawn`` + ``waitpid`` of ``/bin/sh
-c true``) measured right before, the added p50 over it, and the CPU per call of the server
(``/proc/<pid>/schedstat``) and of the sandbox below it (the lease agent and the commands it
reaped).

``--trace FILE``: after the rounds, ``perf trace`` records every system call of this process, the
server and the lease's agent (and the commands, which inherit the tracing) over ``--trace-calls``
calls, and the timeline of the median call is printed hop by hop: env send, server receive,
agent request written, agent's request read, spawn, the command's exit, the agent's reply,
server's read of it, response sent, env receive.

``--client``: each server is also driven, block by block in turn with the raw client, through
trajcore's own env side of the wire (``SlotServerClient.unix(...).execute_slot_calls``, this
tree's, whatever tree serves), as a row labelled ``LABEL+client``. Every row prints the CPU per
call of this process (``env_cpu_us``), so the pair says what the env's client adds to a call at
one trajectory. The raw client is the server's path alone; the target's figure
(``bench/tools.py``: the pool and its dispatcher in front of the client) is higher by that and by
the dispatcher's own turns, both on the path of every call at one trajectory
(docs/benchmarks.md, "Why tools.py reads more than one_call.py").

Run: ``.venv/bin/python bench/one_call.py [--seconds 2] [--rounds 4] [--trace FILE] [--client]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc_cpu import below_s, user_sys_s
from bench.reference import build as build_reference
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall

BODY = (
    b'{"calls":[{"slot":0,"epoch":1,"call_id":"c%d","tool":"bash",'
    b'"arguments":{"command":"true"},"timeout_s":30}]}'
)


class Client(asyncio.Protocol):
    """A raw HTTP/1.1 client: one request at a time, its reply read by ``Content-Length``."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        length = int(re.search(rb"content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(body)

    async def call(self, number: int) -> None:
        """One call of ``true``; raises ``RuntimeError`` when it did not exit 0."""
        body = BODY % number
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(
            b"POST /v1/execute HTTP/1.1\r\nHost: slot\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = await self.waiter
        if b'"exit_code":0' not in reply:
            raise RuntimeError(f"the call failed: {reply[:300]!r}")


class TrajcoreClient:
    """The same call through trajcore's env side of the wire: ``SlotServerClient`` (its HTTP/1.1
    client, the batch written and its results read by ``pools.batch_wire``), as the pools send
    every batch."""

    def __init__(self, socket_path: str) -> None:
        self.client = SlotServerClient.unix(socket_path)
        self.lease = Lease(slot=SlotId(container="one-call", index=0), epoch=1, holder="one-call")

    async def call(self, number: int) -> None:
        """One call of ``true``; raises ``RuntimeError`` when it did not exit 0."""
        call = ToolCall(id=f"t{number}", name="bash", arguments={"command": "true"})
        (result,) = await self.client.execute_slot_calls(
            [SlotCall(lease=self.lease, call=call, timeout_s=30)]
        )
        if result.exec is None or result.exec.exit_code != 0:
            raise RuntimeError(f"the call failed: {result}")


def schedstat_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except OSError:
        return 0.0


def descendants(pid: int) -> list[tuple[int, str]]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        out.append((int(entry), int(text.rpartition(")")[2].split()[1]), name))
    parents = {pid}
    found: list[tuple[int, str]] = []
    changed = True
    while changed:
        changed = False
        for child, parent, name in out:
            if parent in parents and child not in parents:
                parents.add(child)
                found.append((child, name))
                changed = True
    return found


def compiled_p50_s(seconds: float) -> float:
    done = subprocess.run(
        [str(build_reference()), "spawn", "1", str(seconds)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(json.loads(done.stdout)["p50_s"])


@attrs.define
class Served:
    """One slot server under test, its client, and what its calls measured this round."""

    label: str
    pid: int
    client: Client | TrajcoreClient
    times: list[float] = attrs.field(factory=list)
    env_cpu_s: float = 0.0
    block_p50_s: list[float] = attrs.field(factory=list)
    block_cpu_s: list[float] = attrs.field(factory=list)
    cpu_s: float = 0.0
    below_s: float = 0.0
    user_sys_s: list[float] = attrs.field(factory=lambda: [0.0, 0.0])


async def run(args: argparse.Namespace, servers: list[tuple[str, str, int]]) -> None:
    loop = asyncio.get_running_loop()
    served = []
    for label, socket_path, pid in servers:
        _, client = await loop.create_unix_connection(Client, socket_path)
        served.append(Served(label=label, pid=pid, client=client))
        if args.client:
            trajcore = TrajcoreClient(socket_path)
            served.append(Served(label=f"{label}+client", pid=pid, client=trajcore))
    number = 0
    for one in served:
        for _ in range(200):  # the sandbox started and warm
            number += 1
            await one.client.call(number)
    for _ in range(args.rounds):
        compiled = compiled_p50_s(1.0)
        for block in range(args.blocks):  # the servers alternate, block by block
            for one in served if block % 2 == 0 else reversed(served):
                cpu, below = schedstat_s(one.pid), below_s(one.pid)
                user_sys = user_sys_s(one.pid)
                times = []
                env_cpu = time.process_time()
                for _ in range(args.block_calls):
                    number += 1
                    started = time.perf_counter()
                    await one.client.call(number)
                    times.append(time.perf_counter() - started)
                one.env_cpu_s += time.process_time() - env_cpu
                spent = schedstat_s(one.pid) - cpu
                one.times += times
                one.block_p50_s.append(statistics.median(times))
                one.block_cpu_s.append(spent / len(times))
                one.cpu_s += spent
                one.below_s += below_s(one.pid) - below
                for i, (now, then) in enumerate(zip(user_sys_s(one.pid), user_sys, strict=True)):
                    one.user_sys_s[i] += now - then
        for one in served:
            calls, p50 = len(one.times), statistics.median(one.times)
            print(json.dumps({
                "tree": one.label,
                "p50_ms": round(p50 * 1e3, 3),
                "p90_ms": round(statistics.quantiles(one.times, n=10)[-1] * 1e3, 3),
                "compiled_p50_ms": round(compiled * 1e3, 3),
                "added_p50_ms": round((p50 - compiled) * 1e3, 3),
                "env_cpu_us": round(one.env_cpu_s / calls * 1e6, 1),
                "server_cpu_us": round(one.cpu_s / calls * 1e6, 1),
                "sandbox_cpu_us": round(one.below_s / calls * 1e6, 1),
                "server_user_sys_us": [round(spent / calls * 1e6) for spent in one.user_sys_s],
                "calls": calls,
                "loadavg": round(os.getloadavg()[0], 2),
            }), flush=True)  # fmt: skip
            one.times, one.cpu_s, one.below_s, one.env_cpu_s = [], 0.0, 0.0, 0.0
            one.user_sys_s = [0.0, 0.0]
    first = served[0]
    for one in served[1:]:  # adjacent blocks, paired: what the load moves, both share
        pairs = zip(one.block_p50_s, first.block_p50_s, strict=True)
        cpu_pairs = zip(one.block_cpu_s, first.block_cpu_s, strict=True)
        print(json.dumps({
            "paired": f"{one.label} - {first.label}", "blocks": len(one.block_p50_s),
            "median_p50_difference_ms": round(
                statistics.median(a - b for a, b in pairs) * 1e3, 3),
            "median_server_cpu_difference_us": round(
                statistics.median(a - b for a, b in cpu_pairs) * 1e6, 1),
            "median_block_p50_ms": {
                s.label: round(statistics.median(s.block_p50_s) * 1e3, 3) for s in served},
            "median_block_server_cpu_us": {
                s.label: round(statistics.median(s.block_cpu_s) * 1e6, 1) for s in served},
        }), flush=True)  # fmt: skip
    if args.trace:  # the raw clients' calls only: their sends are the timeline's start
        reference_timeline(f"{args.trace}-reference")
        await trace(args, [one for one in served if isinstance(one.client, Client)], number)
    for one in served:
        if isinstance(one.client, TrajcoreClient):
            await one.client.client.aclose()


async def trace(args: argparse.Namespace, served: list[Served], number: int) -> None:
    """``perf record`` of the ``EVENTS`` of this process, every server and its lease agent
    over ``--trace-calls`` calls per server, the servers taking turns call by call (so they
    share the load of the same moments), then each server's timeline."""
    agents = [
        pid for one in served for pid, name in descendants(one.pid) if name.startswith("slot-lease")
    ]
    pids = [os.getpid(), *(one.pid for one in served), *agents]
    events = ",".join(EVENTS)
    perf = subprocess.Popen(  # noqa: ASYNC220 - the calls wait for it, nothing else runs
        ["perf", "record", "-q", "-o", args.trace, "-e", events, "-p", ",".join(map(str, pids))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(2.0)
    for _ in range(args.trace_calls):
        for one in served:
            number += 1
            await one.client.call(number)
    await asyncio.sleep(0.5)
    perf.send_signal(2)
    perf.wait(30)
    script = subprocess.run(  # noqa: ASYNC221 - after the calls, nothing else runs
        ["perf", "script", "-i", args.trace, "-F", "pid,time,event,trace"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for one in served:
        print(f"{one.label}:", flush=True)
        timeline(script.stdout, pids[0], one.pid, {s.pid for s in served})


def reference_timeline(output: str) -> None:
    """The same events around the compiled reference's spawns at one worker: the spawn (from
    the one before it reaped) to exec, exec to exit, exit to reaped, and the whole (median ms)."""
    subprocess.run(
        ["perf", "record", "-q", "-o", output, "-e", ",".join(EVENTS), "--",
         str(build_reference()), "spawn", "1", "0.5"],
        capture_output=True, check=True,
    )  # fmt: skip
    script = subprocess.run(
        ["perf", "script", "-i", output, "-F", "pid,time,event,trace"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    spans: dict[str, list[float]] = {"exec": [], "run": [], "reaped": [], "whole": []}
    start = exec_at = exit_at = None  # a spawn starts as the one before it is reaped
    for line in script.stdout.splitlines():
        found = _LINE.match(line)
        if not found:
            continue
        t, event = float(found[2]) * 1e3, found[3]
        if event.endswith("sched_process_exec") and start is not None:
            exec_at = t
        elif event.endswith("sched_process_exit") and exec_at is not None:
            exit_at = t
        elif event.endswith("sys_exit_wait4"):
            if start is not None and exec_at is not None and exit_at is not None:
                spans["exec"].append(exec_at - start)
                spans["run"].append(exit_at - exec_at)
                spans["reaped"].append(t - exit_at)
                spans["whole"].append(t - start)
            start, exec_at, exit_at = t, None, None
    print(f"compiled reference, {len(spans['whole'])} spawns (median ms): " + ", ".join(
        f"{name} {statistics.median(values):.3f}" for name, values in spans.items() if values
    ))  # fmt: skip


EVENTS = (
    "syscalls:sys_enter_sendto",
    "syscalls:sys_exit_recvfrom",
    "syscalls:sys_exit_read",
    "syscalls:sys_enter_writev",
    "syscalls:sys_enter_clone",
    "syscalls:sys_exit_clone",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_exit_wait4",
    "sched:sched_process_exec",
    "sched:sched_process_exit",
)
_LINE = re.compile(r"^\s*(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
HOPS = (
    ("env sends the request", "env", "send"),
    ("server has read it", "server", "read_request"),
    ("server writes the agent request", "server", "send_agent"),
    ("agent has read the request body", "agent", "read_body"),
    ("agent's spawn starts (vfork)", "agent", "spawn"),
    ("sh execs (in the child)", "sh", "exec"),
    ("sh exits", "sh", "exit"),
    ("agent has reaped it (wait4)", "agent", "reaped"),
    ("agent writes its reply", "agent", "reply"),
    ("server has read the reply", "server", "read_reply"),
    ("server writes the response", "server", "send_response"),
    ("env has read the response", "env", "read_response"),
)


def timeline(text: str, env_pid: int, server_pid: int, servers: set[int]) -> None:  # noqa: PLR0915 - one parser
    """The median time of each hop from the env's send over the traced calls (``perf script``
    of the ``EVENTS``), and the server's event-loop iterations (``epoll_wait``) per call."""
    calls: list[dict[str, float]] = []
    loops: list[int] = []
    current: dict[str, float] | None = None
    for line in text.splitlines():
        found = _LINE.match(line)
        if not found:
            continue
        pid, t, event, rest = int(found[1]), float(found[2]) * 1e3, found[3], found[4]
        who = "env" if pid == env_pid else "server" if pid in servers else "agent"
        ret = re.search(r"0x([0-9a-f]+)$", rest)
        value = int(ret[1], 16) if ret and "sys_exit" in event else -1
        kind = None
        if who == "env" and event.endswith("sys_enter_sendto"):
            current = {"env:send": t, "epolls": 0}
            calls.append(current)
            continue
        if current is None:
            continue
        if who == "env" and event.endswith("sys_exit_recvfrom") and value > 0:
            kind = "read_response"
        elif who == "server" and event.endswith("sys_exit_recvfrom") and value > 0:
            kind = "read_request" if "server:send_agent" not in current else "read_reply"
        elif who == "server" and event.endswith("sys_enter_sendto"):
            kind = "send_agent" if "server:send_agent" not in current else "send_response"
        elif who == "server" and event.endswith("sys_enter_epoll_wait"):
            current["epolls"] += 1
        elif who == "agent" and event.endswith("sys_exit_read") and value > 4:
            kind = "read_body"
        elif who == "agent" and event.endswith("sys_enter_clone"):
            kind = "spawn"
        elif event.endswith("sched_process_exec"):
            current.setdefault("sh:exec", t)
        elif event.endswith("sched_process_exit") and "sh:exec" in current:
            current.setdefault("sh:exit", t)
        elif who == "agent" and event.endswith("sys_exit_wait4") and value > 0:
            kind = "reaped"
        elif who == "agent" and event.endswith("sys_enter_writev"):
            kind = "reply"
        if kind == "read_request":
            current.setdefault("server", pid)
        if kind is not None:
            current.setdefault(f"{who}:{kind}", t)
        if kind == "read_response":
            loops.append(int(current["epolls"]))
            current = None
    whole = [
        c
        for c in calls
        if all(f"{w}:{k}" in c for _, w, k in HOPS) and c.get("server") == server_pid
    ]
    print(f"timeline of {len(whole)} traced calls (median ms after the env's send; step):")
    previous = 0.0
    for label, who, kind in HOPS:
        at = statistics.median(c[f"{who}:{kind}"] - c["env:send"] for c in whole)
        print(f"  {at:7.3f}  (+{at - previous:6.3f})  {label}")
        previous = at
    if loops:
        print(f"  server epoll_wait calls per call: median {statistics.median(loops)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--trace", help="perf trace's output file")
    parser.add_argument("--trace-calls", type=int, default=50)
    parser.add_argument("--profile", help="run the server under cProfile, its stats to this file")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per round")
    parser.add_argument("--block-calls", type=int, default=50, help="calls per block")
    parser.add_argument(
        "--client", action="store_true",
        help="also drive each server through trajcore's SlotServerClient, block by block in turn",
    )  # fmt: skip
    parser.add_argument(
        "--tree", action="append", default=[], metavar="LABEL=PATH",
        help="serve with PATH/src on PYTHONPATH (repeat to alternate trees; default: this one)",
    )  # fmt: skip
    args = parser.parse_args()
    trees = [tuple(given.split("=", 1)) for given in args.tree] or [("this", "")]
    with tempfile.TemporaryDirectory(prefix="trajcore-one-call-") as folder:
        os.chmod(folder, 0o755)
        processes, servers = [], []
        try:
            for index, (label, tree) in enumerate(trees):
                socket_path = f"{folder}/server-{index}.sock"
                env = dict(os.environ)
                if tree:
                    env["PYTHONPATH"] = f"{tree}/src:{tree}"
                argv = [
                    sys.executable,
                    *(["-m", "cProfile", "-o", f"{args.profile}.{label}"] if args.profile else []),
                    "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
                    "--root", f"{folder}/root-{index}", "--unix", socket_path,
                    "--require-sandbox", "--slot-uid-block", str(200 + os.getpid() % 1000 + index),
                ]  # fmt: skip
                server = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
                processes.append(server)
                assert server.stdout is not None
                if not server.stdout.readline():
                    raise RuntimeError(f"the slot server of {label} exited before it was ready")
                servers.append((label, socket_path, server.pid))
            asyncio.run(run(args, servers))
        finally:
            for server in processes:
                server.terminate()
            for server in processes:
                server.wait(30)


if __name__ == "__main__":
    main()
