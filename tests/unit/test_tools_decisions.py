"""The decisions of the tool values: which calls and specs may exist, how a call's arguments are
written out and checked, and what a failed call tells the model."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from trajcore.domain.errors import ConfigError, InvalidInput, ToolArgumentError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.tool_schema import ArgumentCheck, ArgumentProblem
from trajcore.domain.tools import (
    ExecReport,
    SandboxBudget,
    ToolCall,
    ToolOutcome,
    ToolResult,
    ToolSpec,
    timeout_end,
)

CALL = ToolCall(id="c1", name="bash", arguments={"command": "ls"})


def test_a_calls_arguments_must_be_an_object_saying_what_came() -> None:
    with pytest.raises(ToolArgumentError) as caught:
        ToolCall(id="c", name="bash", arguments="ls")  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (
        "arguments",
        "expected a JSON object, got str",
    )


def test_a_calls_arguments_that_hold_no_json_value_are_refused_at_its_path() -> None:
    with pytest.raises(ToolArgumentError) as caught:
        ToolCall(id="c", name="bash", arguments={"a": {"b": math.nan}})
    assert (caught.value.field, caught.value.reason) == (
        "arguments",
        "non-finite number nan @ $.a.b",
    )


@pytest.mark.parametrize("arguments", [{1: "x"}, {"a": "x", 2: None}, {"a": 1.5, 3: True}])
def test_a_flat_object_with_a_key_that_is_no_string_is_refused(arguments: Any) -> None:
    """The flat objects decided without the tree walk are those of string keys only."""
    with pytest.raises(ToolArgumentError) as caught:
        ToolCall(id="c", name="bash", arguments=arguments)
    assert caught.value.field == "arguments"


def test_a_calls_arguments_are_written_as_compact_json_in_their_order_unescaped() -> None:
    """The text a chat template or a wire body gets: no spaces, keys as given, any character
    as itself."""
    call = ToolCall(id="c", name="t", arguments={"z": [1, {"b": None}], "a": "é\u4e2d"})
    assert call.arguments_json() == '{"z":[1,{"b":null}],"a":"é\u4e2d"}'


def test_a_failure_tells_the_model_why_and_keeps_what_the_command_did() -> None:
    report = ExecReport(exit_code=None, stderr="killed", timed_out=True)
    result = ToolResult.failure(CALL, ToolOutcome.TIMEOUT, "ran past 30 s", exec=report)
    assert result == ToolResult(
        call_id="c1",
        name="bash",
        outcome=ToolOutcome.TIMEOUT,
        content="Error: ran past 30 s",
        error="ran past 30 s",
        exec=report,
    )
    assert ToolResult.failure(CALL, ToolOutcome.TOOL_ERROR, "x").exec is None


def test_a_result_answering_another_call_keeps_every_other_field() -> None:
    """How a slot's answer goes back under the model's own call id (``ToolRouter``)."""
    report = ExecReport(exit_code=3, stdout="out", stderr="err", duration_s=0.5, sandboxed=True)
    result = ToolResult(
        call_id="c1#4", name="bash", outcome=ToolOutcome.REJECTED, content="Error: x",
        error="x", exec=report, sandbox_budget=SandboxBudget.DISK, lease_refused=True,
    )  # fmt: skip
    # Every field differs from its default, so a field that answering() leaves out shows here.
    assert all(getattr(result, field.name) != field.default for field in attrs.fields(ToolResult))
    answer = result.answering("c1")
    assert answer == attrs.evolve(result, call_id="c1")
    assert answer.call_id == "c1"
    assert result.call_id == "c1#4"


def test_a_failure_needs_an_outcome_other_than_ok() -> None:
    with pytest.raises(ValueError, match=r"^failure\(\) needs a non-OK outcome$"):
        ToolResult.failure(CALL, ToolOutcome.OK, "fine")


def test_a_broken_batch_answers_each_call_as_an_infra_failure_with_the_reason() -> None:
    other = ToolCall(id="c2", name="read_file", arguments={"path": "a"})
    assert ToolResult.infra_errors([CALL, other], "server gone") == [
        ToolResult.failure(CALL, ToolOutcome.INFRA_ERROR, "server gone"),
        ToolResult.failure(other, ToolOutcome.INFRA_ERROR, "server gone"),
    ]


def test_a_call_to_a_tool_not_offered_is_rejected_naming_the_tool_at_name() -> None:
    assert ToolResult.unknown_tool(ToolCall(id="c", name="rm", arguments={})) == ToolResult(
        call_id="c",
        name="rm",
        outcome=ToolOutcome.REJECTED,
        content="Error: unknown tool 'rm' @ name",
        error="unknown tool 'rm' @ name",
    )


@pytest.mark.parametrize("name", ["a", "A-z_0.9", "x" * 64])
def test_a_tool_name_is_one_to_64_letters_digits_or_dot_dash_underscore(name: str) -> None:
    assert ToolSpec(name=name).name == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "a/b", "tool!", "é"])
def test_any_other_tool_name_is_refused_saying_what_a_name_may_be(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ToolSpec(name=name)
    assert (caught.value.field, caught.value.reason) == (
        "name",
        f"{name!r} is not 1-64 of [A-Za-z0-9_.-]",
    )


def test_a_specs_parameters_must_be_a_json_object_schema_of_type_object() -> None:
    with pytest.raises(ConfigError) as caught:
        ToolSpec(name="t", parameters=["type"])  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (
        "parameters",
        "a schema must be a JSON object",
    )
    with pytest.raises(ConfigError) as caught:
        ToolSpec(name="t", parameters={"type": "object", "default": {"x": math.inf}})
    assert (caught.value.field, caught.value.reason) == (
        "parameters.default.x",
        "non-finite number inf",
    )
    wrong_type: list[JSONObject] = [{"type": "array"}, {"properties": {}}]
    for parameters in wrong_type:
        with pytest.raises(ConfigError) as caught:
            ToolSpec(name="t", parameters=parameters)
        assert (caught.value.field, caught.value.reason) == (
            "parameters.type",
            "a tool's parameters must be of type 'object'",
        )


def test_a_spec_without_parameters_takes_an_object_with_any_properties() -> None:
    spec = ToolSpec(name="t")
    assert spec.parameters == {"type": "object", "properties": {}}
    assert spec.validate_arguments({"anything": 1}) == []
    assert [str(p) for p in spec.validate_arguments([])] == ["expected object, got array @ $"]


class _Recording:
    """A validator that records what it compiled and reports one fixed problem per call."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, JSONObject]] = []

    def compile(self, tool: str, schema: JSONObject) -> ArgumentCheck:
        self.compiled.append((tool, schema))

        def check(arguments: object, /) -> list[ArgumentProblem]:
            return [ArgumentProblem(path="$.seen", reason=repr(arguments))]

        return check


