"""A realistic rollout: an agent's typical commands over a small repository, and where the CPU goes.

Each trajectory gets a slot of a ``LocalSandboxPool`` (real slot servers, real bubblewrap),
writes a small Python repository into it (``prepare``), then runs eight turns whose ``bash``
calls are a typical agent mix: ``ls``, ``cat``, ``grep -r``, ``sed -i``, ``python -c``, a short
``pytest`` run, ``wc``; each turn waits ``--latency-ms`` for the model first. Printed:

- trajectories per second, beside the same commands run directly (no sandbox, no trajcore) by
  one worker per core from this process, over fresh copies of the repository (the replay, whose
  ``RUSAGE_CHILDREN`` also gives their CPU outside a sandbox);
- the share of CPU spent outside the commands themselves (target <= 10%).

How the CPU is counted, and why this way: the env process (trajectories, dispatcher, pool) is
the root of the tree it measures: the slot servers are its children, their bubblewrap sandboxes
and keepers theirs, each lease's agent a child of its slot's keeper, and every command a child of
its lease's agent. A process that ends is reaped by its parent, and its CPU (with all it reaped)
is added to that parent's ``cutime`` and ``cstime``; agents and commands end during the run, and
their keepers, which live for the pool's life, hold their CPU. So the tree's CPU over the run is
the growth, from just before the trajectories start to just after they end (before the pool
closes), of ``utime + stime + cutime + cstime`` summed over every live process of the tree, read
from ``/proc/PID/stat``. Its counts are 10 ms clock ticks: each process's reading is off by less
than a tick per field, about 0.1 s over the whole tree at the default size, against tens of
seconds measured. (``RUSAGE_CHILDREN`` of a parent of the whole tree would be exact, but it
loses whatever the sandboxes' own reapers hold when the pool closes, which was most of it.)

The commands' own CPU is measured where they run: each command reaches the slot as
``./.bench-run run .bench-cpu 'COMMAND'``, the compiled reference (``bench/reference.c``, written
into the workspace by ``prepare``), which starts ``/bin/sh -c COMMAND``, reaps it and appends
its ``RUSAGE_CHILDREN`` (microseconds: the shell and everything it started) to ``.bench-cpu``;
the score hook reads that file. The wrapper's own fork and exec, the prepare step and the file
read count as outside the commands, so the share is, if anything, an overestimate. Beside it,
the replay gives the same commands' CPU outside any sandbox: the difference is what the sandbox
does to the commands themselves (printed, not counted as trajcore's).

Run: ``.venv/bin/python bench/agent_mix.py [--concurrency 16] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reference import build
from bench.rollouts import start_keepers
from trajcore.adapters.event_loops import asyncio_hooks
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import RolloutConfig, TrajectoryHooks, run_trajectory

PYTHON = os.path.realpath(sys.executable)
"""The interpreter every sandbox binds at its own path (``RuntimeConfig.python``)."""

REPOSITORY = {
    "README.md": "# calc\n\nA tiny calculator package.\n\nTODO: division by zero.\n",
    "calc/__init__.py": '"""calc: small arithmetic."""\nfrom calc.core import add, mul, div\n',
    "calc/core.py": (
        "def add(a, b):\n    return a + b\n\n\n"
        "def mul(a, b):\n    return a * b\n\n\n"
        "def div(a, b):\n    # TODO: refuse zero\n    return a / b\n"
    ),
    "calc/text.py": (
        "def words(s):\n    return s.split()\n\n\ndef shout(s):\n    return s.upper()\n"
    ),
    "tests/test_core.py": (
        "from calc import add, mul, div\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n\n\n"
        "def test_div():\n    assert div(6, 3) == 2\n"
    ),
    "tests/test_text.py": (
        "from calc.text import shout, words\n\n\n"
        "def test_words():\n    assert words('a b') == ['a', 'b']\n\n\n"
        "def test_shout():\n    assert shout('a') == 'A'\n"
    ),
    "setup.cfg": "[metadata]\nname = calc\nversion = 0.1\n",
}

COMMANDS = (
    "ls -la && ls calc tests",
    "cat calc/core.py",
    'grep -rn "TODO" .',
    "sed -i 's/return a \\/ b/return a \\/ b if b else 0.0/' calc/core.py",
    f"{PYTHON} -c 'from calc import div; print(div(1, 0))'",
    "grep -rn 'def ' calc | wc -l",
    f"{PYTHON} -m pytest -q -p no:cacheprovider tests",
    "wc -l calc/*.py tests/*.py",
)
"""One trajectory's commands, one per turn, in order."""

