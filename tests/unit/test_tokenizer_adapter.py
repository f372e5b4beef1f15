"""The transformers Tokenizer adapter: local and offline, the template's exact ids, typed errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.template import ChatRenderer
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.ports.tokenizer import Tokenizer
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
CALL = ToolCall(id="abc123xyz", name="bash", arguments={"command": "ls -la"})
CONVERSATION = (
    Message.system("Be brief."),
    Message.user("What is here?"),
    Message.assistant("Let me look.", tool_calls=[CALL], reasoning="I should list files."),
    Message.tool(
        ToolResult(call_id=CALL.id, name="bash", outcome=ToolOutcome.OK, content="a.txt b.txt")
    ),
)


@pytest.fixture(scope="module", params=["qwen3", "llama3", "mistral"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TransformersTokenizer:
    root = tmp_path_factory.mktemp("tokenizers")
    if request.param == "qwen3":
        return TransformersTokenizer.from_path(qwen3_tokenizer_path())
    if request.param == "llama3":
        return TransformersTokenizer.from_path(write_llama3_shaped_tokenizer(root / "llama3"))
    return TransformersTokenizer.from_path(write_mistral_shaped_tokenizer(root / "mistral"))


def test_it_is_a_tokenizer(tokenizer: TransformersTokenizer) -> None:
    port: Tokenizer = tokenizer  # mypy checks the structural fit
    renderer: ChatRenderer = port  # and that any Tokenizer can drive a ledger
    assert port.eos_token_id is not None
    assert renderer.render([Message.user("hi")])


def test_render_gives_ids_not_a_mapping(tokenizer: TransformersTokenizer) -> None:
    """transformers 5 returns a mapping from apply_chat_template(tokenize=True) by default."""
    ids = tokenizer.render(CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert isinstance(ids, list)
    assert all(isinstance(i, int) for i in ids)


@pytest.mark.parametrize("generation_prompt", [False, True])
def test_render_equals_encoding_the_rendered_text(
    tokenizer: TransformersTokenizer, generation_prompt: bool
) -> None:
    """Tokenizing inside apply_chat_template and encoding its text give the same ids (no special
    token added twice, no beginning-of-sequence doubled)."""
    ids = tokenizer.render(CONVERSATION, tools=TOOLS, add_generation_prompt=generation_prompt)
    text = tokenizer.render_text(CONVERSATION, tools=TOOLS, add_generation_prompt=generation_prompt)
    assert ids == tokenizer.encode(text)
    assert tokenizer.decode(ids) == text


def test_render_includes_tools_and_tool_calls(tokenizer: TransformersTokenizer) -> None:
    text = tokenizer.render_text(CONVERSATION, tools=TOOLS)
    assert "Run a shell command." in text
    assert '"command": "ls -la"' in text
    assert "a.txt b.txt" in text
    assert "Run a shell command." not in tokenizer.render_text(CONVERSATION)


def test_encode_adds_no_special_tokens(tokenizer: TransformersTokenizer) -> None:
    ids = tokenizer.encode("hello world")
    assert tokenizer.decode(ids) == "hello world"
    assert tokenizer.eos_token_id not in ids


def test_decode_keeps_special_tokens(tokenizer: TransformersTokenizer) -> None:
    eos = tokenizer.eos_token_id
    assert eos is not None
    assert tokenizer.decode([eos]) != ""


def test_decode_of_a_partial_character_is_replaced(tokenizer: TransformersTokenizer) -> None:
    ids = tokenizer.encode("\U0001d518")  # four UTF-8 bytes, several byte-level tokens
    assert len(ids) > 1
    assert tokenizer.decode(ids[:1]) == "\ufffd"
    assert tokenizer.decode(ids) == "\U0001d518"


def test_missing_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        TransformersTokenizer.from_path(tmp_path / "nope")
    assert info.value.field == "tokenizer_path"


def test_a_folder_without_a_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        TransformersTokenizer.from_path(tmp_path)
    assert info.value.field == "tokenizer_path"


def test_loading_sets_the_hub_offline(tmp_path: Path) -> None:
    TransformersTokenizer.from_path(write_llama3_shaped_tokenizer(tmp_path / "t"))
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_a_refused_conversation_is_a_config_error(tmp_path: Path) -> None:
    tokenizer = TransformersTokenizer.from_path(write_mistral_shaped_tokenizer(tmp_path / "m"))
    with pytest.raises(ConfigError) as info:
        tokenizer.render([Message.user("hi"), Message.system("late system message")])
    assert info.value.field == "messages"
    assert "unsupported role system" in info.value.reason


def test_chat_template_can_be_replaced(tmp_path: Path) -> None:
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tokenizer = TransformersTokenizer.from_path(
        write_llama3_shaped_tokenizer(tmp_path / "t"), chat_template=template
    )
    assert tokenizer.render_text([Message.user("hi")]) == "user: hi\n"


def test_qwen3_files_are_found_without_importing_the_package() -> None:
    folder = qwen3_tokenizer_path()
    assert (folder / "tokenizer.json").is_file()
    assert (folder / "tokenizer_config.json").is_file()
