"""The token ledger: a trajectory's tokens as the model saw and sampled them, for training.

RL on a multi-turn agent trains on one token sequence per trajectory. If that sequence is built
by re-tokenizing the finished conversation, it drifts from what the model actually sampled: the
separator a template puts after an assistant turn goes missing or doubles, think blocks that the
template strips from earlier turns vanish, an end-of-sequence token appears or not. The trainer
then scores tokens the model never produced. The ledger avoids this by never re-encoding:

- A ledger is a list of **segments**. A *prompt* segment is the first rendered prompt; a
  *completion* segment holds the ids and logprobs the server sampled, verbatim; an *environment*
  segment holds the template's tokens for what came back (tool results, a user nudge) plus the
  next generation prompt. The ledger's ids are the concatenation, and are exactly what the next
  request sends as its prompt (``prompt_ids``).
- **Masks and inference logprobs are derived**, never stored (``export``): masks are ``-100`` on
  prompt and environment tokens and the token id itself on completion tokens; inference logprobs
  are the sampled logprob on completion tokens and ``1.0`` elsewhere (Atropos's convention for
  masked positions: an impossible log-probability that is easy to spot).
- **Bridging without re-encoding** (``ChatTemplate.environment_ids``): the tokens that follow an
  assistant turn are learnt by rendering a small fixed *stand-in* conversation (one user line,
  one assistant turn calling the same tool call ids) with and without the new messages, and
  keeping the difference. When the template rewrites that stand-in turn once more messages follow
  (Qwen3 drops the think block of a turn before the latest user query), the bridge is instead
  the tail shared by two stand-ins whose replies differ in their last character, which is the
  end-of-turn followed by the new messages. In front of that goes whatever part of the
  template's end-of-turn the sampled ids lack (Qwen's ``<|im_end|>`` may be sampled while its
  ``\\n`` never is; a server may drop the end-of-sequence id). The render calls see only the
  stand-in and the new messages, so a turn costs the same at turn 8 as at turn 800.
- **Drift is a metric, not an exception** (``measure_drift``): comparing the ledger with a full
  re-render of the conversation reports where they first differ and how many tokens differ on
  each side. Drift is expected with templates that rewrite history (Qwen3 strips earlier think
  blocks); the ledger is what the model saw, and it wins.
- **Truncation is counted in tokens** and reported (``Truncation``): the head is kept, the tail
  cut, and the report says how many prompt, completion and environment tokens were lost.
- **OpenAI mode** (``ChatTemplate.rerender``): when the server did the templating, the ledger is
  rebuilt by re-rendering the messages; it is marked ``token_exact=False`` and has no logprobs.

This module is pure. Rendering is injected as a ``ChatRenderer`` (the ``Tokenizer`` port fits it),
so the domain decides what to render and the adapter does the tokenizer's work.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.messages import Message, ToolCall, ToolSpec
from trajcore.domain.sampling import FinishReason, TokenCompletion

__all__ = [
    "MASKED_LABEL",
    "MASKED_LOGPROB",
    "ChatRenderer",
    "ChatTemplate",
    "Drift",
    "Segment",
    "SegmentKind",
    "TemplateShape",
    "TokenLedger",
    "TrainingTokens",
    "Truncation",
    "measure_drift",
]

MASKED_LABEL = -100
"""The mask value on positions the trainer must not learn (prompt and environment tokens)."""

MASKED_LOGPROB = 1.0
"""Atropos's inference logprob for masked positions: impossible as a log-probability, so visible."""

# The stand-in conversation used to learn what a template writes after an assistant turn.
_STAND_IN_USER = "Hello."
_STAND_IN_REPLY = "Done."
_STAND_IN_REASONING = "Thinking."
# Replies whose last characters differ, so the renders share nothing before the end-of-turn.
_PROBE_REPLIES = ("yes", "no", "maybe")


class ChatRenderer(Protocol):
    """What the ledger needs from a tokenizer: its chat template, as ids (``Tokenizer`` fits)."""

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The chat template applied to ``messages`` and ``tools``, as ids."""
        ...


class SegmentKind(enum.Enum):
    """Where a run of ledger tokens came from."""

    PROMPT = "prompt"  # the first rendered prompt: system, user, tools, generation prompt
    COMPLETION = "completion"  # sampled by the model: trained on
    ENVIRONMENT = "environment"  # the template's tokens for what came back, + generation prompt


def _ids(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _id_set(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


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
    """

    tokens: tuple[int, ...]
    masks: tuple[int, ...]
    inference_logprobs: tuple[float, ...] | None
    prompt_tokens: int
    completion_tokens: int
    environment_tokens: int
    token_exact: bool
    truncation: Truncation | None = None


