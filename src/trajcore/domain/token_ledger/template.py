"""A chat template as the ledger uses it: bridging turns without re-encoding the history.

The rules it keeps are in the package docstring (``trajcore.domain.token_ledger``): what a
template writes after an assistant turn is learnt from a small stand-in conversation, rendered
with and without the new messages, never from the trajectory's own history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.messages import Message, escape_lone_surrogates
from trajcore.domain.token_ledger.drift import Drift, measure_drift
from trajcore.domain.token_ledger.ledger import Segment, SegmentKind, TokenLedger
from trajcore.domain.tools import ToolCall, ToolSpec

__all__ = [
    "ChatRenderer",
    "ChatTemplate",
    "DecodingRenderer",
    "PrefixRenderer",
    "RenderOnly",
    "TemplateShape",
    "common_prefix",
    "render_with_prefixes",
]

# The stand-in conversation used to learn what a template writes after an assistant turn.
_STAND_IN_USER = "Hello."
_STAND_IN_REPLY = "Done."
_STAND_IN_REASONING = "Thinking."
# Replies whose last characters differ, so the renders share nothing before the end-of-turn.
_PROBE_REPLIES = ("yes", "no", "maybe")
# How a template writes a call's empty arguments, where it writes raw arguments text verbatim.
_EMPTY_ARGUMENTS = "{}"


class ChatRenderer(Protocol):
    """What the ledger needs from a tokenizer: its chat template, as ids (``Tokenizer`` fits)."""

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The chat template applied to ``messages`` and ``tools``, as ids.

        Raises:
            ConfigError: the template rejects the conversation (names the message at fault).
        """
        ...


