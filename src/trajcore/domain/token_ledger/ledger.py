"""The ledger itself: segments of prompt, completion and environment tokens, and their export.

The rules it keeps are in the package docstring (``trajcore.domain.token_ledger``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.sampling import FinishReason, TokenCompletion

__all__ = [
    "MASKED_LABEL",
    "MASKED_LOGPROB",
    "Segment",
    "SegmentKind",
    "TokenLedger",
    "TrainingTokens",
    "Truncation",
    "UntrainedTurn",
]

MASKED_LABEL = -100
"""The mask value on positions the trainer must not learn (prompt and environment tokens)."""

MASKED_LOGPROB = 1.0
"""Atropos's inference logprob for masked positions: impossible as a log-probability, so visible."""


class SegmentKind(enum.Enum):
    """Where a run of ledger tokens came from."""

    PROMPT = "prompt"  # the first rendered prompt: system, user, tools, generation prompt
    COMPLETION = "completion"  # sampled by the model: trained on
    ENVIRONMENT = "environment"  # the template's tokens for what came back, + generation prompt


def _ids(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _optional_floats(values: Iterable[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)


@attrs.frozen(kw_only=True)
class Segment:
    """A run of ledger tokens of one kind.

    Attributes:
        kind: Prompt, completion or environment.
        token_ids: The ids, in order.
        logprobs: For a token-exact completion, the sampled logprob of each id; otherwise ``None``.
        finish_reason: For a completion, why sampling stopped.
    """

    kind: SegmentKind
    token_ids: tuple[int, ...] = attrs.field(converter=_ids)
    logprobs: tuple[float, ...] | None = attrs.field(default=None, converter=_optional_floats)
    finish_reason: FinishReason | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind is not SegmentKind.COMPLETION:
            if self.logprobs is not None:
                raise ConfigError("logprobs", f"a {self.kind.value} segment has no logprobs")
            if self.finish_reason is not None:
                raise ConfigError("finish_reason", f"a {self.kind.value} segment has none")
        elif self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ConfigError(
                "logprobs", f"{len(self.logprobs)} logprobs for {len(self.token_ids)} token ids"
            )


@attrs.frozen(kw_only=True)
class Truncation:
    """What ``export`` cut to fit ``max_token_length`` (the head is kept, the tail is cut).

    Attributes:
        max_token_length: The limit the ledger was cut to.
        kept_tokens: Tokens kept (equal to the limit).
        cut_tokens: Tokens cut in all.
        cut_prompt_tokens: Of those, prompt tokens.
        cut_completion_tokens: Of those, sampled tokens (lost for training).
        cut_environment_tokens: Of those, environment tokens.
        first_cut_segment: Index of the segment where the cut falls.
    """

    max_token_length: int
    kept_tokens: int
    cut_tokens: int
    cut_prompt_tokens: int
    cut_completion_tokens: int
    cut_environment_tokens: int
    first_cut_segment: int


@attrs.frozen(kw_only=True)
class TrainingTokens:
    """A ledger exported for the trainer, in Atropos's shape.

    Attributes:
        tokens: Every id, prompt and completions alike.
        masks: ``-100`` on prompt and environment tokens, the id itself on completion tokens.
        inference_logprobs: The sampled logprob on completion tokens and ``1.0`` elsewhere;
            ``None`` when the ledger is not token-exact (OpenAI mode has no logprobs).
        prompt_tokens: Prompt tokens kept.
        completion_tokens: Completion (trained) tokens kept.
        environment_tokens: Environment tokens kept.
        token_exact: Whether the completions are the server's sampled ids (managed mode).
        truncation: What was cut to fit ``max_token_length``, or ``None`` when nothing was.
        untrained_turns: Sampled turns whose tokens are masked although the model wrote
            them, each with why (OpenAI mode: the re-render cannot write a call's arguments
            as the model wrote them); empty when every sampled turn is trained.
    """

    tokens: tuple[int, ...]
    masks: tuple[int, ...]
    inference_logprobs: tuple[float, ...] | None
    prompt_tokens: int
    completion_tokens: int
    environment_tokens: int
    token_exact: bool
    truncation: Truncation | None = None
    untrained_turns: tuple[UntrainedTurn, ...] = ()


@attrs.frozen(kw_only=True)
class UntrainedTurn:
    """A sampled assistant turn left out of training (masked), and why.

    Attributes:
        turn: The turn's number among the trajectory's sampled turns, from 1.
        reason: Why, in words, naming the call at fault.
    """

    turn: int = attrs.field(validator=attrs.validators.ge(1))
    reason: str


@attrs.define
class TokenLedger:
    """A trajectory's tokens, segment by segment (the rules are in the package docstring).

    Start one with ``from_prompt`` (or ``ChatTemplate.start``); then alternate
    ``append_completion`` and ``append_environment``. ``prompt_ids`` is the next request's prompt;
    ``export`` is the training data.
    """

    token_exact: bool = True
    _segments: list[Segment] = attrs.field(factory=list, alias="segments")
    _ids: list[int] = attrs.field(factory=list, alias="ids")

    @classmethod
    def from_prompt(cls, prompt_ids: Sequence[int]) -> TokenLedger:
        """A token-exact ledger that starts with a rendered prompt.

        Raises:
            ConfigError: ``prompt_ids`` is empty.
        """
        if not prompt_ids:
            raise ConfigError("prompt_ids", "a ledger starts with a non-empty prompt")
        ledger = cls(token_exact=True)
        ledger._push(Segment(kind=SegmentKind.PROMPT, token_ids=tuple(prompt_ids)))
        return ledger

    @classmethod
    def from_segments(cls, segments: Iterable[Segment], *, token_exact: bool) -> TokenLedger:
        """A ledger made of ``segments`` as given (checked with ``check_valid``).

        Raises:
            StateError: the segments break a ledger rule (see ``check_valid``).
        """
        ledger = cls(token_exact=token_exact)
        for segment in segments:
            ledger._push(segment)
        ledger.check_valid()
        return ledger

    def _push(self, segment: Segment) -> Segment:
        self._segments.append(segment)
        self._ids.extend(segment.token_ids)
        return segment

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments, in order."""
        return tuple(self._segments)

    @property
    def last_kind(self) -> SegmentKind | None:
        """The kind of the last segment, ``None`` for an empty ledger."""
        return self._segments[-1].kind if self._segments else None

    def __len__(self) -> int:
        return len(self._ids)

    def prompt_ids(self) -> tuple[int, ...]:
        """Every id so far: the prompt for the next request."""
        return tuple(self._ids)

    def append_completion(self, completion: TokenCompletion) -> Segment:
        """Append the server's sampled ids and logprobs, verbatim. Returns the new segment.

        Raises:
            StateError: the ledger does not end in a prompt (a completion must follow a prompt or
                environment segment), or the ledger is not token-exact.
        """
        if not self.token_exact:
            raise StateError("a ledger rebuilt from messages takes no sampled completions")
        if self.last_kind not in (SegmentKind.PROMPT, SegmentKind.ENVIRONMENT):
            raise StateError(
                f"a completion must follow a prompt or environment tokens, not {self._last()}"
            )
        return self._push(
            Segment(
                kind=SegmentKind.COMPLETION,
                token_ids=completion.token_ids,
                logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
            )
        )

    def append_environment(self, token_ids: Sequence[int]) -> Segment:
        """Append environment tokens (already bridged by ``ChatTemplate.environment_ids``).

        Returns the new segment.

        Raises:
            StateError: the ledger does not end in a completion.
            ConfigError: ``token_ids`` is empty.
        """
        if self.last_kind is not SegmentKind.COMPLETION:
            raise StateError(f"environment tokens must follow a completion, not {self._last()}")
        if not token_ids:
            raise ConfigError("token_ids", "environment tokens must not be empty")
        return self._push(Segment(kind=SegmentKind.ENVIRONMENT, token_ids=tuple(token_ids)))

    def _last(self) -> str:
        kind = self.last_kind
        return "an empty ledger" if kind is None else f"a {kind.value} segment"

    def completion_count(self) -> int:
        """How many completions (assistant turns) the ledger holds."""
        return sum(1 for s in self._segments if s.kind is SegmentKind.COMPLETION)

    def export(self, *, max_token_length: int | None = None) -> TrainingTokens:
        """The training data: tokens, masks, inference logprobs and counts.

        With ``max_token_length``, the tail beyond that many tokens is cut and ``truncation``
        says what was lost.

        Raises:
            ConfigError: ``max_token_length`` is below 1.
        """
        if max_token_length is not None and max_token_length < 1:
            raise ConfigError("max_token_length", f"must be at least 1, got {max_token_length}")
        limit = len(self._ids) if max_token_length is None else max_token_length
        tokens: list[int] = []
        masks: list[int] = []
        logprobs: list[float] = []
        kept = dict.fromkeys(SegmentKind, 0)
        cut = dict.fromkeys(SegmentKind, 0)
        first_cut: int | None = None
        for index, segment in enumerate(self._segments):
            room = max(0, limit - len(tokens))
            ids = segment.token_ids[:room]
            if len(ids) < len(segment.token_ids):
                cut[segment.kind] += len(segment.token_ids) - len(ids)
                first_cut = index if first_cut is None else first_cut
            kept[segment.kind] += len(ids)
            tokens.extend(ids)
            if segment.kind is SegmentKind.COMPLETION:
                masks.extend(ids)
                sampled = segment.logprobs or ()
                logprobs.extend(sampled[: len(ids)])
            else:
                masks.extend([MASKED_LABEL] * len(ids))
                logprobs.extend([MASKED_LOGPROB] * len(ids))
        truncation = None
        if first_cut is not None and max_token_length is not None:
            truncation = Truncation(
                max_token_length=max_token_length,
                kept_tokens=len(tokens),
                cut_tokens=sum(cut.values()),
                cut_prompt_tokens=cut[SegmentKind.PROMPT],
                cut_completion_tokens=cut[SegmentKind.COMPLETION],
                cut_environment_tokens=cut[SegmentKind.ENVIRONMENT],
                first_cut_segment=first_cut,
            )
        return TrainingTokens(
            tokens=tuple(tokens),
            masks=tuple(masks),
            inference_logprobs=tuple(logprobs) if self.token_exact else None,
            prompt_tokens=kept[SegmentKind.PROMPT],
            completion_tokens=kept[SegmentKind.COMPLETION],
            environment_tokens=kept[SegmentKind.ENVIRONMENT],
            token_exact=self.token_exact,
            truncation=truncation,
        )

    def check_valid(self) -> None:
        """Check the ledger's rules; raise ``StateError`` naming the first one broken.

        Rules: it starts with its only prompt segment; completions and environment segments
        alternate after it (a completion first); a token-exact ledger's completions all carry
        logprobs; the flat ids are the concatenation of the segments.
        """
        if not self._segments or self._segments[0].kind is not SegmentKind.PROMPT:
            raise StateError("a ledger starts with a prompt segment")
        previous = SegmentKind.PROMPT
        for index, segment in enumerate(self._segments[1:], start=1):
            expected = (
                SegmentKind.COMPLETION
                if previous is not SegmentKind.COMPLETION
                else SegmentKind.ENVIRONMENT
            )
            if segment.kind is not expected:
                raise StateError(
                    f"segment {index} is {segment.kind.value}, expected {expected.value}"
                )
            if self.token_exact and expected is SegmentKind.COMPLETION and segment.logprobs is None:
                raise StateError(f"segment {index}: a token-exact completion needs logprobs")
            previous = segment.kind
        flat = [i for segment in self._segments for i in segment.token_ids]
        if flat != self._ids:
            raise StateError("the ledger's ids are not the concatenation of its segments")
