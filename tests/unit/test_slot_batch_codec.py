"""The codec's fast path for batches and their results (``batch_codec``): it gives exactly what
the converter gives, or nothing; it is taken for the batches this project's client writes and
the results its server writes; and the argument checks and reply checks beside it on the call
path keep their meaning."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.slot_server.batch_codec import FAST_STRUCTURE, FAST_UNSTRUCTURE
from trajcore.adapters.slot_server.channel import AgentLost, check_reply
from trajcore.adapters.slot_server.codec import converter, decode, encode
from trajcore.adapters.slot_server.tool_calls import flat_check
from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import (
    SLOT_TOOL_SPECS,
    ExecuteCall,
    ExecuteRequest,
    ExecuteResponse,
)
from trajcore.domain.tools import ExecReport, SandboxBudget, ToolOutcome, ToolResult, ToolSpec

text = st.text(max_size=12)
count = st.integers(0, 10**9)
leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), text,
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
json_value = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=6,
)
calls = st.builds(
    ExecuteCall, slot=count, epoch=count, call_id=text.filter(bool), tool=text.filter(bool),
    arguments=st.dictionaries(text, json_value, max_size=3),
    timeout_s=st.floats(min_value=0.001, max_value=1e6) | st.integers(1, 10**6).map(float),
    time_left_s=st.none() | st.floats(min_value=0.001, max_value=1e6),
    hook=st.booleans(),
)  # fmt: skip
reports = st.builds(
    ExecReport, exit_code=st.none() | st.integers(-(2**31), 2**31), stdout=text, stderr=text,
    stdout_dropped=count, stderr_dropped=count, timed_out=st.booleans(),
    duration_s=st.floats(0, 1e6), sandboxed=st.booleans(),
)  # fmt: skip
results = st.builds(
    ToolResult, call_id=text, name=text, outcome=st.sampled_from(ToolOutcome), content=text,
    error=st.none() | text, exec=st.none() | reports,
).flatmap(  # the marker of a lease a budget ended, on any result but an OK one
    lambda result: st.just(result) if result.ok else st.builds(
        attrs.evolve, st.just(result), sandbox_budget=st.none() | st.sampled_from(SandboxBudget)
    )
).flatmap(  # the marker of a refusal of the call's lease, on a REJECTED result
    lambda result: st.just(result) if result.outcome is not ToolOutcome.REJECTED else st.builds(
        attrs.evolve, st.just(result), lease_refused=st.booleans()
    )
)  # fmt: skip
batches = st.one_of(
    st.builds(ExecuteRequest, calls=st.lists(calls, max_size=3)),
    st.builds(ExecuteResponse, results=st.lists(results, max_size=3)),
)


def _places(tree: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every path into ``tree`` (dict keys and list indexes)."""
    found = [at]
    if isinstance(tree, dict):
        for key, item in tree.items():
            found += _places(item, (*at, key))
    elif isinstance(tree, list):
        for index, item in enumerate(tree):
            found += _places(item, (*at, index))
    return found


def _changed(tree: Any, at: tuple[object, ...], how: str, value: object) -> Any:
    """A copy of ``tree`` with the place ``at`` replaced by ``value``, deleted, or given an
    unknown key (``how``)."""
    tree = json.loads(json.dumps(tree))
    if not at:
        return value if how == "replace" else tree
    parent = tree
    for step in at[:-1]:
        parent = parent[step]
    last = at[-1]
    if how == "replace":
        parent[last] = value
    elif how == "delete" and isinstance(parent, dict):
        del parent[last]
    elif isinstance(parent, dict):
        parent["an_unknown_key"] = value
    return tree


# What a result's JSON leaves out: each field at its default (``exit_code`` has none, and the
# duration is always written).
_LEFT_OUT_AT = {
    "content": "", "error": None, "exec": None, "stdout": "", "stderr": "", "stdout_dropped": 0,
    "stderr_dropped": 0, "timed_out": False, "sandboxed": False, "sandbox_budget": None,
    "lease_refused": False,
}  # fmt: skip


def _without_defaults(tree: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _without_defaults(value) if key == "exec" and value is not None else value
        for key, value in tree.items()
        if key not in _LEFT_OUT_AT or value != _LEFT_OUT_AT[key]
    }


