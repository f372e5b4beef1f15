"""Group assembly: from ``group_size`` trajectory outcomes to what goes to the trainer.

An environment runs a *group* of trajectories per dataset item; the trainer computes advantages
relative to the group, so one wrong score biases every member. This module decides which members'
scores enter the group and whether the group is sent at all. It is a pure function of the outcomes
and the env's ``GroupRules``; ``GroupRules.assess`` returns a frozen ``GroupVerdict``.

Rules this module keeps:

- A trajectory ends in one of five statuses. ``finished`` and ``budget_exhausted`` are *healthy*:
  what happened is the policy's doing and is scored. ``infra_error`` (sandbox, slot server, tool
  server), ``model_error`` (the LLM server failed or aborted; ``ModelServerError`` is an
  ``InfrastructureError``) and ``env_error`` (the env's own code raised: a hook's bug, a
  forgotten ``await``, a hook that returned something that is not a score) are *failures*: not
  the policy's fault, so they carry no score, are never kept, and are never turned into a 0 that
  would drag the group's advantages. Each is counted under its own name, so a bug in an env is
  never reported as a broken sandbox.
- A healthy member whose model produced nothing has its reward hook skipped (the env has nothing
  to verify) and gets the rules' ``empty_score`` instead: 0.0 by default, since an empty answer
  is the policy's failure and should be learnt from. With ``empty_score=None`` such members are
  left out instead, and they do not count as usable.
- ``on_failure`` is the env's choice: ``drop`` sends no group that had any failure;
  ``keep_healthy`` sends the usable members when at least ``min_healthy`` remain. Under both,
  a group with fewer than ``min_healthy`` usable members is dropped (``1 <= min_healthy <=
  group_size``; the default is 2, the fewest from which a group-relative advantage means
  anything, or 1 for groups of one).
- Scores that are all equal give no learning signal: Atropos drops such groups when
  ``ensure_scores_are_not_same`` is on (a group of one counts as all equal there too). The verdict
  always flags it; with ``drop_equal_scores`` (the default, as in Atropos) it also drops the group.
- Training needs tokens: with ``require_tokens`` (the trainer's rules) a scored member without
  training tokens (it never had a model turn) is left out, and a group left with fewer than
  ``min_healthy`` members with tokens, or with only equal scores once they are left out, is
  dropped as ``no_tokens``. Evaluation does not require tokens. Every threshold comes from the
  rules' ``group_size``, never from the members at hand.
- The first reason found stands: a member failure (under ``drop``), then too few usable members,
  then too few with tokens, then equal scores (all usable ones, then those with tokens).
- A kept partial group has fewer members than ``group_size``; whoever sends it must say so to
  Atropos (``group_overrides["group_size"]``), which otherwise discards a short group.

Whoever sends a group only converts the verdict's ``kept`` members: every keep or drop decision
is made here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, InvalidInput

__all__ = [
    "DropReason",
    "GroupRules",
    "GroupStatus",
    "GroupVerdict",
    "OnFailure",
    "TrajectoryOutcome",
    "TrajectoryStatus",
]


class TrajectoryStatus(enum.Enum):
    """How a trajectory ended, as far as scoring is concerned."""

    FINISHED = "finished"  # the model stopped on its own (or was cut off mid-turn)
    BUDGET_EXHAUSTED = "budget_exhausted"  # max turns, token or time budget
    MODEL_ERROR = "model_error"  # the LLM server failed or aborted the generation
    INFRA_ERROR = "infra_error"  # sandbox, slot server or tool server failed
    ENV_ERROR = "env_error"  # the env's own code (a hook) raised or answered nonsense

    @property
    def healthy(self) -> bool:
        """Whether the trajectory's ending is the policy's doing, and so may be scored."""
        return self in (TrajectoryStatus.FINISHED, TrajectoryStatus.BUDGET_EXHAUSTED)


@attrs.frozen(kw_only=True)
class TrajectoryOutcome:
    """What one trajectory of a group came to.

    Attributes:
        status: How it ended.
        score: The env's reward; ``None`` for failures and for members whose model produced
            nothing (their reward hook is skipped), a finite number otherwise.
        produced_output: Whether the model produced anything (text, reasoning or a call).
        detail: A one-line reason for logs, e.g. the error that ended it.
        has_tokens: Whether the trajectory has training tokens (a sampled token left after
            the cut to the trainer's length); rules with ``require_tokens`` leave a member
            without them out.

    Raises (when built):
        InvalidInput: a failure with a score, a healthy member with output but no score, an
            empty member with a score, or a score that is not a finite number (field ``score``);
            a ``has_tokens`` that is not a bool (field ``has_tokens``).
    """

    status: TrajectoryStatus
    score: float | None = None
    produced_output: bool = True
    detail: str | None = None
    has_tokens: bool = True

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.has_tokens, bool):
            raise InvalidInput("has_tokens", f"must be a bool, got {self.has_tokens!r}")
        if self.score is not None:
            if not self.status.healthy:
                raise InvalidInput(
                    "score", f"a {self.status.value} trajectory is never scored, got {self.score!r}"
                )
            if not self.produced_output:
                raise InvalidInput(
                    "score", "the reward is skipped when the model produced nothing; leave it None"
                )
            if not _is_finite_number(self.score):
                raise InvalidInput("score", f"must be a finite number, got {self.score!r}")
        elif self.status.healthy and self.produced_output:
            raise InvalidInput("score", f"a {self.status.value} trajectory needs a score")


def _is_finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class OnFailure(enum.Enum):
    """What a group does when some member failed (``infra_error``, ``model_error`` or
    ``env_error``)."""

    DROP = "drop"  # send nothing for this group
    KEEP_HEALTHY = "keep_healthy"  # send the usable members when at least min_healthy remain


class GroupStatus(enum.Enum):
    """The health of a group once assessed."""

    COMPLETE = "complete"  # every member is kept
    PARTIAL = "partial"  # some members were left out, enough remain
    FAILED = "failed"  # failures (or too few usable members) void the group


class DropReason(enum.StrEnum):
    """Why a group is not sent (a string enum: its value is its metric and log name)."""

    MEMBER_FAILED = "member_failed"  # on_failure=drop and some member failed
    TOO_FEW_HEALTHY = "too_few_healthy"  # fewer than min_healthy usable members
    NO_TOKENS = "no_tokens"  # require_tokens: too few members with tokens, or only equal scores
    ALL_EQUAL_SCORES = "all_equal_scores"  # no learning signal (drop_equal_scores)


def _default_min_healthy(rules: GroupRules) -> int:
    size: object = rules.group_size  # not validated yet when defaults are filled in
    return min(2, size) if isinstance(size, int) else 1


def _check_min_healthy(rules: GroupRules, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(attribute.name, f"must be an integer, got {value!r}")
    if not 1 <= value <= rules.group_size:
        raise ConfigError(
            attribute.name, f"must be in [1, group_size={rules.group_size}], got {value}"
        )


@attrs.frozen(kw_only=True)
class GroupRules:
    """An env's rules for turning a group's outcomes into training data.

    Attributes:
        group_size: Trajectories per group.
        on_failure: Drop a group with any failed member, or keep its usable members.
        min_healthy: Fewest usable members a group may be sent with; ``1 <= min_healthy <=
            group_size``; default ``min(2, group_size)``.
        empty_score: Score for a healthy member whose model produced nothing; ``None`` leaves
            such members out.
        drop_equal_scores: Drop a group whose kept scores are all equal (Atropos's
            ``ensure_scores_are_not_same``); the verdict flags them either way.
        require_tokens: Leave out scored members without training tokens (a group sent to a
            trainer); ``False`` (evaluation, reports) ignores ``has_tokens``.

    Raises (when built):
        ConfigError: a field out of range, naming it.
    """

    group_size: int = attrs.field(validator=validators.positive_int)
    on_failure: OnFailure = OnFailure.KEEP_HEALTHY
    min_healthy: int = attrs.field(
        default=attrs.Factory(_default_min_healthy, takes_self=True),
        validator=_check_min_healthy,
    )
    empty_score: float | None = attrs.field(
        default=0.0, validator=validators.finite_number(None, optional=True)
    )
    drop_equal_scores: bool = True
    require_tokens: bool = False

    def assess(self, outcomes: Sequence[TrajectoryOutcome]) -> GroupVerdict:
        """Decide which members of a group are kept and whether the group is sent.

        Returns a ``GroupVerdict``; members are referred to by their index in ``outcomes``.

        Raises:
            InvalidInput: ``outcomes`` does not hold exactly ``group_size`` outcomes (field
                ``outcomes``).
        """
        if len(outcomes) != self.group_size:
            raise InvalidInput(
                "outcomes", f"expected group_size={self.group_size} outcomes, got {len(outcomes)}"
            )
        member_scores: list[float | None] = []
        failed: list[int] = []
        left_out: list[int] = []
        for i, outcome in enumerate(outcomes):
            score: float | None
            if not outcome.status.healthy:
                score = None
                failed.append(i)
            elif outcome.produced_output:
                score = outcome.score
            else:
                score = self.empty_score
            if score is None:
                left_out.append(i)
            member_scores.append(score)

        usable = tuple(i for i, s in enumerate(member_scores) if s is not None)
        usable_scores = tuple(s for s in member_scores if s is not None)
        all_equal = len(set(usable_scores)) == 1
        no_tokens = tuple(i for i in usable if self.require_tokens and not outcomes[i].has_tokens)
        trained = [
            (i, s) for i, s in enumerate(member_scores) if s is not None and i not in no_tokens
        ]
        trainable = tuple(i for i, _ in trained)
        trainable_scores = tuple(s for _, s in trained)
        left_out = sorted((*left_out, *no_tokens))

        reason: DropReason | None = None
        if failed and self.on_failure is OnFailure.DROP:
            reason = DropReason.MEMBER_FAILED
        elif len(usable) < self.min_healthy:
            reason = DropReason.TOO_FEW_HEALTHY
        elif len(trainable) < self.min_healthy:
            reason = DropReason.NO_TOKENS
        status = (
            GroupStatus.FAILED
            if reason is not None
            else GroupStatus.PARTIAL
            if left_out
            else GroupStatus.COMPLETE
        )
        if reason is None and self.drop_equal_scores:
            if all_equal:
                reason = DropReason.ALL_EQUAL_SCORES
            elif len(set(trainable_scores)) == 1:
                reason = DropReason.NO_TOKENS

        return GroupVerdict(
            status=status,
            kept=() if reason is not None else trainable,
            scores=() if reason is not None else trainable_scores,
            member_scores=tuple(member_scores),
            failed=tuple(failed),
            left_out=tuple(left_out),
            no_tokens=no_tokens,
            all_equal=all_equal,
            drop_reason=reason,
            detail=self._explain(
                reason, len(failed), usable_scores, len(trainable), trainable_scores
            ),
        )

    def _explain(
        self,
        reason: DropReason | None,
        failures: int,
        scores: tuple[float, ...],
        trainable: int,
        trainable_scores: tuple[float, ...],
    ) -> str:
        usable = len(scores)
        if reason is DropReason.MEMBER_FAILED:
            return f"{failures} of {self.group_size} trajectories failed and on_failure is drop"
        if reason is DropReason.TOO_FEW_HEALTHY:
            return f"{usable} usable trajectories, fewer than min_healthy={self.min_healthy}"
        if reason is DropReason.ALL_EQUAL_SCORES:
            return f"all {len(scores)} scores equal {scores[0]!r}: no learning signal"
        if reason is DropReason.NO_TOKENS:
            if trainable < self.min_healthy:
                return (
                    f"{trainable} of {usable} usable trajectories have training tokens, "
                    f"fewer than min_healthy={self.min_healthy}"
                )
            return (
                f"all {trainable} scores with training tokens equal {trainable_scores[0]!r}: "
                "no learning signal"
            )
        return f"kept {trainable} of {self.group_size}"


@attrs.frozen(kw_only=True)
class GroupVerdict:
    """What to do with one group.

    Attributes:
        status: complete, partial or failed (the group's health, whether or not it is sent).
        kept: Indices of the members to send, ascending; empty when the group is dropped.
        scores: The kept members' scores, aligned with ``kept``; empty when dropped.
        member_scores: One entry per member: its score (``empty_score`` for an empty member),
            or ``None`` for a failure or a left-out empty member. For metrics, even when dropped.
        failed: Indices of members that ended in ``infra_error``, ``model_error`` or
            ``env_error``.
        left_out: Indices of members not sent although the group may be: ``failed``, left-out
            empty members and ``no_tokens``; ascending.
        no_tokens: Indices of scored members left out for want of training tokens (only under
            ``require_tokens``); their scores stay in ``member_scores``.
        all_equal: Whether the usable scores are all one value (true for a single score).
        drop_reason: Why the group is not sent; ``None`` when it is.
        detail: One line for logs.
    """

    status: GroupStatus
    kept: tuple[int, ...]
    scores: tuple[float, ...]
    member_scores: tuple[float | None, ...]
    failed: tuple[int, ...]
    left_out: tuple[int, ...]
    all_equal: bool
    drop_reason: DropReason | None
    detail: str
    no_tokens: tuple[int, ...] = ()

    @property
    def dropped(self) -> bool:
        """Whether the group is not sent."""
        return self.drop_reason is not None
