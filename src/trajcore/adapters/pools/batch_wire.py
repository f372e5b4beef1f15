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
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from trajcore.domain.json_values import check_json
from trajcore.domain.slots import SlotCall

__all__ = ["batch_body", "json_bytes"]

_EXACT_FLOAT = 1 << 53  # the general path's validator converts larger ints to float (or fails)


def json_bytes(tree: Any) -> bytes:
    """``tree`` as compact UTF-8 JSON, as the slot codec's ``encode`` writes it (text that is not
    valid Unicode, a lone surrogate, as a ``\\uXXXX`` escape)."""
    text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(tree, ensure_ascii=True, separators=(",", ":")).encode()


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
            or type(arguments) is not dict
        ):  # fmt: skip
            return None
        if type(timeout) is float:
            if not 0.0 < timeout < math.inf:
                return None
        elif type(timeout) is not int or not 0 < timeout <= _EXACT_FLOAT:
            return None
        if check_json(arguments, "$.arguments"):
            return None
        items.append({
            "slot": slot, "epoch": epoch, "call_id": call_id, "tool": tool,
            "arguments": arguments, "timeout_s": timeout,
        })  # fmt: skip
        per_slot[slot] = per_slot.get(slot, 0.0) + timeout
    return json_bytes({"calls": items}), max(per_slot.values(), default=0.0)
