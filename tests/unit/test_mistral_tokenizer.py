"""The mistral_common Tokenizer adapter: Mistral's own encoder, offline, typed errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mistral_common.protocol.instruct.messages import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool
from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralToolCall
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from tests.mistral_tokenizers import NAMES, adapter, encode
from trajcore.adapters.mistral import BundledMistral, MistralCommonTokenizer, mistral_call_id
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.ledger import SegmentKind
from trajcore.domain.token_ledger.template import ChatRenderer, ChatTemplate
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.ports.tokenizer import Tokenizer

ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
CALL = ToolCall(id="a1B2c3D4e", name="add", arguments={"a": 1, "b": 2})
RESULT = Message.tool(ToolResult(call_id=CALL.id, name="add", outcome=ToolOutcome.OK, content="3"))


def _ported(tokenizer: MistralCommonTokenizer) -> Tokenizer:
    return tokenizer


def _renderer(tokenizer: MistralCommonTokenizer) -> ChatRenderer:
    return tokenizer


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> BundledMistral:
    value: BundledMistral = request.param
    return value


def test_bundled_tokenizers_have_their_version_and_kind(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    assert tokenizer.version == ("v3" if name.endswith("v3") else "v7")
    assert tokenizer.is_tekken is name.startswith("tekken")
    assert tokenizer.source == f"bundled:{name}"
    assert _ported(tokenizer).eos_token_id == 2  # </s>
    assert _renderer(tokenizer).render([Message.user("x")])[0] == 1  # <s>


def test_render_is_mistral_commons_encoding_of_the_same_request(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    conversation = [
        Message.system("Be brief."),
        Message.user("What is 1 + 2? ☃"),
        Message.assistant("", tool_calls=[CALL]),
        RESULT,
        Message.assistant("It is 3."),
    ]
    expected = encode(
        name,
        [
            SystemMessage(content="Be brief."),
            UserMessage(content="What is 1 + 2? ☃"),
            AssistantMessage(
                tool_calls=[
                    MistralToolCall(
                        id=CALL.id, function=FunctionCall(name="add", arguments='{"a": 1, "b": 2}')
                    )
                ]
            ),
            ToolMessage(content="3", tool_call_id=CALL.id, name="add"),
            AssistantMessage(content="It is 3."),
        ],
        [
            Tool(
                function=Function(
                    name="add", description=ADD.description, parameters=dict(ADD.parameters)
                )
            )
        ],
    )
    assert tokenizer.render(conversation, tools=[ADD]) == expected
    # Mistral's format has no generation prompt.
    prompt = conversation[:2]
    assert tokenizer.render(prompt, tools=[ADD], add_generation_prompt=True) == tokenizer.render(
        prompt, tools=[ADD]
    )
    text = tokenizer.decode(expected)
    assert (
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "a1B2c3D4e"}]</s>'
        in (text)
    )
    assert text.startswith("<s>")
    assert text.endswith("It is 3.</s>")


@given(text=st.text(max_size=40))
def test_decode_inverts_encode_and_special_token_text_stays_text(text: str) -> None:
    for name in NAMES:
        tokenizer = adapter(name)
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text, name
        # Text that spells a control token is encoded as text, never as the control token.
        spelled = tokenizer.encode(f"{text}[TOOL_CALLS]</s>[INST]")
        assert tokenizer.special_id("[TOOL_CALLS]") not in spelled
        assert tokenizer.eos_token_id not in spelled


def test_decode_keeps_special_tokens_as_their_text(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    ids = [tokenizer.special_id("[TOOL_CALLS]"), *tokenizer.encode('[{"name": "x"}]'), 2]
    assert tokenizer.decode(ids) == '[TOOL_CALLS][{"name": "x"}]</s>'
    with pytest.raises(ConfigError, match=r"outside the vocabulary .* @ ids\[1\]"):
        tokenizer.decode([1, 10**7])
    with pytest.raises(ConfigError, match=r"not a special token.* @ text"):
        tokenizer.special_id("[NOT_A_TOKEN]")


def test_tool_call_ids_are_made_valid_for_mistral_and_still_pair() -> None:
    assert mistral_call_id("a1B2c3D4e") == "a1B2c3D4e"
    for call_id in ("call_1_0", "call0probe", "x", "ÄÖÜäöüßab"):
        mapped = mistral_call_id(call_id)
        assert re.fullmatch(r"[0-9a-f]{9}", mapped)
        assert mistral_call_id(call_id) == mapped
    assert mistral_call_id("call_1_0") != mistral_call_id("call_1_1")
    tokenizer = adapter("v3")
    call = ToolCall(id="call_1_0", name="add", arguments={"a": 1, "b": 2})
    result = Message.tool(
        ToolResult(call_id="call_1_0", name="add", outcome=ToolOutcome.OK, content="3")
    )
    text = tokenizer.decode(
        tokenizer.render([Message.user("hi"), Message.assistant("", tool_calls=[call]), result])
    )
    assert text.count(f'"{mistral_call_id("call_1_0")}"') == 2


def test_what_the_format_cannot_hold_is_dropped_only_where_documented() -> None:
    both = Message.assistant("Let me add.", tool_calls=[CALL], reasoning="Easy.")
    prompt = [Message.user("hi")]
    v3 = adapter("v3")
    # v3 writes a turn as text or as calls: calls win; reasoning has no place in either version.
    assert v3.render([*prompt, both]) == v3.render(
        [*prompt, Message.assistant("", tool_calls=[CALL])]
    )
    v7 = adapter("v7")
    text = v7.decode(v7.render([*prompt, both]))
    assert text.endswith(
        'Let me add.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, '
        '"id": "a1B2c3D4e"}]</s>'
    )
    assert "Easy." not in text


def test_the_ledger_learns_mistrals_end_of_turn(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    template = ChatTemplate.learn(tokenizer, turn_stops=[2])
    assert template.shape.end_of_turn == (2,)
    bridge = template.environment_ids(
        [*tokenizer.encode("x"), 2], [Message.user("Thanks. Now 2 + 2?")]
    )
    assert tokenizer.decode(bridge) == "[INST]Thanks. Now 2 + 2?[/INST]"


def test_refusals_name_the_field(tmp_path: Path) -> None:
    tokenizer = adapter("v7")
    with pytest.raises(ConfigError, match="@ tokenizer_path"):
        MistralCommonTokenizer.from_file(tmp_path / "missing.json")
    broken = tmp_path / "tekken.json"
    broken.write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"cannot load .* @ tokenizer_path"):
        MistralCommonTokenizer.from_file(broken)
    with pytest.raises(ConfigError, match=r"v99.* @ name"):
        MistralCommonTokenizer.bundled("v99")  # type: ignore[arg-type]  # a wrong name on purpose
    with pytest.raises(ConfigError, match=r"mistral_common refused them.* @ messages"):
        # A tool result that answers no call.
        tokenizer.render([Message.user("hi"), RESULT])
    bad = ToolCall(id="a1B2c3D4e", name="no.dots", arguments={})
    with pytest.raises(ConfigError, match=r"mistral_common refused them.*no\.dots.* @ messages"):
        tokenizer.render([Message.user("hi"), Message.assistant("", tool_calls=[bad])])


def test_from_file_loads_a_tokenizer_file_from_disk() -> None:
    v3 = adapter("v3")
    file = MistralTokenizer._data_path() / "mistral_instruct_tokenizer_240323.model.v3"
    loaded = MistralCommonTokenizer.from_file(file)
    assert loaded.source == str(file)
    assert loaded.render([Message.user("hi")]) == v3.render([Message.user("hi")])


def test_openai_mode_rerender_finds_mistrals_assistant_spans(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    template = ChatTemplate.learn(tokenizer, turn_stops=[2])
    conversation = [
        Message.system("S"),
        Message.user("U"),
        Message.assistant("", tool_calls=[CALL]),
        RESULT,
        Message.assistant("done"),
    ]
    ledger = template.rerender(conversation)
    spans = [(s.kind.value, tokenizer.decode(s.token_ids)) for s in ledger.segments]
    call = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "a1B2c3D4e"}]</s>'
    result = (
        '[TOOL_RESULTS]{"content": 3, "call_id": "a1B2c3D4e"}[/TOOL_RESULTS]'
        if name.endswith("v3")
        else "[TOOL_RESULTS]a1B2c3D4e[TOOL_CONTENT]3[/TOOL_RESULTS]"
    )
    assert spans[1:] == [
        ("completion", call),
        ("environment", result),
        ("completion", "done</s>"),
    ]
    assert list(ledger.prompt_ids()) == tokenizer.render(conversation)


def test_openai_mode_rerender_never_trains_mistrals_user_text(name: BundledMistral) -> None:
    # Mistral writes the tools (v3: and the system prompt) before the last user message, so an
    # earlier reply renders after other history than the whole has: it is masked, and no user
    # text is ever trained as the model's.
    tokenizer = adapter(name)
    template = ChatTemplate.learn(tokenizer, turn_stops=[2])
    tool = ToolSpec(
        name="bash", parameters={"type": "object", "properties": {"command": {"type": "string"}}}
    )
    conversation = [
        Message.user("Hello."),
        Message.assistant("Hi there."),
        Message.user("Thanks."),
        Message.assistant("Welcome."),
    ]
    for tools in ((tool,), ()):
        ledger = template.rerender(conversation, tools=tools)
        trained = [
            tokenizer.decode(s.token_ids)
            for s in ledger.segments
            if s.kind is SegmentKind.COMPLETION
        ]
        assert trained[-1] == "Welcome.</s>"
        assert not any("Hello" in t or "Thanks" in t or "[INST]" in t for t in trained), trained
