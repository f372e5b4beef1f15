"""The env's fast path for a batch's request body (``batch_wire``): for every batch it either
writes the bytes and the deadline the general path (``execute_call``, ``ExecuteRequest``, the
slot codec) writes, or gives nothing, and it gives nothing for every call the general path
refuses."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.pools.batch_wire import batch_body
from trajcore.adapters.slot_server.codec import encode
from trajcore.domain.errors import InvalidInput, WireError
from trajcore.domain.slot_protocol import ExecuteRequest, execute_call
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall


def slot_call(
    *,
    index: object = 0,
    epoch: object = 1,
    call_id: object = "c1",
    tool: object = "bash",
    arguments: object = None,
    timeout_s: object = 30.0,
    time_left_s: object = None,
) -> SlotCall:
    """A ``SlotCall`` with any field values (the constructors' own checks off, as a caller's
    later change to a value would leave them)."""
    with attrs.validators.disabled():
        lease = Lease(slot=SlotId(container="c0", index=index), epoch=epoch, holder="t")  # type: ignore[arg-type]
        call = ToolCall(
            id=call_id,  # type: ignore[arg-type]
            name=tool,  # type: ignore[arg-type]
            arguments={"command": "true"} if arguments is None else arguments,  # type: ignore[arg-type]
        )
        return SlotCall(lease=lease, call=call, timeout_s=timeout_s, time_left_s=time_left_s)  # type: ignore[arg-type]


def general(calls: list[SlotCall]) -> tuple[bytes, float]:
    """What the general path sends (raises what it raises)."""
    request = ExecuteRequest(calls=[execute_call(call) for call in calls])
    return encode(request), request.deadline_s(0.0)


def agrees(calls: list[SlotCall]) -> None:
    """The fast path gives the general path's body and deadline, or nothing."""
    fast = batch_body(calls)
    try:
        slow = general(calls)
    except (InvalidInput, OverflowError):
        assert fast is None, "the fast path took a batch the general path refuses"
        return
    if fast is not None:
        assert fast == slow


class Text(str):
    pass


class Whole(int):
    pass


def test_plain_batches_give_the_general_paths_body_and_deadline() -> None:
    batches = [
        [],
        [slot_call()],
        [slot_call(index=i % 5, epoch=7, call_id=f"p{i}", timeout_s=1 + i) for i in range(16)],
        [slot_call(index=3, timeout_s=0.25), slot_call(index=3, call_id="c2", timeout_s=2**53)],
        [slot_call(arguments={})],
        [slot_call(arguments={"path": "é/\u2603", "n": [1, 2.5, None, True], "o": {"k": "v"}})],
        [slot_call(arguments={"content": "\udcff lone surrogate"}, tool="write_file")],
        [slot_call(index=0, epoch=0, timeout_s=5e-324)],
        [slot_call(time_left_s=2.5), slot_call(call_id="c2", time_left_s=7)],
    ]
    for calls in batches:
        found = batch_body(calls)
        assert found is not None
        assert found == general(calls)


# Each field's wrong types and values: the general path refuses each (a WireError naming the
# field, or an error of Python's own for an integer too large to be a float).
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("slot", {"index": True}),
    ("slot", {"index": -1}),
    ("slot", {"index": 1.0}),
    ("slot", {"index": "1"}),
    ("epoch", {"epoch": -1}),
    ("epoch", {"epoch": False}),
    ("epoch", {"epoch": 2.0}),
    ("epoch", {"epoch": None}),
    ("call_id", {"call_id": ""}),
    ("call_id", {"call_id": 5}),
    ("call_id", {"call_id": b"c1"}),
    ("tool", {"tool": ""}),
    ("tool", {"tool": None}),
    ("arguments", {"arguments": []}),
    ("arguments", {"arguments": {"x": {1, 2}}}),
    ("arguments", {"arguments": {"x": math.nan}}),
    ("arguments", {"arguments": {1: "a"}}),
    ("arguments", {"arguments": {"x": [object()]}}),
    ("timeout_s", {"timeout_s": 0}),
    ("timeout_s", {"timeout_s": 0.0}),
    ("timeout_s", {"timeout_s": -1.5}),
    ("timeout_s", {"timeout_s": math.inf}),
    ("timeout_s", {"timeout_s": math.nan}),
    ("timeout_s", {"timeout_s": True}),
    ("timeout_s", {"timeout_s": "30"}),
    ("timeout_s", {"timeout_s": None}),
    ("time_left_s", {"time_left_s": 0}),
    ("time_left_s", {"time_left_s": -2.0}),
    ("time_left_s", {"time_left_s": math.inf}),
    ("time_left_s", {"time_left_s": math.nan}),
    ("time_left_s", {"time_left_s": False}),
    ("time_left_s", {"time_left_s": "3"}),
]


