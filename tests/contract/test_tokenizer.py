"""The Tokenizer contract against the shaped test tokenizers, Qwen3's real files and Mistral's."""

from __future__ import annotations

import pytest

from trajcore.adapters.mistral import MistralCommonTokenizer
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.ports.tokenizer import Tokenizer
from trajcore.testing.tokenizer_contract import TokenizerContract
from trajcore.testing.tokenizers import (
    write_llama3_shaped_tokenizer,
    write_mistral_shaped_tokenizer,
)


@pytest.fixture(scope="module")
def llama3_shaped(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_llama3_shaped_tokenizer(tmp_path_factory.mktemp("llama3"))
    return TransformersTokenizer.from_path(folder)


@pytest.fixture(scope="module")
def mistral_shaped(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_mistral_shaped_tokenizer(tmp_path_factory.mktemp("mistral"))
    return TransformersTokenizer.from_path(folder)


@pytest.fixture(scope="module")
def qwen3() -> Tokenizer:
    return TransformersTokenizer.from_path(qwen3_tokenizer_path())


@pytest.fixture(scope="module")
def tekken_v7() -> Tokenizer:
    return MistralCommonTokenizer.bundled("tekken-v7")


@pytest.fixture(scope="module")
def sentencepiece_v3() -> Tokenizer:
    return MistralCommonTokenizer.bundled("v3")


class TestLlama3ShapedTokenizer(TokenizerContract):
    @pytest.fixture
    def tokenizer(self, llama3_shaped: Tokenizer) -> Tokenizer:
        return llama3_shaped


class TestMistralShapedTokenizer(TokenizerContract):
    @pytest.fixture
    def tokenizer(self, mistral_shaped: Tokenizer) -> Tokenizer:
        return mistral_shaped


class TestQwen3Tokenizer(TokenizerContract):
    normal_form = "NFC"  # Qwen2's tokenizer normalises text to NFC before encoding

    @pytest.fixture
    def tokenizer(self, qwen3: Tokenizer) -> Tokenizer:
        return qwen3


class TestMistralCommonTekkenV7(TokenizerContract):
    @pytest.fixture
    def tokenizer(self, tekken_v7: Tokenizer) -> Tokenizer:
        return tekken_v7


class TestMistralCommonV3(TokenizerContract):
    # SentencePiece encodes every text with a leading dummy space, so two encodings put together
    # decode with a space between them; one encoding alone round-trips.
    concatenation_round_trips = False

    @pytest.fixture
    def tokenizer(self, sentencepiece_v3: Tokenizer) -> Tokenizer:
        return sentencepiece_v3
