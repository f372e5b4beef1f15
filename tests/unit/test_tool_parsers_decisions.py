"""Parser families' decisions the family tests check only in part (found by mutation testing):
each named here with the family it belongs to."""

from __future__ import annotations

from trajcore.domain.tool_parsers import HermesParser
from trajcore.domain.turns import ParseProblem


def test_hermes_an_empty_closed_call_is_refused_as_empty_with_its_text() -> None:
    """Pins Hermes' refusal of a call with no body: ``empty tool call`` when it was closed (a
    cut-off one is truncated), and the problem keeps the call as written."""
    turn = HermesParser().parse("Hi.\n<tool_call>\n \n</tool_call>")
    assert turn.content == "Hi."
    assert turn.errors == (
        ParseProblem(
            index=0,
            raw="<tool_call>\n \n</tool_call>",
            reason="empty tool call @ call",
            call_id="call_0",
        ),
    )
    cut = HermesParser().parse("<tool_call>\n ")
    assert [(p.raw, p.reason) for p in cut.errors] == [("<tool_call>\n ", "truncated JSON @ call")]
