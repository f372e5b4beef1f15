"""Decisions of the Qwen3-Coder / Seed-OSS parser that its own tests check only in part (found
by mutation testing). Each test's docstring names the decision it pins."""

from __future__ import annotations

from trajcore.domain.json_values import JSONObject
from trajcore.domain.tool_parsers.base import TurnBuilder
from trajcore.domain.tool_parsers.qwen3_coder import Qwen3CoderParser, _Function, _Scan, read_text
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn


def _indexed(scan: _Scan) -> bool:
    return scan.indexed  # (a call, so that one assertion does not narrow the next)


def _scan(text: str) -> _Scan:
    return _Scan.of(text, wrapped=True, open_tag="<tool_call>", close_tag="</tool_call>")


def test_value_end_reads_a_value_that_nests_nothing_without_the_tag_index() -> None:
    """Pins ``_Scan.value_end``'s fast path: a value whose walk stays at depth 0 is decided by
    the plain walk and the text's tags are not indexed; once the index is built (a value that
    nests), later values are read over it, with the same ends."""
    text = (
        "<parameter=a>\nx\n</parameter>\n<parameter=b>\n<parameter=b>y</parameter>\n"
        "</parameter>\n</function>"
    )
    scan = _scan(text)
    function = _Function(known=None)
    first = len("<parameter=a>")
    assert scan.value_end(first, "a", {}, function) == (16, 28)
    assert not _indexed(scan)
    second = text.index("<parameter=b>") + len("<parameter=b>")
    closer = text.rindex("</parameter>")
    assert scan.value_end(second, "b", {"a": "x"}, function) == (closer, closer + 12)
    assert _indexed(scan)
    assert scan.value_end(first, "a", {}, function) == (16, 28)


def test_the_fallback_closer_of_one_tool_is_not_taken_for_another() -> None:
    """Pins that the skip pointers of the fallback closer search (a value whose nesting never
    balances ends at the first structural closer) are kept per tool: a closer before
    ``<parameter=b>`` is structural for a tool that has ``b`` and text for one that lacks it,
    so a search for the second tool, after one for the first passed that closer, still stops
    there."""
    text = (
        "<parameter=a><parameter=a><parameter=a>x</parameter><parameter=b>y</parameter></function>"
    )
    scan = _Scan.of(text, wrapped=False, open_tag="<tool_call>", close_tag="</tool_call>")
    start = len("<parameter=a>")
    first_closer = text.index("</parameter>")
    last_closer = text.rindex("</parameter>")
    without_b = _Function(known={"a": {}})
    with_b = _Function(known={"a": {}, "b": {}})
    assert scan.value_end(start, "a", {}, without_b) == (last_closer, last_closer + 12)
    assert scan.value_end(start, "a", {}, with_b) == (first_closer, first_closer + 12)


def test_seed_oss_reads_its_own_reasoning_tags_when_either_one_is_there() -> None:
    """Pins Seed-OSS's choice of reasoning tags: ``<seed:think>``'s pair as soon as the text
    holds either of them (only the closer when the template opened the block, only the opener
    when the block was cut off), ``<think>`` only when it holds neither."""
    parser = Qwen3CoderParser(family="seed_oss")
    assert parser.parse("r</seed:think>done") == ParsedTurn(content="done", reasoning="r")
    assert parser.parse("a<seed:think>r</think>") == ParsedTurn(content="a", reasoning="r</think>")
    assert parser.parse("<think>r</think>done") == ParsedTurn(content="done", reasoning="r")


def test_a_tool_whose_schema_names_no_properties_has_no_parameter_names() -> None:
    """Pins that a tool spec without ``properties`` knows no parameter names (not "any name"):
    a closer before ``<parameter=y>`` inside a value is then text, not the value's end."""
    tool = ToolSpec(name="f", parameters={"type": "object"})
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\nx</parameter>\n<parameter=y>z\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    turn = Qwen3CoderParser().parse(text, tools=[tool])
    assert turn.errors == ()
    assert [c.arguments for c in turn.calls] == [{"a": "x</parameter>\n<parameter=y>z"}]


def test_a_refused_call_in_a_block_keeps_the_text_from_its_block_opener() -> None:
    """Pins that a refused call's text starts at its ``<tool_call>``, not at the start of the
    completion (the content before it is not part of the call)."""
    text = "Working.\n<tool_call>\n<function=f>\n<parameter=a"
    turn = Qwen3CoderParser().parse(text)
    assert [(p.raw, p.reason) for p in turn.errors] == [
        ("<tool_call>\n<function=f>\n<parameter=a", "truncated call @ arguments")
    ]
    assert turn.content == "Working."


def test_a_call_cut_off_after_its_values_is_truncated_at_the_function_naming_it() -> None:
    """Pins the refusal of a call whose text ends between its parameters: ``truncated call @
    function``, with the function's name and the call's text."""
    text = "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n"
    turn = Qwen3CoderParser().parse(text)
    assert [(p.raw, p.reason, p.name) for p in turn.errors] == [
        (text, "truncated call @ function", "f")
    ]


