"""The ``Tokenizer`` contract as an abstract pytest suite of hypothesis properties.

Subclass ``TokenizerContract`` and provide the ``tokenizer`` fixture (and, when the tokenizer
closes assistant turns with something other than its ``eos_token_id``, ``end_of_turn_ids``). The
port is stateless, so the suite is properties over generated input rather than a state machine:

- ``encode`` adds no special tokens (``encode("") == []``, no end-of-turn id in plain text) and
  returns ints; ``decode(encode(text)) == text`` (up to the Unicode normal form the tokenizer
  documents, ``normal_form``: Qwen's tokenizers apply NFC), and ids of two texts put together
  decode to the two texts put together (set ``concatenation_round_trips = False`` for a tokenizer
  that prefixes every encoded text, as SentencePiece's dummy space does);
- ``render`` of a generated conversation (an optional system prompt, user turns, assistant turns
  with text or with tool calls whose arguments fit the generated tools' schemas, a tool result
  per call) returns ids, the same ids every time; its text holds every message's content, every
  tool's name and every call's name and string arguments;
- ``add_generation_prompt`` only ever appends to a render (formats without a generation prompt
  append nothing);
- an assistant turn is closed by an end-of-turn id after the prompt that asked for it;
- a conversation the template refuses raises ``ConfigError`` and nothing else.

Conversations use words of ASCII letters, digits and a few accented letters (no text of special
tokens, no JSON-looking tool results, so formats that re-serialise JSON render them as written).
"""

from __future__ import annotations

import itertools
import unicodedata
from typing import ClassVar, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.ports.tokenizer import Tokenizer
from trajcore.testing.budget import property_settings
from trajcore.testing.conversations import openings

__all__ = ["Conversation", "TokenizerContract", "conversations", "tool_specs"]

_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZéü", min_size=1, max_size=8)
_ASCII_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
_TEXT = st.lists(_WORD, min_size=1, max_size=6).map(" ".join)
_FREE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
    | st.sampled_from("\n\t"),
    max_size=40,
)

_PARAMETERS: dict[str, JSON] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "a file"},
        "count": {"type": "integer", "description": "how many"},
    },
    "required": ["path"],
}


@st.composite
def tool_specs(draw: st.DrawFn) -> list[ToolSpec]:
    """One to three tools with distinct names, each taking ``path`` (and optionally ``count``)."""
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    return [ToolSpec(name=name, description=draw(_TEXT), parameters=_PARAMETERS) for name in names]


class Conversation:
    """A generated conversation and the tools it was written against."""

    def __init__(self, messages: list[Message], tools: list[ToolSpec]) -> None:
        self.messages = messages
        self.tools = tools

    def __repr__(self) -> str:
        return f"Conversation({self.messages!r}, tools={[t.name for t in self.tools]!r})"


@st.composite
def conversations(
    draw: st.DrawFn, *, ends_with: str | None = None, with_tools: bool | None = None
) -> Conversation:
    """A well-formed conversation: ``ends_with`` ``"user"``, ``"tool"`` or ``"assistant"``."""
    use_tools = draw(st.booleans()) if with_tools is None else with_tools
    tools: list[ToolSpec] = draw(tool_specs()) if use_tools else []
    ids = itertools.count(1)
    messages: list[Message] = draw(openings(_TEXT))
    for _ in range(draw(st.integers(0, 2))):
        calling: bool = draw(st.booleans())
        if tools and calling:
            calls: list[ToolCall] = []
            for _ in range(draw(st.integers(1, 2))):
                tool = draw(st.sampled_from(tools))
                arguments: dict[str, JSON] = {"path": draw(_ASCII_WORD)}
                if draw(st.booleans()):
                    arguments["count"] = draw(st.integers(0, 999))
                calls.append(ToolCall(id=f"call{next(ids)}", name=tool.name, arguments=arguments))
            messages.append(Message.assistant(tool_calls=calls))
            messages.extend(
                Message(role="tool", content=draw(_TEXT), tool_call_id=call.id, name=call.name)
                for call in calls
            )
        else:
            messages.append(Message.assistant(draw(_TEXT)))
        messages.append(Message.user(draw(_TEXT)))
    wanted = ends_with or draw(st.sampled_from(["user", "tool", "assistant"]))
    if wanted == "assistant":
        messages.append(Message.assistant(draw(_TEXT)))
    elif wanted == "tool" and tools:
        tool = draw(st.sampled_from(tools))
        call = ToolCall(id=f"call{next(ids)}", name=tool.name, arguments={"path": "x"})
        messages.append(Message.assistant(tool_calls=[call]))
        messages.append(
            Message(role="tool", content=draw(_TEXT), tool_call_id=call.id, name=call.name)
        )
    return Conversation(messages, tools)


# The tokenizer is stateless, so a function-scoped fixture may serve every example; each subclass
# runs the same inherited method on its own tokenizer. Half the profile's examples per property:
# five properties per tokenizer add up.
_reuse_fixture = property_settings(0.5, minimum=10)