@given(value=batches)
def test_the_fast_path_writes_the_converters_json_and_reads_it_back(value: Any) -> None:
    """A batch's JSON is the converter's; a result's is the converter's less its default-valued
    fields (in the converter's key order), which both paths read back as the same value."""
    kind = type(value)
    tree = FAST_UNSTRUCTURE[kind](value)
    expected = converter.unstructure(value)
    if kind is ExecuteResponse:
        expected = {"results": [_without_defaults(result) for result in expected["results"]]}
    assert tree == expected
    assert json.dumps(tree) == json.dumps(expected)  # key order too
    assert FAST_STRUCTURE[kind](tree) == value
    assert converter.structure(tree, kind) == value
    assert decode(encode(value), kind) == value


def test_a_plain_commands_result_travels_without_its_default_fields() -> None:
    report = ExecReport(exit_code=0, duration_s=0.002, sandboxed=True)
    result = ToolResult(call_id="c1", name="bash", outcome=ToolOutcome.OK, exec=report)
    assert json.loads(encode(ExecuteResponse(results=[result]))) == {
        "results": [
            {
                "call_id": "c1", "name": "bash", "outcome": "ok",
                "exec": {"exit_code": 0, "duration_s": 0.002, "sandboxed": True},
            }
        ]
    }  # fmt: skip


@given(value=batches, data=st.data())
def test_the_fast_path_gives_the_converters_value_or_nothing(
    value: Any, data: st.DataObject
) -> None:
    kind = type(value)
    tree = converter.unstructure(value)
    places = _places(tree)
    at = data.draw(st.sampled_from(places))
    how = data.draw(st.sampled_from(["replace", "delete", "add"]))
    changed = _changed(tree, at, how, data.draw(json_value))
    fast = FAST_STRUCTURE[kind](changed)
    try:
        slow = converter.structure(changed, kind)
    except Exception:  # noqa: BLE001 - whatever the converter refuses, the fast path refuses
        assert fast is None
        with pytest.raises(WireError):
            decode(json.dumps(changed), kind)
        return
    assert fast is None or fast == slow


SAMPLES: list[Any] = [
    ExecuteRequest(
        calls=[
            ExecuteCall(
                slot=0, epoch=1, call_id="a", tool="bash", arguments={"command": "true"},
                timeout_s=2.5,
            ),
            ExecuteCall(
                slot=0, epoch=1, call_id="b", tool="bash", arguments={"command": "true"},
                timeout_s=2.5, time_left_s=1.25,
            ),
        ]
    ),
    ExecuteResponse(
        results=[
            ToolResult(
                call_id="a", name="bash", outcome=ToolOutcome.TIMEOUT, content="c", error="e",
                exec=ExecReport(
                    exit_code=None, stdout="o", stderr="e", stdout_dropped=1, stderr_dropped=2,
                    timed_out=True, duration_s=0.5, sandboxed=True,
                ),
            ),
        ]
    ),
]  # fmt: skip
WRONG: list[object] = [None, True, False, 0, 1, -1, 2**60, 1.5, -1.0, "", "x", "ok", [], {}]


@pytest.mark.parametrize("value", SAMPLES, ids=lambda v: type(v).__name__)
def test_every_field_given_every_wrong_type_gets_the_converters_answer(value: Any) -> None:
    kind = type(value)
    tree = converter.unstructure(value)
    for at in _places(tree):
        for how, wrong in [("delete", None), *(("replace", w) for w in WRONG)]:
            changed = _changed(tree, at, how, wrong)
            fast = FAST_STRUCTURE[kind](changed)
            try:
                slow = converter.structure(changed, kind)
            except Exception:  # noqa: BLE001 - whatever the converter refuses
                assert fast is None, (at, how, wrong)
                continue
            assert fast is None or fast == slow, (at, how, wrong)


def test_a_well_formed_batch_and_its_results_take_the_fast_path() -> None:
    call = ExecuteCall(
        slot=3, epoch=7, call_id="c-1", tool="bash", arguments={"command": "ls -la"}, timeout_s=30
    )
    result = ToolResult(
        call_id="c-1", name="bash", outcome=ToolOutcome.OK, content="x\n",
        exec=ExecReport(exit_code=0, stdout="x\n", duration_s=0.001, sandboxed=True),
    )  # fmt: skip
    for value in (ExecuteRequest(calls=[call, call]), ExecuteResponse(results=[result])):
        wire = json.loads(encode(value))
        assert FAST_STRUCTURE[type(value)](wire) == value


