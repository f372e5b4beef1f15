"""Mistral's real tokenizers for the tests, loaded once per process (Tekken takes most of a second).

The reference side of every Mistral test is built here with ``mistral_common``'s own types and a
``MistralTokenizer`` loaded independently of trajcore's adapter, so the adapter's conversion of
messages is itself under test.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import TypeAlias

from mistral_common.protocol.instruct.messages import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Tool
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.base import Tokenized
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from trajcore.adapters.mistral import BundledMistral, MistralCommonTokenizer

NAMES: tuple[BundledMistral, ...] = ("v3", "v7", "tekken-v3", "tekken-v7")

Reference: TypeAlias = MistralTokenizer[
    UserMessage, AssistantMessage, ToolMessage, SystemMessage, Tokenized
]
ChatMessage: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage

# Removed when the interpreter exits.
_SCRATCH = tempfile.TemporaryDirectory(prefix="trajcore-mistral-")


@functools.cache
def adapter(name: BundledMistral) -> MistralCommonTokenizer:
    """trajcore's adapter over the bundled tokenizer ``name``."""
    return MistralCommonTokenizer.bundled(name)


@functools.cache
def reference(name: BundledMistral) -> Reference:
    """``mistral_common``'s own tokenizer for ``name``, built without trajcore.

    The shipped files are loaded with ``MistralTokenizer.from_file``; Tekken v7 is the shipped
    Tekken file with its version set to v7, loaded with ``from_file`` like any v7 Tekken file.
    """
    data = MistralTokenizer._data_path()
    files = {
        "v3": "mistral_instruct_tokenizer_240323.model.v3",
        "v7": "mistral_instruct_tokenizer_241114.model.v7",
        "tekken-v3": "tekken_240718.json",
    }
    if name in files:
        loaded: Reference = MistralTokenizer.from_file(
            data / files[name], mode=ValidationMode.agnostic
        )
        return loaded
    # A v7 Tekken file: the shipped Tekken file with its config saying v7, loaded the ordinary way.
    tekken = json.loads((data / "tekken_240718.json").read_text(encoding="utf-8"))
    tekken["config"]["version"] = "v7"
    file = Path(_SCRATCH.name) / "tekken_v7.json"
    file.write_text(json.dumps(tekken), encoding="utf-8")
    loaded = MistralTokenizer.from_file(file, mode=ValidationMode.agnostic)
    return loaded


def encode(name: BundledMistral, messages: list[ChatMessage], tools: list[Tool]) -> list[int]:
    """Mistral's encoding of a whole chat request."""
    request = ChatCompletionRequest(messages=messages, tools=tools or None)
    return list(reference(name).encode_chat_completion(request).tokens)
