"""Every conformance case through ``get_parser(family).parse(text, tools)``.

A case agrees with its reference (same calls, the same content up to whitespace, and trajcore's
problems for the malformed calls the reference drops), or it names a difference that
``docs/tool_parsers.md`` documents and trajcore's documented result is asserted instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conformance.cases import CASES, Call, Case
from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser
from trajcore.domain.tools import ToolSpec
from trajcore.domain.turns import ParsedTurn

# Tools as the model sees them: their schemas enforced whole, as the env's tools are.
_VALIDATOR = JSONSchemaValidator()

DOC = Path(__file__).resolve().parents[2] / "docs" / "tool_parsers.md"
DIFFERENCE_HEADING = re.compile(r"^### `([a-z0-9-]+)`", re.MULTILINE)


def _parse(case: Case) -> ParsedTurn:
    tools = (
        None
        if case.tools is None
        else [
            ToolSpec(name=name, parameters=params, validator=_VALIDATOR)
            for name, params in case.tools
        ]
    )
    return get_parser(case.family).parse(case.text, tools=tools)


def _assert_result(
    turn: ParsedTurn, calls: tuple[Call, ...], content: str | None, problems: tuple[str, ...]
) -> None:
    assert [c.name for c in turn.calls] == [name for name, _ in calls]
    for got, (_, arguments) in zip(turn.calls, calls, strict=True):
        if arguments is not None:
            assert got.arguments == arguments
    if content is not None:
        # trajcore joins the text around calls with newlines; the references keep it as
        # written: content agrees when its words and their order agree.
        assert turn.content.split() == content.split()
    assert len(turn.errors) == len(problems), [p.reason for p in turn.errors]
    for problem, expected in zip(turn.errors, problems, strict=True):
        assert expected in problem.reason


@pytest.mark.parametrize("case", [c for c in CASES if c.difference is None], ids=lambda c: c.id)
def test_case_agrees_with_its_reference(case: Case) -> None:
    _assert_result(_parse(case), case.calls, case.content, case.problems)


@pytest.mark.parametrize("case", [c for c in CASES if c.difference is not None], ids=lambda c: c.id)
def test_case_differs_as_documented(case: Case) -> None:
    assert case.ours is not None, "a difference states trajcore's own result"
    assert case.difference in DIFFERENCE_HEADING.findall(DOC.read_text()), case.difference
    _assert_result(_parse(case), case.ours.calls, case.ours.content, case.ours.problems)


def test_every_documented_difference_has_a_case() -> None:
    documented = set(DIFFERENCE_HEADING.findall(DOC.read_text()))
    used = {c.difference for c in CASES if c.difference is not None}
    assert documented == used


def test_the_corpus_covers_every_family_and_names_its_sources() -> None:
    assert {c.family for c in CASES} == set(PARSER_NAMES)
    for case in CASES:
        assert case.repo
        assert case.file.startswith(("tests/", "test/"))
        assert case.file.endswith(".py")
        assert case.test
    assert len({c.id for c in CASES}) == len(CASES)
