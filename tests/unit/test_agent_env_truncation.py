"""Members cut to ``max_token_length`` are said to be cut, and one with no sampled token left is
left out.

``TokenLedger.export`` keeps the head of a trajectory and cuts its tail to the trainer's length.
What it cut is now in the member's ``overrides[i]["trajcore"]`` (``truncated_tokens``,
``truncated_completion_tokens``), in the ``trajcore/truncated*`` counters and in a warning; and
a member whose every sampled token was cut (the prompt fills the length) has no training tokens,
so the group's rules leave it out instead of sending its score over masks that are all -100.
Before, nothing read the cut, and such a member was sent.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.unit.test_agent_env import FileEnv, _config
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.json_values import JSON
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos import tasks
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.rollout.group import GroupResult
from trajcore.rollout.tools import SlotTools

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(**fields: Any) -> AgentEnvConfig:
    """``test_agent_env``'s config for a managed group of two with the file tools."""
    base: dict[str, Any] = {
        "group_size": 2, "include_messages": False, "mode": "managed",
        "tool_call_parser": "hermes", "enabled_toolsets": ["file"],
    }  # fmt: skip
    return _config(**{**base, **fields})


def responder(env: FileEnv, answer_words: int) -> Callable[[Sequence[int]], TokenCompletion]:
    """Each member writes done.txt (one right, one wrong), then answers in ``answer_words``."""
    tokenizer = env.tokenizer_port()
    end = tokenizer.encode("<|im_end|>")
    parser = get_parser("hermes")
    turns = itertools.count()

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        n = next(turns)
        if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1:
            text = "All done. " + "word " * answer_words
        else:
            arguments: dict[str, JSON] = {"path": "done.txt", "content": "ok" if n % 2 else "no"}
            text = parser.render([ToolCall(id="x", name="write_file", arguments=arguments)])
        ids = [*tokenizer.encode(text), *end]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    return respond


async def run(env: FileEnv, answer_words: int) -> tuple[GroupResult, FakeTokenServer]:
    server = FakeTokenServer(policy=responder(env, answer_words))
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        group = await env.run_task("ok", pool=pool, policy=env.make_policy(token=server))
    return group, server


async def prompt_length() -> int:
    _, server = await run(FileEnv(config()), 0)
    return len(server.requests[0].prompt_ids)


class BigReadEnv(FileEnv):
    """Its workspace holds a large file, which each member reads first."""

    async def prepare_workspace(self, item: str, tools: SlotTools) -> None:
        await tools.write_file("big.txt", "line of text\n" * 400)


def reader(env: FileEnv) -> Callable[[Sequence[int]], TokenCompletion]:
    """Each member reads big.txt, then answers."""
    tokenizer = env.tokenizer_port()
    end = tokenizer.encode("<|im_end|>")
    parser = get_parser("hermes")

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1:
            text = "Read it."
        else:
            call = ToolCall(id="x", name="read_file", arguments={"path": "big.txt"})
            text = parser.render([call])
        ids = [*tokenizer.encode(text), *end]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    return respond


async def test_a_member_cut_to_the_trainers_length_is_said_to_be_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tool result longer than what is left of the length: no turn fits after it, so the
    member ends there on its token budget (no request for a single token), and the export cuts
    the tail (the result's end)."""
    env = BigReadEnv(
        config(max_token_length=await prompt_length() + 200, ensure_scores_are_not_same=False)
    )
    server = FakeTokenServer(policy=reader(env))
    with caplog.at_level(logging.WARNING):
        async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
            group = await env.run_task("ok", pool=pool, policy=env.make_policy(token=server))
        scored = env.scored_group(group)
    assert scored is not None
    assert len(server.requests) == len(group.members)  # each member's first turn, and no more
    assert {m.stats.stop_reason for m in group.members} == {StopReason.TOKEN_BUDGET}
    stories = [overrides["trajcore"] for overrides in scored["overrides"]]
    for member, story in zip(group.members, stories, strict=True):
        assert member.tokens is not None
        cut = member.tokens.truncation
        assert cut is not None
        assert cut.cut_environment_tokens > 0
        assert story["truncated_tokens"] == cut.cut_tokens
        assert story["truncated_completion_tokens"] == cut.cut_completion_tokens
    metrics = env.tool_error_metrics()
    assert metrics["trajcore/truncated"] == 2
    assert metrics["trajcore/truncated_completion_tokens"] == sum(
        s["truncated_completion_tokens"] for s in stories
    )
    warned = [r.getMessage() for r in caplog.records if "cut to max_token_length" in r.getMessage()]
    assert len(warned) == 2, warned


async def test_a_member_with_no_sampled_token_left_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FileEnv(config(max_token_length=await prompt_length() - 5))  # the prompt fills it
    group, _ = await run(env, 0)
    for member in group.members:
        assert member.tokens is not None
        assert member.tokens.completion_tokens == 0
        assert not member.outcome.has_tokens
    with caplog.at_level(logging.WARNING):
        assert env.scored_group(group) is None  # nothing to train on: not sent
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    said = [m for m in left_out if "has no training tokens" in m]
    assert len(said) == len(group.members), left_out
    # the reason is the cut, not a member that never called the model
    assert all("every sampled token was cut by max_token_length" in m for m in said), said


async def test_each_managed_turn_is_capped_by_the_context_left() -> None:
    """``max_tokens`` None (or above what is left) asks each turn for no more than fits in the
    trainer's length after its prompt, so nothing sampled is cut for length."""
    limit = await prompt_length() + 300
    env = FileEnv(config(max_tokens=None, max_token_length=limit))
    group, server = await run(env, 10)
    exported = limit - 1  # Atropos takes sequences shorter than max_token_length
    for request in server.requests:
        assert request.sampling.max_tokens == exported - len(request.prompt_ids), (
            request.sampling.max_tokens,
            len(request.prompt_ids),
        )
    assert all(m.tokens is not None and m.tokens.truncation is None for m in group.members)


async def test_the_trainers_lower_max_token_len_cuts_the_tokens_so_the_group_is_sent() -> None:
    """The trainer's ``max_token_len`` (``get_server_info``) below ``max_token_length``: the
    members are cut to fit it, so Atropos sends the group trajcore counts as sent."""
    env = FileEnv(config(max_token_length=8192, ensure_scores_are_not_same=False))
    limit = await prompt_length() + 40
    env.max_token_len = limit  # what the trainer's /info said
    group, _ = await run(env, 200)
    scored = env.scored_group(group)
    assert scored is not None
    assert all(len(tokens) == limit - 1 for tokens in scored["tokens"])
    counted = env.tool_error_metrics()
    assert counted["trajcore/groups_sent"] == 1
    assert counted["trajcore/truncated"] == 2
    sent: list[object] = []

    async def keep(scored_data: object, item: object = None) -> None:
        sent.append(scored_data)

    env.add_rollouts_for_wandb = keep  # type: ignore[method-assign]  # called per group sent
    atropos: Any = env  # atroposlib's BaseEnv.handle_send_to_api, untyped
    await atropos.handle_send_to_api(scored, "ok", do_send_to_api=False)
    assert sent == [scored]


def test_a_trainer_limit_below_max_token_length_is_said_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="trajcore.env"):
        tasks.log_token_limit(8192, 4096)
        tasks.log_token_limit(8192, 8192)
        tasks.log_token_limit(8192, -1)
    assert [r.getMessage() for r in caplog.records] == [
        "the trainer's max_token_len 4096 is below max_token_length 8192: trajectories are cut "
        "to 4095 tokens, so that Atropos does not skip their groups"
    ]
