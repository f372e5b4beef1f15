"""Hypothesis strategies for trajcore's domain values, shared by the unit tests."""

from __future__ import annotations

import attrs
from hypothesis import strategies as st

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message, Role
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.tools import (
    ExecReport,
    SandboxBudget,
    ToolCall,
    ToolOutcome,
    ToolResult,
    ToolSpec,
)

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=20)
json_scalars: st.SearchStrategy[JSON] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values: st.SearchStrategy[JSON] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(names, children, max_size=4),
    max_leaves=12,
)
json_objects: st.SearchStrategy[JSONObject] = st.dictionaries(names, json_values, max_size=5)

tool_calls = st.builds(ToolCall, id=names, name=names, arguments=json_objects)

exec_reports = st.builds(
    ExecReport,
    exit_code=st.none() | st.integers(-255, 255),
    stdout=st.text(max_size=50),
    stderr=st.text(max_size=50),
    stdout_dropped=st.integers(0, 10**9),
    stderr_dropped=st.integers(0, 10**9),
    timed_out=st.booleans(),
    duration_s=st.floats(0, 1e6, allow_nan=False),
    sandboxed=st.booleans(),
)
tool_results = st.builds(
    ToolResult,
    call_id=names,
    name=names,
    outcome=st.sampled_from(ToolOutcome),
    content=st.text(max_size=50),
    error=st.none() | st.text(max_size=30),
    exec=st.none() | exec_reports,
).flatmap(  # a call whose lease a budget ended is never OK
    lambda result: (
        st.just(result)
        if result.ok
        else st.builds(
            attrs.evolve, st.just(result), sandbox_budget=st.none() | st.just(SandboxBudget.DISK)
        )
    )
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role: Role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    content = draw(st.text(max_size=60))
    if role == "assistant":
        return Message.assistant(
            content,
            tool_calls=draw(st.lists(tool_calls, max_size=3)),
            reasoning=draw(st.none() | st.text(max_size=30)),
        )
    if role == "tool":
        return Message(role="tool", content=content, tool_call_id=draw(names), name=draw(names))
    return Message(role=role, content=content)


_property_schemas: st.SearchStrategy[JSONObject] = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {}},
        {"type": "string", "enum": ["a", "b"]},
    ]
)


@st.composite
def tool_specs(draw: st.DrawFn) -> ToolSpec:
    props = draw(st.dictionaries(names, _property_schemas, max_size=4))
    required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
    return ToolSpec(
        name=draw(names),
        description=draw(st.text(max_size=40)),
        parameters={
            "type": "object",
            "properties": dict[str, JSON](props),
            "required": list[JSON](required),
        },
    )


sampling_params = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 100_000),
    temperature=st.floats(0, 10),
    top_p=st.floats(0, 1),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3).map(tuple),
    seed=st.none() | st.integers(0, 2**31),
    extra_body=json_objects,
)


@st.composite
def token_completions(draw: st.DrawFn) -> TokenCompletion:
    ids = draw(st.lists(st.integers(0, 200_000), max_size=30))
    logprobs = draw(
        st.lists(st.floats(-100, 0, allow_nan=False), min_size=len(ids), max_size=len(ids))
    )
    return TokenCompletion.of(ids, logprobs, draw(st.sampled_from(FinishReason)))
