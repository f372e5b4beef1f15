"""The domain's converters: iterables frozen into tuples, and command-line settings as words."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trajcore.domain import converters
from trajcore.domain.errors import ConfigError


def test_a_command_line_string_is_split_on_whitespace() -> None:
    assert converters.command_words("  nomad  agent\t-dev\n") == ("nomad", "agent", "-dev")


def test_a_command_line_sequence_keeps_its_items_as_words() -> None:
    assert converters.command_words(["sh", "-c", "echo a b", 3]) == ("sh", "-c", "echo a b", "3")


def test_anything_else_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as caught:
        converters.command_words(7)
    assert str(caught.value) == "expected words, got 7 @ command"
    with pytest.raises(ConfigError) as caught:
        converters.command_words(None, "engine_options")
    assert str(caught.value) == "expected words, got None @ engine_options"


def _items() -> Iterator[int]:
    yield from (1, 2, 3)


@pytest.mark.parametrize(
    "convert",
    [
        converters.ints,
        converters.floats,
        converters.strs,
        converters.tool_calls,
        converters.tool_results,
        converters.parse_problems,
        converters.execute_calls,
    ],
)
def test_each_tuple_converter_freezes_any_iterable_in_order(
    convert: Callable[[Any], tuple[Any, ...]],
) -> None:
    assert convert(_items()) == (1, 2, 3)
    assert convert([]) == ()