@runtime_checkable
class PrefixRenderer(ChatRenderer, Protocol):
    """A renderer that can measure a conversation's prefixes against the whole for less than
    rendering each prefix whole (``TransformersTokenizer`` can). OpenAI mode's re-render uses
    it when the renderer has it (``render_with_prefixes``), and renders each prefix otherwise.
    """

    def render_with_prefixes(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        prefixes: Sequence[tuple[int, bool]],
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``render(messages, tools=tools)``, and for each ``(n, add_generation_prompt)`` of
        ``prefixes`` the pair ``(shared, length)`` of ``ids = render(messages[:n], tools=tools,
        add_generation_prompt=add_generation_prompt)``: ``length`` is ``len(ids)``, ``shared``
        the length of the longest common prefix of ``ids`` and the whole's ids. Exactly what
        rendering each prefix gives (``render_with_prefixes``, the function, is the reference).

        Raises:
            ConfigError: as ``render``, for the whole or a prefix.
        """
        ...


@runtime_checkable
class DecodingRenderer(ChatRenderer, Protocol):
    """A renderer that also decodes ids to text (``Tokenizer`` does): what
    ``ChatTemplate.writes_raw_arguments`` needs to read what a render wrote."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept."""
        ...


def render_with_prefixes(
    renderer: ChatRenderer,
    messages: Sequence[Message],
    *,
    tools: Sequence[ToolSpec] = (),
    prefixes: Sequence[tuple[int, bool]],
) -> tuple[list[int], list[tuple[int, int]]]:
    """What ``PrefixRenderer.render_with_prefixes`` returns: the renderer's own when it is a
    ``PrefixRenderer``, else by rendering the whole, then each prefix, in the order given."""
    if isinstance(renderer, PrefixRenderer):
        return renderer.render_with_prefixes(messages, tools=tools, prefixes=prefixes)
    full = renderer.render(messages, tools=tools)
    measured: list[tuple[int, int]] = []
    for n, add_generation_prompt in prefixes:
        ids = renderer.render(
            messages[:n], tools=tools, add_generation_prompt=add_generation_prompt
        )
        measured.append((common_prefix(ids, full), len(ids)))
    return full, measured


class RenderOnly:
    """``renderer`` seen through ``render`` alone, never as a ``PrefixRenderer``: given to
    ``render_with_prefixes`` (the function), it renders each prefix whole, the reference a
    renderer's own ``render_with_prefixes`` falls back to and is measured against."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.render = renderer.render


def _ids(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _id_set(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def _first_end_of_turn(ids: Sequence[int], end_of_turn: tuple[int, ...], start: int) -> int:
    """The index just after the first id of the end of turn at or after ``start`` in ``ids``
    (the template may write other ids after that one once a message follows); ``start`` when
    there is none."""
    if not end_of_turn:
        return start
    try:
        return ids.index(end_of_turn[0], start) + 1
    except ValueError:
        return start


_CHUNK = 4096


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, compared a slice at a time
    (the comparison runs in C), then by halving the first slice that differs."""
    x, y = list(a), list(b)
    limit = min(len(x), len(y))
    low = 0
    while low < limit and x[low : low + _CHUNK] == y[low : low + _CHUNK]:
        low += _CHUNK
    if low >= limit:
        return limit
    high = min(low + _CHUNK, limit)
    if x[low:high] == y[low:high]:  # the shorter one ends there
        return high
    while high - low > 1:  # x[:low] == y[:low], and they differ in [low, high)
        middle = (low + high) // 2
        if x[low:middle] == y[low:middle]:
            low = middle
        else:
            high = middle
    return low


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

    def writes_raw_arguments(self, call: ToolCall) -> str | None:
        """Why the template does not write ``call.raw_arguments`` (the text of arguments the
        model wrote as no JSON object) as the model wrote them, or ``None`` when it does.

        It does when a stand-in turn making ``call`` renders, decoded, as the same turn making
        it with empty arguments renders, with the text of those (``{}``) replaced by the raw
        text: a template that writes text arguments in place (Qwen3's) does; one that writes
        them as a JSON string (``tojson``), or parses and rewrites them (``mistral_common``),
        does not. A renderer that cannot decode (no ``decode``) cannot show it.
        """
        raw = call.raw_arguments
        if raw is None:
            return None
        # the method (``DecodingRenderer``'s), not an isinstance of the protocol: a runtime
        # protocol check also asks for every other name its class holds (mutmut's trampolines)
        decode: Callable[[Sequence[int]], str] | None = getattr(self.renderer, "decode", None)
        if decode is None:
            return "the tokenizer cannot decode a render to check its text"
        try:
            written = decode(self.renderer.render(_stand_in([call], reasoning=False)))
        except ConfigError as exc:
            return f"the chat template refuses them ({exc})"
        empty = attrs.evolve(call, arguments={}, raw_arguments=None)
        plain = decode(self.renderer.render(_stand_in([empty], reasoning=False)))
        raw = escape_lone_surrogates(raw)  # as the tokenizer adapters write text
        at = plain.find(_EMPTY_ARGUMENTS)
        while at >= 0:
            if plain[:at] + raw + plain[at + len(_EMPTY_ARGUMENTS) :] == written:
                return None
            at = plain.find(_EMPTY_ARGUMENTS, at + 1)
        return "the chat template does not write them as the model wrote them"

    def rerender(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        cut_turns: Iterable[int] = (),
        untrained_turns: Iterable[int] = (),
    ) -> TokenLedger:
        """OpenAI mode: a ledger rebuilt by rendering ``messages``, marked ``token_exact=False``.

        Each assistant message's span is found by rendering the conversation up to it (with the
        generation prompt) and up to and including it; the span ends after the first token of
        the end-of-turn (the template's separator after it counts as environment). A message the
        template renders otherwise while it is the last one (Qwen3 writes an empty think block
        into the last assistant turn only, so every earlier tool-call turn differs) ends at the
        first end-of-turn after its start in the whole conversation, when the conversation
        before it renders as the whole has it (a template that moves earlier text, as Mistral's
        moves the system prompt and the tools to the last user message, gives no span there,
        never one over user text): its tokens as the whole conversation has them are trained.
        ``cut_turns`` holds the positions, counted among
        the assistant messages from 0, of turns the server cut at ``max_tokens`` (finish
        ``length``): the model sampled no end of turn there, so the template's is environment,
        not trained. ``untrained_turns`` holds the positions, counted the same way, of turns
        whose tokens are not trained at all (environment): a turn the render cannot write as
        the model wrote it (``writes_raw_arguments``). The prefixes are measured by
        ``render_with_prefixes``: a
        ``PrefixRenderer`` (the transformers adapter) tokenizes the whole once and of each
        prefix only what follows its last point shared with the whole, so with a template that
        renders a prefix as the whole begins (most do, between user queries) the cost is near
        linear in the conversation; any other renderer tokenizes every prefix whole, twice
        per assistant turn (quadratic: fine for SFT data, not for a hot loop).

        Raises:
            ConfigError: the conversation is empty or starts with an assistant message
                (``messages[0].role``), or the template rejects the messages.
        """
        if not messages or messages[0].role == "assistant":
            raise ConfigError("messages[0].role", "a conversation starts with a prompt message")
        turns = [i for i, message in enumerate(messages) if message.role == "assistant"]
        full, measured = render_with_prefixes(
            self.renderer,
            messages,
            tools=tools,
            prefixes=[p for index in turns for p in ((index, True), (index + 1, False))],
        )
        eot = self.shape.end_of_turn
        spans: list[tuple[int, int]] = []
        cut, untrained = frozenset(cut_turns), frozenset(untrained_turns)
        for turn in range(len(turns)):
            (start, before), (end, _) = measured[2 * turn], measured[2 * turn + 1]
            if end - start >= len(eot) and tuple(full[end - len(eot) : end]) == eot:
                end -= len(eot) - 1
            elif start == before:  # rendered otherwise when last (Qwen3's empty think
                # block), after a history the whole shares: up to its own end of turn
                end = max(end, _first_end_of_turn(full, eot, start))
            if turn in cut and end > start and eot and full[end - 1] == eot[0]:
                end -= 1
            start = max(start, spans[-1][1] if spans else 0)
            if end > start and turn not in untrained:
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
