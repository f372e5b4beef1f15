"""Identities of sandbox slots and leases, shared by the slot book, the pools and the dispatcher.

A *slot* is one workspace in one container (a slot server); a *lease* is one trajectory's
exclusive use of a slot. Every lease carries the slot's epoch at the time it was granted: the epoch
grows on every grant, so a release or call with an old epoch is recognisably stale and can be
rejected instead of freeing (or running in) a slot that now belongs to someone else.

Slot ids and leases are dictionary keys on every tool call's path (the batch planner, the slot
book), so each computes its hash once and keeps it.
"""

from __future__ import annotations

import enum

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import JSONObject
from trajcore.domain.tools import ToolCall

__all__ = ["Lease", "PoolStatistics", "SlotCall", "SlotId", "SlotState", "time_left_spent"]


@attrs.frozen(kw_only=True, order=True, cache_hash=True)
class SlotId:
    """A slot's address: the container (slot server) that holds it and its index there."""

    container: str
    index: int = attrs.field(validator=attrs.validators.ge(0))

    def __str__(self) -> str:
        return f"{self.container}/{self.index}"


class SlotState(enum.Enum):
    """Where a slot is in its life. Every slot is in exactly one of these."""

    FREE = "free"  # ready to be leased
    LEASED = "leased"  # held by one trajectory
    RESETTING = "resetting"  # released; its sandbox is being torn down and its workspace wiped
    QUARANTINED = "quarantined"  # a reset or its server failed; never leased again
    DRAINING = "draining"  # its container is being removed; leased again never, freed to gone


@attrs.frozen(kw_only=True, cache_hash=True)
class Lease:
    """One trajectory's hold on one slot.

    Attributes:
        slot: The leased slot.
        epoch: The slot's grant counter when this lease was made.
        holder: Who holds it (a trajectory id), for statistics and logs.
    """

    slot: SlotId
    epoch: int = attrs.field(validator=attrs.validators.ge(1))
    holder: str


@attrs.frozen(kw_only=True)
class SlotCall:
    """A tool call bound to the lease it runs under, as sent to a slot server.

    Attributes:
        lease: The lease whose slot runs the call; its epoch guards against stale use.
        call: The tool call, its id doubling as the idempotency key.
        timeout_s: The limit the env's policy gives this call (never the model's own figure).
        hook: Sent by one of the env's hooks (prepare, score), never by the model: a command it
            starts may use the lease's process reserve (docs/sandbox.md, "Processes").
        time_left_s: The time its turn has left, in seconds from when the pool is handed the
            call: the slot runs a call of it under what remains of that time when it starts
            (its timeout cut to it, if shorter) and answers one that would start with none left
            ``TIMEOUT`` without running it. A turn's calls in one slot run one after another, so
            this bounds them all, where ``timeout_s`` bounds each. ``None``: only ``timeout_s``.
    """

    lease: Lease
    call: ToolCall
    timeout_s: float = attrs.field(
        validator=validators.finite_number(0.0, unit="seconds", error=InvalidInput)
    )
    hook: bool = attrs.field(
        default=False, kw_only=True, validator=validators.instance_of(bool, error=InvalidInput)
    )
    time_left_s: float | None = attrs.field(
        default=None,
        kw_only=True,
        validator=validators.finite_number(0.0, optional=True, unit="seconds", error=InvalidInput),
    )

    @property
    def container(self) -> str:
        return self.lease.slot.container

    @property
    def arguments(self) -> JSONObject:
        return self.call.arguments


def time_left_spent(time_left_s: float) -> str:
    """Why a call given ``time_left_s`` (``SlotCall.time_left_s``) was answered ``TIMEOUT``
    without running: the calls before it in its slot spent its turn's time. The model reads it
    in the call's result; every pool words it so."""
    return (
        f"not run: its turn's time ran out before it could start (it had {time_left_s:.3g} s "
        "left, spent by the calls before it in this slot)"
    )


@attrs.frozen(kw_only=True)
class PoolStatistics:
    """A snapshot of a sandbox pool (or of its slot book).

    Attributes:
        containers: Containers known and not lost.
        free, leased, resetting, quarantined, draining: Slots in each state.
        waiting: Lease requests queued for a slot.
        leases_granted: Leases granted since the start.
        leases_expired: Lease requests whose deadline passed before a slot came.
    """

    containers: int
    free: int
    leased: int
    resetting: int
    quarantined: int
    draining: int
    waiting: int
    leases_granted: int = 0
    leases_expired: int = 0

    @property
    def total(self) -> int:
        return self.free + self.leased + self.resetting + self.quarantined + self.draining
