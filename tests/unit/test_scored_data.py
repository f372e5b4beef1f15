"""A judged group as Atropos's ``ScoredDataGroup``: a pure conversion, counted by its caller."""

from __future__ import annotations

import copy

from tests.unit.test_report import TOKENS, group, member
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.token_ledger import TrainingTokens
from trajcore.entrypoints.atropos import AgentEnvConfig
from trajcore.entrypoints.atropos.config import RolloutSettings
from trajcore.entrypoints.atropos.metrics import RolloutCounters
from trajcore.entrypoints.atropos.scored_data import scored_group
from trajcore.rollout.group import GroupResult
from trajcore.testing.tokenizers import qwen3_tokenizer_path

INEXACT = TrainingTokens(
    tokens=(1, 2),
    masks=(-100, 2),
    inference_logprobs=None,
    prompt_tokens=1,
    completion_tokens=1,
    environment_tokens=0,
    token_exact=False,
)


def _settings(**fields: object) -> RolloutSettings:
    config = AgentEnvConfig(
        tokenizer_name=str(qwen3_tokenizer_path()), use_wandb=False, group_size=3, **fields
    )
    return config.settings()


def test_a_whole_exact_group_is_sent_with_its_logprobs() -> None:
    judged = group("g", member("g/0", tokens=TOKENS), member("g/1", score=0.0, tokens=TOKENS))
    before = copy.deepcopy(judged)
    conversion = scored_group(judged, _settings(agent_temperature=0.5))
    assert judged == before  # the group is read, never changed
    scored = conversion.scored
    assert scored is not None
    assert conversion.drop_reason is None
    assert not conversion.partial
    assert conversion.left_out == ()
    assert scored["scores"] == [1.0, 0.0]
    assert scored["tokens"] == [[1, 2, 3], [1, 2, 3]]
    assert scored["masks"] == [[-100, 2, 3], [-100, 2, 3]]
    assert scored["inference_logprobs"] == [[1.0, -0.5, -0.25], [1.0, -0.5, -0.25]]
    assert scored["group_overrides"] == {"token_exact": True, "trajcore_group": "g"}
    assert [o["trajcore"]["trajectory_id"] for o in scored["overrides"]] == ["g/0", "g/1"]
    assert scored["generation_params"]["temperature"] == 0.5


def test_inexact_tokens_carry_no_logprobs() -> None:
    judged = group("g", member("g/0", tokens=TOKENS), member("g/1", score=0.0, tokens=INEXACT))
    scored = scored_group(judged, _settings()).scored
    assert scored is not None
    assert scored["inference_logprobs"] is None
    assert scored["group_overrides"]["token_exact"] is False
    assert all(o["token_exact"] is False for o in scored["overrides"])


def test_members_without_tokens_are_left_out_and_the_group_says_its_size() -> None:
    judged = group(
        "g",
        member("g/0", tokens=TOKENS),
        member("g/1", score=0.0, tokens=TOKENS),
        member("g/2", score=0.5),  # no model turn: no tokens
    )
    conversion = scored_group(judged, _settings())
    assert conversion.left_out == ("g/2",)
    assert conversion.partial
    assert conversion.scored is not None
    assert conversion.scored["group_overrides"]["group_size"] == 2
    counters = RolloutCounters()
    counters.record_conversion(conversion)
    assert (counters.groups_sent, counters.groups_partial, counters.groups_dropped) == (1, 1, {})


def test_too_few_members_with_tokens_is_not_sent() -> None:
    judged = group("g", member("g/0", tokens=TOKENS), member("g/1", score=0.0))
    conversion = scored_group(judged, _settings())
    assert conversion.scored is None
    assert conversion.drop_reason == "no_tokens"
    assert conversion.detail == "1 members with tokens"
    assert conversion.left_out == ("g/1",)


def test_equal_scores_left_after_leaving_members_out_are_not_sent() -> None:
    judged = group(
        "g",
        member("g/0", tokens=TOKENS),
        member("g/1", tokens=TOKENS),
        member("g/2", score=0.0),
    )
    assert scored_group(judged, _settings(ensure_scores_are_not_same=False)).scored is not None
    dropped = scored_group(judged, _settings(ensure_scores_are_not_same=True))
    assert dropped.drop_reason == "no_tokens"


def test_a_dropped_verdict_is_not_sent_and_counted_by_its_reason() -> None:
    failed = member("g/1", score=None, stop=StopReason.MODEL_ERROR)
    judged = group("g", member("g/0", tokens=TOKENS), failed)
    dropped = GroupResult(
        group_id="g",
        members=judged.members,
        verdict=_settings(on_failure="drop")
        .group_policy(2)
        .assess([m.outcome for m in judged.members]),
        duration_s=1.0,
    )
    conversion = scored_group(dropped, _settings())
    assert conversion.scored is None
    assert conversion.drop_reason == "member_failed"
    assert conversion.detail == dropped.verdict.detail
    counters = RolloutCounters()
    counters.record_conversion(conversion)
    counters.record_conversion(conversion)
    assert counters.groups_dropped == {"member_failed": 2}
    assert counters.groups_sent == 0
