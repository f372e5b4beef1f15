"""A realistic rollout: an agent's typical commands over a small repository, and where the CPU goes.

Each trajectory gets a slot of a ``LocalSandboxPool`` (real slot servers, real bubblewrap),
writes a small Python repository into it (``prepare``), then runs eight turns whose ``bash``
calls are a typical agent mix: ``ls``, ``cat``, ``grep -r``, ``sed -i``, ``python -c``, a short
``pytest`` run, ``wc``; each turn waits ``--latency-ms`` for the model first. Printed:

- trajectories per second, beside the same commands run directly (no sandbox, no trajcore) by
  one worker per core from this process, over fresh copies of the repository (the replay);
- the share of CPU spent outside the commands themselves (target <= 10%).

How the CPU is counted, and why this way: a process's CPU reaches its parent's
``RUSAGE_CHILDREN`` when the parent reaps it, in microseconds. This process makes itself a
child subreaper (so nothing of the tree can escape to init) and runs the rollout in a child
process (the env process: trajectories, dispatcher, pool), which starts the slot servers, their
bubblewrap sandboxes, keepers, lease agents and the commands; it closes the pool and exits, and
this process reaps everything left. The tree's CPU is this process's ``RUSAGE_CHILDREN`` growth
over that child: every process of the tree, from the env process down to each command.
Starting and closing the pool (servers, 256 keepers' sandboxes) is not part of a rollout, so the
same child is run once more without trajectories, and its CPU subtracted.

The commands' own CPU comes from the replay: the same sequence, the same repository, each
command a ``/bin/sh -c`` reaped by this process (``RUSAGE_CHILDREN`` again). Inside the sandbox
the same commands cost somewhat more (seccomp on every system call, two cores shared by more
processes), and that difference counts as "outside the commands" here: the share is an upper
bound. (``/proc/PID/stat`` of each command was the other choice: it counts in 10 ms clock ticks,
coarser than an ``ls``, and misses processes that end between two readings.)

Run: ``.venv/bin/python bench/agent_mix.py [--concurrency 16] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import resource
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

from bench.rollouts import start_keepers
from trajcore.adapters.sandbox.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.sandbox_policy import SlotPolicy
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
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
        command = COMMANDS[turn % len(COMMANDS)]
        call = ToolCall(id=f"call_{turn}", name="bash", arguments={"command": command})
        return ChatTurn(
            message=Message.assistant("", tool_calls=[call]), finish_reason=FinishReason.TOOL_CALLS
        )

    async def aclose(self) -> None:
        return None


async def _prepare(tools: SlotTools) -> None:
    await tools.upload(REPOSITORY)


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 1.0


async def child(args: argparse.Namespace) -> None:
    """The env process: start the pool, start every keeper, run the trajectories (none when
    ``--empty``), close the pool; print what it measured as one JSON line."""
    slots = -(-args.concurrency // args.servers)
    policy = SlotPolicy(require_sandbox=True, max_processes=64, memory_bytes=512 << 20)
    pool_config = LocalPoolConfig(
        containers=args.servers, slots_per_container=slots, policy=policy,
        acquire_timeout_s=300.0, start_timeout_s=120.0,
    )  # fmt: skip
    config = RolloutConfig(
        agent=AgentLoopConfig(max_turns=len(COMMANDS)),
        sampling=SamplingParams(max_tokens=64),
        tool_timeout_s=60.0,
        deadline_s=600.0,
        acquire_timeout_s=300.0,
    )
    hooks = TrajectoryHooks(prepare=_prepare, score=_score)
    policy_ = ChatPolicy(MixChatServer(latency_s=args.latency_ms / 1000))
    statuses: dict[str, int] = {}
    failed = 0
    elapsed = 0.0
    async with (
        LocalSandboxPool(pool_config) as pool,
        ToolDispatcher(pool, BatchConfig(window_ms=args.window_ms)) as dispatcher,
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
                statuses[status] = statuses.get(status, 0) + 1
                failed += result.stats.tool_errors.total

        started = time.perf_counter()
        if not args.empty:
            async with anyio.create_task_group() as group:
                for index in range(args.concurrency):
                    group.start_soon(worker, index)
        elapsed = time.perf_counter() - started
    count = sum(statuses.values())
    print(json.dumps({"trajectories": count, "seconds": elapsed, "statuses": statuses,
                      "tool_errors": failed}))  # fmt: skip


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reap_all(deadline_s: float, settle_s: float = 1.0) -> None:
    """Reap every process left in this subreaper's tree, waiting up to ``deadline_s``. Done only
    once no child has been seen for ``settle_s``: a process whose parent is still exiting
    reaches this subreaper a moment later."""
    stop_at = time.monotonic() + deadline_s
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            time.sleep(0.02)
            continue
        if pid != 0:
            quiet_since = time.monotonic()
            continue
        quiet_since = time.monotonic()  # a child still runs
        if quiet_since > stop_at:
            raise RuntimeError("processes of the rollout's tree outlived its deadline")
        time.sleep(0.02)


def run_child(args: argparse.Namespace, *, empty: bool) -> tuple[dict[str, object], float]:
    """Run the env process; its figures and the CPU of its whole tree, in seconds."""
    argv = [sys.executable, __file__, "--child", "--concurrency", str(args.concurrency),
            "--rounds", str(args.rounds), "--servers", str(args.servers),
            "--latency-ms", str(args.latency_ms), "--window-ms", str(args.window_ms)]  # fmt: skip
    if empty:
        argv.append("--empty")
    before = children_cpu()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    reap_all(30.0)
    if done.returncode != 0:
        raise RuntimeError(f"the rollout failed:\n{done.stderr}")
    figures: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures, children_cpu() - before


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
    parser.add_argument("--empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        anyio.run(child, args, backend="asyncio")
        return
    if shutil.which("bwrap") is None:
        parser.error("bubblewrap (bwrap) is required")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        sys.exit("agent_mix: cannot become a child subreaper, so the tree's CPU cannot be counted")
    cores = os.cpu_count() or 1
    direct_rate, command_cpu = replay(max(cores * 2, 4), cores)
    _, idle_cpu = run_child(args, empty=True)
    figures, tree_cpu = run_child(args, empty=False)
    trajectories = int(str(figures["trajectories"]))
    seconds = float(str(figures["seconds"]))
    rate = trajectories / seconds
    rollout_cpu = tree_cpu - idle_cpu
    commands = command_cpu * trajectories
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
    print(f"CPU of the whole tree: {tree_cpu:.2f} s, less {idle_cpu:.2f} s for the pool's start "
          f"and close alone = {rollout_cpu:.2f} s for the rollout "
          f"({rollout_cpu / trajectories * 1e3:.1f} ms per trajectory); the commands' own: "
          f"{commands:.2f} s")  # fmt: skip
    print(f"TARGET share of CPU outside the commands <= 10%: {outside:.1%}  "
          f"{'met' if outside <= 0.10 else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
