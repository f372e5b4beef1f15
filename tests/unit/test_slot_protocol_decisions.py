"""The decisions of the slot-server protocol's values: how a slot call goes on the wire, how long
a batch may take, and which arguments a call may carry."""

from __future__ import annotations

import math

import pytest

from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import ExecuteCall, ExecuteRequest, execute_call
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall


def _call(slot: int, timeout_s: float, call_id: str = "c") -> ExecuteCall:
    return ExecuteCall(
        slot=slot, epoch=1, call_id=call_id, tool="bash", arguments={}, timeout_s=timeout_s
    )


def test_a_slot_call_goes_on_the_wire_as_its_slot_index_epoch_call_and_limit() -> None:
    """The server is addressed by the lease's container; the call names the slot there by its
    index, the lease's epoch, the call's id, tool and arguments, and the env's limit."""
    slot_call = SlotCall(
        lease=Lease(slot=SlotId(container="c7", index=3), epoch=12, holder="traj-1"),
        call=ToolCall(id="call_9", name="write_file", arguments={"path": "a", "content": "b"}),
        timeout_s=42.5,
    )
    assert execute_call(slot_call) == ExecuteCall(
        slot=3,
        epoch=12,
        call_id="call_9",
        tool="write_file",
        arguments={"path": "a", "content": "b"},
        timeout_s=42.5,
    )


def test_a_batch_may_take_its_slowest_slots_limits_one_after_another_plus_the_grace() -> None:
    """Calls of one slot run in order, so their limits add up; slots run side by side, so the
    batch takes the longest of those sums. The grace is added once."""
    batch = ExecuteRequest(
        calls=(_call(0, 10.0, "a"), _call(1, 25.0, "b"), _call(0, 20.0, "c"), _call(2, 5.0, "d"))
    )
    assert batch.deadline_s(3.0) == 33.0  # slot 0: 10 + 20, more than slot 1's 25
    assert ExecuteRequest(calls=(_call(1, 25.0),)).deadline_s(0.5) == 25.5


def test_an_empty_batch_may_take_the_grace_only() -> None:
    """No call, no limit: the client waits only the grace."""
    assert ExecuteRequest(calls=()).deadline_s(2.0) == 2.0


def test_a_calls_arguments_must_be_a_json_object_naming_the_field() -> None:
    """A peer that sends arguments that are not an object is refused, saying what came."""
    with pytest.raises(WireError) as caught:
        ExecuteCall(slot=0, epoch=1, call_id="c", tool="bash", arguments=[1], timeout_s=1.0)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (
        "arguments",
        "expected a JSON object, got list",
    )


def test_arguments_that_are_not_json_inside_are_refused_at_their_path() -> None:
    """A value no JSON can hold, anywhere inside the arguments, is named by its path."""
    with pytest.raises(WireError) as caught:
        ExecuteCall(
            slot=0,
            epoch=1,
            call_id="c",
            tool="bash",
            arguments={"a": [1, math.inf]},
            timeout_s=1.0,
        )
    assert (caught.value.field, caught.value.reason) == (
        "arguments",
        "non-finite number inf @ $.arguments.a[1]",
    )
    ExecuteCall(slot=0, epoch=1, call_id="c", tool="bash", arguments={"a": [1]}, timeout_s=1.0)