@attrs.frozen(kw_only=True)
class Drift:
    """How a ledger differs from a full re-render of its conversation.

    Attributes:
        ledger_tokens: Length of the ledger.
        rendered_tokens: Length of the re-render.
        first_difference: The first position where they differ (``None`` when identical; the
            shorter length when one is a prefix of the other).
        ledger_only_tokens: Ledger tokens outside the longest matching runs (what the re-render
            lost or changed, such as stripped think blocks).
        rendered_only_tokens: Re-render tokens outside the matching runs (what it added).
    """

    ledger_tokens: int
    rendered_tokens: int
    first_difference: int | None
    ledger_only_tokens: int
    rendered_only_tokens: int

    @property
    def exact(self) -> bool:
        """Whether the ledger and the re-render are the same ids."""
        return self.first_difference is None


def measure_drift(ledger_ids: Sequence[int], rendered_ids: Sequence[int]) -> Drift:
    """Compare a ledger's ids with a re-render's ids; returns a ``Drift``, never raises.

    The common prefix and suffix are stripped first; the middle is aligned with
    ``difflib.SequenceMatcher`` (no junk heuristic) to count differing tokens on each side.
    """
    a, b = list(ledger_ids), list(rendered_ids)
    shorter = min(len(a), len(b))
    prefix = 0
    while prefix < shorter and a[prefix] == b[prefix]:
        prefix += 1
    if prefix == len(a) == len(b):
        return Drift(
            ledger_tokens=len(a),
            rendered_tokens=len(b),
            first_difference=None,
            ledger_only_tokens=0,
            rendered_only_tokens=0,
        )
    suffix = 0
    while suffix < shorter - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    middle_a, middle_b = a[prefix : len(a) - suffix], b[prefix : len(b) - suffix]
    matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return Drift(
        ledger_tokens=len(a),
        rendered_tokens=len(b),
        first_difference=prefix,
        ledger_only_tokens=len(middle_a) - matched,
        rendered_only_tokens=len(middle_b) - matched,
    )


