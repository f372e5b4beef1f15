"""OpenAI mode's re-render measured through ``render_with_prefixes`` gives exactly what rendering
every prefix whole gave: a differential test against that algorithm, kept here as the oracle.

The transformers adapter measures a conversation's prefixes by tokenizing the whole once and of
each prefix only the text after its last point shared with the whole. These properties compare
it, and the re-rendered ledgers built on it, with the prefix-by-prefix algorithm over Qwen3's
real template (which rewrites earlier turns when a new user query comes), two small tokenizers
shaped like Llama 3 and Mistral, and a Qwen3 tokenizer with an added token that strips the
spaces around it (where the adapter must not take its shortcut), with message text that spells
added tokens, private-use characters, decomposed accents and runs of whitespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.ledger import Segment, SegmentKind, TokenLedger
from trajcore.domain.token_ledger.template import (
    ChatTemplate,
    PrefixRenderer,
    RenderOnly,
    render_with_prefixes,
)
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.testing.tokenizers import (
    write_llama3_shaped_tokenizer,
    write_mistral_shaped_tokenizer,
)

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
STRIPPING = "<|strip|>"  # an added token with lstrip and rstrip


# ------------------------------------------------------------------------------ the oracle


def _oracle_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _oracle_first_end_of_turn(ids: Sequence[int], end_of_turn: tuple[int, ...], start: int) -> int:
    if not end_of_turn:
        return start
    try:
        return ids.index(end_of_turn[0], start) + 1
    except ValueError:
        return start


def oracle_rerender(
    template: ChatTemplate,
    messages: Sequence[Message],
    *,
    tools: Sequence[ToolSpec] = (),
    cut_turns: Iterable[int] = (),
) -> TokenLedger:
    """``ChatTemplate.rerender`` as it was before prefixes were measured: every prefix rendered
    whole, twice per assistant turn, compared id by id."""
    renderer = template.renderer
    if not messages or messages[0].role == "assistant":
        raise ConfigError("messages[0].role", "a conversation starts with a prompt message")
    full = renderer.render(messages, tools=tools)
    eot = template.shape.end_of_turn
    spans: list[tuple[int, int]] = []
    cut = frozenset(cut_turns)
    turn = -1
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        turn += 1
        before = renderer.render(messages[:index], tools=tools, add_generation_prompt=True)
        upto = renderer.render(messages[: index + 1], tools=tools)
        start = _oracle_common_prefix(before, full)
        end = _oracle_common_prefix(upto, full)
        if end - start >= len(eot) and tuple(full[end - len(eot) : end]) == eot:
            end -= len(eot) - 1
        elif start == len(before):
            end = max(end, _oracle_first_end_of_turn(full, eot, start))
        if turn in cut and end > start and eot and full[end - 1] == eot[0]:
            end -= 1
        start = max(start, spans[-1][1] if spans else 0)
        if end > start:
            spans.append((start, end))
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


# ------------------------------------------------------------------------------ setups


def _stripping_qwen3() -> TransformersTokenizer:
    plain = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    hf = plain._tokenizer
    hf.add_tokens([AddedToken(STRIPPING, lstrip=True, rstrip=True)])
    return TransformersTokenizer(tokenizer=hf, path=plain.path)


def _load(name: str, root: Path) -> TransformersTokenizer:
    if name == "qwen3":
        return TransformersTokenizer.from_path(qwen3_tokenizer_path())
    if name == "qwen3-stripping":
        return _stripping_qwen3()
    if name == "llama3":
        return TransformersTokenizer.from_path(write_llama3_shaped_tokenizer(root / name))
    return TransformersTokenizer.from_path(write_mistral_shaped_tokenizer(root / name))


@attrs.frozen
class Setup:
    name: str
    tokenizer: TransformersTokenizer = attrs.field(repr=False)
    template: ChatTemplate = attrs.field(repr=False)


@pytest.fixture(scope="module", params=["qwen3", "qwen3-stripping", "llama3", "mistral"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    name: str = request.param
    tokenizer = _load(name, tmp_path_factory.mktemp("tokenizers"))
    return Setup(name, tokenizer, ChatTemplate.learn(tokenizer))


# ------------------------------------------------------------------------------ conversations

SPELLED = [
    "<|im_end|>",
    "<|im_start|>user",
    "<think>",
    "</think>",
    "<tool_call>",
    "<tool_response>",
    "<|eot_id|>",
    "</s>",
    "[INST]",
    STRIPPING,
    f" {STRIPPING} ",
]
PLAIN = st.sampled_from(
    [
        "ls",
        "def f(x):",
        "  return x",
        "\n",
        "\n\n",
        "   ",
        "é",
        "e\u0301",  # decomposed: NFC joins it, also across what a split would cut
        "\U000f0001",  # private use: the adapter's placeholders
        "{}",
        "'s",
        "12345",
    ]
)
TEXT = st.lists(PLAIN | st.sampled_from(SPELLED), max_size=6).map("".join)
PLAIN_TEXT = st.lists(PLAIN, max_size=6).map("".join)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Assistant text may spell added tokens (the model wrote them); the other messages' text
    does so only in some conversations (the adapter's shortcut is not taken for those)."""
    text = draw(st.sampled_from([PLAIN_TEXT, TEXT]))  # every message's but the assistant's
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message.system(draw(text)))
    messages.append(Message.user(draw(text)))
    for turn in range(draw(st.integers(0, 4))):
        calls = tuple(
            ToolCall(id=f"call{turn}x{k}", name="bash", arguments={"command": draw(text)})
            for k in range(draw(st.integers(0, 2)))
        )
        reasoning = draw(st.none() | TEXT)
        messages.append(Message.assistant(draw(TEXT), tool_calls=calls, reasoning=reasoning))
        for call in calls:
            result = ToolResult(
                call_id=call.id, name="bash", outcome=ToolOutcome.OK, content=draw(text)
            )
            messages.append(Message.tool(result))
        if not calls or draw(st.booleans()):
            messages.append(Message.user(draw(text)))  # a new query: Qwen3 rewrites history
    if draw(st.booleans()):
        messages.append(Message.assistant(draw(TEXT), reasoning=draw(st.none() | TEXT)))
    return messages