def test_a_call_refused_by_the_tool_checks_keeps_its_text_up_to_where_it_ends() -> None:
    """Pins the text of a call read whole but refused by the shared checks (an unknown tool):
    from its ``<tool_call>`` to its ``</function>``, or to the block's end when the function
    was not closed."""
    tools = [ToolSpec(name="f", parameters={"type": "object", "properties": {}})]
    closed = "<tool_call>\n<function=g>\n</function>"
    unclosed = "<tool_call>\n<function=h>\n"
    turn = Qwen3CoderParser().parse(f"{closed}\n</tool_call>{unclosed}</tool_call>", tools=tools)
    assert [(p.raw, p.reason) for p in turn.errors] == [
        (closed, "unknown tool 'g' @ name"),
        (unclosed, "unknown tool 'h' @ name"),
    ]


def test_text_between_parameters_is_passed_over() -> None:
    """Pins that text between a function's header and its parameters that is no markup is
    skipped to the next tag (past a ``<`` that opens none), in a call that opens the completion
    too (only a ``<tool_call>`` right there cuts the call off)."""
    text = (
        "<tool_call>\n<function=f>\nnote < this\n<parameter=a>\nx\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    turn = Qwen3CoderParser().parse(text)
    assert turn.errors == ()
    assert [(c.name, c.arguments) for c in turn.calls] == [("f", {"a": "x"})]
    # one character of text right before the tag
    turn = Qwen3CoderParser().parse(text.replace("note < this\n", "y"))
    assert [(c.name, c.arguments) for c in turn.calls] == [("f", {"a": "x"})]


def test_a_block_opener_outside_values_cuts_the_call_naming_its_function() -> None:
    """Pins that a ``<tool_call>`` between a function's parameters ends that call as ``truncated
    call @ function`` with the function's name and the text before the opener, and the next
    call is read."""
    text = "<tool_call>\n<function=f>\n<tool_call>\n<function=g>\n</function>\n</tool_call>"
    turn = Qwen3CoderParser().parse(text)
    assert [(p.raw, p.reason, p.name) for p in turn.errors] == [
        ("<tool_call>\n<function=f>\n", "truncated call @ function", "f")
    ]
    assert [c.name for c in turn.calls] == ["g"]


def test_a_broken_parameter_name_is_refused_naming_the_function() -> None:
    """Pins the refusal of a parameter whose name is broken off (by a newline before ``>``):
    ``expected '>' after the parameter name @ arguments``, with the function's name."""
    text = "<tool_call>\n<function=f>\n<parameter=a\nx\n</parameter>\n</function>\n</tool_call>"
    turn = Qwen3CoderParser().parse(text)
    assert [(p.reason, p.name) for p in turn.errors] == [
        ("expected '>' after the parameter name @ arguments", "f")
    ]


# ------------------------------------------------------------------- the index's skip pointers


def _literal_pairs(name: str, n: int) -> str:
    """A value opening ``<parameter=a>`` that holds ``n`` literal ``<parameter=NAME>`` pairs,
    each closer followed by text (so none is structural), then the function's end."""
    return "<parameter=a>" + f"<parameter={name}>q</parameter> t " * n + "</function>"


def _steps(scan: _Scan) -> int:
    return scan.tags.steps


def test_a_value_read_again_over_the_index_follows_the_pointers_its_first_read_left() -> None:
    """Pins that each search of a value's end over the index leaves skip pointers behind: the
    search for the next tag that may end a value (one per tool), the fallback closer's and the
    function end's. A second read of the same value then takes one step per search, where the
    first walked past every literal pair (a walk without its pointers would again, and the
    reads of many values would be quadratic)."""
    pairs = 20
    text = _literal_pairs("zz", pairs)  # zz: a name the tool lacks, so its pairs are text
    scan = _Scan.of(text, wrapped=False, open_tag="<tool_call>", close_tag="</tool_call>")
    function = _Function(known={"a": {}})
    start = len("<parameter=a>")
    end = text.index("</function>")
    assert scan.value_end(start, "a", {}, function) == (end, end)
    first = _steps(scan)
    assert first >= 3 * pairs
    assert scan.indexed_value_end(start, "a", {}, function) == (end, end)
    assert _steps(scan) - first <= 4


def test_the_values_of_one_function_share_its_skip_pointers() -> None:
    """Pins that a function's own skip pointers serve all of its values: what ends a value only
    shrinks as the names given grow, so the next parameter's search (another key, one more name
    given) passes in one step the literal pairs the first value's search passed."""
    pairs = 20
    text = _literal_pairs("a", pairs)  # pairs of the value's own name: literal, they nest
    scan = _Scan.of(text, wrapped=False, open_tag="<tool_call>", close_tag="</tool_call>")
    function = _Function(known={"a": {}, "b": {}})
    start = len("<parameter=a>")
    end = text.index("</function>")
    assert scan.value_end(start, "a", {}, function) == (end, end)
    first = _steps(scan)
    assert first >= 3 * pairs
    assert scan.indexed_value_end(start, "b", {"a": "x"}, function) == (end, end)
    assert _steps(scan) - first <= 5


def test_skip_pointers_are_shared_between_functions_only_while_few_names_are_given() -> None:
    """Pins the bound on the pointers shared between functions of one tool: they are keyed by
    the names given, and kept only for fewer than eight (``_SHARED_GIVEN``), so that a call
    with many parameters does not keep a table per prefix of them."""
    text = _literal_pairs("zz", 3)
    start = len("<parameter=a>")
    for given, shared in ((7, True), (8, False)):
        scan = _Scan.of(text, wrapped=False, open_tag="<tool_call>", close_tag="</tool_call>")
        names: JSONObject = {f"p{i}": "x" for i in range(given)}
        function = _Function(known={"a": {}})
        scan.indexed_value_end(start, "a", names, function)
        keys = [key for key in scan.tags.skips if isinstance(key, tuple) and key[0] == "ends"]
        assert len(keys) == (1 if shared else 0), given


def test_a_parameter_without_a_name_is_refused_naming_the_function() -> None:
    """Pins the refusal of ``<parameter=>``: ``missing parameter name @ arguments``, with the
    function's name, the call ending at its ``</function>``."""
    call = "<tool_call>\n<function=f>\n<parameter=>\nx\n</parameter>\n</function>"
    turn = Qwen3CoderParser().parse(call + "\n</tool_call>")
    assert [(p.raw, p.reason, p.name) for p in turn.errors] == [
        (call, "missing parameter name @ arguments", "f")
    ]


def test_a_value_its_schema_cannot_read_is_refused_naming_the_function_and_parameter() -> None:
    """Pins the refusal of a value the parameter's schema types and that does not read as its
    type (an object cut off): the fault at ``arguments.KEY``, the function's name, and the
    call's text to its ``</function>``."""
    tool = ToolSpec(
        name="f", parameters={"type": "object", "properties": {"x": {"type": "object"}}}
    )
    call = '<tool_call>\n<function=f>\n<parameter=x>\n{"a": 1\n</parameter>\n</function>'
    turn = Qwen3CoderParser().parse(call + "\n</tool_call>", tools=[tool])
    assert [(p.raw, p.reason, p.name) for p in turn.errors] == [
        (call, "truncated JSON @ arguments.x", "f")
    ]


def test_a_bare_function_is_a_call_from_its_opener_and_takes_a_stray_block_closer() -> None:
    """Pins the calls of a text without ``<tool_call>``: each ``<function=`` block is a call
    whose text starts at its opener (the content before it is not part of it), and a
    ``</tool_call>`` right after its ``</function>`` is part of the call, not content."""
    good = "Hi.\n<function=f>\n<parameter=x>\nq\n</parameter>\n</function>\n</tool_call>\nDone."
    turn = Qwen3CoderParser().parse(good)
    assert turn == ParsedTurn(
        content="Hi.\nDone.", calls=[ToolCall(id="call_0", name="f", arguments={"x": "q"})]
    )
    refused = "Hi.\n<function=f>\n<parameter=>\nq\n</parameter>\n</function>"
    turn = Qwen3CoderParser().parse(refused + "\n</tool_call>\nDone.")
    assert turn.content == "Hi.\nDone."
    assert [p.raw for p in turn.errors] == [refused.removeprefix("Hi.\n")]


def test_a_repeated_parameter_is_refused_naming_the_function() -> None:
    """Pins the refusal of a parameter given twice: ``repeated parameter @ arguments.KEY``
    with the function's name, the call ending at its ``</function>``."""
    call = (
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n<parameter=a>\ny\n"
        "</parameter>\n</function>"
    )
    turn = Qwen3CoderParser().parse(call + "\n</tool_call>")
    assert [(p.raw, p.reason, p.name) for p in turn.errors] == [
        (call, "repeated parameter @ arguments.a", "f")
    ]


def test_once_the_index_is_built_every_later_value_is_read_over_it() -> None:
    """Pins that the plain walk is tried only until the tag index is built: a value after the
    first that nests is read over the index even when it nests nothing (the two agree on its
    end; the index answers from what earlier walks left)."""
    values = 10
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\n<parameter=a>x</parameter>\n</parameter>\n"
        + "".join(f"<parameter=b{i}>\nv\n</parameter>\n" for i in range(values))
        + "</function>\n</tool_call>"
    )
    scan = _scan(text)
    builder = TurnBuilder.start(None, "call")
    read_text(builder, scan)
    assert [len(c.arguments) for c in builder.calls] == [1 + values]
    assert _steps(scan) >= values
