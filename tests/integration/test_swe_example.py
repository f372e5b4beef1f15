"""The SWE-style example end to end: each task's repository in its own image, on real pools.

``examples/swe_style.py`` names each item's image (``task_environment``); the pool leases
every member's slot over it through the slot server's image cache; the member copies the
repository out of the image, and its tests run with the image's pytest and dependencies. A
fake chat server plays the model: in each group of two, one member runs the failing tests,
applies the task's fix and runs them again; the other (the control) answers at once. The fix
scores 1.0 and the control 0.0, each with pytest's verdict as its metadata, so the score flips
because of the fix. Run on the local pool (the images read from podman's store), and on the
container pool (the image saved as an OCI layout in a directory the containers mount), each
with an image cache.

The images come from ``./dev images``; a missing or stale one skips naming it.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from examples.swe_style import SOLUTIONS, TASKS, SweStyleEnv, SweTask, image_problem, solve

from tests.image_source import image_problem as server_image_problem
from tests.integration.test_slot_server import searchable_dir
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.pools.container_pool import DEFAULT_IMAGE, find_engine
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.environment_leases import EnvironmentStatistics
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.ports.sandbox_pool import EnvironmentPool
from trajcore.rollout.group import GroupResult
from trajcore.rollout.scripted import chat_turn
from trajcore.rollout.trajectory import TrajectoryResult


def _missing_api() -> str | None:
    """What the env side of task environments still lacks here, or ``None``."""
    if not hasattr(AgentEnv, "task_environment"):
        return "AgentEnv has no task_environment hook yet (the env side of task environments)"
    if "image_cache_dir" not in AgentEnvConfig.model_fields:
        return "AgentEnvConfig has no image_cache_dir setting yet (the pools' image cache)"
    return None


IMAGE_PROBLEMS = [problem for task in TASKS if (problem := image_problem(task)) is not None]
MISSING = _missing_api()

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    pytest.mark.skipif(MISSING is not None, reason=str(MISSING)),
    pytest.mark.skipif(bool(IMAGE_PROBLEMS), reason="; ".join(IMAGE_PROBLEMS)),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def cache_dir() -> Iterator[Path]:
    """One image cache for the module: each image is unpacked once, then hit."""
    with searchable_dir("swe-cache") as folder:
        yield folder


def _config(**fields: Any) -> AgentEnvConfig:
    settings: dict[str, Any] = {
        "tokenizer_name": str(qwen3_tokenizer_path()),
        "use_wandb": False,
        "group_size": 2,
        "max_turns": 6,
        "max_token_length": 8192,
        "slots_per_container": 2,
        "require_sandbox": True,
        "terminal_timeout_s": 60.0,
        "acquire_timeout_s": 60.0,
        "include_messages": True,
        "ensure_scores_are_not_same": False,
    }
    return AgentEnvConfig(**(settings | fields))


def _fix_and_control() -> FakeChatServer:
    """A model whose first conversation of each pair plays the task's fix (``solve``) and whose
    second answers at once without touching anything (the control)."""
    openings = itertools.count()

    def respond(messages: Sequence[Message]) -> ChatTurn:
        if not any(m.role == "assistant" for m in messages) and next(openings) % 2:
            return chat_turn("I will leave the repository as it is.", messages)
        return chat_turn(solve(messages), messages)

    return FakeChatServer(policy=respond)


def _fixed_and_control(group: GroupResult) -> tuple[TrajectoryResult, TrajectoryResult]:
    by_calls = sorted(group.members, key=lambda m: len(m.exchanges), reverse=True)
    fixed, control = by_calls
    assert len(control.exchanges) == 0
    return fixed, control


async def _run_each_task(env: SweStyleEnv, tasks: Sequence[SweTask]) -> EnvironmentStatistics:
    """Run one group of each task; the pool's statistics of its leases over environments."""
    chat = _fix_and_control()
    async with env.rollout_services(policy=env.make_policy(chat=chat)) as services:
        for task in tasks:
            group = await env.run_group(task)
            assert group.environment == task.image
            fixed, control = _fixed_and_control(group)
            for member in (fixed, control):
                assert member.outcome.status is TrajectoryStatus.FINISHED, member.outcome
                assert member.prepare_metadata is not None
                assert member.prepare_metadata["image"] == task.image
            # The fix's member: the image's pytest failed, the fix ran, then the tests passed.
            before, fix, after = fixed.exchanges
            assert before.result.exec is not None
            assert before.result.exec.sandboxed
            assert before.result.exec.exit_code == 1, before.result.content
            assert fix.call.arguments == SOLUTIONS[task.name].arguments
            assert after.result.exec is not None
            assert after.result.exec.exit_code == 0, after.result.content
            assert fixed.outcome.score == 1.0
            assert fixed.score_metadata is not None
            assert fixed.score_metadata["failing"] == []
            # The control, on the same image, scores 0 with the failing tests named.
            assert control.outcome.score == 0.0
            assert control.score_metadata is not None
            failing = control.score_metadata["failing"]
            assert isinstance(failing, list)
            assert failing
            assert all(str(name).startswith(f"{task.tests}/") for name in failing)
        assert isinstance(services.pool, EnvironmentPool)
        return services.pool.environment_statistics()


@pytest.mark.parametrize("prepare_once", [False, True], ids=["each-member", "prepare-once"])
async def test_each_task_fails_until_its_fix_on_the_local_pool(
    cache_dir: Path, prepare_once: bool
) -> None:
    env = SweStyleEnv(
        _config(
            sandbox="local",
            local_containers=1,
            image_cache_dir=str(cache_dir),
            prepare_once=prepare_once,
        )
    )
    statistics = await _run_each_task(env, TASKS)
    assert statistics.refused == 0
    if prepare_once:  # one preparation lease per group, frozen; both members forked from it
        assert (statistics.snapshots, statistics.forks) == (len(TASKS), 2 * len(TASKS))
    else:
        assert (statistics.leases, statistics.snapshots, statistics.forks) == (2 * len(TASKS), 0, 0)


ENGINE = find_engine()
SERVER_IMAGE_PROBLEM = server_image_problem(ENGINE, DEFAULT_IMAGE)


@pytest.fixture(scope="module")
def saved() -> Iterator[SweTask]:
    """The first task with its image saved as an OCI layout in a searchable directory."""
    task = TASKS[0]
    with searchable_dir("swe-layouts") as layouts:
        layout = layouts / task.name
        subprocess.run(
            ["podman", "save", "--format", "oci-dir", "-o", str(layout), task.image_name],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        yield attrs.evolve(task, image=f"oci:{layout}")


@pytest.mark.skipif(SERVER_IMAGE_PROBLEM is not None, reason=str(SERVER_IMAGE_PROBLEM))
async def test_a_task_fails_until_its_fix_on_the_container_pool(
    cache_dir: Path, saved: SweTask
) -> None:
    # The containers cannot read podman's store: the image goes in as an OCI layout in a
    # directory every container mounts read-only (the same image: the cache may hold it already).
    env = SweStyleEnv(
        _config(
            sandbox="container",
            local_containers=1,
            container_image=DEFAULT_IMAGE,
            image_cache_dir=str(cache_dir),
            container_environment_dirs=str(Path(saved.image.split(":", 1)[1]).parent),
        )
    )
    statistics = await _run_each_task(env, [saved])
    assert (statistics.leases, statistics.refused) == (2, 0)
