"""Messages: the decisions ``test_messages`` checks only in part (found by mutation testing):
each refused message's field and reason, what each constructor fills in, and every key of the
chat dict."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolResult

CALL = ToolCall(id="c1", name="write", arguments={"path": "ü.txt", "n": 2})


def _refusal(**fields: object) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        Message(**fields)  # type: ignore[arg-type]
    return caught.value.field, caught.value.reason


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        (
            {"role": "robot"},
            "role",
            "unknown role 'robot'; expected one of ['assistant', 'system', 'tool', 'user']",
        ),
        (
            {"role": "user", "tool_calls": (CALL,)},
            "tool_calls",
            "only assistant messages carry tool calls, not user",
        ),
        ({"role": "tool"}, "tool_call_id", "a tool message must name the call it answers"),
        (
            {"role": "tool", "tool_call_id": ""},
            "tool_call_id",
            "a tool message must name the call it answers",
        ),
        (
            {"role": "system", "reasoning": "hm"},
            "reasoning",
            "only assistant messages carry reasoning, not system",
        ),
        (
            {"role": "tool", "tool_call_id": "c1", "reasoning": ""},
            "reasoning",
            "only assistant messages carry reasoning, not tool",
        ),
    ],
)
def test_a_refused_message_names_its_field_and_why(
    fields: dict[str, object], field: str, reason: str
) -> None:
    assert _refusal(**fields) == (field, reason)


def test_each_role_is_a_message_and_an_assistant_may_carry_calls_and_reasoning() -> None:
    for role in ("system", "user", "assistant"):
        assert Message(role=role).role == role
    assert Message(role="tool", tool_call_id="c1").tool_call_id == "c1"
    message = Message(role="assistant", tool_calls=(CALL,), reasoning="")
    assert message.tool_calls == (CALL,)
    assert message.reasoning == ""


def test_the_constructors_fill_in_their_role_and_fields() -> None:
    assert Message.system("s") == Message(role="system", content="s")
    assert Message.user("u") == Message(role="user", content="u")
    assert Message.assistant() == Message(role="assistant")
    assert Message.assistant("a", tool_calls=[CALL], reasoning="r") == Message(
        role="assistant", content="a", tool_calls=(CALL,), reasoning="r"
    )
    result = ToolResult.success(CALL, "done")
    assert Message.tool(result) == Message(
        role="tool", content="done", tool_call_id="c1", name="write"
    )


def test_the_chat_dict_holds_exactly_the_fields_a_message_has() -> None:
    assert Message.user("hi").to_chat_dict() == {"role": "user", "content": "hi"}
    assistant = Message.assistant("a", tool_calls=[CALL], reasoning="")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "write", "arguments": CALL.arguments},
    }
    assert assistant.to_chat_dict() == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "",
        "tool_calls": [call],
    }
    as_json = assistant.to_chat_dict(arguments_as_json=True)
    assert as_json["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "write", "arguments": '{"path":"ü.txt","n":2}'},
        }
    ]
    tool = Message.tool(ToolResult.success(CALL, "done")).to_chat_dict()
    assert tool == {"role": "tool", "content": "done", "tool_call_id": "c1", "name": "write"}
