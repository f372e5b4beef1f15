"""The fast path of the slot-server codec for what travels on every tool call: a batch of
calls (``ExecuteRequest``) and its results (``ExecuteResponse``).

The converter in ``codec`` is general and names the path of every fault, and costs tens of
microseconds per call doing it. These functions take only the exact shapes ``json.loads``
produces for a well-formed message (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``,
``None``, compared by exact type) and build the values through their own constructors, so
every validator of ``domain.slot_protocol`` and ``domain.tools`` still runs. Anything else
(a missing key, a key a request does not know, a wrong type, a value a validator refuses, a
huge integer) returns ``None``,
and ``codec.structure`` hands the data to the converter, which accepts or refuses it exactly as
before and names the field. So the fast path can only be faster, never more permissive: for any
input it either gives the value the converter would give, or gives nothing.

Unstructuring a batch writes the same JSON tree the converter writes (keys in field order,
enums by value, ``None`` kept). A batch's results, written on every call, leave out each field
at its default (``content`` empty, no ``error``, no ``exec``, no ``sandbox_budget``, not
``lease_refused``; in ``exec`` empty streams, no
bytes dropped, not timed out, not sandboxed), in the converter's key order otherwise: every
reader (the converter, this fast path, the env's ``pools.batch_wire``) takes a field left out
as its default, so the value read back is the same, in about half the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from trajcore.adapters.exec_wire import read_exec_report
from trajcore.domain.errors import InvalidInput
from trajcore.domain.slot_protocol import ExecuteCall, ExecuteRequest, ExecuteResponse
from trajcore.domain.tools import ExecReport, SandboxBudget, ToolOutcome, ToolResult

__all__ = ["FAST_STRUCTURE", "FAST_UNSTRUCTURE"]

_OUTCOMES = {outcome.value: outcome for outcome in ToolOutcome}
_BUDGETS = {budget.value: budget for budget in SandboxBudget}
_EXACT_FLOAT = 1 << 53  # integers up to this convert to float exactly, as the converter's do
_REFUSED = (InvalidInput, ValueError, TypeError)
# a request's keys: any other is refused by the converter (``codec.REQUEST_TYPES``)
_CALL_KEYS = frozenset(field.name for field in attrs.fields(ExecuteCall))
_REQUEST_KEYS = frozenset(field.name for field in attrs.fields(ExecuteRequest))
T = TypeVar("T")


def _number(value: object) -> float | None:
    """``value`` as the converter's strict float would give it, or ``None`` to let it decide."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int and -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
        return float(value)
    return None


def _call(item: object) -> ExecuteCall | None:
    if type(item) is not dict or not item.keys() <= _CALL_KEYS:
        return None
    slot, epoch, call_id, tool = (
        item.get("slot"),
        item.get("epoch"),
        item.get("call_id"),
        item.get("tool"),
    )
    arguments, hook = item.get("arguments", {}), item.get("hook", False)
    timeout = _number(item.get("timeout_s"))
    left = item.get("time_left_s")  # absent or None: no turn's time (an older client)
    time_left = None if left is None else _number(left)
    if (left is not None and time_left is None) or (
        type(slot) is not int or type(epoch) is not int or type(call_id) is not str
        or type(tool) is not str or type(arguments) is not dict or timeout is None
        or type(hook) is not bool
    ):  # fmt: skip
        return None
    # the constructor's validators check ranges, emptiness and that arguments are JSON
    return ExecuteCall(
        slot=slot, epoch=epoch, call_id=call_id, tool=tool, arguments=arguments,
        timeout_s=timeout, time_left_s=time_left, hook=hook,
    )  # fmt: skip


def _items(data: object, key: str, read: Callable[[object], T | None]) -> list[T] | None:
    """``data[key]`` read item by item with ``read``; ``None`` when any item is not of the exact
    shape (the converter then decides)."""
    if type(data) is not dict:
        return None
    items = data.get(key)
    if type(items) is not list:
        return None
    out = []
    try:
        for item in items:
            value = read(item)
            if value is None:
                return None
            out.append(value)
    except _REFUSED:
        return None
    return out


