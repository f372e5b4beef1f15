"""The demo end to end, and the example envs' tasks, against the real local pool (bubblewrap).

- ``trajcore demo`` runs offline (no model endpoint) as a real command, in a bounded time, and
  writes JSONL and HTML in which every bundled task is solved by the scripted policy.
- Every shell task's check fails on the prepared workspace and passes after its scripted
  solution; the code-fix env's pytest scoring tells a fixed module from a buggy one, also when
  the sandbox's Python has no pytest of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from examples import code_fix
from examples.shell_tasks import SOLUTIONS, TASKS, ShellTasksEnv

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_protocol import SLOT_TOOLS
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter
from trajcore.rollout.trajectory import ScoreAnswer

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_demo_runs_offline_and_solves_every_task(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "trajcore.entrypoints.cli", "demo", "--out", str(out)],
        cwd=tmp_path,  # not the repository: the demo finds examples/ on its own
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No model endpoint is configured" in done.stderr
    # The scripted policy is the demo's model, not Atropos's servers: no advice about their flags.
    assert "--openai." not in done.stderr, done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * len(TASKS)  # default group size 2, one group per task
    assert {line["group"].split("-", 1)[1] for line in lines} == {t.name for t in TASKS}
    assert all(line["score"] == 1.0 for line in lines)
    assert all(line["status"] == "finished" for line in lines)
    assert all(line["tool_calls"] >= 1 and line["tool_errors"] == 0 for line in lines)
    assert all(line["tokens"] and len(line["tokens"]) == len(line["masks"]) for line in lines)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h1>trajcore demo: shell tasks</h1>" in page  # a complete run: nothing more said
    assert "stopped" not in done.stdout
    for task in TASKS:
        assert task.name in page
    assert (out / "atropos_groups.jsonl").read_text().count("\n") == len(TASKS)
    assert "mean score 1.000" in done.stdout


@asynccontextmanager
async def local_pool() -> AsyncIterator[tuple[LocalSandboxPool, ToolDispatcher]]:
    """A real local pool (one slot server, bubblewrap required) and a dispatcher over it."""
    config = LocalPoolConfig(
        containers=1,
        server=SlotServerSettings(
            slots_per_container=2, acquire_timeout_s=30.0,
            isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.5),
        ),
    )  # fmt: skip
    async with (
        LocalSandboxPool(config) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):
        yield pool, dispatcher


@asynccontextmanager
async def slot_tools(
    services: tuple[LocalSandboxPool, ToolDispatcher],
) -> AsyncIterator[SlotTools]:
    """The hooks' toolbox bound to a freshly leased slot (its release wipes the workspace)."""
    pool, dispatcher = services
    async with pool.lease("example-test") as lease:
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None,
            offered=frozenset(SLOT_TOOLS), tool_timeout_s=60.0, trajectory_id="example-test",
        )  # fmt: skip
        yield SlotTools(router)


async def solve(tools: SlotTools, steps: Sequence[ToolCall]) -> None:
    for i, step in enumerate(steps):
        (result,) = await tools.router.run(
            [ToolCall(id=f"s{i}", name=step.name, arguments=step.arguments)]
        )
        assert result.ok, result.content


def _score(answer: ScoreAnswer) -> float:
    return answer if isinstance(answer, float) else answer[0]


def _config() -> AgentEnvConfig:
    return AgentEnvConfig(tokenizer_name=str(qwen3_tokenizer_path()), use_wandb=False)


@pytest.mark.anyio
async def test_every_shell_task_fails_before_and_passes_after_its_solution() -> None:
    env = ShellTasksEnv(_config())
    assert {t.name for t in TASKS} == set(SOLUTIONS)
    async with local_pool() as services:
        for task in TASKS:
            async with slot_tools(services) as tools:  # a fresh workspace per task
                await env.prepare_workspace(task, tools)
                assert _score(await env.verify_and_score(task, tools, ())) == 0.0, task.name
                await solve(tools, SOLUTIONS[task.name])
                assert _score(await env.verify_and_score(task, tools, ())) == 1.0, task.name


@pytest.mark.anyio
async def test_code_fix_scores_fixed_one_buggy_or_test_edited_zero() -> None:
    env = code_fix.CodeFixEnv(_config())
    async with local_pool() as services:
        for task in code_fix.TASKS:
            async with slot_tools(services) as tools:
                await env.prepare_workspace(task, tools)
                assert _score(await env.verify_and_score(task, tools, ())) == 0.0, task.name
                await solve(tools, code_fix.SOLUTIONS[task.name])
                assert _score(await env.verify_and_score(task, tools, ())) == 1.0, task.name
        async with slot_tools(services) as tools:  # edited tests do not count
            task = code_fix.TASKS[0]
            await env.prepare_workspace(task, tools)
            for name in task.tests:
                await tools.write_file(name, "def test_nothing() -> None:\n    pass\n")
            assert _score(await env.verify_and_score(task, tools, ())) == 0.0


SYSTEM_PYTHON = "/usr/bin/python3"


def _has_pytest(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import pytest"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.anyio
@pytest.mark.skipif(
    not os.path.exists(SYSTEM_PYTHON) or _has_pytest(SYSTEM_PYTHON),
    reason="needs a system python3 without pytest",
)
async def test_code_fix_ships_pytest_when_the_sandbox_python_lacks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(code_fix, "SANDBOX_PYTHON", SYSTEM_PYTHON)
    env = code_fix.CodeFixEnv(_config())
    task = code_fix.TASKS[1]
    async with local_pool() as services, slot_tools(services) as tools:
        await env.prepare_workspace(task, tools)
        assert _score(await env.verify_and_score(task, tools, ())) == 0.0
        shipped = await tools.bash("test -d .verify/_pytest")
        assert shipped.exec is not None
        assert shipped.exec.exit_code == 0
        await solve(tools, code_fix.SOLUTIONS[task.name])
        assert _score(await env.verify_and_score(task, tools, ())) == 1.0