TASK = (Message.system("You fix code."), Message.user("Make div(1, 0) return 0.0."))
BASH = tuple(spec for spec in SLOT_TOOL_SPECS if spec.name == "bash")


@attrs.define
class MixChatServer:
    """A ``ChatServer`` whose n-th answer (after ``latency_s``) runs ``COMMANDS[n]``."""

    latency_s: float

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        await anyio.sleep(self.latency_s)
        turn = sum(1 for m in messages if m.role == "assistant")
        command = f"{WRAPPER} run {CPU_FILE} {shlex.quote(COMMANDS[turn % len(COMMANDS)])}"
        call = ToolCall(id=f"call_{turn}", name="bash", arguments={"command": command})
        return ChatTurn(
            message=Message.assistant("", tool_calls=[call]), finish_reason=FinishReason.TOOL_CALLS
        )

    async def aclose(self) -> None:
        return None


WRAPPER = "./.bench-run"
CPU_FILE = ".bench-cpu"
COMMAND_CPU_S: list[float] = []
"""Each trajectory's commands' own CPU, as the wrapper measured it in the sandbox."""


@attrs.define
class Prepare:
    """Write the repository and the measuring wrapper (``reference run``, sent as base64 and
    decoded in the slot) into the workspace."""

    wrapper_b64: str

    async def __call__(self, tools: SlotTools) -> None:
        await tools.upload({**REPOSITORY, ".bench-run.b64": self.wrapper_b64})
        setup = f"base64 -d .bench-run.b64 > {WRAPPER} && chmod 755 {WRAPPER} && rm .bench-run.b64"
        if not await tools.check(setup):
            raise RuntimeError("the measuring wrapper could not be set up in the slot")


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    text = await tools.read_file(CPU_FILE)
    COMMAND_CPU_S.append(sum(int(line) for line in text.split()) / 1e6)
    return 1.0


