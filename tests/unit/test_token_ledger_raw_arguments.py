"""``ChatTemplate.writes_raw_arguments`` and ``rerender``'s ``untrained_turns``, over toy
renderers whose text can be read by eye: the domain's decisions about a call whose arguments
were no JSON object, without a tokenizer (the real templates' cases are in
``test_openai_mode_raw_arguments.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.ledger import SegmentKind
from trajcore.domain.token_ledger.template import ChatTemplate, TemplateShape
from trajcore.domain.tools import ToolCall, ToolSpec

EOT = "\n"


@attrs.frozen
class TextRenderer:
    """Each message is ``role: content`` (a call ``<name ARGUMENTS>``) and a newline, as code
    points. ``in_place`` writes a call's raw arguments as they are (as Qwen3's template does),
    else as a JSON string (as a ``tojson`` template does); ``header`` is written first, so that
    ``{}`` may stand before the call's own; ``refuse`` refuses raw arguments."""

    in_place: bool = True
    header: str = ""
    refuse: bool = False

    def text(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        out = self.header
        for message in messages:
            calls = ""
            for call in message.tool_calls:
                raw = call.raw_arguments
                if raw is not None and self.refuse:
                    raise ConfigError("tool_calls", "arguments must be a JSON object")
                if raw is None:
                    written = json.dumps(call.arguments, separators=(",", ":"))
                else:
                    written = raw if self.in_place else json.dumps(raw)
                calls += f"<{call.name} {written}>"
            out += f"{message.role}: {message.content}{calls}{EOT}"
        return out + ("assistant: " if add_generation_prompt else "")

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        return [ord(c) for c in self.text(messages, add_generation_prompt)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


@attrs.frozen
class MuteRenderer:
    """A renderer that cannot decode what it rendered."""

    inner: TextRenderer = TextRenderer()

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        return self.inner.render(messages, add_generation_prompt=add_generation_prompt)


def template(renderer: TextRenderer | MuteRenderer) -> ChatTemplate:
    shape = TemplateShape(end_of_turn=(ord(EOT),), turn_stops=(), stand_in_reasoning=False)
    return ChatTemplate(renderer=renderer, shape=shape)


def malformed(raw: str) -> ToolCall:
    return ToolCall(id="c", name="write_file", arguments={}, raw_arguments=raw)


UNTERMINATED = '{"path": "a.txt", "content": "x'


def test_a_template_that_writes_text_arguments_in_place_writes_them_as_the_model_did() -> None:
    for raw in (UNTERMINATED, '["a.txt", "x"]', "null", "", "{}", "{}{}"):
        assert template(TextRenderer()).writes_raw_arguments(malformed(raw)) is None, raw


def test_a_call_with_json_object_arguments_needs_no_check() -> None:
    plain = ToolCall(id="c", name="write_file", arguments={"path": "a"})
    for renderer in (TextRenderer(in_place=False), MuteRenderer(), TextRenderer(refuse=True)):
        assert template(renderer).writes_raw_arguments(plain) is None


def test_a_template_that_quotes_them_or_refuses_them_or_cannot_be_read_is_named() -> None:
    call = malformed(UNTERMINATED)
    assert template(TextRenderer(in_place=False)).writes_raw_arguments(call) == (
        "the chat template does not write them as the model wrote them"
    )
    assert template(TextRenderer(refuse=True)).writes_raw_arguments(call) == (
        "the chat template refuses them (arguments must be a JSON object @ tool_calls)"
    )
    assert template(MuteRenderer()).writes_raw_arguments(call) == (
        "the tokenizer cannot decode a render to check its text"
    )


def test_the_calls_own_empty_arguments_are_found_past_any_earlier_braces() -> None:
    """The check compares the render with raw text against the one with ``{}`` put back where
    the call's ``{}`` stands, even when ``{}`` stands earlier in the render."""
    header = "system: {} and {}\n"
    for raw in (UNTERMINATED, "null", "{}x"):
        assert template(TextRenderer(header=header)).writes_raw_arguments(malformed(raw)) is None
    quoting = TextRenderer(in_place=False, header=header)
    assert template(quoting).writes_raw_arguments(malformed("null")) is not None


def test_a_lone_surrogate_in_the_raw_text_is_compared_as_the_tokenizers_write_it() -> None:
    @attrs.frozen
    class Escaping(TextRenderer):
        def text(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
            written = super().text(messages, add_generation_prompt)
            return written.replace("\ud800", "\\ud800")

    assert template(Escaping()).writes_raw_arguments(malformed('{"a": "\ud800')) is None


def test_an_untrained_turn_is_environment_and_the_others_are_still_trained() -> None:
    messages = [
        Message.user("go"),
        Message.assistant("", tool_calls=[malformed(UNTERMINATED)]),
        Message(role="tool", content="bad arguments", tool_call_id="c", name="write_file"),
        Message.assistant("done"),
    ]
    chat = template(TextRenderer())
    trained = chat.rerender(messages)
    masked = chat.rerender(messages, untrained_turns=[0])
    every = [[i for s in ledger.segments for i in s.token_ids] for ledger in (trained, masked)]
    assert every[0] == every[1]  # the same text, only its marks differ
    completions = [s for s in masked.segments if s.kind is SegmentKind.COMPLETION]
    assert "".join(chr(i) for s in completions for i in s.token_ids) == "done\n"
    assert [s.kind for s in trained.segments].count(SegmentKind.COMPLETION) == 2
    later = chat.rerender(messages, untrained_turns=[1])
    written = [s for s in later.segments if s.kind is SegmentKind.COMPLETION]
    assert "".join(chr(i) for s in written for i in s.token_ids) == f"<write_file {UNTERMINATED}>\n"
