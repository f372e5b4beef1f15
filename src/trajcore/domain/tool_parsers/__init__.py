"""Tool-call parsers for raw completions (managed mode), one per model family, and their registry.

In managed mode trajcore samples token ids itself, so nobody has parsed the model's tool calls
yet: the decoded completion text goes through the parser of the model's family, chosen by name
in the env's config (``tool_call_parser``). Each parser is a pure function of the text (and the
tool list, when given) to a ``ParsedTurn``: content, reasoning, the well-formed calls and one
``ParseProblem`` per malformed call. The rules they share are written at the top of
``tool_parsers.base``; each family's module states its own.

Families and their registry names:

========================  ==================================================================
``hermes``                ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
``qwen3_coder``           ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...``
``llama3_json``           ``<|python_tag|>{"name": ..., "parameters": {...}}; {...}``
``mistral``               ``[TOOL_CALLS][{...}]`` and ``[TOOL_CALLS]NAME[ARGS]{...}``
``deepseek_v3``           ``<|tool_call_begin|>function<|tool_sep|>NAME`` + JSON fence
``deepseek_v31``          ``<|tool_call_begin|>NAME<|tool_sep|>{...}`` (reads V3 too)
``qwen``                  the ``hermes`` format, under the seed environments' name
``kimi_k2``               ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}``
``glm45``                 ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...``
``pythonic``              ``[get_weather(city='Paris'), get_time()]`` (Llama 3.2)
``llama4_pythonic``       the same list in ``<|python_start|>...<|python_end|>`` (Llama 4)
``granite``               ``<|tool_call|>[{"name": ..., "arguments": {...}}]`` (Granite 3.x)
``seed_oss``              ``qwen3_coder`` calls in ``<seed:tool_call>`` (ByteDance Seed-OSS)
========================  ==================================================================

The formats, the rules each parser keeps, and where each differs from vLLM's and SGLang's
parsers (with the reason) are written down in ``docs/tool_parsers.md``; the conformance corpus
in ``tests/conformance`` holds those references' own test cases.

(DeepSeek's tokens are spelled in ASCII here; see ``deepseek_v3`` for the real characters.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trajcore.domain.errors import ConfigError
from trajcore.domain.tool_parsers.base import ToolCallParser
from trajcore.domain.tool_parsers.deepseek_v3 import DeepSeekV3Parser
from trajcore.domain.tool_parsers.glm45 import Glm45Parser
from trajcore.domain.tool_parsers.granite import GraniteParser
from trajcore.domain.tool_parsers.hermes import HermesParser
from trajcore.domain.tool_parsers.kimi_k2 import KimiK2Parser
from trajcore.domain.tool_parsers.llama3_json import Llama3JsonParser
from trajcore.domain.tool_parsers.mistral import MistralParser
from trajcore.domain.tool_parsers.pythonic import PythonicParser
from trajcore.domain.tool_parsers.qwen3_coder import Qwen3CoderParser

__all__ = [
    "PARSER_NAMES",
    "DeepSeekV3Parser",
    "Glm45Parser",
    "GraniteParser",
    "HermesParser",
    "KimiK2Parser",
    "Llama3JsonParser",
    "MistralParser",
    "PythonicParser",
    "Qwen3CoderParser",
    "ToolCallParser",
    "get_parser",
]

_FACTORIES: Mapping[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "deepseek_v3": DeepSeekV3Parser,
    "deepseek_v31": lambda: DeepSeekV3Parser(render_style="v31"),
    "qwen": lambda: HermesParser(family="qwen"),
    "kimi_k2": KimiK2Parser,
    "glm45": Glm45Parser,
    "pythonic": PythonicParser,
    "llama4_pythonic": lambda: PythonicParser(family="llama4_pythonic"),
    "granite": GraniteParser,
    "seed_oss": lambda: Qwen3CoderParser(family="seed_oss"),
}

PARSER_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""The names ``get_parser`` knows, in a stable order."""


def get_parser(name: str) -> ToolCallParser:
    """The parser registered as ``name``.

    Raises:
        ConfigError: ``name`` is not one of ``PARSER_NAMES`` (field ``tool_call_parser``; the
            reason lists the known names).
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(PARSER_NAMES)
        raise ConfigError("tool_call_parser", f"unknown parser {name!r}; known: {known}")
    return factory()