def test_a_spec_compiles_its_schema_once_under_its_name_with_its_validator() -> None:
    validator = _Recording()
    parameters: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "integer"}}}
    spec = ToolSpec(name="calc", parameters=parameters, validator=validator)
    assert validator.compiled == [("calc", parameters)]
    assert spec.validate_arguments({"x": 1}) == [ArgumentProblem(path="$.seen", reason="{'x': 1}")]
    spec.validate_arguments({})
    assert len(validator.compiled) == 1


def test_a_call_that_misses_the_schema_raises_its_first_problem_and_lists_every_one() -> None:
    """The error's field is the tool's name then the problem's path below the arguments."""
    spec = ToolSpec(
        name="bash",
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
            "additionalProperties": False,
        },
    )
    call = ToolCall(id="c", name="bash", arguments={"timeout": "9", "x": 1})
    with pytest.raises(ToolArgumentError) as caught:
        spec.check_call(call)
    assert (caught.value.field, caught.value.reason) == ("bash.command", "required")
    assert caught.value.problems == (
        "required @ bash.command",
        "expected number, got string @ bash.timeout",
        "unexpected property @ bash.x",
    )
    spec.check_call(ToolCall(id="c", name="bash", arguments={"command": "ls"}))


def test_a_spec_in_the_openai_shape_carries_its_name_description_and_schema() -> None:
    parameters: dict[str, Any] = {"type": "object", "properties": {"p": {"type": "string"}}}
    spec = ToolSpec(name="read", description="Read a file.", parameters=parameters)
    assert spec.to_openai() == {
        "type": "function",
        "function": {"name": "read", "description": "Read a file.", "parameters": parameters},
    }


def test_a_non_json_value_under_a_property_whose_name_holds_an_at_sign_is_named_whole() -> None:
    """The field is the whole path to the bad value, a property's name with `` @ `` in it
    included, and the reason is the fault alone."""
    for name in ("a @ b", "x @ parameters.y"):
        with pytest.raises(ConfigError) as caught:
            ToolSpec(
                name="t",
                parameters={"type": "object", "properties": {name: {"default": math.nan}}},
            )
        assert (caught.value.field, caught.value.reason) == (
            f"parameters.properties.{name}.default",
            "non-finite number nan",
        )


KILLED_SHELL = (
    "the shell did not stop on Ctrl-C or its tmux server did not answer, so the shell was killed "
    "with everything it ran; the next call starts a new shell (directory and variables reset)"
)
CTRL_C = "the command got Ctrl-C and stopped; the shell keeps its state"


@pytest.mark.parametrize(
    ("tool", "signal_number", "says"),
    [
        ("bash", 9, "its process group was killed"),
        ("bash", None, "its process group was killed"),
        ("bash_stateful", 2, CTRL_C),
        ("bash_stateful", None, CTRL_C),
        ("bash_stateful", 9, KILLED_SHELL),
        ("tmux", 9, KILLED_SHELL),
        ("tmux", 2, "keys not sent by then were dropped; the pane is shown as it was"),
    ],
)
def test_a_timed_out_command_says_what_became_of_it(
    tool: str, signal_number: int | None, says: str
) -> None:
    assert timeout_end(tool, signal_number) == says


@pytest.mark.parametrize("outcome", [o for o in ToolOutcome if o is not ToolOutcome.REJECTED])
def test_only_a_rejected_result_may_be_marked_a_refusal_of_its_lease(outcome: ToolOutcome) -> None:
    with pytest.raises(InvalidInput) as caught:
        ToolResult(call_id="c1", name="bash", outcome=outcome, content="", lease_refused=True)
    assert (caught.value.field, caught.value.reason) == (
        "lease_refused",
        "a refusal of the call's lease is REJECTED",
    )


def test_a_lease_refusal_is_the_calls_rejection_marked_so() -> None:
    refused = ToolResult.lease_refusal(CALL, "lease 3 is stale @ $.epoch")
    assert refused == attrs.evolve(
        ToolResult.failure(CALL, ToolOutcome.REJECTED, "lease 3 is stale @ $.epoch"),
        lease_refused=True,
    )
    assert (refused.outcome, refused.error, refused.lease_refused) == (
        ToolOutcome.REJECTED,
        "lease 3 is stale @ $.epoch",
        True,
    )
    assert refused.call_id == CALL.id
