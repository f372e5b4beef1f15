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

The registry is open: ``register_parser(name, factory)`` makes a parser of another family
selectable as ``tool_call_parser: name``, exactly as the built-ins above are registered (a
package can also name its factory as an entry point in group ``trajcore.tool_parsers``; the
Atropos entrypoint reads those, the domain reads no package metadata). ``parser_names()`` lists
every registered name, ``PARSER_NAMES`` the built-ins.

The formats, the rules each parser keeps, and where each differs from vLLM's and SGLang's
parsers (with the reason) are written down in ``docs/tool_parsers.md``; the conformance corpus
in ``tests/conformance`` holds those references' own test cases.

(DeepSeek's tokens are spelled in ASCII here; see ``deepseek_v3`` for the real characters.)
"""

from __future__ import annotations

from collections.abc import Callable

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

__all__ = ["PARSER_NAMES", "ParserFactory", "get_parser", "parser_names", "register_parser"]

ParserFactory = Callable[[], ToolCallParser]
"""Makes a fresh parser; called once per ``get_parser``."""

_FACTORIES: dict[str, ParserFactory] = {}


def register_parser(name: str, factory: ParserFactory, *, replace: bool = False) -> None:
    """Make ``factory``'s parser selectable as ``tool_call_parser: name``.

    Raises:
        ConfigError: ``name`` is empty or holds whitespace, or is already registered and
            ``replace`` is false (field ``tool_call_parser``).
    """
    given: object = name  # callers outside trajcore may pass anything
    if not isinstance(given, str) or not name or name != "".join(name.split()):
        raise ConfigError("tool_call_parser", f"cannot register parser {name!r}: not a plain name")
    if name in _FACTORIES and not replace:
        raise ConfigError(
            "tool_call_parser",
            f"parser {name!r} is already registered (pass replace=True to override it)",
        )
    _FACTORIES[name] = factory


def parser_names() -> tuple[str, ...]:
    """Every registered name: the built-ins, then the others in the order registered."""
    return tuple(_FACTORIES)


register_parser("hermes", HermesParser)
register_parser("qwen3_coder", Qwen3CoderParser)
register_parser("llama3_json", Llama3JsonParser)
register_parser("mistral", MistralParser)
register_parser("deepseek_v3", DeepSeekV3Parser)
register_parser("deepseek_v31", lambda: DeepSeekV3Parser(render_style="v31"))
register_parser("qwen", lambda: HermesParser(family="qwen"))
register_parser("kimi_k2", KimiK2Parser)
register_parser("glm45", Glm45Parser)
register_parser("pythonic", PythonicParser)
register_parser("llama4_pythonic", lambda: PythonicParser(family="llama4_pythonic"))
register_parser("granite", GraniteParser)
register_parser("seed_oss", lambda: Qwen3CoderParser(family="seed_oss"))

PARSER_NAMES: tuple[str, ...] = parser_names()
"""trajcore's own parsers' names, in a stable order (``parser_names()`` adds registered ones)."""


def get_parser(name: str) -> ToolCallParser:
    """A fresh parser of the family registered as ``name``.

    Raises:
        ConfigError: ``name`` is not registered (field ``tool_call_parser``; the reason lists
            the registered names).
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(parser_names())
        raise ConfigError("tool_call_parser", f"unknown parser {name!r}; known: {known}")
    return factory()
