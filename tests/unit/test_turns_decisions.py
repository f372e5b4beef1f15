"""The decisions of a parsed turn: the error a refused call is answered with, and what passes
between a turn and the assistant message that holds it."""

from __future__ import annotations

from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall
from trajcore.domain.turns import ParsedTurn, ParseProblem

CALL = ToolCall(id="call_1", name="read_file", arguments={"path": "a.txt"})


def test_a_refused_call_is_answered_naming_its_position_its_tool_and_the_reason() -> None:
    """The model's error names the call by its position and, when it was read, its tool."""
    problem = ParseProblem(index=2, raw="<x>", reason="truncated JSON @ arguments", name="bash")
    assert problem.message_for_model() == (
        "Error: tool call 2 (bash) was not run: truncated JSON @ arguments"
    )


def test_a_refused_call_whose_name_was_not_read_is_named_by_its_position_only() -> None:
    """Without a readable name (none, or empty) the error adds nothing after the position."""
    for name in (None, ""):
        problem = ParseProblem(index=0, raw="{", reason="truncated JSON", name=name)
        assert problem.message_for_model() == "Error: tool call 0 was not run: truncated JSON"


def test_a_turn_becomes_the_assistant_message_with_its_content_calls_and_reasoning() -> None:
    """The conversation keeps the turn's visible text, its well-formed calls in order and its
    reasoning; the problems are answered separately and are not part of the message."""
    other = ToolCall(id="call_2", name="bash", arguments={"cmd": "ls"})
    turn = ParsedTurn(
        content="Let me look.",
        reasoning="The file may exist.",
        calls=(CALL, other),
        errors=(ParseProblem(index=2, raw="{", reason="truncated JSON"),),
    )
    assert turn.to_message() == Message(
        role="assistant",
        content="Let me look.",
        tool_calls=(CALL, other),
        reasoning="The file may exist.",
    )


def test_a_server_parsed_message_becomes_a_turn_with_its_content_calls_and_reasoning() -> None:
    """In OpenAI mode the server parsed the calls: the turn takes the message's content,
    reasoning and calls as they are, and has no problems of its own."""
    message = Message.assistant("Done.", tool_calls=(CALL,), reasoning="All read.")
    turn = ParsedTurn.from_message(message)
    assert turn == ParsedTurn(content="Done.", reasoning="All read.", calls=(CALL,), errors=())
    assert turn.to_message() == message
