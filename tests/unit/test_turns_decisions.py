"""The decisions of a parsed turn: the error a refused call is answered with, and what passes
between a turn and the assistant message that holds it."""

from __future__ import annotations

import attrs

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


def _call(call_id: str, name: str = "bash") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments={"command": call_id})


def _problem(index: int, call_id: str | None, name: str | None = "bash") -> ParseProblem:
    return ParseProblem(index=index, raw="{", reason="truncated JSON @ arguments", name=name,
                        call_id=call_id)  # fmt: skip


def test_a_turn_with_distinct_ids_is_itself() -> None:
    turn = ParsedTurn(calls=(_call("a"), _call("b")), errors=(_problem(2, "c"),))
    assert turn.with_distinct_ids() is turn


def test_a_repeated_id_is_renamed_by_its_position_in_the_models_order() -> None:
    """Pins the renaming: good calls take the positions the problems leave free, a later repeat
    gets ``<id>_<position>`` (again until new), and problems keep their positions."""
    turn = ParsedTurn(
        calls=(_call("x"), _call("x"), _call("x_2")),
        errors=(_problem(1, "x"),),
    )
    distinct = turn.with_distinct_ids()
    # positions: call x at 0, problem x at 1, call x at 2, call x_2 at 3
    assert [c.id for c in distinct.calls] == ["x", "x_2", "x_2_3"]
    assert [p.call_id for p in distinct.errors] == ["x_1"]
    assert [c.arguments for c in distinct.calls] == [c.arguments for c in turn.calls]
    assert distinct.errors[0].index == 1
    assert len({c.id for c in distinct.calls} | {"x_1"}) == 4


def test_a_problem_without_an_id_keeps_none_and_takes_no_id() -> None:
    turn = ParsedTurn(calls=(_call("a"), _call("a")), errors=(_problem(0, None),))
    distinct = turn.with_distinct_ids()
    assert [c.id for c in distinct.calls] == ["a", "a_2"]
    assert distinct.errors[0].call_id is None


def test_the_message_keeps_each_named_problem_with_an_id_in_the_models_order() -> None:
    """Pins ``message_calls``: without ``pair_problems`` (or problems) the good calls only;
    with it, each problem that has an id and a name as a call with empty arguments, placed at
    its index among the good calls."""
    calls = (_call("a"), _call("b"))
    errors = (_problem(0, "p0", "read_file"), _problem(2, "p2"), _problem(3, None),
              _problem(4, "p4", None))  # fmt: skip
    assert ParsedTurn(calls=calls, errors=errors).message_calls() == calls
    assert ParsedTurn(calls=calls, pair_problems=True).message_calls() == calls
    paired = ParsedTurn(calls=calls, errors=errors, pair_problems=True)
    assert paired.message_calls() == (
        ToolCall(id="p0", name="read_file"),
        _call("a"),  # position 1
        ToolCall(id="p2", name="bash"),
        _call("b"),  # position 5: 3 and 4 are problems without a message call
    )
    assert paired.to_message().tool_calls == paired.message_calls()


def test_renaming_follows_positions_not_ids_and_leaves_other_ids_alone() -> None:
    # positions: call b at 0, problem q at 1, call a at 2, call b at 3 (a repeat: renamed)
    turn = ParsedTurn(calls=(_call("b"), _call("a"), _call("b")), errors=(_problem(1, "q"),))
    distinct = turn.with_distinct_ids()
    assert [c.id for c in distinct.calls] == ["b", "a", "b_3"]
    assert [p.call_id for p in distinct.errors] == ["q"]
    paired = attrs.evolve(distinct, pair_problems=True)
    assert [c.id for c in paired.message_calls()] == ["b", "q", "a", "b_3"]


def test_a_problem_is_answered_by_a_rejection_naming_its_call_and_reason() -> None:
    from trajcore.domain.tools import ToolOutcome

    named = ParseProblem(index=1, raw="{", reason="truncated JSON @ arguments", name="bash",
                         call_id="c9")  # fmt: skip
    unnamed = ParseProblem(index=2, raw="?", reason="no tool name @ name")
    answer = named.rejection(turn=3)
    assert (answer.call_id, answer.name, answer.outcome) == ("c9", "bash", ToolOutcome.REJECTED)
    assert answer.error == "truncated JSON @ arguments"
    assert answer.content == "Error: tool call 1 (bash) was not run: truncated JSON @ arguments"
    other = unnamed.rejection(turn=3)
    assert (other.call_id, other.name, other.error) == ("invalid-3-2", "", "no tool name @ name")
