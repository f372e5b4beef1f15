"""A judged group as Atropos's ``ScoredDataGroup``: a pure conversion, counted by its caller.

The verdict (``RolloutSettings.group_rules``, which requires tokens) makes every decision; the
conversion only sends the kept members and says the verdict's reason when it sends nothing.
"""

from __future__ import annotations

import copy
import logging

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_report import TOKENS, member
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import StateError
from trajcore.domain.groups import DropReason
from trajcore.domain.token_ledger.ledger import TrainingTokens
from trajcore.entrypoints.atropos.config import AgentEnvConfig, RolloutSettings
from trajcore.entrypoints.atropos.metrics import RolloutCounters, log_conversion
from trajcore.entrypoints.atropos.scored_data import scored_group
from trajcore.rollout.group import GroupResult
from trajcore.rollout.trajectory import TrajectoryResult

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


def _with_tokens_flag(m: TrajectoryResult) -> TrajectoryResult:
    """The member as the trajectory runner makes it: its outcome says whether it has tokens."""
    return attrs.evolve(m, outcome=attrs.evolve(m.outcome, has_tokens=m.tokens is not None))


def group(
    group_id: str, *members: TrajectoryResult, settings: RolloutSettings | None = None
) -> GroupResult:
    """A group judged as ``AgentEnv.run_group`` judges a training group."""
    members = tuple(_with_tokens_flag(m) for m in members)
    rules = (settings or _settings()).group_rules(len(members))
    return GroupResult(
        group_id=group_id,
        members=members,
        verdict=rules.assess([m.outcome for m in members]),
        duration_s=2.0,
    )


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


def test_each_members_story_names_the_task_environment_it_ran_over() -> None:
    judged = group("g", member("g/0", tokens=TOKENS), member("g/1", score=0.0, tokens=TOKENS))
    over = scored_group(attrs.evolve(judged, environment="oci:/images/task-1"), _settings())
    plain = scored_group(judged, _settings())
    assert over.scored is not None
    assert plain.scored is not None
    stories = [o["trajcore"] for o in over.scored["overrides"]]
    assert [s["environment"] for s in stories] == ["oci:/images/task-1"] * 2
    assert all("environment" not in o["trajcore"] for o in plain.scored["overrides"])


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
    assert conversion.drop_reason is DropReason.NO_TOKENS
    assert conversion.detail == judged.verdict.detail
    assert conversion.detail == (
        "1 of 2 usable trajectories have training tokens, fewer than min_healthy=2"
    )
    assert conversion.left_out == ("g/1",)


def test_equal_scores_left_after_leaving_members_out_are_not_sent() -> None:
    members = (
        member("g/0", tokens=TOKENS),
        member("g/1", tokens=TOKENS),
        member("g/2", score=0.0),
    )
    kept = _settings(ensure_scores_are_not_same=False)
    assert scored_group(group("g", *members, settings=kept), kept).scored is not None
    dropping = _settings(ensure_scores_are_not_same=True)
    dropped = scored_group(group("g", *members, settings=dropping), dropping)
    assert dropped.drop_reason is DropReason.NO_TOKENS


def test_the_conversion_decides_nothing_a_kept_member_without_tokens_is_refused() -> None:
    # A verdict made without require_tokens (the evaluation rules) keeps a member without
    # tokens: the conversion does not quietly send the group short, it refuses.
    members = (member("g/0", tokens=TOKENS), member("g/1", score=0.0))
    evaluated = GroupResult(
        group_id="g",
        members=members,
        verdict=RolloutSettings.eval_rules(2).assess([m.outcome for m in members]),
        duration_s=1.0,
    )
    with pytest.raises(StateError, match=r"kept member g/1 has no tokens"):
        scored_group(evaluated, _settings())


def test_a_dropped_verdict_is_not_sent_and_counted_by_its_reason() -> None:
    failed = member("g/1", score=None, stop=StopReason.MODEL_ERROR)
    judged = group("g", member("g/0", tokens=TOKENS), failed)
    dropped = GroupResult(
        group_id="g",
        members=judged.members,
        verdict=_settings(on_failure="drop")
        .group_rules(2)
        .assess([m.outcome for m in judged.members]),
        duration_s=1.0,
    )
    conversion = scored_group(dropped, _settings())
    assert conversion.scored is None
    assert conversion.drop_reason is DropReason.MEMBER_FAILED
    assert conversion.detail == dropped.verdict.detail
    counters = RolloutCounters()
    counters.record_conversion(conversion)
    counters.record_conversion(conversion)
    assert counters.groups_dropped == {"member_failed": 2}
    assert counters.groups_sent == 0


_MEMBERS = st.builds(
    lambda score, tokens: (score, tokens),
    st.sampled_from([None, 0.0, 0.5, 1.0]),
    st.sampled_from([None, TOKENS, INEXACT]),
)


@given(
    st.lists(_MEMBERS, min_size=1, max_size=5),
    st.booleans(),
    st.sampled_from(["drop", "keep_healthy"]),
)
def test_what_is_sent_is_exactly_the_verdicts_kept_members(
    drawn: list[tuple[float | None, TrainingTokens | None]], equal: bool, on_failure: str
) -> None:
    settings = _settings(ensure_scores_are_not_same=equal, on_failure=on_failure)
    members = [
        member(
            f"g/{i}",
            score=score,
            stop=StopReason.NATURAL if score is not None else StopReason.MODEL_ERROR,
            tokens=tokens,
        )
        for i, (score, tokens) in enumerate(drawn)
    ]
    judged = group("g", *members, settings=settings)
    conversion = scored_group(judged, settings)
    verdict = judged.verdict
    assert conversion.drop_reason is verdict.drop_reason
    assert conversion.left_out == tuple(f"g/{i}" for i in verdict.no_tokens)
    if verdict.dropped:
        assert conversion.scored is None
        assert conversion.detail == verdict.detail
        return
    scored = conversion.scored
    assert scored is not None
    assert scored["scores"] == list(verdict.scores)
    assert [o["trajcore"]["trajectory_id"] for o in scored["overrides"]] == [
        f"g/{i}" for i in verdict.kept
    ]
    assert conversion.partial == (len(verdict.kept) < len(members))


def test_the_log_says_why_a_member_with_turns_has_no_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member with model turns whose render was given up is not said to have had no model
    turn: the log gives the outcome's own reason."""
    late = "no training tokens: their render did not finish by the trajectory's deadline"
    without = member("g/2", score=0.5)
    without = attrs.evolve(without, outcome=attrs.evolve(without.outcome, detail=late))
    judged = group(
        "g", member("g/0", tokens=TOKENS), member("g/1", score=0.0, tokens=TOKENS), without
    )
    with caplog.at_level(logging.WARNING, logger="trajcore.env"):
        log_conversion(judged, scored_group(judged, _settings()))
    (said,) = [r.getMessage() for r in caplog.records if "g/2" in r.getMessage()]
    assert said == f"group g: member g/2 has no training tokens ({late}); left out"