@pytest.mark.parametrize(
    ("field", "values"), REFUSED, ids=[f"{field}-{i}" for i, (field, _) in enumerate(REFUSED)]
)
def test_what_the_general_path_refuses_the_fast_path_leaves_to_it(
    field: str, values: dict[str, Any]
) -> None:
    bad = slot_call(**values)
    for calls in ([bad], [slot_call(), bad], [bad, slot_call(call_id="c2")]):
        assert batch_body(calls) is None
        with pytest.raises(WireError) as refused:
            general(calls)
        assert refused.value.field == field


def test_a_timeout_too_large_for_a_float_is_left_to_the_general_path() -> None:
    calls = [slot_call(timeout_s=10**400)]
    assert batch_body(calls) is None
    with pytest.raises(OverflowError):
        general(calls)


def test_subclasses_are_left_to_the_general_path() -> None:
    for calls in (
        [slot_call(call_id=Text("c1"))],
        [slot_call(tool=Text("bash"))],
        [slot_call(index=Whole(2))],
        [slot_call(epoch=Whole(2))],
        [slot_call(timeout_s=Whole(2))],
        [slot_call(timeout_s=2**53 + 1)],
        [slot_call(time_left_s=Whole(2))],
        [slot_call(time_left_s=2**53 + 1)],
    ):
        assert batch_body(calls) is None
        general(calls)  # which accepts them


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.text(max_size=6),
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(), inner)),
    max_leaves=6,
)
edges = st.sampled_from(
    ["", 0, -1, 0.0, -0.0, math.nan, math.inf, 10**400, 2**53 + 1, True, False, {}, []]
)
anything = st.one_of(
    edges, st.none(), st.integers(-(2**60), 2**60), st.text(max_size=4), st.floats(),
    st.binary(max_size=3), st.builds(Text, st.text(max_size=3)), st.builds(Whole, st.integers()),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.integers(), st.sets(st.integers())),
)  # fmt: skip
VALID: dict[str, st.SearchStrategy[Any]] = {
    "index": st.integers(0, 10**6),
    "epoch": st.integers(0, 10**6),
    "call_id": st.text(min_size=1, max_size=6),
    "tool": st.sampled_from(["bash", "read_file", "t"]),
    "arguments": st.dictionaries(st.text(max_size=6), json_value, max_size=4),
    "timeout_s": st.one_of(st.floats(min_value=5e-324, max_value=1e300), st.integers(1, 2**53)),
    "time_left_s": st.one_of(
        st.none(), st.floats(min_value=5e-324, max_value=1e300), st.integers(1, 2**53)
    ),
}


@st.composite
def calls(draw: st.DrawFn, wrong: str | None = None) -> SlotCall:
    """A call whose fields are all valid, or all but one (``wrong``, or a drawn one, gets any
    value, an edge value half of the time)."""
    fields = {name: draw(strategy) for name, strategy in VALID.items()}
    if wrong is None and draw(st.booleans()):
        wrong = draw(st.sampled_from(sorted(VALID)))
    if wrong is not None:
        fields[wrong] = draw(st.one_of(edges, anything))
    return slot_call(**fields)


@given(st.lists(calls(), max_size=4))
def test_any_batch_the_fast_path_takes_it_writes_as_the_general_path(batch: list[SlotCall]) -> None:
    agrees(batch)


@pytest.mark.parametrize("field", sorted(VALID))
@given(data=st.data())
def test_a_batch_with_one_field_of_any_value_agrees(field: str, data: st.DataObject) -> None:
    batch = data.draw(st.lists(calls(), max_size=3))
    batch.insert(data.draw(st.integers(0, len(batch))), data.draw(calls(wrong=field)))
    agrees(batch)
