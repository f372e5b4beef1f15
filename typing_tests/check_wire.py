"""The wire codec returns the type it is asked for."""

from __future__ import annotations

from typing import assert_type

from trajcore.adapters.wire import structure
from trajcore.domain.messages import Message
from trajcore.domain.sampling import TokenCompletion
from trajcore.domain.tools import ToolResult


def check_structure_is_typed(data: object) -> None:
    assert_type(structure(data, Message), Message)
    assert_type(structure(data, ToolResult), ToolResult)
    assert_type(structure(data, TokenCompletion), TokenCompletion)
