"""The decisions of the slot-server protocol's values: how a slot call goes on the wire, how long
a batch may take, which arguments a call may carry, and what a fork request and its answer hold."""

from __future__ import annotations

import math

import pytest

from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import (
    ExecuteCall,
    ExecuteRequest,
    ForkAnswer,
    ForkLease,
    ForkRequest,
    LeaseAnswer,
    execute_call,
    home_relative,
    workspace_path_problem,
)
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


def test_a_slot_calls_turn_time_goes_on_the_wire_with_it() -> None:
    slot_call = SlotCall(
        lease=Lease(slot=SlotId(container="c7", index=3), epoch=12, holder="traj-1"),
        call=ToolCall(id="call_9", name="bash", arguments={"command": "sleep 9"}),
        timeout_s=30.0,
        time_left_s=2.5,
        hook=True,
    )
    wire = execute_call(slot_call)
    assert (wire.timeout_s, wire.time_left_s, wire.hook) == (30.0, 2.5, True)
    assert _call(0, 1.0).time_left_s is None  # a client that sends none: the limit alone


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.inf, -math.inf, math.nan, True, "2", [2.0]])
def test_a_calls_turn_time_is_finite_seconds_or_none_naming_the_field(bad: object) -> None:
    """A turn's time left that is not finite seconds > 0 is refused, naming ``time_left_s``."""
    with pytest.raises(WireError) as caught:
        ExecuteCall(
            slot=0,
            epoch=1,
            call_id="c",
            tool="bash",
            timeout_s=1.0,
            time_left_s=bad,  # type: ignore[arg-type]
        )
    assert caught.value.field == "time_left_s"
    assert caught.value.reason.startswith("must be None or finite seconds > 0"), caught.value
    call = ExecuteCall(slot=0, epoch=1, call_id="c", tool="bash", timeout_s=1.0, time_left_s=3)
    assert call.time_left_s == 3


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


def test_a_fork_request_names_an_environment_a_snapshot_and_its_leases_in_order() -> None:
    """A fork request holds the environment, the snapshot to start from and its leases as
    slot/epoch pairs, kept as a tuple in the order given (an iterable is taken)."""
    asked = ForkRequest(
        environment="oci:/images/py",
        snapshot="snap-1",
        leases=iter([ForkLease(slot=2, epoch=7), ForkLease(slot=0, epoch=3)]),
    )
    assert (asked.environment, asked.snapshot) == ("oci:/images/py", "snap-1")
    assert asked.leases == (ForkLease(slot=2, epoch=7), ForkLease(slot=0, epoch=3))
    assert (asked.leases[0].slot, asked.leases[0].epoch) == (2, 7)


def test_a_fork_request_of_one_lease_is_a_fork() -> None:
    """One lease is enough: a fork needs at least one, not several."""
    asked = ForkRequest(environment="oci:/a", snapshot="s", leases=(ForkLease(slot=5, epoch=0),))
    assert asked.leases == (ForkLease(slot=5, epoch=0),)


def test_a_fork_request_without_leases_is_refused_naming_the_leases() -> None:
    """A fork that starts nothing is a peer's mistake, refused with the field and the reason."""
    empty: tuple[ForkLease, ...] | list[ForkLease]
    for empty in ((), []):
        with pytest.raises(WireError) as caught:
            ForkRequest(environment="oci:/a", snapshot="s", leases=empty)
        assert (caught.value.field, caught.value.reason) == (
            "leases",
            "must name at least one lease",
        )
        assert str(caught.value) == "must name at least one lease @ leases"


def test_a_fork_request_naming_a_slot_twice_is_refused_listing_its_slots() -> None:
    """Each slot is forked at most once per request (two leases of one slot cannot both run),
    whatever their epochs; the refusal names the field and lists the slots asked, sorted."""
    with pytest.raises(WireError) as caught:
        ForkRequest(
            environment="oci:/a",
            snapshot="s",
            leases=(
                ForkLease(slot=3, epoch=1),
                ForkLease(slot=1, epoch=1),
                ForkLease(slot=3, epoch=2),
            ),
        )
    assert (caught.value.field, caught.value.reason) == ("leases", "names a slot twice: [1, 3, 3]")
    assert str(caught.value) == "names a slot twice: [1, 3, 3] @ leases"


