"""What Atropos is sent: a judged group as a ``ScoredDataGroup``, and conversations as text.

``scored_group`` is a pure function of the ``GroupResult`` and the run's settings: it returns
either the ``ScoredGroup`` to send or the verdict's reason it is not sent, and leaves counting
and logging to its caller. It decides nothing: which members are sent, and whether the group is,
is the verdict's (``domain.groups.GroupRules.assess``; the training rules,
``RolloutSettings.group_rules``, leave out members without tokens).

Rules it keeps:

- ``tokens[i]`` and ``masks[i]`` have equal lengths; ``inference_logprobs`` is set only when
  every kept member's tokens are exact.
- A partial group says its size in ``group_overrides["group_size"]``, because Atropos
  discards a group whose size differs from the configured one.
- A kept member without tokens is a verdict made without ``require_tokens``: refused
  (``StateError``), never sent short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import attrs

from trajcore.domain.errors import StateError
from trajcore.domain.groups import DropReason
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolOutcome
from trajcore.entrypoints.atropos.config import RolloutSettings
from trajcore.rollout.group import GroupResult
from trajcore.rollout.trajectory import TrajectoryResult

__all__ = [
    "GroupConversion",
    "MemberOverrides",
    "ScoredGroup",
    "chat_dicts",
    "member_story",
    "render_transcript",
    "scored_group",
]


class MemberOverrides(TypedDict):
    """``overrides[i]`` of a group trajcore sends: exactness and the member's story."""

    token_exact: bool
    trajcore: dict[str, Any]


class ScoredGroup(TypedDict):
    """The ``ScoredDataGroup`` trajcore hands Atropos (a plain dict on the wire).

    ``tokens[i]`` and ``masks[i]`` have equal lengths; ``masks[i][j]`` is ``-100`` outside the
    model's completions. ``inference_logprobs`` is ``None`` unless the tokens are exact.
    """

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: None
    ref_logprobs: None
    messages: list[list[dict[str, Any]]] | None
    generation_params: dict[str, Any]
    inference_logprobs: list[list[float]] | None
    group_overrides: dict[str, Any]
    overrides: list[MemberOverrides]
    images: None


@attrs.frozen(kw_only=True)
class GroupConversion:
    """What ``scored_group`` made of a judged group.

    Attributes:
        scored: The group to send, or ``None`` when it is not sent.
        drop_reason: Why it is not sent (the verdict's drop reason); ``None`` when it is sent.
        detail: The reason in words, for the log (empty when it is sent).
        left_out: Ids of scored members the verdict left out because they have no tokens.
    """

    scored: ScoredGroup | None
    drop_reason: DropReason | None = None
    detail: str = ""
    left_out: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        """Whether the group is sent with fewer members than it ran."""
        return self.scored is not None and "group_size" in self.scored["group_overrides"]


def chat_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``messages`` as OpenAI chat dicts, tool-call arguments as JSON text."""
    return [dict(m.to_chat_dict(arguments_as_json=True)) for m in messages]


def member_story(member: TrajectoryResult, environment: str | None = None) -> dict[str, Any]:
    """``overrides[i]["trajcore"]``: the member's id, status, stop reason, counts, what was cut
    to fit ``max_token_length``, the sampled turns not trained and why, and metadata; and the
    task ``environment`` (image reference) its lease ran over, when it ran over one."""
    stats = member.stats
    errors = stats.tool_errors
    cut = member.truncation
    story: dict[str, Any] = {
        "trajectory_id": member.trajectory_id,
        "status": member.outcome.status.value,
        "stop_reason": stats.stop_reason.value if stats.stop_reason else None,
        "turns": stats.turns,
        "tool_calls": stats.tool_calls,
        "tool_errors": errors.total,
        "tool_errors_by_outcome": {o.value: errors.of(o) for o in ToolOutcome if errors.of(o)},
        "parse_errors": stats.parse_errors,
        "duration_s": round(member.duration_s, 3),
        "slot": member.slot,
        "drift_tokens": None
        if member.drift is None
        else member.drift.ledger_only_tokens + member.drift.rendered_only_tokens,
        "truncated_tokens": 0 if cut is None else cut.cut_tokens,
        "truncated_completion_tokens": 0 if cut is None else cut.cut_completion_tokens,
        "untrained_turns": []
        if member.tokens is None
        else [{"turn": u.turn, "reason": u.reason} for u in member.tokens.untrained_turns],
        "prepare_metadata": member.prepare_metadata,
        "score_metadata": member.score_metadata,
    }
    if environment is not None:
        story["environment"] = environment
    return story


def scored_group(group: GroupResult, settings: RolloutSettings) -> GroupConversion:
    """The Atropos ``ScoredDataGroup`` of a judged group's kept members, or why it is not sent.

    ``generation_params`` carries the sampling the group ran with (``group.sampling``, else
    ``settings``'), and ``settings`` the mode and whether to send the conversations.

    Raises:
        StateError: a kept member has no tokens (the group was judged by rules without
            ``require_tokens``, such as the evaluation rules).
    """
    verdict = group.verdict
    left_out = tuple(group.members[i].trajectory_id for i in verdict.no_tokens)
    if verdict.drop_reason is not None:
        return GroupConversion(
            scored=None, drop_reason=verdict.drop_reason, detail=verdict.detail, left_out=left_out
        )
    kept = group.kept
    tokens = []
    for member in kept:
        if member.tokens is None:
            raise StateError(
                f"kept member {member.trajectory_id} has no tokens: judge training groups with "
                "require_tokens (RolloutSettings.group_rules)"
            )
        tokens.append(member.tokens)
    exact = all(t.token_exact for t in tokens)
    logprobs: list[list[float]] | None = None
    if exact and all(t.inference_logprobs is not None for t in tokens):
        logprobs = [list(t.inference_logprobs or ()) for t in tokens]
    group_overrides: dict[str, Any] = {"token_exact": exact, "trajcore_group": group.group_id}
    if len(kept) != len(verdict.member_scores):  # one per member of the configured group size
        group_overrides["group_size"] = len(kept)
    # what the members ran with (an item's own sampling, from item_rollout), else the config's
    sampling = group.sampling or settings.rollout.sampling
    scored = ScoredGroup(
        tokens=[list(t.tokens) for t in tokens],
        masks=[list(t.masks) for t in tokens],
        scores=[float(s) for s in verdict.scores],
        advantages=None,
        ref_logprobs=None,
        messages=[chat_dicts(m.messages) for m in kept] if settings.include_messages else None,
        generation_params={
            "temperature": sampling.temperature,
            "max_tokens": sampling.max_tokens,
            "mode": settings.mode,
        },
        inference_logprobs=logprobs,
        group_overrides=group_overrides,
        overrides=[
            MemberOverrides(token_exact=exact, trajcore=member_story(m, group.environment))
            for m in kept
        ],
        images=None,
    )
    return GroupConversion(scored=scored, left_out=left_out)


def render_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as readable text: each turn, each tool call with its arguments, each result.

    Takes OpenAI chat dicts (what ``ScoredGroup["messages"]`` holds) and returns plain text for
    logs and wandb tables.
    """
    lines: list[str] = []
    for message in messages:
        role = str(message.get("role", "?"))
        if role == "tool":
            lines.append(f"--- tool result [{message.get('name', '?')}]")
        else:
            lines.append(f"--- {role}")
        reasoning = message.get("reasoning_content")
        if reasoning:
            lines.append(f"(thinking) {reasoning}")
        content = message.get("content")
        if content:
            lines.append(str(content))
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            lines.append(f">>> {function.get('name', '?')}({function.get('arguments', '')})")
    return "\n".join(lines)
