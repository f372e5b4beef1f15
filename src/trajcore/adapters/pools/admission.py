"""Which slot servers may join a pool: only fresh ones.

A pool hands a joined server's slots out as free. That is right only for a server no lease has
used yet: a server the pool once counted as lost (a Slurm job suspended then resumed, a Nomad
client that reconnects) may come back with the old leases' workspaces and sandboxes, and
handing those out would let the next trajectory see the previous one's files and processes.
The sources never join such a run on purpose; this check is the second line: before a server's
slots enter the book, its slot listing must show that nothing ran in any of them.

A fresh server's listing, slot by slot: no call running (``busy``), no sandbox running, no call
run yet (``calls_run``), no epoch retired by a reset (``retired_epoch``). Its sandboxes start
with the first lease's first call, never at the server's start.
"""

from __future__ import annotations

import logging

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.errors import SlotServerError
from trajcore.domain.slot_protocol import SlotInfo, SlotListing

__all__ = ["check_fresh", "slots_in_use"]

_log = logging.getLogger(__name__)


def _use(slot: SlotInfo) -> str | None:
    if slot.busy:
        return "a call is running"
    if slot.sandbox_running:
        return "its sandbox is running"
    if slot.calls_run:
        return f"{slot.calls_run} calls ran"
    if slot.retired_epoch:
        return f"leases up to epoch {slot.retired_epoch} ended"
    return None


def slots_in_use(listing: SlotListing) -> list[str]:
    """What shows that a lease used each slot of ``listing`` (``"slot 2: a call is running"``);
    empty for a fresh server."""
    return [f"slot {s.index}: {use}" for s in listing.slots if (use := _use(s)) is not None]


async def check_fresh(client: SlotServerClient, name: str) -> None:
    """Refuse the server ``name`` unless its slot listing shows a fresh server.

    Raises ``SlotServerError`` naming the server and the slots in use (a warning says the same),
    and whatever ``client.list_slots`` raises.
    """
    used = slots_in_use(await client.list_slots())
    if used:
        reason = (
            f"slot server {name} was refused: it is not fresh, a lease used it "
            f"({'; '.join(used[:4])}{'; ...' if len(used) > 4 else ''})"
        )
        _log.warning("%s", reason)
        raise SlotServerError(reason)
