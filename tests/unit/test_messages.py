"""Message, tool-call and tool-spec values refuse nonsense when built."""

from __future__ import annotations

import pytest
from hypothesis import given

from tests import strategies as s
from trajcore.domain.errors import ConfigError, ToolArgumentError
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec

BASH = ToolSpec(
    name="bash",
    description="run a command",
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "env": {"type": "object", "properties": {}},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "files": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)


def test_only_assistant_messages_carry_tool_calls() -> None:
    call = ToolCall(id="c0", name="bash", arguments={"command": "ls"})
    with pytest.raises(ConfigError) as info:
        Message(role="user", content="hi", tool_calls=(call,))
    assert info.value.field == "tool_calls"


def test_tool_messages_name_their_call() -> None:
    with pytest.raises(ConfigError) as info:
        Message(role="tool", content="out")
    assert info.value.field == "tool_call_id"


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        Message(role="robot", content="x")  # type: ignore[arg-type]
    assert "unknown role" in str(info.value)


def test_tool_call_arguments_must_be_a_json_object() -> None:
    with pytest.raises(ToolArgumentError) as info:
        ToolCall(id="c", name="bash", arguments=["ls"])  # type: ignore[arg-type]
    assert info.value.field == "arguments"
    with pytest.raises(ToolArgumentError):
        ToolCall(id="c", name="bash", arguments={"x": float("inf")})


def test_tool_spec_names_and_schemas_are_checked() -> None:
    with pytest.raises(ConfigError, match="not 1-64"):
        ToolSpec(name="has space")
    with pytest.raises(ConfigError) as info:
        ToolSpec(name="t", parameters={"type": "array"})
    assert info.value.field == "parameters.type"
    with pytest.raises(ConfigError) as info:
        ToolSpec(name="t", parameters={"type": "object", "properties": {"a": {"type": "strin"}}})
    assert info.value.field == "parameters.properties.a.type"


def test_argument_validation_reports_every_problem_with_its_path() -> None:
    problems = BASH.validate_arguments(
        {"timeout": "10", "mode": "medium", "files": ["a", 3], "extra": 1}
    )
    assert sorted(map(str, problems)) == [
        "expected integer, got string @ $.timeout",
        "expected string, got integer @ $.files[1]",
        "must be one of ['fast', 'slow'] @ $.mode",
        "required @ $.command",
        "unexpected property @ $.extra",
    ]
    assert BASH.validate_arguments({"command": "ls", "timeout": 3, "files": []}) == []


def test_booleans_are_not_integers_and_integral_floats_are() -> None:
    assert BASH.validate_arguments({"command": "x", "timeout": True})
    assert BASH.validate_arguments({"command": "x", "timeout": 3.0}) == []
    assert BASH.validate_arguments({"command": "x", "timeout": 3.5})


def test_check_call_raises_with_the_tool_and_field() -> None:
    with pytest.raises(ToolArgumentError) as info:
        BASH.check_call(ToolCall(id="c", name="bash", arguments={"timeout": 1}))
    assert info.value.field == "bash.command"
    assert info.value.reason == "required"


def test_failure_results_tell_the_model_why() -> None:
    call = ToolCall(id="c9", name="bash", arguments={})
    result = ToolResult.failure(call, ToolOutcome.REJECTED, "required @ bash.command")
    assert not result.ok
    assert result.content == "Error: required @ bash.command"
    assert Message.tool(result).tool_call_id == "c9"
    with pytest.raises(ValueError, match="non-OK"):
        ToolResult.failure(call, ToolOutcome.OK, "fine")


def test_a_success_answers_its_call_with_its_content() -> None:
    result = ToolResult.success(ToolCall(id="c9", name="bash", arguments={}), "done")
    assert (result.call_id, result.name, result.outcome) == ("c9", "bash", ToolOutcome.OK)
    assert (result.content, result.error) == ("done", None)


def test_a_broken_batch_is_an_infra_error_for_each_call_in_order() -> None:
    calls = [ToolCall(id=f"c{i}", name="bash", arguments={}) for i in range(3)]
    results = ToolResult.infra_errors(calls, "connection reset")
    assert [(r.call_id, r.outcome, r.error) for r in results] == [
        (c.id, ToolOutcome.INFRA_ERROR, "connection reset") for c in calls
    ]
    assert ToolResult.infra_errors([], "connection reset") == []


def test_an_unknown_tool_is_rejected_naming_it_at_name() -> None:
    result = ToolResult.unknown_tool(ToolCall(id="c1", name="nope", arguments={}))
    assert (result.call_id, result.outcome) == ("c1", ToolOutcome.REJECTED)
    assert result.error == "unknown tool 'nope' @ name"


@given(s.json_objects)
def test_generated_json_is_json(value: object) -> None:
    assert check_json(value) is None


def test_check_json_names_the_first_fault() -> None:
    assert check_json({"a": [1, {"b": object()}]}) == "object is not a JSON value @ $.a[1].b"
    assert check_json({1: 2}) == "object key 1 is not a string @ $"


@given(s.messages())
def test_chat_dicts_keep_tool_calls_in_order(message: Message) -> None:
    out = message.to_chat_dict(arguments_as_json=True)
    assert out["role"] == message.role
    calls = out.get("tool_calls", [])
    assert isinstance(calls, list)
    assert [c["id"] for c in calls if isinstance(c, dict)] == [c.id for c in message.tool_calls]


@given(s.tool_specs())
def test_specs_accept_arguments_built_from_their_own_required_fields(spec: ToolSpec) -> None:
    samples = {
        "string": "x",
        "integer": 1,
        "number": 1.5,
        "boolean": True,
        "array": ["x"],
        "object": {},
    }
    props = spec.parameters["properties"]
    assert isinstance(props, dict)
    args: dict[str, object] = {}
    for name, schema in props.items():
        assert isinstance(schema, dict)
        enum = schema.get("enum")
        args[name] = enum[0] if isinstance(enum, list) else samples[str(schema["type"])]
    assert spec.validate_arguments(args) == []


@pytest.mark.parametrize(
    "name", ["ToolSpec", "ToolOutcome", "JSON", "check_json", "BuiltinArgumentValidator"]
)
def test_the_tool_and_json_values_have_one_home_not_messages(name: str) -> None:
    """No shim: the tool values, JSON and the schema checker import from their own modules."""
    import importlib

    messages = importlib.import_module("trajcore.domain.messages")
    assert not hasattr(messages, name)


def _arguments_of(chat: JSONObject) -> list[JSON]:
    calls = chat["tool_calls"]
    assert isinstance(calls, list)
    out: list[JSON] = []
    for call in calls:
        assert isinstance(call, dict)
        function = call["function"]
        assert isinstance(function, dict)
        out.append(function["arguments"])
    return out


def test_a_chat_dict_gives_templates_a_calls_raw_arguments_and_the_wire_its_object() -> None:
    kept = ToolCall(id="a", name="write_file", arguments={}, raw_arguments='{"path": "a.txt"')
    plain = ToolCall(id="b", name="write_file", arguments={"path": "b.txt"})
    message = Message.assistant("", tool_calls=[kept, plain])
    assert _arguments_of(message.to_chat_dict()) == ['{"path": "a.txt"', {"path": "b.txt"}]
    wire = _arguments_of(message.to_chat_dict(arguments_as_json=True))
    assert wire == ["{}", '{"path":"b.txt"}']
