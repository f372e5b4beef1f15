"""A script as the model: ``ScriptedPolicy`` in both modes and ``Replay`` of recorded calls,
run through a real env on the fake pool."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.unit.test_agent_env import FileEnv, _config
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.errors import InvalidInput
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.report import trajectory_record
from trajcore.rollout.scripted import Replay, ScriptedPolicy, ScriptStep, script_message

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def write(content: str) -> ToolCall:
    return ToolCall(
        id="pending", name="write_file", arguments={"path": "done.txt", "content": content}
    )


def solve(messages: Sequence[Message]) -> ScriptStep:
    return write("ok") if messages[-1].role == "user" else "Done."


def test_a_step_becomes_an_assistant_message_with_call_ids() -> None:
    message = script_message([write("a"), write("b")], 3)
    assert [c.id for c in message.tool_calls] == ["call_3_0", "call_3_1"]
    kept = script_message(ToolCall(id="mine", name="bash", arguments={}), 0)
    assert kept.tool_calls[0].id == "mine"
    assert script_message("All done.", 1) == Message.assistant("All done.")
    with pytest.raises(InvalidInput) as caught:
        script_message(42, 0)  # type: ignore[arg-type]  # what a buggy script returns
    assert caught.value.field == "step"
    with pytest.raises(InvalidInput):
        script_message(Message.user("hi"), 0)


async def test_openai_mode_runs_the_script_through_the_env() -> None:
    env = FileEnv(_config(group_size=2))
    policy = ScriptedPolicy.openai(solve, template=env.chat_template())
    async with FakeSandboxPool(slots_per_container=2) as pool:
        result = await env.run_task("ok", policy=policy, pool=pool)
    assert [m.outcome.score for m in result.members] == [1.0, 1.0]
    assert all(m.tokens is not None and not m.tokens.token_exact for m in result.members)
    assert result.members[0].messages[-1].content == "Done."


async def test_managed_mode_samples_the_rendered_calls_as_exact_tokens() -> None:
    env = FileEnv(_config(group_size=2, tool_call_parser="hermes", mode="managed"))
    parser = get_parser("hermes")
    tokenizer = env.tokenizer_port()
    policy = ScriptedPolicy.managed(
        solve, tokenizer=tokenizer, template=env.chat_template(), parser=parser
    )
    async with FakeSandboxPool(slots_per_container=2) as pool:
        result = await env.run_task("ok", policy=policy, pool=pool)
    assert [m.outcome.score for m in result.members] == [1.0, 1.0]
    member = result.members[0]
    assert member.tokens is not None
    assert member.tokens.token_exact
    rendered = tokenizer.encode(parser.render([write("ok")]))
    trained = [t for t, m in zip(member.tokens.tokens, member.tokens.masks, strict=True) if m >= 0]
    assert trained[: len(rendered)] == rendered  # the call, sampled verbatim
    first = next(m for m in member.messages if m.role == "assistant")
    assert first.tool_calls[0].arguments == {"path": "done.txt", "content": "ok"}


async def test_a_replay_plays_recorded_calls_and_fails_a_task_it_never_saw() -> None:
    env = FileEnv(_config(group_size=2))
    recorded_contents = iter(["ok", "no"])

    def vary(messages: Sequence[Message]) -> ScriptStep:
        return write(next(recorded_contents)) if messages[-1].role == "user" else "Done."

    async with FakeSandboxPool(slots_per_container=2) as pool:
        recorded = await env.run_task(
            "ok", policy=ScriptedPolicy.openai(vary), pool=pool, group_size=2
        )
        records = [trajectory_record(recorded, i) for i in range(2)]
        replay = Replay.of(records)
        again = await env.run_task(
            "ok", policy=ScriptedPolicy.openai(replay), pool=pool, group_size=2
        )
    assert sorted(m.outcome.score or 0.0 for m in again.members) == [0.0, 1.0]  # one each

    class OtherEnv(FileEnv):
        def build_task(self, item: str) -> str:
            return f"Something else entirely: {item}"

    other = OtherEnv(_config(group_size=1))
    async with FakeSandboxPool() as pool:
        missing = await other.run_task("ok", policy=ScriptedPolicy.openai(replay), pool=pool)
    (member,) = missing.members
    assert member.outcome.status is TrajectoryStatus.MODEL_ERROR
    assert "no recorded trajectory" in (member.outcome.detail or "")


def test_records_that_are_not_trajectories_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidInput) as caught:
        Replay.of([{"messages": [{"role": "assistant", "tool_calls": "x"}]}])
    assert caught.value.field == "records[0].messages[0].tool_calls"
    with pytest.raises(InvalidInput) as caught:
        Replay.of([{"messages": [{"role": "user", "content": "only a task"}]}])
    assert caught.value.field == "records"


async def test_a_script_that_raises_is_a_model_error_naming_it_never_the_infrastructures() -> None:
    def broken(messages: Sequence[Message]) -> ScriptStep:
        return [write("ok")][len(messages)]  # IndexError: the script's own bug

    env = FileEnv(_config(group_size=1))
    async with FakeSandboxPool() as pool:
        group = await env.run_task("ok", policy=ScriptedPolicy.openai(broken), pool=pool)
    (member,) = group.members
    assert member.outcome.status is TrajectoryStatus.MODEL_ERROR
    detail = member.outcome.detail or ""
    assert "the model script" in detail, detail
    assert "broken raised IndexError" in detail, detail
    assert "test_scripted_policy.py:" in detail, detail
