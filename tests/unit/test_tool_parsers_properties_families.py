"""Properties of the parser families added beside the seed's five: round trips, cut-off calls.

The shared properties (any text parses without raising, think blocks, round trips for the
families whose render takes any call) run over every registered family in
``test_tool_parsers_properties``; this module adds what those cannot say for kimi_k2, glm45,
the Python call lists and Qwen3-Coder's markup-in-values rule.
"""

from __future__ import annotations

import ast
import json
import keyword

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_tool_parsers_properties import (
    Family,
    assert_indexes_consistent,
    call_lists,
    exact,
    free_text,
    json_values,
    specs_for,
)
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tool_parsers.pythonic import read_plain
from trajcore.domain.tools import ToolCall, ToolSpec

KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"

# ------------------------------------------------------------------------- Python call lists

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s)
)


def python_call_lists() -> st.SearchStrategy[list[ToolCall]]:
    """Calls whose names and argument keys are Python identifiers (all the format can write)."""

    def build(pairs: list[tuple[str, JSONObject]]) -> list[ToolCall]:
        return [
            ToolCall(id=f"call_{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(pairs)
        ]

    args = st.dictionaries(identifiers, json_values(free_text()), max_size=4)
    return st.lists(
        st.tuples(identifiers, args), min_size=0, max_size=4, unique_by=lambda p: p[0]
    ).map(build)


@pytest.mark.parametrize("family", ["pythonic", "llama4_pythonic"])
@given(calls=python_call_lists(), content=free_text("<[{"), with_tools=st.booleans())
def test_python_call_lists_round_trip(
    family: str, calls: list[ToolCall], content: str, with_tools: bool
) -> None:
    parser = get_parser(family)
    turn = parser.parse(
        parser.render(calls, content=content), tools=specs_for(calls) if with_tools else None
    )
    assert exact(turn.calls) == exact(calls)
    assert turn.errors == ()
    assert turn.content == content.strip()


@pytest.mark.parametrize("key", ["a-b", "1x", "class", "x.y"])
def test_python_call_lists_refuse_to_render_keys_python_cannot_write(key: str) -> None:
    call = ToolCall(id="call_0", name="f", arguments={key: 1})
    with pytest.raises(ValueError, match="not a Python identifier"):
        get_parser("pythonic").render([call])


@given(calls=python_call_lists().filter(bool), data=st.data())
def test_a_cut_off_python_call_list_is_one_problem(
    calls: list[ToolCall], data: st.DataObject
) -> None:
    parser = get_parser("pythonic")
    text = parser.render(calls)
    text = text[: data.draw(st.integers(text.index("(") + 1, len(text) - 1), "cut")]
    turn = parser.parse(text)
    assert turn.calls == ()
    assert [p.index for p in turn.errors] == [0]
    assert turn.errors[0].reason in ("truncated call @ call",) or turn.errors[0].reason.startswith(
        "invalid Python"
    )


# ------------------------------------------------------------------- kimi_k2 and glm45 mixes


def _kimi_piece(c: ToolCall) -> tuple[str, int, int]:
    text = get_parser("kimi_k2").render([c])[len(KIMI_SECTION_BEGIN) : -len(KIMI_SECTION_END)]
    return text, len("<|tool_call_begin|>"), text.rindex("}")


def _glm_piece(c: ToolCall) -> tuple[str, int, int]:
    text = get_parser("glm45").render([c])
    return text, len("<tool_call>"), len(text) - 1


FAMILIES = {
    "kimi_k2": Family(
        parser=get_parser("kimi_k2"),
        piece=_kimi_piece,
        join=lambda pieces: KIMI_SECTION_BEGIN + "".join(pieces) + KIMI_SECTION_END,
    ),
    "glm45": Family(parser=get_parser("glm45"), piece=_glm_piece, join="\n".join),
}


@pytest.mark.parametrize("family_name", list(FAMILIES))
@given(data=st.data())
def test_good_and_cut_off_calls_mixed(family_name: str, data: st.DataObject) -> None:
    family = FAMILIES[family_name]
    calls = data.draw(call_lists(family.text, min_size=1), label="calls")
    bad = data.draw(st.lists(st.booleans(), min_size=len(calls), max_size=len(calls)), "bad")
    pieces = []
    for c, is_bad in zip(calls, bad, strict=True):
        text, low, high = family.piece(c)
        pieces.append(text[: data.draw(st.integers(low, high), "cut")] if is_bad else text)
    turn = family.parser.parse(family.join(pieces), tools=specs_for(calls))
    good = [c for c, is_bad in zip(calls, bad, strict=True) if not is_bad]
    assert exact(turn.calls) == exact(good)
    assert [p.index for p in turn.errors] == [i for i, is_bad in enumerate(bad) if is_bad]
    assert_indexes_consistent(turn)
    for problem in turn.errors:
        assert problem.name is None or calls[problem.index].name.startswith(problem.name)


# ------------------------------------------------------------ Qwen3-Coder: markup in values

NESTED_CALL = st.builds(
    lambda name, key, value: (
        f"<tool_call>\n<function={name}>\n<parameter={key}>\n{value}\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    st.sampled_from(["write_file", "other"]),
    st.sampled_from(["not_a_parameter", "zz"]),
    free_text(),
)
VALUE_PIECES = st.lists(
    NESTED_CALL | free_text() | st.just("x </parameter> more text") | st.just("</tool_call> x"),
    max_size=5,
).map("".join)


@given(path=free_text().filter(lambda s: s.strip() == s and s != ""), content=VALUE_PIECES)
def test_qwen3_coder_values_holding_literal_calls_come_back_verbatim(
    path: str, content: str
) -> None:
    spec = ToolSpec(
        name="write_file",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    )
    call = ToolCall(id="call_0", name="write_file", arguments={"path": path, "content": content})
    parser = get_parser("qwen3_coder")
    turn = parser.parse(parser.render([call]), tools=[spec])
    assert exact(turn.calls) == exact([call])
    assert turn.errors == ()


@given(calls=call_lists(free_text(), min_size=1), data=st.data())
def test_qwen3_coder_call_cut_anywhere_at_the_end_is_one_problem(
    calls: list[ToolCall], data: st.DataObject
) -> None:
    parser = get_parser("qwen3_coder")
    last = parser.render(calls[-1:])
    end = last.index("</function>") + len("</function>") - 1
    cut = data.draw(st.integers(len("<tool_call>"), end), "cut")
    text = parser.render(calls[:-1], content="Working.") + "\n" + last[:cut]
    turn = parser.parse(text, tools=specs_for(calls))
    assert exact(turn.calls) == exact(calls[:-1])
    assert [p.index for p in turn.errors] == [len(calls) - 1]
    assert turn.errors[0].reason.startswith("truncated call @ ")
    assert turn.content == "Working."


# --------------------------------------------------------------------- markup soup, new families

MARKUP = [
    KIMI_SECTION_BEGIN, KIMI_SECTION_END, "<|tool_call_begin|>", "<|tool_call_end|>",
    "<|tool_call_argument_begin|>", "functions.", ":0", "<tool_call>", "</tool_call>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<function=", "</function>",
    "<parameter=", "</parameter>", ">", "<|python_start|>", "<|python_end|>", "[", "]", "(",
    ")", "=", "'", '"', ",", "{", "}", "x", "f", "1", "None", "\n", " ", "1e999", "b'", "**",
]  # fmt: skip
soup = st.lists(st.sampled_from(MARKUP) | st.text(max_size=3), max_size=40).map("".join)


@pytest.mark.parametrize(
    "family", ["kimi_k2", "glm45", "pythonic", "llama4_pythonic", "qwen3_coder"]
)
@given(text=soup, with_tools=st.booleans())
def test_markup_soup_never_raises(family: str, text: str, with_tools: bool) -> None:
    tools = [
        ToolSpec(
            name="f",
            parameters={"type": "object", "properties": {"x": {"type": ["integer", "null"]}}},
        )
    ]
    turn = get_parser(family).parse(text, tools=tools if with_tools else None, id_prefix="t")
    assert_indexes_consistent(turn, "t")


# ---------------------------------------------------- plain-shape reader agrees with Python


def _python_oracle(source: str) -> list[tuple[str, JSON]] | None:
    """What Python itself reads from a call list: ``(name, arguments)``; ``None`` if not that."""
    try:  # whitespace before the list is no indentation to the reader (nor to ``eval``)
        tree = ast.parse(source.lstrip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls: list[tuple[str, JSON]] = []
    for element in tree.body.elts:
        if not isinstance(element, ast.Call) or element.args:
            return None
        name = ast.unparse(element.func)
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in element.keywords if k.arg}
        except (ValueError, SyntaxError, TypeError):
            return None
        calls.append((name, json.loads(json.dumps(arguments))))
    return calls


PLAIN_PIECES = [
    "[", "]", "(", ")", "{", "}", ",", "=", ":", " ", "\n", "f", "g.h", "x", "y", "'a'", '"b"',
    "'it''s'", "'\\n'", "1", "-2", "3.5", "1e3", "1e999", "007", "1_0", "True", "None", "if",
    "r'x'", "(1,)", "#", "\\", "[f(x=1)]", "f(x=", "),",
]  # fmt: skip


@given(calls=python_call_lists())
def test_plain_reader_reads_rendered_lists_as_python_does(calls: list[ToolCall]) -> None:
    source = get_parser("pythonic").render(calls) or "[f()]"
    plain = read_plain(source)
    oracle = _python_oracle(source)
    if plain is not None:
        assert [(n, a) for n, a, _ in plain] == oracle


@given(source=st.lists(st.sampled_from(PLAIN_PIECES), max_size=25).map("".join))
def test_plain_reader_never_reads_what_python_reads_differently(source: str) -> None:
    plain = read_plain(source)
    if plain is not None:
        assert [(n, a) for n, a, _ in plain] == _python_oracle(source)
        assert all(source[source.index(raw) :].startswith(raw) for _, _, raw in plain)


@given(calls=call_lists(free_text(), min_size=1), data=st.data())
def test_granite_array_cut_anywhere_keeps_the_complete_calls_before_the_cut(
    calls: list[ToolCall], data: st.DataObject
) -> None:
    parser = get_parser("granite")
    text = parser.render(calls, content="Checking.")
    start = text.index("[")
    cut = data.draw(st.integers(start + 1, len(text) - 1), "cut")
    turn = parser.parse(text[:cut], tools=specs_for(calls))
    assert exact(turn.calls) == exact(calls[: len(turn.calls)])
    assert len(turn.errors) <= 1
    assert_indexes_consistent(turn)
    assert turn.content == "Checking."