def test_a_turns_time_takes_the_fast_path_and_a_bad_one_is_named() -> None:
    call = ExecuteCall(
        slot=3, epoch=7, call_id="c-1", tool="bash", arguments={}, timeout_s=30, time_left_s=4
    )
    wire = json.loads(encode(ExecuteRequest(calls=[call])))
    assert wire["calls"][0]["time_left_s"] == 4.0
    assert FAST_STRUCTURE[ExecuteRequest](wire) == ExecuteRequest(calls=[call])
    del wire["calls"][0]["time_left_s"]  # an older client's: no turn's time
    assert FAST_STRUCTURE[ExecuteRequest](wire) == ExecuteRequest(
        calls=[attrs.evolve(call, time_left_s=None)]
    )
    wire["calls"][0]["time_left_s"] = -1.0
    assert FAST_STRUCTURE[ExecuteRequest](wire) is None
    with pytest.raises(WireError) as refused:
        decode(json.dumps(wire), ExecuteRequest)
    assert refused.value.field == "$.calls[0].time_left_s"


def test_a_refused_batch_still_names_the_field_of_its_fault() -> None:
    body = b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": -1}]}'
    assert FAST_STRUCTURE[ExecuteRequest](json.loads(body)) is None
    with pytest.raises(WireError) as refused:
        decode(body, ExecuteRequest)
    assert refused.value.field == "$.calls[0].timeout_s"


# ------------------------------------------------------------------------- argument checks

SPECS = {spec.name: spec for spec in SLOT_TOOL_SPECS}
arguments = st.dictionaries(
    st.sampled_from(["command", "timeout", "path", "keys", "other"]) | text, json_value, max_size=4
)


@given(tool=st.sampled_from(sorted(SPECS)), found=arguments)
def test_the_flat_check_passes_only_what_the_schema_checker_passes(
    tool: str, found: dict[str, Any]
) -> None:
    fits = flat_check(SPECS[tool])
    if fits is not None and fits(found):
        assert SPECS[tool].validate_arguments(found) == []


def test_the_flat_check_covers_the_commands_and_nothing_it_cannot_judge() -> None:
    bash = flat_check(SPECS["bash"])
    assert bash is not None
    assert bash({"command": "true"})
    assert bash({"command": "true", "timeout": 5, "allow_network": True})
    assert not bash({"command": 1})
    assert not bash({"command": "true", "timeout": True})
    assert not bash({})
    assert flat_check(SPECS["tmux"]) is None  # keys may be a string or a list
    nested = ToolSpec(
        name="t", parameters={"type": "object", "properties": {"a": {"type": "array"}}}
    )
    assert flat_check(nested) is None


# ------------------------------------------------------------------------- agent replies

GOOD = {
    "exit": 0, "signal": None, "stdout": "", "stderr": "", "stdout_dropped": 0,
    "stderr_dropped": 0, "timed_out": False, "duration": 0.01,
}  # fmt: skip


def test_a_well_formed_reply_passes() -> None:
    assert check_reply(dict(GOOD)) == GOOD
    assert check_reply({"exit": None, "error": "no such program"})["error"] == "no such program"


@pytest.mark.parametrize(
    "change",
    [
        {"exit": True},
        {"exit": "0"},
        {"timed_out": 0},
        {"duration": False},
        {"duration": "1"},
        {"stdout_dropped": 1.5},
        {"stdout": None},
        {"forged": 1},
    ],
)
def test_a_reply_of_the_wrong_shape_ends_the_lease(change: dict[str, object]) -> None:
    with pytest.raises(AgentLost, match="malformed reply"):
        check_reply({**GOOD, **change})


@pytest.mark.parametrize("reply", [[], "exit", None, {"stdout": ""}])
def test_a_reply_that_is_no_reply_ends_the_lease(reply: object) -> None:
    with pytest.raises(AgentLost, match="malformed reply"):
        check_reply(reply)
