"""Converters that freeze an iterable into a tuple, one per element type, for ``attrs.field``.

mypy's attrs plugin types an ``__init__`` parameter from the converter's first parameter, so a
generic converter would leave the element type unsolved; each element type gets one typed function
here. The element types are imported for type checking only, so any domain module, including those
that define them, can import this one without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajcore.domain.slot_protocol import ExecuteCall
    from trajcore.domain.tools import ToolCall, ToolResult
    from trajcore.domain.turns import ParseProblem


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
