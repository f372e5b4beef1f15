"""The checks on what the rollout reports to the agent loop, before the loop takes it.

Each function either returns the checked value or raises ``InvalidInput`` naming the field at
fault and why; none changes anything, so a refused event leaves the loop as it was
(``trajcore.domain.agent_loop`` calls them before it moves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trajcore.domain.errors import InvalidInput
from trajcore.domain.tools import ToolCall, ToolResult
from trajcore.domain.turns import ParsedTurn

__all__ = ["check_distinct_call_ids", "check_results", "checked_count", "checked_now"]


def checked_count(field: str, value: object) -> int:
    """``value``, a count of tokens.

    Raises:
        InvalidInput: ``value`` is not an integer >= 0 (a bool is not one), at ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(field, f"must be an integer >= 0, got {value!r}")
    return value


def checked_now(now: object, *, after: float | None) -> float:
    """``now``, the time of an event, at or after ``after`` (the last event's, or ``None``).

    Raises:
        InvalidInput: ``now`` is not a finite number, or went backwards (field ``now``).
    """
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise InvalidInput("now", f"must be a finite number, got {now!r}")
    if after is not None and now < after:
        raise InvalidInput("now", f"went backwards: {now!r} after {after!r}")
    return now


def check_distinct_call_ids(turn: ParsedTurn) -> None:
    """Raises ``InvalidInput`` at ``turn.calls[i].id`` when a call repeats an earlier one's id
    (``ParsedTurn.with_distinct_ids`` makes them distinct)."""
    ids = [call.id for call in turn.calls]
    for i, call_id in enumerate(ids):
        if call_id in ids[:i]:
            raise InvalidInput(f"turn.calls[{i}].id", f"duplicate call id {call_id!r}")


def check_results(pending: Sequence[ToolCall], results: Sequence[ToolResult]) -> None:
    """Check that ``results`` answer each of the ``pending`` calls exactly once, in any order.

    Raises:
        InvalidInput: a result that answers no pending call or answers one twice
            (``results[i].call_id``), or a pending call without a result (``results``).
    """
    waiting = {call.id for call in pending}
    answered: set[str] = set()
    for i, result in enumerate(results):
        if result.call_id not in waiting:
            raise InvalidInput(f"results[{i}].call_id", f"{result.call_id!r} is not pending")
        if result.call_id in answered:
            raise InvalidInput(f"results[{i}].call_id", f"{result.call_id!r} answered twice")
        answered.add(result.call_id)
    missing = [call.id for call in pending if call.id not in answered]
    if missing:
        raise InvalidInput("results", f"no result for pending calls {missing}")
