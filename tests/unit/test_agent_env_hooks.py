"""Hooks carry what the seeds carried: workspace metadata, the trajectory's story, (score,
metadata), and limits per item; the metadata reaches the member's overrides and the log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.unit.test_agent_env import _alternating_chat, _config
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.errors import ConfigError, ToolServerError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.env import AgentEnv, ItemLimits, JSONObject, SlotTools, Transcript

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class StoryEnv(AgentEnv[str]):
    """Returns workspace metadata and scores with metadata; records what scoring saw."""

    name = "story"
    seen: list[Transcript]
    prepare_answer: Any = None

    async def get_next_item(self) -> str:
        return "ok"

    def build_task(self, item: str) -> str:
        return f"Create done.txt containing {item}."

    async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
        await tools.write_file("README", "task files")
        answer: JSONObject | None = self.prepare_answer or {"readme": True, "item": item}
        return answer

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Transcript
    ) -> float | tuple[float, JSONObject]:
        self.seen.append(messages)
        try:
            text = await tools.read_file("done.txt")
        except ToolServerError:
            text = ""
        return (1.0 if text == item else 0.0), {"found": text}

    def item_limits(self, item: str) -> ItemLimits | None:
        return ItemLimits(max_turns=1) if item == "short" else None


async def test_metadata_reaches_scoring_the_overrides_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = StoryEnv(_config())
    env.seen = []
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with FakeSandboxPool(containers=2, slots_per_container=2) as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
    assert len(env.seen) == 4
    for transcript in env.seen:
        assert transcript.prepare_metadata == {"readme": True, "item": "ok"}
        assert transcript.final_response == "done"
        assert transcript.stats.turns == 2
        assert [e.call.name for e in transcript.exchanges] == ["write_file"]
        assert transcript.tool_errors == ()
        assert transcript.trajectory_id in {m.trajectory_id for m in result.members}
        assert transcript[0].role == "user"
        assert [m.role for m in transcript][-1] == "assistant"
    group = env.scored_group(result)
    assert group is not None
    found = sorted(o["trajcore"]["score_metadata"]["found"] for o in group["overrides"])
    assert found == ["no", "no", "ok", "ok"]
    assert all(o["trajcore"]["prepare_metadata"]["readme"] for o in group["overrides"])
    logged = [r.getMessage() for r in caplog.records if "metadata" in r.getMessage()]
    assert len(logged) == 4
    assert '"found": "ok"' in "".join(logged)


@pytest.mark.parametrize("bad", [["not", "an", "object"], {"x": float("nan")}])
async def test_metadata_that_is_not_a_json_object_fails_the_member(bad: Any) -> None:
    env = StoryEnv(_config(group_size=2, on_failure="keep_healthy", min_healthy=1))
    env.seen = []
    env.prepare_answer = bad
    async with FakeSandboxPool() as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR  # the env's doing
        assert member.outcome.detail is not None
        assert "prepare hook returned" in member.outcome.detail
        assert member.outcome.score is None
    assert env.seen == []


async def test_item_limits_apply_to_that_items_group() -> None:
    env = StoryEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    env.seen = []
    async with FakeSandboxPool() as pool:
        short = await env.run_task(
            "short", pool=pool, policy=env.make_policy(chat=_alternating_chat())
        )
        full = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_alternating_chat()))
    assert {m.stats.turns for m in short.members} == {1}
    assert {m.stats.stop_reason.value for m in short.members if m.stats.stop_reason} == {
        "max_turns"
    }
    assert {m.stats.turns for m in full.members} == {2}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"deadline_s": -1}, "deadline_s"),
    ],
)
def test_bad_item_limits_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ItemLimits(**fields)
    assert caught.value.field == field
