"""One batch of tool calls sent to one slot server, with the failure rules both real pools share.

The local pool and the Nomad pool differ in how their slot servers start, die and get replaced;
they do not differ in what ``SandboxPool.execute`` promises about a batch. ``execute_batch``
keeps those promises once, for both:

- A call whose lease is not current in the slot book (stale, released, for another container)
  is ``REJECTED`` with the reason, and is never sent; one whose lease ended because its slot
  server was lost is an ``INFRA_ERROR`` (the trajectory's infrastructure failed, not its
  model), also never sent.
- When the container is gone (no live client), every other call is an ``INFRA_ERROR``.
- The rest go to the slot server as one request, or as several when one would pass the server's
  ``MAX_REQUEST_BYTES``. What the calls carry never fails the batch: the client answers a call
  too large for any request, and each call of a request the server refuses itself (413 too
  large, 400 malformed), with a ``REJECTED`` result of its own (``SlotServerClient.execute``).
- A ``SlotServerError`` (unreachable, crashed, timed out, 5xx, 401) or an answer outside the
  protocol (``InvalidInput``: ``WireError`` and kin) makes each of those calls an
  ``INFRA_ERROR`` naming the cause, and the pool's ``lose`` callback takes the container out of
  service (its slots leave the book, its leases turn stale).
- One result per call, in the order of the calls; nothing raises for a call's failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.leasing import SlotLeasing
from trajcore.domain.errors import InvalidInput, SlotServerError
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolOutcome, ToolResult

__all__ = ["execute_batch", "refuse_stale"]


def refuse_stale(
    leasing: SlotLeasing, container: str, calls: Sequence[SlotCall]
) -> tuple[list[ToolResult | None], list[int]]:
    """The batch's first step, for every pool: a ``REJECTED`` result for each call whose lease
    is not current (an ``INFRA_ERROR`` where its server was lost; ``None`` for the others), and
    the indices of the calls that may run."""
    results: list[ToolResult | None] = [None] * len(calls)
    runnable: list[int] = []
    for i, call in enumerate(calls):
        refusal = leasing.refusal(container, call)
        if refusal is None:
            runnable.append(i)
        elif call.container == container and leasing.was_lost(container):  # ended with it
            lease = f"{call.lease.slot}#{call.lease.epoch}"
            reason = f"slot server {container} was lost: lease {lease} ended with it"
            results[i] = ToolResult.failure(call.call, ToolOutcome.INFRA_ERROR, reason)
        else:
            results[i] = ToolResult.lease_refusal(call.call, refusal)
    return results, runnable


async def execute_batch(
    leasing: SlotLeasing,
    container: str,
    calls: Sequence[SlotCall],
    client: SlotServerClient | None,
    lose: Callable[[str], None],
) -> list[ToolResult]:
    """Run ``calls`` for ``container`` through ``client`` (``None``: the container is gone).

    Returns one result per call, in order. ``lose(reason)`` is called once when the server fails
    the batch. Never raises for a call's or the server's failure.
    """
    results, runnable = refuse_stale(leasing, container, calls)
    if runnable and client is None:
        reason = f"slot server {container} is gone"
        for i in runnable:
            results[i] = ToolResult.failure(calls[i].call, ToolOutcome.INFRA_ERROR, reason)
        runnable = []
    if runnable:
        assert client is not None
        try:
            answers = await client.execute_slot_calls([calls[i] for i in runnable])
        except (SlotServerError, InvalidInput) as error:
            reason = f"slot server {container} failed the batch: {error}"
            for i in runnable:
                results[i] = ToolResult.failure(calls[i].call, ToolOutcome.INFRA_ERROR, reason)
            lose(reason)
        else:
            for i, answer in zip(runnable, answers, strict=True):
                results[i] = answer
    return [result for result in results if result is not None]