@attrs.define
class TokenLedger:
    """A trajectory's tokens, segment by segment (see the module docstring for the rules).

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


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@attrs.frozen(kw_only=True)
class TemplateShape:
    """What the ledger learnt about a chat template, once, by rendering stand-ins.

    Attributes:
        end_of_turn: The ids the template writes after an assistant message's content
            (Qwen: ``<|im_end|>`` ``\\n``; Llama 3: ``<|eot_id|>``; Mistral: ``</s>``).
        turn_stops: Sampled ids that end an assistant turn in place of ``end_of_turn[0]``
            (the end-of-sequence id, ``<|eom_id|>``...).
        stand_in_reasoning: Whether the stand-in assistant turn carries reasoning. Templates that
            drop reasoning from turns they consider old (Qwen3) render the stand-in the same way
            before and after new messages only when it has some.
    """

    end_of_turn: tuple[int, ...] = attrs.field(converter=_ids)
    turn_stops: frozenset[int] = attrs.field(converter=_id_set)
    stand_in_reasoning: bool

    @end_of_turn.validator
    def _nonempty(self, _: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
        if not value:
            raise ConfigError("end_of_turn", "an assistant turn must end with some token")

    def missing_end_of_turn(self, completion_ids: Sequence[int]) -> tuple[int, ...]:
        """The part of ``end_of_turn`` that ``completion_ids`` lack, to be supplied by the bridge.

        A completion that ends with a turn stop other than ``end_of_turn[0]`` counts as having
        ended its turn with it; otherwise the longest prefix of ``end_of_turn`` that the
        completion ends with is taken as sampled, and the rest is returned.
        """
        eot = self.end_of_turn
        if (
            completion_ids
            and completion_ids[-1] in self.turn_stops
            and completion_ids[-1] != eot[0]
        ):
            return eot[1:]
        for k in range(min(len(eot), len(completion_ids)), 0, -1):
            if tuple(completion_ids[-k:]) == eot[:k]:
                return eot[k:]
        return eot


def _stand_in(calls: Sequence[ToolCall], *, reasoning: bool) -> list[Message]:
    return [
        Message.user(_STAND_IN_USER),
        Message.assistant(
            _STAND_IN_REPLY,
            tool_calls=calls,
            reasoning=_STAND_IN_REASONING if reasoning else None,
        ),
    ]


def _calls_answered(messages: Sequence[Message]) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(id=m.tool_call_id, name=m.name or "tool")
        for m in messages
        if m.role == "tool" and m.tool_call_id
    )


@attrs.frozen(kw_only=True)
class ChatTemplate:
    """A chat template as the ledger uses it: a renderer plus its learnt ``TemplateShape``.

    Build it once per tokenizer with ``learn``; it is immutable and shared by all trajectories.

    Attributes:
        renderer: Renders messages to ids (the ``Tokenizer`` port).
        shape: What ``learn`` found out about the template.
    """

    renderer: ChatRenderer = attrs.field(repr=False)
    shape: TemplateShape

    @classmethod
    def learn(cls, renderer: ChatRenderer, *, turn_stops: Iterable[int] = ()) -> ChatTemplate:
        """Learn the template's end-of-turn and bridging behaviour from a few stand-in renders.

        ``turn_stops`` are ids that may end a sampled turn: pass the tokenizer's end-of-sequence
        id, every id of the model's generation config's ``eos_token_id`` list (Qwen3 lists
        ``<|im_end|>`` and ``<|endoftext|>``; ``trajcore.adapters.generation_config`` reads it)
        and any other stop ids the server uses. A turn ending with any of them is bridged as
        one ending with the template's end-of-turn, and its id stays in the ledger verbatim.

        Raises:
            ConfigError: the template has no end-of-turn tokens, or rendering a tool result after
                an assistant turn changes the tokens before it (``chat_template``).
        """
        end_of_turn: tuple[int, ...] = ()
        for reasoning in (True, False):
            renders = [
                renderer.render(
                    [
                        Message.user(_STAND_IN_USER),
                        Message.assistant(
                            reply, reasoning=_STAND_IN_REASONING if reasoning else None
                        ),
                    ]
                )
                for reply in _PROBE_REPLIES
            ]
            n = min(_common_suffix(renders[0], other) for other in renders[1:])
            if n:
                end_of_turn = tuple(renders[0][len(renders[0]) - n :])
                break
        if not end_of_turn:
            raise ConfigError("chat_template", "an assistant turn ends with no template tokens")
        probe = [Message(role="tool", content="ok", tool_call_id="call0probe", name="probe")]
        calls = _calls_answered(probe)
        for reasoning in (True, False):
            if _bridge(renderer, calls, probe, reasoning=reasoning) is not None:
                shape = TemplateShape(
                    end_of_turn=end_of_turn,
                    turn_stops={*turn_stops, end_of_turn[0]},
                    stand_in_reasoning=reasoning,
                )
                return cls(renderer=renderer, shape=shape)
        raise ConfigError("chat_template", _UNBRIDGEABLE)

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec] = ()) -> TokenLedger:
        """A ledger whose prompt is ``messages`` and ``tools`` rendered with the generation prompt.

        Raises:
            ConfigError: ``messages`` is empty, or the template rejects them.
        """
        if not messages:
            raise ConfigError("messages", "a trajectory starts with at least one message")
        return TokenLedger.from_prompt(
            self.renderer.render(messages, tools=tools, add_generation_prompt=True)
        )

    def environment_ids(
        self, completion_ids: Sequence[int], messages: Sequence[Message]
    ) -> tuple[int, ...]:
        """The ids that follow a sampled assistant turn: the end-of-turn it lacks, ``messages``
        in the template's own tokens, then the generation prompt.

        Only a fixed stand-in conversation and ``messages`` are rendered, never the history.

        Raises:
            ConfigError: ``messages`` is empty or holds an assistant message (``messages[i]``),
                or the template cannot be bridged for these messages (``chat_template``).
        """
        if not messages:
            raise ConfigError("messages", "at least one environment message is needed")
        for index, message in enumerate(messages):
            if message.role == "assistant":
                raise ConfigError(
                    f"messages[{index}].role", "environment messages are not assistant"
                )
        calls = _calls_answered(messages)
        preferred = self.shape.stand_in_reasoning
        for reasoning in (preferred, not preferred):
            body = _bridge(self.renderer, calls, messages, reasoning=reasoning)
            if body is not None:
                return self.shape.missing_end_of_turn(completion_ids) + body
        body = _bridge_by_suffix(self.renderer, messages, self.shape.end_of_turn)
        if body is not None:
            return self.shape.missing_end_of_turn(completion_ids) + body
        raise ConfigError("chat_template", _UNBRIDGEABLE)

    def append_environment(self, ledger: TokenLedger, messages: Sequence[Message]) -> Segment:
        """Bridge ``messages`` after the ledger's last completion and append them.

        Returns the new environment segment.

        Raises:
            StateError: the ledger does not end in a completion.
            ConfigError: as ``environment_ids``.
        """
        segments = ledger.segments
        if not segments or segments[-1].kind is not SegmentKind.COMPLETION:
            raise StateError("environment messages must follow a completion")
        return ledger.append_environment(self.environment_ids(segments[-1].token_ids, messages))

    def drift(
        self,
        ledger: TokenLedger,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
    ) -> Drift:
        """Compare ``ledger`` with a full re-render of ``messages`` (the whole conversation).

        The re-render ends with the generation prompt when the ledger ends with environment
        tokens. When the ledger ends with a completion, the ledger side is closed with the
        end-of-turn tokens that completion lacks (the separator a model never samples), since
        the re-render has them. Returns a ``Drift``; a difference is a measurement, not an error.

        Raises:
            ConfigError: the template rejects the conversation.
        """
        ends_in_completion = ledger.last_kind is SegmentKind.COMPLETION
        rendered = self.renderer.render(
            messages, tools=tools, add_generation_prompt=not ends_in_completion
        )
        ids = ledger.prompt_ids()
        if ends_in_completion:
            ids += self.shape.missing_end_of_turn(ledger.segments[-1].token_ids)
        return measure_drift(ids, rendered)

    def rerender(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec] = ()
    ) -> TokenLedger:
        """OpenAI mode: a ledger rebuilt by rendering ``messages``, marked ``token_exact=False``.

        Each assistant message's span is found by rendering the conversation up to it (with the
        generation prompt) and up to and including it; the span ends after the first token of
        the end-of-turn (the template's separator after it counts as environment). This renders
        the conversation once per assistant turn: fine for SFT data, not for a hot loop.

        Raises:
            ConfigError: the conversation is empty or starts with an assistant message
                (``messages[0].role``), or the template rejects the messages.
        """
        if not messages or messages[0].role == "assistant":
            raise ConfigError("messages[0].role", "a conversation starts with a prompt message")
        full = self.renderer.render(messages, tools=tools)
        eot = self.shape.end_of_turn
        spans: list[tuple[int, int]] = []
        for index, message in enumerate(messages):
            if message.role != "assistant":
                continue
            before = self.renderer.render(messages[:index], tools=tools, add_generation_prompt=True)
            upto = self.renderer.render(messages[: index + 1], tools=tools)
            start = _common_prefix(before, full)
            end = _common_prefix(upto, full)
            if end - start >= len(eot) and tuple(full[end - len(eot) : end]) == eot:
                end -= len(eot) - 1
            start = max(start, spans[-1][1] if spans else 0)
            if end > start:
                spans.append((start, end))
        # Prompt, then completion and environment alternating; an environment run between two
        # touching assistant spans is empty, which keeps the alternation.
        segments: list[Segment] = []
        cursor = 0
        for start, end in spans:
            kind = SegmentKind.PROMPT if not segments else SegmentKind.ENVIRONMENT
            segments.append(Segment(kind=kind, token_ids=full[cursor:start]))
            segments.append(Segment(kind=SegmentKind.COMPLETION, token_ids=full[start:end]))
            cursor = end
        if cursor < len(full) or not segments:
            kind = SegmentKind.PROMPT if not segments else SegmentKind.ENVIRONMENT
            segments.append(Segment(kind=kind, token_ids=full[cursor:]))
        return TokenLedger.from_segments(segments, token_exact=False)


_UNBRIDGEABLE = (
    "rendering messages after an assistant turn changes the tokens before them, so they cannot "
    "be appended without re-encoding the history"
)


def _bridge(
    renderer: ChatRenderer,
    calls: Sequence[ToolCall],
    messages: Sequence[Message],
    *,
    reasoning: bool,
) -> tuple[int, ...] | None:
    """The ids ``messages`` add after the stand-in assistant turn (which makes ``calls``), or
    ``None`` when the stand-in renders differently once they follow it."""
    stand_in = _stand_in(calls, reasoning=reasoning)
    before = renderer.render(stand_in)
    after = renderer.render([*stand_in, *messages], add_generation_prompt=True)
    if len(after) < len(before) or after[: len(before)] != before:
        return None
    return tuple(after[len(before) :])


def _bridge_by_suffix(
    renderer: ChatRenderer, messages: Sequence[Message], end_of_turn: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The ids ``messages`` add after an assistant turn, for templates that rewrite that turn
    once more messages follow (Qwen3 drops its think block when a new user query comes).

    Two stand-ins whose replies differ in their last character share exactly the tokens after
    the reply: the end-of-turn, then the bridge. ``None`` when that tail does not start with the
    end-of-turn.
    """
    renders = [
        renderer.render(
            [Message.user(_STAND_IN_USER), Message.assistant(reply), *messages],
            add_generation_prompt=True,
        )
        for reply in _PROBE_REPLIES[:2]
    ]
    n = _common_suffix(renders[0], renders[1])
    tail = tuple(renders[0][len(renders[0]) - n :])
    if tail[: len(end_of_turn)] != end_of_turn:
        return None
    return tail[len(end_of_turn) :]
