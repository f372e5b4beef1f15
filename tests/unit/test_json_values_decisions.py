"""The decisions of the domain's JSON values: how a JSON Lines text is read, which text holds a
JSON object, how a value's type is named, and which trees ``check_json`` takes on its fast path
(``plain_json``) and which it walks with their paths."""

from __future__ import annotations

import collections
import enum
import math

import pytest

from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.json_values import (
    MAX_DEPTH,
    check_json,
    json_lines,
    json_object,
    json_type,
    json_value,
    plain_json,
)


def test_json_lines_numbers_each_object_by_its_line_from_one_skipping_blank_lines() -> None:
    """A blank (or whitespace-only) line is skipped but still counted, so the numbers are the
    lines a person finds in the file."""
    lines = ['{"a": 1}', "", "   ", '{"b": [2]}']
    assert list(json_lines(lines)) == [(1, {"a": 1}), (4, {"b": [2]})]


def test_json_lines_refuses_a_line_naming_its_number_and_why() -> None:
    """A line that is no JSON object stops the read with the line's number as the field."""
    with pytest.raises(InvalidInput) as caught:
        list(json_lines(['{"a": 1}', "", "[1, 2]"]))
    assert (caught.value.field, caught.value.reason) == ("line 3", "expected a JSON object")
    with pytest.raises(InvalidInput) as caught:
        list(json_lines(["{oops"]))
    assert caught.value.field == "line 1"
    assert caught.value.reason.startswith("not JSON: ")


def test_a_json_object_text_is_decoded_whole() -> None:
    """The object comes back as decoded, nested values included."""
    assert json_object('{"a": {"b": [1, 2.5, null, true]}, "c": "d"}', "body") == {
        "a": {"b": [1, 2.5, None, True]},
        "c": "d",
    }


def test_text_that_is_not_json_is_refused_with_the_decoders_reason_and_the_field() -> None:
    """The reason is the JSON decoder's own message, after ``not JSON: ``."""
    with pytest.raises(InvalidInput) as caught:
        json_object('{"a": ', "config.extra")
    assert (caught.value.field, caught.value.reason) == (
        "config.extra",
        "not JSON: Expecting value",
    )
    assert caught.value.__cause__ is None  # the decoder's traceback is not chained


def test_a_json_value_is_any_json_and_its_refusal_is_the_callers_error_at_the_field() -> None:
    """A setting's text may hold any JSON value; a refusal is the error the caller names
    (``ConfigError`` for a setting), at its field, with the decoder's own message."""
    assert json_value('[1, {"a": null}]', "flag") == [1, {"a": None}]
    assert json_value('"text"', "flag") == "text"
    with pytest.raises(ConfigError) as caught:
        json_value("[1,", "--env.flag", error=ConfigError)
    assert (caught.value.field, caught.value.reason) == (
        "--env.flag",
        "not JSON: Expecting value",
    )
    assert caught.value.__cause__ is None
    with pytest.raises(InvalidInput) as plain:
        json_value("{", "body")
    assert type(plain.value) is InvalidInput


def test_a_number_past_pythons_digit_limit_is_refused_naming_the_field() -> None:
    """``int()`` refuses a number of more than 4300 digits with a bare ``ValueError``; the text
    is refused as not JSON at its field (a JSON Lines line, a setting), never that error."""
    huge = "1" * 5000
    with pytest.raises(InvalidInput) as caught:
        json_object(f'{{"a": {huge}}}', "line 7")
    assert caught.value.field == "line 7"
    assert caught.value.reason.startswith("not JSON: Exceeds the limit")
    with pytest.raises(ConfigError) as setting:
        json_value(huge, "--env.flag", error=ConfigError)
    assert setting.value.field == "--env.flag"


@pytest.mark.parametrize("text", ["[]", "1", '"text"', "null", "true"])
def test_json_that_is_not_an_object_is_refused_naming_the_field(text: str) -> None:
    """Only an object is taken; any other JSON value is refused as such."""
    with pytest.raises(InvalidInput) as caught:
        json_object(text, "payload")
    assert (caught.value.field, caught.value.reason) == ("payload", "expected a JSON object")


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (3, "integer"),
        (2.5, "number"),
        ("s", "string"),
        ([], "array"),
        ({}, "object"),
        ((1, 2), "tuple"),
        (b"x", "bytes"),
        (float, "type"),
    ],
)
def test_a_values_type_is_its_json_schema_name_or_else_its_python_name(
    value: object, name: str
) -> None:
    """JSON values get JSON Schema's names (a bool is a boolean, not an integer); anything else
    is named by its Python type, so an error says what was given."""
    assert json_type(value) == name


