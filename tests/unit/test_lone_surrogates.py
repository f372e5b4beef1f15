"""Text that carries a lone surrogate (a file name's undecodable byte as the slot protocol writes
it, ``\\udcff``; a model's JSON escape of one in a tool call) renders and encodes with every
tokenizer adapter as the JSON escape it stands for, never a failed render that would lose a
scored member of its group."""

from __future__ import annotations

import re

import pytest

from tests.mistral_tokenizers import NAMES, adapter
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message, escape_lone_surrogates
from trajcore.domain.tools import ToolCall

NAME = "bad\udcffname"
CONVERSATION = [
    Message.user("Read the file."),
    Message.assistant(
        "", tool_calls=[ToolCall(id="c1", name="read_file", arguments={"path": NAME})]
    ),
    Message(role="tool", content="x\udc80y", tool_call_id="c1", name="read_file"),
    Message.assistant("done \ud800"),
]


def test_each_lone_surrogate_becomes_its_json_escape_and_the_rest_is_kept() -> None:
    assert escape_lone_surrogates("a\udcffb\ud800\U0001f600é") == "a\\udcffb\\ud800\U0001f600é"
    plain = "no surrogate: é \U0001f600"
    assert escape_lone_surrogates(plain) is plain


def test_the_transformers_adapter_renders_and_encodes_them() -> None:
    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    text = tokenizer.decode(tokenizer.render(CONVERSATION))
    for escaped in ("bad\\udcffname", "x\\udc80y", "done \\ud800"):
        assert escaped in text, text
    assert tokenizer.encode(NAME) == tokenizer.encode("bad\\udcffname")


@pytest.mark.parametrize("name", NAMES)
def test_the_mistral_adapter_renders_and_encodes_them(name: str) -> None:
    """Each version writes a tool result its own way (as JSON in some); a call's arguments,
    which ``mistral_common`` reads and writes again, hold U+FFFD in each one's place."""
    tokenizer = adapter(name)
    text = tokenizer.decode(tokenizer.render(CONVERSATION))
    assert '"bad\ufffdname"' in text, (name, text)
    assert re.search(r"x\\+udc80y", text), (name, text)
    assert "done \\ud800" in text, (name, text)
    assert tokenizer.encode(NAME) == tokenizer.encode("bad\\udcffname")