def test_leases_of_distinct_slots_may_share_an_epoch() -> None:
    """Only the slot must differ: leases of different slots with the same epoch are a fork."""
    asked = ForkRequest(
        environment="oci:/a",
        snapshot="s",
        leases=(ForkLease(slot=0, epoch=4), ForkLease(slot=1, epoch=4)),
    )
    assert [lease.slot for lease in asked.leases] == [0, 1]


def test_a_fork_request_must_name_its_snapshot() -> None:
    """A fork starts from a snapshot, so an empty snapshot name is refused naming the field."""
    with pytest.raises(WireError) as caught:
        ForkRequest(environment="oci:/a", snapshot="", leases=(ForkLease(slot=0, epoch=0),))
    assert (caught.value.field, caught.value.reason) == (
        "snapshot",
        "expected a non-empty string, got ''",
    )


def test_a_fork_lease_is_a_slot_index_and_an_epoch_neither_negative() -> None:
    """A fork lease's slot and epoch are whole numbers from 0, as a lease request's are."""
    assert ForkLease(slot=0, epoch=0) == ForkLease(slot=0, epoch=0)
    for field, given in (("slot", {"slot": -1, "epoch": 0}), ("epoch", {"slot": 0, "epoch": -1})):
        with pytest.raises(WireError) as caught:
            ForkLease(**given)
        assert (caught.value.field, caught.value.reason) == (
            field,
            "must be an integer >= 0, got -1",
        )


def test_a_fork_answer_holds_one_lease_answer_per_lease_in_order() -> None:
    """The answer keeps each lease's own answer, in the request's order, as a tuple: a refused
    lease fails that lease only."""
    answers = [
        LeaseAnswer(slot=2, epoch=7, ok=True, image_id="img", hit=True),
        LeaseAnswer(slot=0, epoch=3, ok=False, error="no room", field="snapshot"),
    ]
    answer = ForkAnswer(leases=iter(answers))
    assert answer.leases == tuple(answers)
    assert [(lease.slot, lease.ok) for lease in answer.leases] == [(2, True), (0, False)]
    assert ForkAnswer(leases=()).leases == ()


@pytest.mark.parametrize(
    ("path", "relative"),
    [("~", "."), ("~/", "."), ("~/a.txt", "a.txt"), ("~/d/b", "d/b"), ("~user/x", "~user/x"),
     ("a/~/b", "a/~/b"), ("x.txt", "x.txt"), ("~/../out", "../out"), ("~//a.txt", "a.txt"),
     ("~/XX/y", "XX/y"), ("~//X", "X")],
)  # fmt: skip
def test_a_tilde_path_is_the_workspaces_as_home_is(path: str, relative: str) -> None:
    assert home_relative(path) == relative  # ../out is then refused as any other


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("notes.txt", None),
        ("a/b/c", None),
        ("./a//b/", None),
        ("..x/x..", None),
        ("~user/x", None),
        ("\udcff-name", None),  # one byte 0xFF of a non-UTF-8 name
        ("", "must be a non-empty path without NUL bytes"),
        ("a\0b", "must be a non-empty path without NUL bytes"),
        (
            "x-\ud800",
            "'x-\\ud800' holds a lone surrogate at 2 that stands for no byte "
            "(only U+DC80..U+DCFF may appear, each for one byte 0x80..0xFF of a name)",
        ),
        ("/etc/passwd", "'/etc/passwd' is absolute; give a path relative to the workspace"),
        ("..", "'..' contains '..'; paths must stay inside the workspace"),
        ("a/../b", "'a/../b' contains '..'; paths must stay inside the workspace"),
        ("a/..", "'a/..' contains '..'; paths must stay inside the workspace"),
    ],
)
def test_a_file_tools_path_that_names_nothing_in_a_workspace_says_why(
    path: str, problem: str | None
) -> None:
    """The one rule the slot server (before it opens anything) and ``SlotTools`` (before it
    sends a hook's call) share: what no workspace could hold at ``path``."""
    assert workspace_path_problem(path) == problem


def test_a_path_from_the_home_stays_in_the_home() -> None:
    """``~`` is the workspace, and ``~//etc/passwd`` is ``$HOME//etc/passwd`` in a shell: the
    workspace's ``etc/passwd``, never ``/etc/passwd``."""
    assert home_relative("~//etc/passwd") == "etc/passwd"
    assert workspace_path_problem(home_relative("~//etc/passwd")) is None
    assert workspace_path_problem(home_relative("~/ok.txt")) is None
