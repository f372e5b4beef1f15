"""``AgentEnv.evaluate``: eval items run apart from training, one item's failure is one failed
sample, and what is written (``metrics.json``, ``samples.jsonl``, wandb) is strict JSON that
says which item each sample is, and takes nothing from the training log.

Built like ``test_agent_env``: ``FileEnv`` over ``FakeSandboxPool`` and ``FakeChatServer``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.unit.test_agent_env import FileEnv, _alternating_chat, _config
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.entrypoints.atropos import metrics
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.rollout.group import GroupResult
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import RolloutConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def evaluate(env: FileEnv) -> None:
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        await env.evaluate()


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def samples(folder: Path) -> list[dict[str, Any]]:
    return [strict_json(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


class RaisingScoreEnv(FileEnv):
    """Every verify_and_score raises: every eval item is an env_error."""

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        raise RuntimeError("bug in the env's scorer")


async def test_metrics_json_is_strict_json_when_every_eval_item_fails(tmp_path: Path) -> None:
    env = RaisingScoreEnv(_config(data_dir_to_save_evals=str(tmp_path)))
    env.eval_set = ("ok", "ok")
    await evaluate(env)
    written = strict_json((tmp_path / "metrics.json").read_text())["results"]["all"]
    assert written["eval/failed"] == 2
    assert written["eval/failed/env_error"] == 2
    assert "eval/mean_score" not in written
    assert "eval/solved_rate" not in written


async def test_eval_groups_are_not_counted_as_training_groups(tmp_path: Path) -> None:
    env = FileEnv(_config(data_dir_to_save_evals=str(tmp_path)))
    env.eval_set = ("ok", "ok", "ok")
    await evaluate(env)
    counted = env.tool_error_metrics()
    assert counted["trajcore/groups"] == 0
    assert counted["trajcore/trajectories"] == 0
    assert counted["trajcore/tool_calls"] == 0


class WrongRolloutEnv(FileEnv):
    """An env bug: item_rollout returns an ItemLimits instead of a RolloutConfig."""

    def item_rollout(self, item: str) -> RolloutConfig:
        return ItemLimits(max_turns=2)  # type: ignore[return-value]  # the bug under test


async def test_an_item_rollout_that_is_not_a_rollout_config_fails_its_members(
    tmp_path: Path,
) -> None:
    env = WrongRolloutEnv(_config(data_dir_to_save_evals=str(tmp_path)))
    env.eval_set = ("ok",)
    await evaluate(env)
    (sample,) = samples(tmp_path)
    assert sample["status"] == "env_error", sample
    assert sample["detail"].startswith("item_rollout returned ItemLimits"), sample


class OneItemRaisesEnv(FileEnv):
    """run_group itself raises for the item "boom" (outside any member)."""

    async def run_group(
        self, item: str, *, group_size: int | None = None, for_eval: bool = False
    ) -> GroupResult:
        if item == "boom":
            raise RuntimeError("the group could not be set up")
        return await super().run_group(item, group_size=group_size, for_eval=for_eval)


async def test_an_item_that_raises_is_a_failed_sample_and_the_others_run(tmp_path: Path) -> None:
    env = OneItemRaisesEnv(_config(data_dir_to_save_evals=str(tmp_path)))
    env.eval_set = ("ok", "boom", "ok")
    await evaluate(env)
    written = strict_json((tmp_path / "metrics.json").read_text())["results"]["all"]
    assert written["eval/scored"] == 2
    assert written["eval/failed"] == 1
    lines = samples(tmp_path)
    assert [s["item"] for s in lines] == [0, 1, 2]
    assert lines[1]["status"] == "env_error"
    assert "RuntimeError: the group could not be set up" in lines[1]["detail"]


async def test_eval_samples_say_which_item_and_trajectory_they_are(tmp_path: Path) -> None:
    class BadTaskEnv(FileEnv):
        def build_task(self, item: str) -> str:
            if item == "bad":
                raise KeyError("prompt")
            return super().build_task(item)

    env = BadTaskEnv(_config(data_dir_to_save_evals=str(tmp_path)))
    env.eval_set = ("ok", "bad", "ok")
    await evaluate(env)
    lines = samples(tmp_path)
    assert [s["item"] for s in lines] == [0, 1, 2]
    assert lines[1]["status"] == "env_error"
    assert lines[1]["trajectory_id"].startswith("BadTaskEnv-")
    assert len({s["trajectory_id"] for s in lines}) == 3


async def test_eval_metrics_go_to_wandb_without_the_training_rollout_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import wandb

    logged: list[dict[str, Any]] = []

    def log(data: dict[str, Any], step: int | None = None) -> None:
        logged.append(dict(data))

    monkeypatch.setattr(wandb, "log", log)
    env = FileEnv(_config(use_wandb=True, group_size=2, ensure_scores_are_not_same=False))
    env.eval_set = ("ok",)
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        training = env.scored_group(await env.run_group("ok"))
        assert training is not None
        await env.add_rollouts_for_wandb(training)
        await env.evaluate()
    assert len(logged) == 1
    assert sorted(logged[0]) == [
        "eval/failed", "eval/items", "eval/mean_score", "eval/scored", "eval/solved_rate",
    ]  # fmt: skip
    assert env._table.rows, "the training rollouts wait for the training log"


async def test_max_eval_workers_below_one_is_refused(tmp_path: Path) -> None:
    env = FileEnv(_config(max_eval_workers=0))
    env.eval_set = ("ok",)
    with pytest.raises(ConfigError) as caught:
        await evaluate(env)
    assert caught.value.field == "max_eval_workers"


async def test_each_limited_runs_limit_workers_not_one_task_per_item() -> None:
    tasks: set[int] = set()
    running = 0
    most = 0

    async def run(item: int) -> int:
        nonlocal running, most
        tasks.add(anyio.get_current_task().id)
        running += 1
        most = max(most, running)
        await anyio.lowlevel.checkpoint()
        running -= 1
        return item * 2

    assert await metrics.each_limited(range(1000), run, limit=8) == [i * 2 for i in range(1000)]
    assert most == 8
    assert len(tasks) == 8