async def child(args: argparse.Namespace) -> None:
    """The env process: start the pool, start every keeper, run the trajectories and measure
    the tree's CPU over them, close the pool; print what it measured as one JSON line."""
    slots = -(-args.concurrency // args.servers)
    isolation = SlotIsolation(require_sandbox=True, max_processes=64, memory_bytes=512 << 20)
    pool_config = LocalPoolConfig(
        containers=args.servers,
        server=SlotServerSettings(
            slots_per_container=slots, isolation=isolation,
            acquire_timeout_s=300.0, start_timeout_s=120.0,
        ),
    )  # fmt: skip
    config = RolloutConfig(
        agent=AgentLoopConfig(max_turns=len(COMMANDS)),
        sampling=SamplingParams(max_tokens=64),
        tool_timeout_s=60.0,
        deadline_s=600.0,
        acquire_timeout_s=300.0,
    )
    wrapper = base64.b64encode(build().read_bytes()).decode("ascii")
    hooks = TrajectoryHooks(prepare=Prepare(wrapper_b64=wrapper), score=_score)
    policy_ = ChatPolicy(MixChatServer(latency_s=args.latency_ms / 1000))
    statuses: dict[str, int] = {}
    failed = 0
    elapsed = 0.0
    async with (
        LocalSandboxPool(pool_config) as pool,
        ToolDispatcher(
            pool, BatchConfig(window_ms=args.window_ms), loop_hooks=asyncio_hooks
        ) as dispatcher,
    ):
        await start_keepers(pool, args.servers * slots)

        async def worker(index: int) -> None:
            nonlocal failed
            for round_ in range(args.rounds):
                result = await run_trajectory(
                    trajectory_id=f"mix-{index}-{round_}", messages=TASK, tools=BASH,
                    hooks=hooks, policy=policy_, pool=pool, dispatcher=dispatcher,
                    tool_server=None, config=config,
                )  # fmt: skip
                status = result.outcome.status.value
                if status == "env_error":
                    print(f"a trajectory failed: {result.outcome.detail}", file=sys.stderr)
                statuses[status] = statuses.get(status, 0) + 1
                failed += result.stats.tool_errors.total

        cpu_before = tree_cpu(os.getpid())
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index in range(args.concurrency):
                group.start_soon(worker, index)
        elapsed = time.perf_counter() - started
        cpu = tree_cpu(os.getpid()) - cpu_before
    count = sum(statuses.values())
    print(json.dumps({"trajectories": count, "seconds": elapsed, "statuses": statuses,
                      "tool_errors": failed, "tree_cpu_s": cpu,
                      "commands_cpu_s": sum(COMMAND_CPU_S),
                      "measured_trajectories": len(COMMAND_CPU_S)}))  # fmt: skip


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, each with what it reaped:
    ``utime + stime + cutime + cstime`` from ``/proc/PID/stat``."""
    parents: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
        cpu[int(entry.name)] = sum(int(f) for f in fields[11:15]) / TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(parents.get(pid, []))
    return total


def run_child(args: argparse.Namespace) -> dict[str, object]:
    """Run the env process; what it measured."""
    argv = [sys.executable, __file__, "--child", "--concurrency", str(args.concurrency),
            "--rounds", str(args.rounds), "--servers", str(args.servers),
            "--latency-ms", str(args.latency_ms), "--window-ms", str(args.window_ms)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the rollout failed:\n{done.stderr}")
    figures: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def replay(trajectories: int, workers: int) -> tuple[float, float]:
    """Run ``trajectories`` trajectories' commands directly, ``workers`` at a time, each in a
    fresh copy of the repository. Returns (trajectories per second, CPU seconds per
    trajectory)."""

    async def one_worker(jobs: list[int], root: Path) -> None:
        for job in jobs:
            folder = root / f"replay-{job}"
            for path, content in REPOSITORY.items():
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_text(content)
            environment = {"PATH": os.environ["PATH"], "HOME": str(folder), "LANG": "C.UTF-8"}
            for command in COMMANDS:
                process = await asyncio.create_subprocess_exec(
                    "/bin/sh", "-c", command, cwd=folder, env=environment,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                await process.wait()

    async def everything(root: Path) -> None:
        jobs = [list(range(trajectories))[i::workers] for i in range(workers)]
        await asyncio.gather(*(one_worker(j, root) for j in jobs))

    with tempfile.TemporaryDirectory(prefix="trajcore-mix-") as folder:
        before = children_cpu()
        started = time.perf_counter()
        asyncio.run(everything(Path(folder)))
        elapsed = time.perf_counter() - started
        cpu = children_cpu() - before
    return trajectories / elapsed, cpu / trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="trajectories per worker")
    parser.add_argument("--servers", type=int, default=2, help="slot servers (containers)")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--window-ms", type=float, default=5.0, help="dispatcher batch window")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        anyio.run(child, args, backend="asyncio")
        return
    if shutil.which("bwrap") is None:
        parser.error("bubblewrap (bwrap) is required")
    cores = os.cpu_count() or 1
    direct_rate, command_cpu = replay(max(cores * 2, 4), cores)
    figures = run_child(args)
    trajectories = int(str(figures["trajectories"]))
    seconds = float(str(figures["seconds"]))
    rate = trajectories / seconds
    rollout_cpu = float(str(figures["tree_cpu_s"]))
    commands = float(str(figures["commands_cpu_s"]))
    outside = 1 - commands / rollout_cpu if rollout_cpu > 0 else float("nan")
    print(f"cpus={cores}  pool: {args.servers} slot servers, concurrency={args.concurrency}, "
          f"rounds={args.rounds}, {len(COMMANDS)} turns, "
          f"model latency={args.latency_ms:.0f} ms")  # fmt: skip
    print("commands per trajectory: " + " | ".join(c.replace(PYTHON, "python") for c in COMMANDS))
    print(f"measured: {trajectories} trajectories in {seconds:.2f} s = {rate:.2f} traj/s   "
          f"statuses {figures['statuses']}   tool errors {figures['tool_errors']}")  # fmt: skip
    print(f"the same commands run directly ({cores} workers, no sandbox): {direct_rate:.2f} "
          f"traj/s, {command_cpu * 1e3:.1f} ms CPU per trajectory   measured / direct = "
          f"{rate / direct_rate:.2f}")  # fmt: skip
    print(f"CPU of the whole tree during the run: {rollout_cpu:.2f} s "
          f"({rollout_cpu / trajectories * 1e3:.1f} ms per trajectory); the commands' own, "
          f"measured in the sandbox: {commands:.2f} s ({commands / trajectories * 1e3:.1f} ms "
          f"per trajectory; {command_cpu * 1e3:.1f} ms run directly)")  # fmt: skip
    print(f"TARGET share of CPU outside the commands <= 10%: {outside:.1%}  "
          f"{'met' if outside <= 0.10 else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
