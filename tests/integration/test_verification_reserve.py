"""A score hook's check on the real local pool (bubblewrap) when the model left processes behind.

The model writes the right answer, starts a service on loopback, then fills every process it may
hold with background sleepers. The score hook's ``check`` must still start (its commands use the
lease's process reserve, which the model's commands leave free) and find both the answer and
the service: a right answer scored 0 because the check could not fork is the silent failure
this guards against. Nothing of the model's is ended to make room.

A model's command that raises its own soft limit first thing and then forks all it can still
holds no more than the commands' share: its hard limit is that share from its first instruction.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

import attrs
import pytest

from tests.integration.test_local_pool import bash, config, running_now, wait_no_leftovers
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    run_trajectory,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

MAX_PROCESSES = 32  # the model's commands may hold 24 of them, the hooks' the other 8
COMMAND_NPROC = MAX_PROCESSES - MAX_PROCESSES // 4
SERVE = "python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &"
# The same service in one thread: ``http.server``'s own starts a thread per request, which its
# full share of the limit would refuse (a service the model started runs within that share).
SERVE_ONE_THREAD = (
    "python3 -c 'import http.server as h; "
    'h.HTTPServer(("127.0.0.1", 8000), h.SimpleHTTPRequestHandler).serve_forever()\' '
    ">/dev/null 2>&1 &"
)
# A fork loop left running in the background: each child sleeps, and a fork the limit refuses is
# tried again 1 ms later, so every process slot the model's commands may hold stays taken (it
# writes ``full`` once the first fork is refused). The command then shows that the model itself
# cannot fork any more: its command substitution is refused (dash: "Cannot fork").
LOOP = (
    "import os, time\n"
    "told = False\n"
    "while True:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        if not told:\n"
    "            open('full', 'w').close()\n"
    "            told = True\n"
    "        time.sleep(0.001)\n"
    "        continue\n"
    "    if pid == 0:\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
)
FILL = (
    f'python3 -c "{LOOP}" </dev/null >/dev/null 2>&1 & '
    'while [ ! -e full ]; do :; done; echo "$(echo forked)"'
)
# The score hook's check: the answer (a fork for the substitution) and the service.
FETCH = (
    "import time, urllib.request\n"
    "for _ in range(100):\n"
    "    try:\n"
    "        body = urllib.request.urlopen('http://127.0.0.1:8000/answer.txt', timeout=1).read()\n"
    "        raise SystemExit(0 if body == b'42' else 2)\n"
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "raise SystemExit(3)\n"
)
CHECK = f'test "$(cat answer.txt)" = 42 && python3 -c "{FETCH}"'

# A command bent on the reserve: a program that raises its soft limit to its hard one first
# thing, then forks all it can. It counts the processes of the lease (its pid namespace: the
# agent, the shell, itself, its children) at the first fork refused, ends its children and
# prints the count. (A hard limit lowered only once the command runs came too late for about one
# such command in five: the shell had forked the program with the whole limit by then.)
GRAB = (
    "import os, resource, signal\n"
    "hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]\n"
    "resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))\n"
    "children = []\n"
    "while True:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        signal.pause()\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "held = sum(name.isdigit() for name in os.listdir('/proc'))\n"
    "for pid in children:\n"
    "    os.kill(pid, 9)\n"
    "for pid in children:\n"
    "    os.waitpid(pid, 0)\n"
    "print(held)\n"
)
RAISE = f'python3 -c "{GRAB}"; exit $?'
RAISES = 50

CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    sampling=SamplingParams(max_tokens=64),
    tool_timeout_s=20.0,
    deadline_s=120.0,
    acquire_timeout_s=60.0,
)


def _call(index: int, name: str, **arguments: str) -> ToolCall:
    return ToolCall(id=f"c{index}", name=name, arguments=dict(arguments))


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 1.0 if await tools.check(CHECK) else 0.0


async def _trajectory(pool: LocalSandboxPool, *, fill: bool) -> TrajectoryResult:
    calls = [
        _call(1, "write_file", path="answer.txt", content="42"),
        _call(2, "bash", command=SERVE_ONE_THREAD if fill else SERVE),
        *([_call(3, "bash", command=FILL)] if fill else []),
    ]
    chat = FakeChatServer(
        script=[Message.assistant("working", tool_calls=calls), Message.assistant("done")]
    )
    async with ToolDispatcher(pool, BatchConfig()) as dispatcher:
        return await run_trajectory(
            trajectory_id="t-0",
            messages=[Message.user("Write 42 to answer.txt and serve the folder on port 8000")],
            tools=SLOT_TOOL_SPECS,
            hooks=TrajectoryHooks(prepare=_prepare, score=_score),
            policy=ChatPolicy(chat),
            pool=pool,
            dispatcher=dispatcher,
            tool_server=None,
            config=CONFIG,
        )


def _pool_config(*, cgroups: bool = True) -> LocalPoolConfig:
    """One slot; ``cgroups`` False: the process limit is ``RLIMIT_NPROC`` (where the server
    cannot delegate cgroups), else the slot's cgroup's ``pids.max`` where it can."""
    base = config(containers=1, slots=1)
    isolation = attrs.evolve(
        base.server.isolation, max_processes=MAX_PROCESSES, use_cgroups=cgroups
    )
    return attrs.evolve(base, server=attrs.evolve(base.server, isolation=isolation))


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup_or_rlimit", "rlimit"])
async def test_a_check_starts_when_the_models_processes_fill_its_limit(cgroups: bool) -> None:
    before = running_now()
    async with LocalSandboxPool(_pool_config(cgroups=cgroups)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        result = await _trajectory(pool, fill=True)
    await wait_no_leftovers(groups, run_dir, before)
    results = {exchange.call.id: exchange.result for exchange in result.exchanges}
    filled = results["c3"].exec
    # the model's own command could not fork once its share was full
    assert filled is not None, results["c3"]
    assert "Cannot fork" in filled.stderr, results["c3"]
    assert "forked" not in filled.stdout, results["c3"]
    assert result.outcome.score == 1.0, result.outcome


async def test_a_service_the_model_started_is_reachable_from_the_score_hook() -> None:
    before = running_now()
    async with LocalSandboxPool(_pool_config()) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        result = await _trajectory(pool, fill=False)
    await wait_no_leftovers(groups, run_dir, before)
    assert result.outcome.score == 1.0, result.outcome


async def _fork_after_raising(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 1.0 if await tools.check('test "$(echo forked)" = forked') else 0.0


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup_or_rlimit", "rlimit"])
async def test_a_command_that_raises_its_soft_limit_at_once_holds_no_more_than_its_share(
    cgroups: bool,
) -> None:
    calls = [_call(index, "bash", command=RAISE) for index in range(RAISES)]
    chat = FakeChatServer(
        script=[Message.assistant("forking", tool_calls=calls), Message.assistant("done")]
    )
    before = running_now()
    async with LocalSandboxPool(_pool_config(cgroups=cgroups)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with ToolDispatcher(pool, BatchConfig()) as dispatcher:
            result = await run_trajectory(
                trajectory_id="t-0",
                messages=[Message.user("Fork all you can")],
                tools=SLOT_TOOL_SPECS,
                hooks=TrajectoryHooks(prepare=_prepare, score=_fork_after_raising),
                policy=ChatPolicy(chat),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=attrs.evolve(CONFIG, deadline_s=300.0),
            )
    await wait_no_leftovers(groups, run_dir, before)
    held = []
    for exchange in result.exchanges:
        ran = exchange.result.exec
        assert ran is not None, exchange.result
        assert ran.exit_code == 0, exchange.result
        held.append(int(ran.stdout))
    assert len(held) == RAISES
    # every command filled its share (one that could not would show nothing) and held no more
    assert all(COMMAND_NPROC - 2 <= count <= COMMAND_NPROC for count in held), held
    assert result.outcome.score == 1.0, result.outcome


async def test_health_says_the_reserve_and_a_pool_warns_of_a_server_without_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sandboxed slot keeps a quarter of its limit for the hooks, and its server's health
    says so; an unsandboxed slot whose processes its cgroup counts keeps none (its user's count
    is host-wide), which the pool says once, at its start, rather than letting a check fail to
    start later without a word."""
    with caplog.at_level(logging.WARNING, logger="trajcore.adapters.pools.pool_core"):
        async with LocalSandboxPool(_pool_config()) as pool:
            (name,) = pool.container_names()
            health = await pool.client(name).health()
        assert health.hook_process_reserve == MAX_PROCESSES // 4
        assert not [r for r in caplog.records if "for the env's hooks" in r.getMessage()]

        base = _pool_config()
        isolation = attrs.evolve(
            base.server.isolation, require_sandbox=False, bwrap="/nonexistent/bwrap"
        )
        bare = attrs.evolve(base, server=attrs.evolve(base.server, isolation=isolation))
        async with LocalSandboxPool(bare) as pool:
            (name,) = pool.container_names()
            health = await pool.client(name).health()
    if not health.capabilities.cgroups:
        pytest.skip(
            "the server cannot delegate cgroups here: an unsandboxed slot's limit is an rlimit"
        )
    assert not health.sandboxed
    assert health.hook_process_reserve == 0
    said = [r.getMessage() for r in caplog.records if "for the env's hooks" in r.getMessage()]
    assert said == [
        f"local pool: slot server {name} keeps none of a slot's {MAX_PROCESSES} processes for "
        "the env's hooks (a server that predates the reserve, or slots whose process count is "
        "not their own): a score hook's check can fail to start while the model's processes "
        'hold them all (docs/sandbox.md, "Processes at verification time")'
    ]


async def test_a_model_that_lowers_its_agents_limit_still_runs_its_commands() -> None:
    """The model's commands run as the agent's uid, so one may lower the agent's own process
    limit (``prlimit --pid 1``): its later commands then hold that lower limit, and still
    start (a command whose own limit could not be set to the share was refused to start)."""
    lowered = COMMAND_NPROC - 4
    async with LocalSandboxPool(_pool_config()) as pool, pool.lease("t") as lease:
        container = lease.slot.container
        first, after = await pool.execute(
            container,
            [
                bash(lease, f"prlimit --pid 1 --nproc={lowered}:{lowered} && echo lowered"),
                bash(lease, "prlimit --pid $$ --nproc --noheadings --output HARD"),
            ],
        )
    assert (first.outcome, first.content) == (ToolOutcome.OK, "lowered\n"), first
    assert after.outcome is ToolOutcome.OK, after
    assert (after.content or "").strip() == str(lowered), after
