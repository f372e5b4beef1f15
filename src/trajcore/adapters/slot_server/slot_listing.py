"""A slot's state as ``GET /v1/slots`` reports it."""

from __future__ import annotations

from trajcore.adapters.slot_server.slot_state import Slot, sandbox_pid
from trajcore.domain.slot_protocol import SlotInfo

__all__ = ["slot_info"]


def slot_info(slot: Slot) -> SlotInfo:
    """The slot's entry in the listing: its sandbox, its queue's statistics, its start."""
    calls = slot.calls.statistics()
    return SlotInfo(
        index=slot.index,
        sandbox_running=slot.agent is not None,
        busy=calls.busy,
        retired_epoch=calls.retired_epoch,
        calls_run=calls.calls_run,
        broken=calls.broken,
        sandbox_pid=sandbox_pid(slot),
        sandbox_start_s=slot.sandbox_start_s,
        set_aside=slot.set_aside,
        readied_lost=slot.readied_lost,
    )
