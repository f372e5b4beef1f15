"""Group assembly: failures are never scored, the rules drop or keep, all-equal groups flagged."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.groups import (
    DropReason,
    GroupRules,
    GroupStatus,
    OnFailure,
    TrajectoryOutcome,
    TrajectoryStatus,
)

FINISHED = TrajectoryStatus.FINISHED
BUDGET = TrajectoryStatus.BUDGET_EXHAUSTED
INFRA = TrajectoryStatus.INFRA_ERROR
MODEL = TrajectoryStatus.MODEL_ERROR


def done(score: float) -> TrajectoryOutcome:
    return TrajectoryOutcome(status=FINISHED, score=score)


def infra() -> TrajectoryOutcome:
    return TrajectoryOutcome(status=INFRA, detail="slot server died")


def empty() -> TrajectoryOutcome:
    return TrajectoryOutcome(status=FINISHED, produced_output=False)


# ----------------------------------------------------------------------------------- outcomes


def test_failures_carry_no_score() -> None:
    for status in (INFRA, MODEL):
        with pytest.raises(InvalidInput, match=r"never scored, got 0\.0 @ score"):
            TrajectoryOutcome(status=status, score=0.0)
        assert TrajectoryOutcome(status=status).score is None


def test_outcome_score_rules() -> None:
    with pytest.raises(InvalidInput, match=r"needs a score @ score"):
        TrajectoryOutcome(status=BUDGET)
    with pytest.raises(InvalidInput, match=r"produced nothing.* @ score"):
        TrajectoryOutcome(status=FINISHED, score=1.0, produced_output=False)
    with pytest.raises(InvalidInput, match=r"finite number.* @ score"):
        TrajectoryOutcome(status=FINISHED, score=math.inf)
    with pytest.raises(InvalidInput, match=r"finite number.* @ score"):
        TrajectoryOutcome(status=FINISHED, score=math.nan)


def test_healthy_statuses() -> None:
    assert {s for s in TrajectoryStatus if s.healthy} == {FINISHED, BUDGET}


# ------------------------------------------------------------------------------------- rules


def test_policy_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"@ group_size"):
        GroupRules(group_size=0)
    with pytest.raises(ConfigError, match=r"must be in \[1, group_size=4\], got 5 @ min_healthy"):
        GroupRules(group_size=4, min_healthy=5)
    with pytest.raises(ConfigError, match=r"@ min_healthy"):
        GroupRules(group_size=4, min_healthy=0)
    with pytest.raises(ConfigError, match=r"@ empty_score"):
        GroupRules(group_size=4, empty_score=math.nan)


def test_min_healthy_default() -> None:
    assert GroupRules(group_size=8).min_healthy == 2
    assert GroupRules(group_size=1).min_healthy == 1


def test_wrong_number_of_outcomes() -> None:
    with pytest.raises(InvalidInput, match=r"expected group_size=3 outcomes, got 2 @ outcomes"):
        GroupRules(group_size=3).assess([done(1.0), done(0.0)])


def test_complete_group() -> None:
    verdict = GroupRules(group_size=3).assess([done(1.0), done(0.0), done(0.5)])
    assert verdict.status is GroupStatus.COMPLETE
    assert verdict.kept == (0, 1, 2)
    assert verdict.scores == (1.0, 0.0, 0.5)
    assert not verdict.dropped
    assert not verdict.all_equal


def test_keep_healthy_partial_group_never_scores_infra() -> None:
    rules = GroupRules(group_size=4, min_healthy=2)
    verdict = rules.assess([done(1.0), infra(), done(0.0), TrajectoryOutcome(status=MODEL)])
    assert verdict.status is GroupStatus.PARTIAL
    assert verdict.kept == (0, 2)
    assert verdict.scores == (1.0, 0.0)
    assert verdict.failed == (1, 3)
    assert verdict.member_scores == (1.0, None, 0.0, None)
    assert not verdict.dropped


def test_keep_healthy_too_few() -> None:
    verdict = GroupRules(group_size=4, min_healthy=3).assess(
        [done(1.0), infra(), done(0.0), infra()]
    )
    assert verdict.status is GroupStatus.FAILED
    assert verdict.drop_reason is DropReason.TOO_FEW_HEALTHY
    assert verdict.kept == ()
    assert verdict.scores == ()
    assert "fewer than min_healthy=3" in verdict.detail


def test_drop_policy_drops_on_any_failure() -> None:
    rules = GroupRules(group_size=3, on_failure=OnFailure.DROP)
    verdict = rules.assess([done(1.0), done(0.0), infra()])
    assert verdict.status is GroupStatus.FAILED
    assert verdict.drop_reason is DropReason.MEMBER_FAILED
    assert verdict.kept == ()
    assert rules.assess([done(1.0), done(0.0), done(0.2)]).status is GroupStatus.COMPLETE


def test_empty_member_gets_empty_score() -> None:
    verdict = GroupRules(group_size=3, empty_score=-1.0).assess([done(1.0), empty(), done(0.0)])
    assert verdict.status is GroupStatus.COMPLETE
    assert verdict.scores == (1.0, -1.0, 0.0)


def test_empty_member_left_out_when_no_empty_score() -> None:
    verdict = GroupRules(group_size=3, empty_score=None).assess([done(1.0), empty(), done(0.0)])
    assert verdict.status is GroupStatus.PARTIAL
    assert verdict.kept == (0, 2)
    assert verdict.left_out == (1,)
    assert verdict.failed == ()


def test_all_equal_scores_dropped_by_default_and_flagged_when_kept() -> None:
    outcomes = [done(1.0), done(1.0), infra()]
    verdict = GroupRules(group_size=3).assess(outcomes)
    assert verdict.all_equal
    assert verdict.drop_reason is DropReason.ALL_EQUAL_SCORES
    assert verdict.status is GroupStatus.PARTIAL
    assert verdict.kept == ()
    assert verdict.member_scores == (1.0, 1.0, None)
    kept = GroupRules(group_size=3, drop_equal_scores=False).assess(outcomes)
    assert kept.all_equal
    assert not kept.dropped
    assert kept.kept == (0, 1)


def test_group_of_one_is_all_equal_like_atropos() -> None:
    verdict = GroupRules(group_size=1).assess([done(0.5)])
    assert verdict.all_equal
    assert verdict.drop_reason is DropReason.ALL_EQUAL_SCORES


def test_all_infra_group_fails_and_is_not_all_equal() -> None:
    verdict = GroupRules(group_size=2, min_healthy=1).assess([infra(), infra()])
    assert verdict.status is GroupStatus.FAILED
    assert verdict.drop_reason is DropReason.TOO_FEW_HEALTHY
    assert not verdict.all_equal


# --------------------------------------------------------------------------------- properties

outcomes_strategy = st.one_of(
    st.builds(
        TrajectoryOutcome,
        status=st.sampled_from([FINISHED, BUDGET]),
        score=st.sampled_from([0.0, 0.5, 1.0]) | st.floats(-10, 10),
    ),
    st.builds(
        TrajectoryOutcome,
        status=st.sampled_from([FINISHED, BUDGET]),
        produced_output=st.just(False),
    ),
    st.builds(TrajectoryOutcome, status=st.sampled_from([INFRA, MODEL])),
)


@st.composite
def groups(draw: st.DrawFn) -> tuple[GroupRules, list[TrajectoryOutcome]]:
    size = draw(st.integers(min_value=1, max_value=8))
    rules = GroupRules(
        group_size=size,
        on_failure=draw(st.sampled_from(OnFailure)),
        min_healthy=draw(st.integers(min_value=1, max_value=size)),
        empty_score=draw(st.none() | st.sampled_from([0.0, -1.0])),
        drop_equal_scores=draw(st.booleans()),
    )
    return rules, draw(st.lists(outcomes_strategy, min_size=size, max_size=size))


@given(groups())
def test_failures_are_never_kept_or_scored(
    group: tuple[GroupRules, list[TrajectoryOutcome]],
) -> None:
    rules, outcomes = group
    verdict = rules.assess(outcomes)
    for i, outcome in enumerate(outcomes):
        if not outcome.status.healthy:
            assert i not in verdict.kept
            assert i in verdict.failed
            assert verdict.member_scores[i] is None
    assert len(verdict.kept) == len(verdict.scores) <= rules.group_size
    assert list(verdict.kept) == sorted(set(verdict.kept))
    assert all(
        verdict.member_scores[i] == s for i, s in zip(verdict.kept, verdict.scores, strict=True)
    )


@given(groups())
def test_dropped_exactly_when_the_rules_say(
    group: tuple[GroupRules, list[TrajectoryOutcome]],
) -> None:
    rules, outcomes = group
    verdict = rules.assess(outcomes)
    any_failed = any(not o.status.healthy for o in outcomes)
    usable = [
        o.score if o.produced_output else rules.empty_score
        for o in outcomes
        if o.status.healthy and (o.produced_output or rules.empty_score is not None)
    ]
    voided = (rules.on_failure is OnFailure.DROP and any_failed) or len(usable) < rules.min_healthy
    all_equal = len(set(usable)) == 1
    assert verdict.all_equal == all_equal
    assert (verdict.status is GroupStatus.FAILED) == voided
    assert verdict.dropped == (voided or (all_equal and rules.drop_equal_scores))
    if verdict.dropped:
        assert verdict.kept == ()
    else:
        assert len(verdict.kept) == len(usable) >= rules.min_healthy
        assert list(verdict.scores) == usable
        complete = len(usable) == rules.group_size
        assert verdict.status is (GroupStatus.COMPLETE if complete else GroupStatus.PARTIAL)


# ---------------------------------------------------------------------------- pinned decisions


@pytest.mark.parametrize(
    ("rules", "outcomes", "reason", "detail"),
    [
        (
            GroupRules(group_size=3, on_failure=OnFailure.DROP),
            [done(0.5), done(0.5), infra()],
            DropReason.MEMBER_FAILED,
            "1 of 3 trajectories failed and on_failure is drop",
        ),
        (
            GroupRules(group_size=3, min_healthy=3),
            [done(0.5), done(0.5), infra()],
            DropReason.TOO_FEW_HEALTHY,
            "2 usable trajectories, fewer than min_healthy=3",
        ),
    ],
)
def test_a_failed_group_is_dropped_for_its_failure_not_for_equal_scores(
    rules: GroupRules, outcomes: list[TrajectoryOutcome], reason: DropReason, detail: str
) -> None:
    # The first reason found stands: a group that failed says why it failed, even when its
    # usable scores are also all equal (the flag still says so).
    verdict = rules.assess(outcomes)
    assert verdict.drop_reason is reason
    assert verdict.detail == detail
    assert verdict.all_equal
    assert verdict.status is GroupStatus.FAILED


def test_the_verdict_detail_says_what_was_kept_or_why_nothing_was() -> None:
    kept = GroupRules(group_size=3).assess([done(1.0), done(0.0), done(0.5)])
    assert kept.detail == "kept 3 of 3"
    equal = GroupRules(group_size=3).assess([done(0.5), done(0.5), infra()])
    assert equal.detail == "all 2 scores equal 0.5: no learning signal"


def test_a_score_for_an_empty_answer_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput) as caught:
        TrajectoryOutcome(status=FINISHED, score=1.0, produced_output=False)
    assert str(caught.value) == (
        "the reward is skipped when the model produced nothing; leave it None @ score"
    )


@pytest.mark.parametrize("min_healthy", [2.5, "2", True])
def test_min_healthy_must_be_an_integer(min_healthy: object) -> None:
    with pytest.raises(ConfigError) as caught:
        GroupRules(group_size=4, min_healthy=min_healthy)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == f"must be an integer, got {min_healthy!r} @ min_healthy"


def test_a_group_size_that_is_no_integer_is_named_not_a_type_error() -> None:
    # min_healthy's default is filled in before group_size is validated: it must not fail on
    # a bad group_size first.
    with pytest.raises(ConfigError) as caught:
        GroupRules(group_size="4")  # type: ignore[arg-type]  # bad input on purpose
    assert caught.value.field == "group_size"


# ------------------------------------------------------------------- training tokens (one judge)


def tokenless(score: float) -> TrajectoryOutcome:
    return TrajectoryOutcome(status=FINISHED, score=score, has_tokens=False)


def test_has_tokens_must_be_a_bool() -> None:
    with pytest.raises(InvalidInput) as caught:
        TrajectoryOutcome(status=FINISHED, score=1.0, has_tokens=1)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == "must be a bool, got 1 @ has_tokens"


def test_a_member_without_tokens_is_left_out_and_the_group_is_partial() -> None:
    rules = GroupRules(group_size=3, require_tokens=True)
    verdict = rules.assess([done(1.0), done(0.0), tokenless(0.5)])
    assert verdict.status is GroupStatus.PARTIAL
    assert verdict.kept == (0, 1)
    assert verdict.scores == (1.0, 0.0)
    assert verdict.no_tokens == (2,)
    assert verdict.left_out == (2,)
    assert verdict.failed == ()
    assert verdict.member_scores == (1.0, 0.0, 0.5)  # its score still counts in metrics
    assert verdict.detail == "kept 2 of 3"


def test_too_few_members_with_tokens_drop_the_group_as_no_tokens() -> None:
    # The minimum is min_healthy of the configured group size (2 of 3), not of the members
    # that happen to have tokens.
    verdict = GroupRules(group_size=3, require_tokens=True).assess(
        [done(1.0), tokenless(0.0), tokenless(0.5)]
    )
    assert verdict.drop_reason is DropReason.NO_TOKENS
    assert verdict.status is GroupStatus.FAILED
    assert verdict.kept == ()
    assert verdict.scores == ()
    assert verdict.no_tokens == (1, 2)
    assert verdict.detail == (
        "1 of 3 usable trajectories have training tokens, fewer than min_healthy=2"
    )


def test_equal_scores_once_tokenless_members_are_left_out_drop_as_no_tokens() -> None:
    outcomes = [done(1.0), done(1.0), tokenless(0.0)]
    verdict = GroupRules(group_size=3, require_tokens=True).assess(outcomes)
    assert verdict.drop_reason is DropReason.NO_TOKENS
    assert verdict.status is GroupStatus.PARTIAL
    assert not verdict.all_equal  # the usable scores differ; those with tokens do not
    assert verdict.detail == "all 2 scores with training tokens equal 1.0: no learning signal"
    kept = GroupRules(group_size=3, require_tokens=True, drop_equal_scores=False).assess(outcomes)
    assert not kept.dropped
    assert kept.kept == (0, 1)


def test_an_earlier_reason_stands_before_no_tokens() -> None:
    drop = GroupRules(group_size=3, on_failure=OnFailure.DROP, require_tokens=True)
    assert drop.assess([tokenless(1.0), tokenless(0.0), infra()]).drop_reason is (
        DropReason.MEMBER_FAILED
    )
    few = GroupRules(group_size=3, min_healthy=3, require_tokens=True)
    assert few.assess([tokenless(1.0), done(0.0), infra()]).drop_reason is (
        DropReason.TOO_FEW_HEALTHY
    )
    equal = GroupRules(group_size=3, require_tokens=True)
    assert equal.assess([done(1.0), done(1.0), tokenless(1.0)]).drop_reason is (
        DropReason.ALL_EQUAL_SCORES
    )


def test_without_require_tokens_a_tokenless_member_is_kept() -> None:
    verdict = GroupRules(group_size=2).assess([tokenless(1.0), done(0.0)])
    assert verdict.kept == (0, 1)
    assert verdict.no_tokens == ()


def test_drop_reasons_are_their_metric_names() -> None:
    assert {str(r) for r in DropReason} == {
        "member_failed",
        "too_few_healthy",
        "no_tokens",
        "all_equal_scores",
    }
    assert f"{DropReason.NO_TOKENS}" == "no_tokens"


with_tokens_or_not = st.tuples(outcomes_strategy, st.booleans()).map(
    lambda pair: attrs.evolve(pair[0], has_tokens=pair[1])
)


@st.composite
def token_groups(draw: st.DrawFn) -> tuple[GroupRules, list[TrajectoryOutcome]]:
    rules, _ = draw(groups())
    rules = attrs.evolve(rules, require_tokens=draw(st.booleans()))
    size = rules.group_size
    return rules, draw(st.lists(with_tokens_or_not, min_size=size, max_size=size))


@given(token_groups())
def test_members_without_tokens_are_judged_exactly_by_the_rules(
    group: tuple[GroupRules, list[TrajectoryOutcome]],
) -> None:
    rules, outcomes = group
    verdict = rules.assess(outcomes)
    scores = [
        (i, o.score if o.produced_output else rules.empty_score)
        for i, o in enumerate(outcomes)
        if o.status.healthy and (o.produced_output or rules.empty_score is not None)
    ]
    usable = [s for _, s in scores]
    no_tokens = [i for i, _ in scores if rules.require_tokens and not outcomes[i].has_tokens]
    trainable = [(i, s) for i, s in scores if i not in no_tokens]
    any_failed = any(not o.status.healthy for o in outcomes)
    reason: DropReason | None = None
    if rules.on_failure is OnFailure.DROP and any_failed:
        reason = DropReason.MEMBER_FAILED
    elif len(usable) < rules.min_healthy:
        reason = DropReason.TOO_FEW_HEALTHY
    elif len(trainable) < rules.min_healthy:
        reason = DropReason.NO_TOKENS
    elif rules.drop_equal_scores and len(set(usable)) == 1:
        reason = DropReason.ALL_EQUAL_SCORES
    elif rules.drop_equal_scores and len({s for _, s in trainable}) == 1:
        reason = DropReason.NO_TOKENS
    assert verdict.drop_reason is reason
    assert verdict.no_tokens == tuple(no_tokens)
    assert set(verdict.no_tokens) <= set(verdict.left_out)
    assert list(verdict.left_out) == sorted(set(verdict.left_out))
    if reason is None:
        assert list(verdict.kept) == [i for i, _ in trainable]
        assert list(verdict.scores) == [s for _, s in trainable]
        assert len(verdict.kept) >= rules.min_healthy
        # Sent partial exactly when fewer than the configured group size are kept.
        partial = len(verdict.kept) < rules.group_size
        assert verdict.status is (GroupStatus.PARTIAL if partial else GroupStatus.COMPLETE)
    else:
        assert verdict.kept == verdict.scores == ()
    # Tokens never change a member's score, only whether it is sent.
    assert list(verdict.member_scores) == [dict(scores).get(i) for i in range(rules.group_size)]


@given(token_groups())
def test_without_require_tokens_has_tokens_changes_nothing(
    group: tuple[GroupRules, list[TrajectoryOutcome]],
) -> None:
    rules, outcomes = group
    ignoring = attrs.evolve(rules, require_tokens=False)
    with_all = [attrs.evolve(o, has_tokens=True) for o in outcomes]
    assert ignoring.assess(outcomes) == ignoring.assess(with_all)
    # And when every member has tokens, requiring them changes nothing either.
    requiring = attrs.evolve(rules, require_tokens=True)
    assert requiring.assess(with_all) == ignoring.assess(with_all)


def test_a_single_member_with_tokens_is_no_learning_signal_and_says_so() -> None:
    rules = GroupRules(group_size=2, min_healthy=1, require_tokens=True)
    verdict = rules.assess([done(1.0), tokenless(0.0)])
    assert verdict.drop_reason is DropReason.NO_TOKENS
    assert verdict.detail == "all 1 scores with training tokens equal 1.0: no learning signal"
