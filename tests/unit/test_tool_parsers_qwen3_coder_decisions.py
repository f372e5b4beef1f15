"""Decisions of the Qwen3-Coder / Seed-OSS parser that its own tests check only in part (found
by mutation testing). Each test's docstring names the decision it pins."""

from __future__ import annotations

from trajcore.domain.tool_parsers.qwen3_coder import _Function, _Scan


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
    assert not scan.indexed
    second = text.index("<parameter=b>") + len("<parameter=b>")
    closer = text.rindex("</parameter>")
    assert scan.value_end(second, "b", {"a": "x"}, function) == (closer, closer + 12)
    assert scan.indexed
    assert scan.value_end(first, "a", {}, function) == (16, 28)