class _Text(str):
    """A ``str`` subclass: JSON all the same, but not of the plain kind."""


class _Level(enum.IntEnum):
    """An ``int`` subclass, likewise."""

    LOW = 1


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        "",
        1.5,
        [],
        {},
        {"command": "ls -l", "timeout": 30, "env": None, "force": False},
        {"a": [1, 2.5, "x", None, True, {"b": [[], {}]}]},
    ],
)
def test_a_tree_of_exactly_the_built_in_json_types_is_plain_and_so_json(value: object) -> None:
    assert plain_json(value) is True
    assert check_json(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": 1, "b": math.inf}, "non-finite number inf @ $.b"),
        ([1, [math.nan]], "non-finite number nan @ $[1][0]"),
        ({"a": "x", 1: "y"}, "object key 1 is not a string @ $"),
        ({"a": (1, 2)}, "tuple is not a JSON value @ $.a"),
        ([1, {"a": [b"x"]}], "bytes is not a JSON value @ $[1].a[0]"),
    ],
)
def test_a_tree_that_is_not_json_is_not_plain_and_check_json_names_its_first_fault(
    value: object, problem: str
) -> None:
    assert plain_json(value) is False
    assert check_json(value) == problem


@pytest.mark.parametrize(
    "value",
    [
        _Text("ls"),
        {"command": _Text("ls")},
        [1, {"a": [_Text("x")]}],
        [_Text("x"), 2.5],  # its finite float walked with the paths, and taken
        {_Text("key"): 1},
        collections.OrderedDict(a=1),
        [_Level.LOW],
    ],
)
def test_json_built_of_subclasses_is_not_plain_yet_check_json_takes_it(value: object) -> None:
    assert plain_json(value) is False
    assert check_json(value) is None


def _nested(depth: int, leaf: object = 1) -> object:
    """``leaf`` inside ``depth`` arrays and objects, one inside the other, alternating."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_a_tree_nested_up_to_the_bound_is_plain_json(depth: int) -> None:
    assert plain_json(_nested(depth)) is True
    assert check_json(_nested(depth)) is None
    assert check_json(_nested(depth, leaf=_Text("x"))) is None  # the walk with paths takes it


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, MAX_DEPTH + 2, 5_000])
def test_a_tree_nested_past_the_bound_is_refused_at_the_level_past_it(depth: int) -> None:
    """Past ``MAX_DEPTH`` nested arrays and objects a tree is refused, naming where the level
    past the bound begins, however deep it goes (a few hundred levels used to end the walk in
    a RecursionError): by ``check_json`` with a reason, by ``plain_json`` with ``False``."""
    value = _nested(depth)
    assert plain_json(value) is False
    problem = check_json(value, "$.x")
    assert problem is not None
    reason, _, path = problem.partition(" @ ")
    assert reason == f"nested deeper than {MAX_DEPTH} arrays and objects"
    assert path.startswith("$.x")
    assert path.count("[0]") + path.count(".k") == MAX_DEPTH  # the first level past the bound


def test_the_bound_counts_arrays_and_objects_not_scalars() -> None:
    assert MAX_DEPTH == 100
    assert check_json({"a": [1, "x", None, 2.5]}) is None
    assert check_json(_nested(MAX_DEPTH, leaf="deep")) is None


@pytest.mark.parametrize("innermost", [{"k": 1}, [1], {}, []])
def test_one_array_or_object_past_the_bound_is_refused_whichever_it_is(innermost: object) -> None:
    """The level past the bound is refused whether it is an array or an object, empty or not;
    the same tree one level shallower is taken."""
    assert plain_json(_nested(MAX_DEPTH - 1, leaf=innermost)) is True
    assert plain_json(_nested(MAX_DEPTH, leaf=innermost)) is False
    assert check_json(_nested(MAX_DEPTH, leaf=innermost)) is not None