def _kinds_and_ids(ledger: TokenLedger) -> list[tuple[SegmentKind, tuple[int, ...]]]:
    return [(s.kind, s.token_ids) for s in ledger.segments]


# ------------------------------------------------------------------------------ properties


@settings(max_examples=40)
@given(messages=conversations(), cut=st.sets(st.integers(0, 5), max_size=2))
def test_the_rerender_is_the_prefix_by_prefix_rerender(
    setup: Setup, messages: list[Message], cut: set[int]
) -> None:
    try:
        expected = oracle_rerender(setup.template, messages, tools=TOOLS, cut_turns=cut)
    except ConfigError as refused:  # the template refuses it: so must the new path
        with pytest.raises(ConfigError, match=re.escape(str(refused))):
            setup.template.rerender(messages, tools=TOOLS, cut_turns=cut)
        return
    ledger = setup.template.rerender(messages, tools=TOOLS, cut_turns=cut)
    assert _kinds_and_ids(ledger) == _kinds_and_ids(expected)
    assert ledger.export() == expected.export()


@settings(max_examples=40)
@given(
    messages=conversations(),
    picks=st.lists(st.tuples(st.integers(1, 20), st.booleans()), min_size=1, max_size=6),
)
def test_measured_prefixes_are_those_of_rendering_each_prefix(
    setup: Setup, messages: list[Message], picks: list[tuple[int, bool]]
) -> None:
    prefixes = [(min(n, len(messages)), gen) for n, gen in picks]
    try:
        expected = render_with_prefixes(
            RenderOnly(setup.tokenizer), messages, tools=TOOLS, prefixes=prefixes
        )
    except ConfigError:
        with pytest.raises(ConfigError):
            setup.tokenizer.render_with_prefixes(messages, tools=TOOLS, prefixes=prefixes)
        return
    assert setup.tokenizer.render_with_prefixes(messages, tools=TOOLS, prefixes=prefixes) == (
        expected
    )


def test_the_adapter_measures_prefixes_itself_only_where_added_tokens_match_as_written(
    setup: Setup,
) -> None:
    assert isinstance(setup.tokenizer, PrefixRenderer)
    backend = setup.tokenizer._rust()
    assert backend is not None
    assert setup.tokenizer._splits_at_added_tokens(backend) is (setup.name != "qwen3-stripping")


def test_a_renderer_seen_through_render_alone_renders_as_it_does(setup: Setup) -> None:
    plain = RenderOnly(setup.tokenizer)
    assert not isinstance(plain, PrefixRenderer)
    messages = [Message.user("Hi"), Message.assistant("Hello")]
    assert plain.render(messages, tools=TOOLS, add_generation_prompt=True) == (
        setup.tokenizer.render(messages, tools=TOOLS, add_generation_prompt=True)
    )


# ------------------------------------------------------------------------------ the work done


@attrs.define
class CountingTokenizer(TransformersTokenizer):
    """Counts the characters ``_encode`` encodes (every render's, and each prefix's tail)."""

    encoded: int = 0

    def _encode(self, text: str, *, what: str) -> list[int]:
        self.encoded += len(text)
        return super()._encode(text, what=what)


def _long_agent_conversation(turns: int) -> list[Message]:
    messages = [Message.system("You are a careful agent."), Message.user("Fix the bug.")]
    for turn in range(turns):
        call = ToolCall(id=f"call{turn}", name="bash", arguments={"command": f"cat f{turn}.py"})
        messages.append(Message.assistant(f"Reading {turn}.", tool_calls=[call], reasoning="Hm."))
        output = "".join(f"line {k} of file {turn}: x = {k * turn}\n" for k in range(100))
        result = ToolResult(call_id=call.id, name="bash", outcome=ToolOutcome.OK, content=output)
        messages.append(Message.tool(result))
    return [*messages, Message.assistant("Fixed.")]


def test_a_rerender_encodes_the_conversation_about_once_not_once_per_prefix() -> None:
    plain = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    counting = CountingTokenizer(tokenizer=plain._tokenizer, path=plain.path)
    template = ChatTemplate.learn(counting)
    messages = _long_agent_conversation(24)
    whole = len(counting.render_text(messages, tools=TOOLS))
    counting.encoded = 0
    ledger = template.rerender(messages, tools=TOOLS)
    # the whole once, and of each of the 50 prefixes only its last message or so
    assert counting.encoded < 1.2 * whole
    assert _kinds_and_ids(ledger) == _kinds_and_ids(
        oracle_rerender(template, messages, tools=TOOLS)
    )
    completions = [s for s in ledger.segments if s.kind is SegmentKind.COMPLETION]
    assert len(completions) == 25
