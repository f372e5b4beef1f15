"""A slot server's "try again later": a 408 or 429 that a proxy in front of it answered.

A slot server never answers 408 or 429 itself; a proxy or gateway between a pool and it does
(a rate limit, a request it gave up reading). The answer says nothing about the server's health
and nothing about what the calls carry: the request was not served, and every request of the
protocol may be sent again (``SlotServerClient``'s module docstring). So it is sent again, after
the wait the answer asks for (``Retry-After``, seconds or an HTTP date) or, without one, a short
backoff, while a budget of waiting that starts at the first such answer lasts.

Rules it keeps:

- Each try gets the request's whole limit; only the waits between tries count against the
  budget, and no wait passes its end: an answer asking for longer than what is left ends the
  tries at once, with that answer.
- The waits double from ``FIRST_WAIT_S`` up to ``LONGEST_WAIT_S``; a longer ``Retry-After`` is
  waited for in full (a shorter one, ``0`` included, never makes the tries a busy loop).
- What comes back is the first answer that is not "try again later", or the last one that was.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from trajcore.adapters.http1.values import Response
from trajcore.adapters.llm.wire import retry_after_s
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolOutcome, ToolResult

__all__ = [
    "FIRST_WAIT_S",
    "LONGEST_WAIT_S",
    "TRY_LATER",
    "not_served",
    "served",
    "wait_before_retry",
]

TRY_LATER = frozenset({408, 429})
"""The statuses that ask for the same request later."""
FIRST_WAIT_S = 0.05
"""The wait after a first "try again later" that does not say how long."""
LONGEST_WAIT_S = 2.0
"""The longest wait between tries that no ``Retry-After`` asked for."""


def wait_before_retry(tries: int, asked_s: float | None, left_s: float) -> float | None:
    """Seconds to wait after the ``tries``-th "try again later" (from 1) before the next try:
    a doubling backoff, or ``asked_s`` (its ``Retry-After``) when that is longer; ``None`` when
    the wait would pass the ``left_s`` the budget still holds (give up now)."""
    backoff = min(FIRST_WAIT_S * 2 ** min(tries - 1, 16), LONGEST_WAIT_S)
    wait = backoff if asked_s is None else max(asked_s, backoff)
    return wait if wait <= left_s else None


async def served(send: Callable[[], Awaitable[Response]], budget_s: float) -> Response:
    """The answer of ``send()``, tried again after each "try again later" (``TRY_LATER``) while
    ``budget_s`` of waiting, counted from the first one, allows; the last answer otherwise.

    Raises what ``send`` raises.
    """
    loop = asyncio.get_running_loop()
    end: float | None = None
    tries = 0
    while True:
        response = await send()
        if response.status not in TRY_LATER:
            return response
        now = loop.time()
        end = now + budget_s if end is None else end
        tries += 1
        asked = retry_after_s(response.headers, now=time.time())
        wait = wait_before_retry(tries, asked, end - now)
        if wait is None:
            return response
        await asyncio.sleep(wait)


def not_served(
    calls: Sequence[ExecuteCall], status: int, detail: str, waited_s: float
) -> list[ToolResult]:
    """The results of ``calls`` whose request was still "try again later" (``status``) after
    ``waited_s`` of waiting: each an ``INFRA_ERROR`` (they did not run; no fault of theirs,
    so never ``REJECTED``), naming the status and ``detail`` (the answer's error)."""
    reason = f"not served: HTTP {status} (try again later) past {waited_s:g} s: {detail}"
    outcome = ToolOutcome.INFRA_ERROR
    content = f"Error: {reason}"
    return [
        ToolResult(call_id=c.call_id, name=c.tool, outcome=outcome, content=content, error=reason)
        for c in calls
    ]
