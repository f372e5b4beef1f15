"""Converters that freeze an iterable into a tuple, one per element type, for ``attrs.field``.

mypy's attrs plugin types an ``__init__`` parameter from the converter's first parameter, so a
generic converter would leave the element type unsolved; each element type gets one typed function
here. The element types are imported for type checking only, so any domain module, including those
that define them, can import this one without an import cycle. ``command_words`` reads a
command-line setting (a string or a sequence) as words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from trajcore.domain.errors import ConfigError

if TYPE_CHECKING:
    from trajcore.domain.slot_protocol import ExecuteCall
    from trajcore.domain.tools import ToolCall, ToolResult
    from trajcore.domain.turns import ParseProblem


def command_words(value: object, field: str = "command") -> tuple[str, ...]:
    """A command line setting as words: a string split on whitespace, or a sequence's items as
    text. Raises ``ConfigError`` naming ``field`` for anything else."""
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, Sequence):
        return tuple(str(word) for word in value)
    raise ConfigError(field, f"expected words, got {value!r}")


def ints(values: Iterable[int]) -> tuple[int, ...]:
    """The integers, as a tuple."""
    return tuple(values)


def floats(values: Iterable[float]) -> tuple[float, ...]:
    """The floats, as a tuple."""
    return tuple(values)


def strs(values: Iterable[str]) -> tuple[str, ...]:
    """The strings, as a tuple."""
    return tuple(values)


def tool_calls(values: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    """The tool calls, as a tuple."""
    return tuple(values)


def tool_results(values: Iterable[ToolResult]) -> tuple[ToolResult, ...]:
    """The tool results, as a tuple."""
    return tuple(values)


def parse_problems(values: Iterable[ParseProblem]) -> tuple[ParseProblem, ...]:
    """The parse problems, as a tuple."""
    return tuple(values)


def execute_calls(values: Iterable[ExecuteCall]) -> tuple[ExecuteCall, ...]:
    """The slot-server calls, as a tuple."""
    return tuple(values)
