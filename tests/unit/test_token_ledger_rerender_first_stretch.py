"""A tokenizer whose pre-tokenizer treats the text's first stretch otherwise (``Metaspace`` with
``prepend_scheme="first"``, as Mistral's and Llama 2's converted tokenizers have it: a word start
is marked at the very beginning of the text only, not after an added token) still gets, from the
transformers adapter's ``render_with_prefixes`` and the re-render built on it, exactly what
rendering each prefix whole gives.

The adapter encodes a conversation as its stretches between added tokens; a stretch encoded on
its own is the text's first, so with such a pre-tokenizer it gains a word-start mark it does not
have in the conversation. The whole's check cannot see it when every stretch of the whole starts
with a space, while a prefix has one that does not (here: reasoning a template writes only for
the turns after the latest user query, which a prefix ending earlier still shows).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.unit.test_token_ledger_rerender_prefixes import _kinds_and_ids, oracle_rerender
from trajcore.adapters.tokenizers import TransformersTokenizer
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.template import ChatTemplate, RenderOnly, render_with_prefixes

SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[THINK]", "[/THINK]"]

# Mistral's shape with a space after each opening tag, and reasoning shown for the turns after
# the latest user query only (as Qwen3 does).
SPACED = """\
{{- bos_token }}
{%- set ns = namespace(query=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.query = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- if m.role == 'user' %}{{- '[INST] ' + m.content + '[/INST]' }}
    {%- else %}
        {%- if m.reasoning_content and loop.index0 > ns.query %}
            {{- '[THINK]' + m.reasoning_content + '[/THINK]' }}
        {%- endif %}
        {{- ' ' + m.content + eos_token }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '[THINK]' }}{%- endif %}
"""

# ChatML's shape: no space after the opening tags (so the whole's stretches start otherwise).
UNSPACED = """\
{{- bos_token }}
{%- for m in messages %}
    {{- '[INST]' + m.role + '\\n' }}
    {%- if m.reasoning_content and loop.last %}
        {{- '[THINK]' + m.reasoning_content + '[/THINK]' }}
    {%- endif %}
    {{- m.content + eos_token }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '[INST]assistant\\n' }}{%- endif %}
"""


def _write(directory: Path, template: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False)
    corpus = ["hello world, think about it: the answer is done and the plan is fine"] * 3
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module", params=["spaced", "unspaced"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TransformersTokenizer:
    template = SPACED if request.param == "spaced" else UNSPACED
    folder = _write(tmp_path_factory.mktemp("metaspace-first"), template)
    return TransformersTokenizer.from_path(folder)


def test_a_stretch_after_an_added_token_is_measured_as_the_whole_conversation_encodes_it(
    tmp_path: Path,
) -> None:
    adapter = TransformersTokenizer.from_path(_write(tmp_path, SPACED))
    messages = [
        Message.user("hello"),
        Message.assistant("answer", reasoning="think"),
        Message.user("world"),
        Message.assistant("done"),
    ]
    prefixes = [(1, True), (2, False), (3, True), (4, False)]
    # the prefix of two messages still shows the reasoning, right after [THINK]
    assert "[THINK]think[/THINK]" in adapter.render_text(messages[:2])
    assert adapter.render_with_prefixes(messages, prefixes=prefixes) == render_with_prefixes(
        RenderOnly(adapter), messages, prefixes=prefixes
    )


WORDS = st.lists(
    st.sampled_from(["hello", " world", "think", " the", "\n", " ", "answer", "é", "12"]),
    max_size=4,
).map("".join)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages = [Message.user(draw(WORDS))]
    for _ in range(draw(st.integers(0, 3))):
        messages.append(Message.assistant(draw(WORDS), reasoning=draw(st.none() | WORDS)))
        if draw(st.booleans()):
            messages.append(Message.user(draw(WORDS)))
    return messages


@settings(max_examples=60)
@given(messages=conversations())
def test_prefixes_and_the_rerender_are_those_of_rendering_each_prefix(
    tokenizer: TransformersTokenizer, messages: list[Message]
) -> None:
    prefixes = [(n, gen) for n in range(1, len(messages) + 1) for gen in (True, False)]
    assert tokenizer.render_with_prefixes(messages, prefixes=prefixes) == render_with_prefixes(
        RenderOnly(tokenizer), messages, prefixes=prefixes
    )
    template = ChatTemplate.learn(tokenizer)
    assert _kinds_and_ids(template.rerender(messages)) == _kinds_and_ids(
        oracle_rerender(template, messages)
    )