class TokenizerContract:
    """Abstract suite: subclass and override the ``tokenizer`` fixture (see the module doc)."""

    normal_form: ClassVar[Literal["NFC", "NFKC", "NFD", "NFKD"] | None] = None
    concatenation_round_trips: ClassVar[bool] = True

    @pytest.fixture
    def tokenizer(self) -> Tokenizer:
        raise NotImplementedError

    @pytest.fixture
    def end_of_turn_ids(self, tokenizer: Tokenizer) -> frozenset[int]:
        """The ids that may close an assistant turn (the end-of-sequence id by default)."""
        eos = tokenizer.eos_token_id
        assert eos is not None, "override end_of_turn_ids: this tokenizer has no eos id"
        return frozenset({eos})

    def _same_text(self, got: str, want: str) -> None:
        if self.normal_form is not None:
            want = unicodedata.normalize(self.normal_form, want)
        assert got == want

    # ------------------------------------------------------------------------- text

    def test_the_empty_text_is_no_ids(self, tokenizer: Tokenizer) -> None:
        assert tokenizer.encode("") == []
        assert tokenizer.decode([]) == ""

    @_reuse_fixture
    @given(text=_FREE_TEXT)
    def test_encode_then_decode_gives_the_text_back(
        self, tokenizer: Tokenizer, end_of_turn_ids: frozenset[int], text: str
    ) -> None:
        ids = tokenizer.encode(text)
        assert all(type(i) is int for i in ids)
        assert not end_of_turn_ids.intersection(ids), "encode added an end-of-turn id"
        self._same_text(tokenizer.decode(ids), text)

    @_reuse_fixture
    @given(first=_FREE_TEXT, second=_FREE_TEXT)
    def test_ids_put_together_decode_to_the_texts_put_together(
        self, tokenizer: Tokenizer, first: str, second: str
    ) -> None:
        if not self.concatenation_round_trips:
            pytest.skip("this tokenizer prefixes every encoded text (concatenation_round_trips)")
        ids = tokenizer.encode(first) + tokenizer.encode(second)
        self._same_text(tokenizer.decode(ids), first + second)

    # ------------------------------------------------------------------------- chats

    @_reuse_fixture
    @given(chat=conversations())
    def test_a_render_is_ids_the_same_every_time_holding_every_message(
        self, tokenizer: Tokenizer, chat: Conversation
    ) -> None:
        ids = tokenizer.render(chat.messages, tools=chat.tools)
        assert ids
        assert all(type(i) is int for i in ids)
        assert tokenizer.render(chat.messages, tools=chat.tools) == ids
        text = tokenizer.decode(ids)
        for message in chat.messages:
            assert message.content in text, f"{message.role} content missing from {text!r}"
            for call in message.tool_calls:
                assert call.name in text
                assert str(call.arguments["path"]) in text
        for tool in chat.tools:
            assert tool.name in text, f"tool {tool.name} missing from {text!r}"

    @_reuse_fixture
    @given(chat=st.one_of(conversations(ends_with="user"), conversations(ends_with="tool")))
    def test_the_generation_prompt_only_appends(
        self, tokenizer: Tokenizer, chat: Conversation
    ) -> None:
        plain = tokenizer.render(chat.messages, tools=chat.tools)
        prompted = tokenizer.render(chat.messages, tools=chat.tools, add_generation_prompt=True)
        assert prompted[: len(plain)] == plain

    @_reuse_fixture
    @given(chat=conversations(ends_with="assistant"))
    def test_an_assistant_turn_is_closed_by_an_end_of_turn_id(
        self, tokenizer: Tokenizer, end_of_turn_ids: frozenset[int], chat: Conversation
    ) -> None:
        prompt = tokenizer.render(chat.messages[:-1], tools=chat.tools, add_generation_prompt=True)
        full = tokenizer.render(chat.messages, tools=chat.tools)
        tail = full[len(prompt) :]
        closing = [k for k, i in enumerate(tail) if i in end_of_turn_ids]
        assert closing, f"no end-of-turn id after the prompt: {tokenizer.decode(tail)!r}"
        assert chat.messages[-1].content in tokenizer.decode(tail[: closing[-1]])

    @_reuse_fixture
    @given(
        chat=conversations(ends_with="user", with_tools=True),
        broken=st.sampled_from(["orphan result", "result first", "unanswered then user"]),
    )
    def test_a_refused_conversation_is_a_config_error(
        self, tokenizer: Tokenizer, chat: Conversation, broken: str
    ) -> None:
        messages = list(chat.messages)
        orphan = Message(role="tool", content="lost", tool_call_id="call0", name=chat.tools[0].name)
        if broken == "orphan result":
            messages.insert(len(messages) - 1, orphan)
        elif broken == "result first":
            messages.insert(0, orphan)
        else:
            call = ToolCall(id="callx", name=chat.tools[0].name, arguments={"path": "p"})
            messages[-1:-1] = [Message.assistant(tool_calls=[call])]
        try:
            ids = tokenizer.render(messages, tools=chat.tools)
        except ConfigError as error:
            refusal: ConfigError | None = error
        else:
            refusal = None
            assert all(type(i) is int for i in ids)  # a lenient template may render it
        assert refusal is None or str(refusal), "a ConfigError with no reason"
