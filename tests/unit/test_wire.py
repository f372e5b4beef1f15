"""Every wire type round-trips through JSON, and bad JSON is refused with its path."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import strategies as s
from trajcore.adapters.wire import structure, unstructure
from trajcore.domain.errors import WireError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams, TokenCompletion
from trajcore.domain.tools import ExecReport, ToolCall, ToolResult, ToolSpec

WIRE_TYPES: list[tuple[type[object], st.SearchStrategy[object]]] = [
    (ToolCall, s.tool_calls),
    (ExecReport, s.exec_reports),
    (ToolResult, s.tool_results),
    (Message, s.messages()),
    (ToolSpec, s.tool_specs()),
    (SamplingParams, s.sampling_params),
    (TokenCompletion, s.token_completions()),
]


@pytest.mark.parametrize(("cls", "strategy"), WIRE_TYPES, ids=lambda x: getattr(x, "__name__", ""))
def test_round_trip_through_json_text(
    cls: type[object], strategy: st.SearchStrategy[object]
) -> None:
    @given(strategy)
    def check(value: object) -> None:
        text = json.dumps(unstructure(value), allow_nan=False)
        assert structure(json.loads(text), cls) == value

    check()


@pytest.mark.parametrize(
    ("data", "cls", "field", "reason"),
    [
        ({"role": "bogus"}, Message, "$.role", "must be one of"),
        ({"role": "tool", "content": "x"}, Message, "$.tool_call_id", "must name the call"),
        (
            {"role": "assistant", "tool_calls": [{"id": "a", "name": 7}]},
            Message,
            "$.tool_calls[0].name",
            "expected a string",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "a"}]},
            Message,
            "$.tool_calls[0].name",
            "required field missing",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "a", "name": "n", "arguments": [1]}]},
            Message,
            "$.tool_calls[0].arguments",
            "expected a JSON object",
        ),
        ({"role": "user", "tool_calls": "x"}, Message, "$.tool_calls[0]", "expected a JSON object"),
        ([1, 2], Message, "$", "expected a JSON object"),
        (
            {"token_ids": [1, "2"], "logprobs": [0.0, 0.0], "finish_reason": "stop"},
            TokenCompletion,
            "$.token_ids[1]",
            "expected an integer",
        ),
        (
            {"token_ids": [1, 2], "logprobs": [0.0], "finish_reason": "stop"},
            TokenCompletion,
            "$.logprobs",
            "1 logprobs for 2 token ids",
        ),
        ({"temperature": -1}, SamplingParams, "$.temperature", "in [0, 10]"),
        ({"max_tokens": True}, SamplingParams, "$.max_tokens", "expected an integer"),
        (
            {"name": "x", "parameters": {"type": "object", "properties": {}, "required": "q"}},
            ToolSpec,
            "$.parameters.required",
            "not a valid JSON Schema",
        ),
        (
            {"call_id": "c", "name": "n", "outcome": "fine"},
            ToolResult,
            "$.outcome",
            "fine",
        ),
    ],
)
def test_bad_input_names_the_path(data: object, cls: type[object], field: str, reason: str) -> None:
    with pytest.raises(WireError) as info:
        structure(data, cls)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).endswith(f" @ {field}") or "; also " in str(info.value)


def test_every_fault_is_listed() -> None:
    with pytest.raises(WireError) as info:
        structure({"role": "user", "content": 3, "name": 4}, Message)
    assert sorted(info.value.problems) == [
        "expected a string, got int @ $.content",
        "expected a string, got int @ $.name",
    ]


def test_non_finite_numbers_in_arguments_are_refused_with_their_path() -> None:
    data = {"id": "a", "name": "n", "arguments": {"x": [1, float("nan")]}}
    with pytest.raises(WireError) as info:
        structure(data, ToolCall)
    assert info.value.field == "$.arguments.x[1]"