def _execute_request(data: object) -> ExecuteRequest | None:
    if type(data) is dict and not data.keys() <= _REQUEST_KEYS:
        return None
    calls = _items(data, "calls", _call)
    return None if calls is None else ExecuteRequest(calls=calls)


def _result(data: object) -> ToolResult | None:
    if type(data) is not dict:
        return None
    call_id, name, outcome = data.get("call_id"), data.get("name"), data.get("outcome")
    content, error = data.get("content", ""), data.get("error")
    found, budget = data.get("exec"), data.get("sandbox_budget")
    lease_refused = data.get("lease_refused", False)
    report = None if found is None else read_exec_report(found)
    if (
        type(call_id) is not str or type(name) is not str or type(outcome) is not str
        or outcome not in _OUTCOMES or type(content) is not str
        or (error is not None and type(error) is not str) or (found is not None and report is None)
        or (budget is not None and (type(budget) is not str or budget not in _BUDGETS))
        or type(lease_refused) is not bool
    ):  # fmt: skip
        return None
    return ToolResult(
        call_id=call_id, name=name, outcome=_OUTCOMES[outcome], content=content, error=error,
        exec=report, sandbox_budget=None if budget is None else _BUDGETS[budget],
        lease_refused=lease_refused,
    )  # fmt: skip


def _execute_response(data: object) -> ExecuteResponse | None:
    results = _items(data, "results", _result)
    if results is None:
        return None
    assert type(data) is dict  # _items read a list from it
    boot = data.get("boot")
    if boot is not None and type(boot) is not str:
        return None  # the general path says what is wrong
    return ExecuteResponse(results=results, boot=boot)


def _unstructure_request(request: ExecuteRequest) -> dict[str, Any]:
    return {
        "calls": [
            {
                "slot": call.slot,
                "epoch": call.epoch,
                "call_id": call.call_id,
                "tool": call.tool,
                "arguments": call.arguments,
                "timeout_s": call.timeout_s,
                "time_left_s": call.time_left_s,
                "hook": call.hook,
            }
            for call in request.calls
        ]
    }


def _unstructure_report(report: ExecReport) -> dict[str, Any]:
    tree: dict[str, Any] = {"exit_code": report.exit_code}
    if report.stdout:
        tree["stdout"] = report.stdout
    if report.stderr:
        tree["stderr"] = report.stderr
    if report.stdout_dropped:
        tree["stdout_dropped"] = report.stdout_dropped
    if report.stderr_dropped:
        tree["stderr_dropped"] = report.stderr_dropped
    if report.timed_out:
        tree["timed_out"] = True
    tree["duration_s"] = report.duration_s
    if report.sandboxed:
        tree["sandboxed"] = True
    return tree


def _unstructure_result(result: ToolResult) -> dict[str, Any]:
    tree: dict[str, Any] = {
        "call_id": result.call_id,
        "name": result.name,
        "outcome": result.outcome._value_,  # ``value``, without its descriptor
    }
    if result.content:
        tree["content"] = result.content
    if result.error is not None:
        tree["error"] = result.error
    if result.exec is not None:
        tree["exec"] = _unstructure_report(result.exec)
    if result.sandbox_budget is not None:
        tree["sandbox_budget"] = result.sandbox_budget._value_
    if result.lease_refused:
        tree["lease_refused"] = True
    return tree


def _unstructure_response(response: ExecuteResponse) -> dict[str, Any]:
    tree: dict[str, Any] = {"results": [_unstructure_result(r) for r in response.results]}
    if response.boot is not None:
        tree["boot"] = response.boot
    return tree


FAST_STRUCTURE: dict[type, Callable[[object], object | None]] = {
    ExecuteRequest: _execute_request,
    ExecuteResponse: _execute_response,
}
"""Per type: JSON data to the value, or ``None`` (let the converter decide)."""

FAST_UNSTRUCTURE: dict[type, Callable[[Any], Any]] = {
    ExecuteRequest: _unstructure_request,
    ExecuteResponse: _unstructure_response,
}
"""Per type: the value as the JSON tree the converter would write."""
