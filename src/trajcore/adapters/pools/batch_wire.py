"""A batch of ``SlotCall`` values straight to its ``POST /v1/execute`` body: the env's fast path.

The general path builds an ``ExecuteCall`` per call (``domain.slot_protocol.execute_call``, every
validator running), an ``ExecuteRequest`` around them, and then unstructures them again for the
codec. On the env's hot path the values come from ``SlotCall``s that are already checked, so
``batch_body`` reads them once and writes the JSON tree the codec would write, after the same
checks ``ExecuteCall``'s validators make, done by exact type (``int``, ``float``, ``str``,
``dict``) with the arguments still checked as JSON (a caller may have changed the dict after its
``ToolCall`` was made). Anything else (a subclass, a ``bool`` index, an out-of-range or
non-finite figure, an empty name, arguments that are not JSON) returns ``None`` and the caller
takes the general path, which refuses it as it always did, naming the field.

So both paths send the same bytes with the same deadline for every batch the general path
accepts, and the fast path accepts nothing the general path refuses
(``tests/unit/test_batch_wire.py``).

The answer comes back the same way: ``batch_results`` reads a ``POST /v1/execute`` response body
in one pass into the calls' ``ToolResult``s, checking each answers its call, where the general path
(``codec.decode`` into an ``ExecuteResponse``, then the client's count and ``call_id`` checks)
builds the response and walks it again. It takes only the exact shapes the slot codec's own fast
path takes, builds every value through its constructor (so every validator runs), and returns
``None`` for anything else, for the general path to accept or refuse as it always did, naming
the field (``tests/unit/test_batch_results.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from trajcore.adapters.exec_wire import read_exec_report
from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import check_json
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import SandboxBudget, ToolOutcome, ToolResult

__all__ = ["batch_body", "batch_results", "json_bytes"]

_EXACT_FLOAT = 1 << 53  # the general path's validator converts larger ints to float (or fails)
_OUTCOMES = {outcome.value: outcome for outcome in ToolOutcome}
_BUDGETS = {budget.value: budget for budget in SandboxBudget}
# The codec's encoding, built once. A cycle cannot reach it: ``check_json`` refuses (or recurses
# out of) any tree before it is encoded, so the circular check is left off.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_PLAIN = (str, int, bool, type(None))


def json_bytes(tree: Any) -> bytes:
    """``tree`` as compact UTF-8 JSON, as the slot codec's ``encode`` writes it (text that is not
    valid Unicode, a lone surrogate, as a ``\\uXXXX`` escape)."""
    text = _COMPACT.encode(tree)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(tree).encode()


def batch_body(calls: Sequence[SlotCall]) -> tuple[bytes, float] | None:
    """The request body for ``calls`` and the batch's own limit (the slowest slot's timeouts in
    sequence, as ``ExecuteRequest.deadline_s`` without its grace); ``None`` when a call is not
    of the plain shape, for the general path to decide."""
    items: list[dict[str, Any]] = []
    per_slot: dict[int, float] = {}
    for call in calls:
        lease, tool_call, timeout = call.lease, call.call, call.timeout_s
        slot, epoch = lease.slot.index, lease.epoch
        call_id, tool, arguments = tool_call.id, tool_call.name, tool_call.arguments
        if (
            type(slot) is not int or slot < 0 or type(epoch) is not int or epoch < 0
            or type(call_id) is not str or not call_id or type(tool) is not str or not tool
            or type(arguments) is not dict or type(call.hook) is not bool
        ):  # fmt: skip
            return None
        if type(timeout) is float:
            if not 0.0 < timeout < math.inf:
                return None
        elif type(timeout) is not int or not 0 < timeout <= _EXACT_FLOAT:
            return None
        left = call.time_left_s
        if left is not None and not _plain_seconds(left):
            return None
        # str keys and values of exactly str, int, bool or None: nothing for ``check_json``
        # to refuse (decided inline, without a call per call); anything else, it decides
        for key, value in arguments.items():
            if type(key) is not str or type(value) not in _PLAIN:
                if check_json(arguments, "$.arguments"):
                    return None
                break
        items.append({
            "slot": slot, "epoch": epoch, "call_id": call_id, "tool": tool,
            "arguments": arguments, "timeout_s": timeout, "time_left_s": left,
            "hook": call.hook,
        })  # fmt: skip
        per_slot[slot] = per_slot.get(slot, 0.0) + timeout
    return json_bytes({"calls": items}), max(per_slot.values(), default=0.0)


def _plain_seconds(value: object) -> bool:
    """Whether ``value`` is seconds > 0 of the plain shape: a finite ``float`` or an ``int``
    that a float holds exactly (others: the general path decides)."""
    if type(value) is float:
        return 0.0 < value < math.inf
    return type(value) is int and 0 < value <= _EXACT_FLOAT


def batch_results(
    payload: bytes, call_ids: Sequence[str]
) -> tuple[list[ToolResult], str | None] | None:
    """The results of a ``POST /v1/execute`` answer ``payload``, one per call of ``call_ids``
    in order, each answering its call, and the server's ``boot``; ``None`` when the answer is
    not JSON of the plain shape or does not answer the calls one for one, for the general path
    to decide."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):  # UnicodeDecodeError; nested too deep: ``decode`` says
        return None
    if type(data) is not dict:
        return None
    items, boot = data.get("results"), data.get("boot")
    if type(items) is not list or len(items) != len(call_ids):
        return None
    if boot is not None and type(boot) is not str:
        return None
    try:
        results = _read_results(items, call_ids)
    except (InvalidInput, ValueError, TypeError):  # a validator added since: the general path
        return None
    return None if results is None else (results, boot)


def _read_results(items: list[Any], call_ids: Sequence[str]) -> list[ToolResult] | None:
    out: list[ToolResult] = []
    outcomes = _OUTCOMES
    for item, asked in zip(items, call_ids, strict=True):
        if type(item) is not dict:
            return None
        call_id, name, outcome = item.get("call_id"), item.get("name"), item.get("outcome")
        content, error, found = item.get("content", ""), item.get("error"), item.get("exec")
        budget = item.get("sandbox_budget")  # set only on a call whose lease a budget ended
        lease_refused = item.get("lease_refused", False)  # set only on a refusal of the lease
        if (
            type(call_id) is not str or call_id != asked or type(name) is not str
            or type(outcome) is not str or outcome not in outcomes or type(content) is not str
            or (error is not None and type(error) is not str)
            or (budget is not None and (type(budget) is not str or budget not in _BUDGETS))
            or type(lease_refused) is not bool
        ):  # fmt: skip
            return None
        report = None
        if found is not None:
            report = read_exec_report(found)
            if report is None:
                return None
        result = ToolResult(
            call_id=call_id, name=name, outcome=outcomes[outcome], content=content, error=error,
            exec=report, sandbox_budget=None if budget is None else _BUDGETS[budget],
            lease_refused=lease_refused,
        )  # fmt: skip
        out.append(result)
    return out
