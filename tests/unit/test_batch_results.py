"""The env's fast path for a batch's answer (``batch_wire.batch_results``): for every answer it
either gives the results the general path gives (``codec.decode`` into an ``ExecuteResponse``,
then the client's count and ``call_id`` checks), or gives nothing, and it gives nothing for every
answer the general path refuses."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.pools.batch_wire import batch_results
from trajcore.adapters.pools.client import _results
from trajcore.adapters.slot_server.codec import decode
from trajcore.domain.errors import InvalidInput
from trajcore.domain.slot_protocol import ExecuteResponse
from trajcore.domain.tools import ToolResult


def general(payload: bytes, call_ids: list[str]) -> tuple[list[ToolResult], str | None]:
    """What the general path gives (raises what it raises)."""
    answer = decode(payload, ExecuteResponse)
    return _results(answer, call_ids), answer.boot


def agrees(payload: bytes, call_ids: list[str]) -> list[ToolResult] | None:
    """The fast path gives the general path's results and boot, or nothing; returns the
    results it gave."""
    fast = batch_results(payload, call_ids)
    try:
        slow = general(payload, call_ids)
    except InvalidInput:
        assert fast is None, "the fast path took an answer the general path refuses"
        return None
    if fast is None:
        return None
    assert fast == slow
    assert [type(r.exec) for r in fast[0]] == [type(r.exec) for r in slow[0]]
    return fast[0]


def report(**values: Any) -> dict[str, Any]:
    found = {
        "exit_code": 0, "stdout": "", "stderr": "", "stdout_dropped": 0, "stderr_dropped": 0,
        "timed_out": False, "duration_s": 0.0015758049994474277, "sandboxed": True,
    }  # fmt: skip
    found.update(values)
    return found


def result(call_id: object = "c1", **values: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "call_id": call_id, "name": "bash", "outcome": "ok", "content": "", "error": None,
        "exec": report(),
    }  # fmt: skip
    found.update(values)
    return found


def body(*results: dict[str, Any]) -> bytes:
    return json.dumps({"results": list(results)}).encode()


def test_a_slot_servers_plain_answers_take_the_fast_path() -> None:
    answers = [
        (body(), []),
        (body(result()), ["c1"]),
        (body(*(result(f"p{i}") for i in range(16))), [f"p{i}" for i in range(16)]),
        (body(result(exec=None, outcome="rejected", error="no", content="Error: no")), ["c1"]),
        (body(result(exec=report(exit_code=None, timed_out=True, duration_s=3))), ["c1"]),
        (body(result(exec=report(stdout="é\u2603", stdout_dropped=5, duration_s=0))), ["c1"]),
        (body({"call_id": "c1", "name": "bash", "outcome": "ok"}), ["c1"]),
        (body(result(exec={"exit_code": 2})), ["c1"]),
        (b'{"results":[{"call_id":"c1","name":"x","outcome":"ok","content":"\\udcff"}]}', ["c1"]),
    ]
    for payload, call_ids in answers:
        found = agrees(payload, call_ids)
        assert found is not None
        assert [r.call_id for r in found] == call_ids


def test_the_servers_boot_comes_back_with_the_results() -> None:
    payload = json.dumps({"results": [result()], "boot": "1f2e3d4c5b6a7988"}).encode()
    assert agrees(payload, ["c1"]) is not None
    fast = batch_results(payload, ["c1"])
    assert fast is not None
    assert fast[1] == "1f2e3d4c5b6a7988"
    read = batch_results(body(result()), ["c1"])
    assert read is not None
    assert read[1] is None  # a server that predates it
    bads: list[object] = [3, [], {"a": 1}]
    for bad in bads:
        payload = json.dumps({"results": [result()], "boot": bad}).encode()
        assert batch_results(payload, ["c1"]) is None
        with pytest.raises(InvalidInput):
            general(payload, ["c1"])


# Answers the general path refuses (a WireError naming the field), each left to it.
REFUSED: list[tuple[bytes, list[str]]] = [
    (b"not json", ["c1"]),
    (b"\xff\xfe", ["c1"]),
    (b"[]", []),
    (b"{}", []),
    (body(result()), []),
    (body(result()), ["c1", "c2"]),
    (body(result("c2")), ["c1"]),
    (body(result("c1"), result("c1")), ["c1", "c2"]),
    (body(result(call_id=1)), ["c1"]),
    (body(result(name=None)), ["c1"]),
    (body(result(outcome="fine")), ["c1"]),
    (body(result(outcome=1)), ["c1"]),
    (body(result(content=None)), ["c1"]),
    (body(result(error=3)), ["c1"]),
    (body(result(exec=[])), ["c1"]),
    (body(result(exec={})), ["c1"]),
    (body(result(exec=report(exit_code="0"))), ["c1"]),
    (body(result(exec=report(exit_code=True))), ["c1"]),
    (body(result(exec=report(stdout_dropped=-1))), ["c1"]),
    (body(result(exec=report(stderr_dropped=-3))), ["c1"]),
    (body(result(exec=report(stderr_dropped=1.0))), ["c1"]),
    (body(result(exec=report(duration_s=-0.5))), ["c1"]),
    (body(result(exec=report(duration_s="1"))), ["c1"]),
    (body(result(exec=report(timed_out=0))), ["c1"]),
    (body(result(exec=report(sandboxed=None))), ["c1"]),
    (body(result(exec=report(stdout=None))), ["c1"]),
    (b'{"results":[{"call_id":"c1","name":"x","outcome":"ok","exec":{"exit_code":0,'
     b'"duration_s":Infinity}}]}', ["c1"]),
    (b"[" * 100_000 + b"]" * 100_000, ["c1"]),  # nested past the parser: never RecursionError
    (b'{"results":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}", ["c1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "call_ids"), REFUSED, ids=[str(i) for i in range(len(REFUSED))]
)
def test_what_the_general_path_refuses_the_fast_path_leaves_to_it(
    payload: bytes, call_ids: list[str]
) -> None:
    assert batch_results(payload, call_ids) is None
    with pytest.raises(InvalidInput):
        general(payload, call_ids)


def test_shapes_the_codecs_own_fast_path_leaves_to_its_converter_are_left_alone() -> None:
    # an integer duration beyond a float's exact range: the converter decides
    payload = body(result(exec=report(duration_s=2**53 + 1)))
    assert batch_results(payload, ["c1"]) is None
    agrees(payload, ["c1"])


any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**54), st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=1),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)  # fmt: skip
OUTCOMES = st.sampled_from(["ok", "tool_error", "timeout", "rejected", "infra_error", "OK"])


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    """An answer of 0-3 results, each field plain or (now and then) anything, some left out."""

    def field(plain: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(plain, any_value) if draw(st.integers(0, 9)) == 0 else plain)

    items = []
    call_ids = []
    for i in range(draw(st.integers(0, 3))):
        exec_report: Any = None
        if draw(st.booleans()):
            exec_report = {
                "exit_code": field(st.one_of(st.none(), st.integers(-1, 255))),
                "stdout": field(st.text(max_size=4)),
                "stderr": field(st.text(max_size=4)),
                "stdout_dropped": field(st.integers(0, 10)),
                "stderr_dropped": field(st.integers(0, 10)),
                "timed_out": field(st.booleans()),
                "duration_s": field(st.one_of(st.floats(0, 1e6), st.integers(0, 10))),
                "sandboxed": field(st.booleans()),
            }
            for key in draw(st.lists(st.sampled_from(sorted(exec_report)), max_size=2)):
                exec_report.pop(key, None)
        item: dict[str, Any] = {
            "call_id": field(st.just(f"c{i}")),
            "name": field(st.text(min_size=1, max_size=3)),
            "outcome": field(OUTCOMES),
            "content": field(st.text(max_size=4)),
            "error": field(st.one_of(st.none(), st.text(max_size=4))),
            "exec": field(st.just(exec_report)),
        }
        for key in draw(st.lists(st.sampled_from(sorted(item)), max_size=2)):
            item.pop(key, None)
        items.append(item)
        call_ids.append(f"c{i}")
    if draw(st.integers(0, 4)) == 0:
        call_ids = draw(st.lists(st.sampled_from(["c0", "c1", "c2"]), max_size=3))
    text = json.dumps({"results": items}, allow_nan=True)
    return text.encode(), call_ids


@given(answers())
def test_any_answer_gives_the_general_paths_results_or_nothing(
    answer: tuple[bytes, list[str]],
) -> None:
    agrees(*answer)


@given(st.lists(st.floats(0, 1e9) | st.integers(0, 2**53), min_size=1, max_size=4))
def test_plain_answers_always_take_the_fast_path(durations: list[float]) -> None:
    call_ids = [f"c{i}" for i in range(len(durations))]
    payload = body(
        *(result(c, exec=report(duration_s=d)) for c, d in zip(call_ids, durations, strict=True))
    )
    found = agrees(payload, call_ids)
    assert found is not None
    assert [r.exec.duration_s if r.exec else None for r in found] == [float(d) for d in durations]
    assert all(math.isfinite(r.exec.duration_s) for r in found if r.exec)
