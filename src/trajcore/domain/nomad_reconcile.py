"""Which Nomad allocations the pool uses, drains, gives up on and asks to have replaced.

The Nomad pool runs its slot servers as the allocations of one job and polls the job's
allocation listing. Everything it decides from that listing lives here, without any I/O: which
running allocations to join, which joined ones are gone (lost, or removed after draining), which
to stop so that Nomad's reschedule policy places a replacement, which to drain or bring back for
a new target, and when to change the job's count. The adapter lists allocations, feeds them in
with the demand and the time, and carries out the actions it gets back.

Events (each returns the actions to carry out, in order):

- ``observe(allocations, demand, now)``: one poll. ``allocations`` are ``Allocation`` values of
  the job's current version as Nomad lists them, with the slot book's counts of the pool's own
  container on each (``held``, ``quarantined``); ``demand`` is leased plus waiting slots.
- ``registered(count)`` / ``scaled(count)``: Nomad accepted the job, or a new count.
- ``joined(alloc_id, now)``: a ``Join`` succeeded (the slot server is healthy, its slots can
  be added); ``join_failed(alloc_id, reason, now)``: it did not.
- ``failed(alloc_id, reason, now)``: a joined slot server failed a batch or a reset.

Each member allocation is in one state:

    =========  ===================================  ===============================================
    state      entered by                           left by
    =========  ===================================  ===============================================
    JOINING    ``Join`` (running, not retired)      ``joined`` (JOINED or DRAINING), ``join_failed``
                                                    or the join deadline (``Replace``), gone
    JOINED     ``joined``, ``Undrain``              index >= target or a duplicate index
                                                    (``Drain``), gone (``Lose``), ``failed``
    DRAINING   ``Drain``, ``joined`` when unwanted  index < target again and nothing held
                                                    (``Undrain``), gone (``Remove`` when nothing
                                                    is held, else ``Lose``), ``failed``
    =========  ===================================  ===============================================

An allocation may be *ending*: its scheduler will end it soon (a Slurm job near its time
limit). An ending run is never joined; a JOINED member whose run is ending is drained at once
(before any other on its index, so a fresh run of the same index joins beside it) and, once it
holds nothing, removed and stopped (``Remove``, then ``Replace``); it is never undrained. The
Nomad pool never reports one, so none of this touches it.

"Gone" is: no longer listed, finished (terminal on the client or no longer desired to run), or
restarted in place (a restarted slot server has forgotten its slots; the new run joins afresh).
An allocation whose run failed to join, failed a batch or reset, or was restarted in place more
than ``restart_attempts`` times is *retired*: asked to stop once (``Replace``) and never joined
again under that run (``(alloc_id, restarts)``). A run that is gone is retired too: its leases
turned stale, but its server may still hold their workspaces and processes, so a run the
scheduler lost (client status ``lost``: a Slurm job suspended or preempted, a Nomad client
disconnected) is asked to stop at once, and any other gone run that is seen running again is
asked to stop then; either way once, and it is never joined again.

Rules it keeps (``check_valid`` asserts them):

- The target is the ``ScaleRules``'s, always within ``[min_containers, max_containers]``; a
  ``SetCount`` never asks for more than ``max_containers``.
- Capacity is the JOINED members only: draining and joining ones do not count. At most one
  JOINED member per index and every JOINED index is below the target, so capacity never
  exceeds the target, hence never the maximum.
- Up at once: a target above the job's count sets the count at once. Down only once drained:
  Nomad stops the highest indices when the count drops, so those members are drained first and
  the count is lowered only when none of them holds a slot.
- A member that restarted in place more than ``restart_attempts`` times, or whose join takes
  longer than ``join_timeout_s``, is replaced; every retired run is replaced exactly once, a
  gone one only when it is lost or runs again. A retired run is never a member again.
- Deterministic: the same events give the same actions, whatever the order of the listing (it
  is read by index, then ID).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Final

import attrs

from trajcore.domain.errors import InvalidInput
from trajcore.domain.scaling import ScaleReason, ScaleRules, ScaleSettings
from trajcore.domain.validators import (
    instance_of,
    non_negative_int,
    positive_int,
    positive_seconds,
    whole_number,
)

__all__ = [
    "TERMINAL_CLIENT_STATUSES",
    "Action",
    "Allocation",
    "AllocationStatus",
    "ContainerAction",
    "Discard",
    "Drain",
    "Join",
    "Lose",
    "MemberState",
    "NomadReconciler",
    "ReconcileConfig",
    "Remove",
    "Replace",
    "SetCount",
    "Undrain",
]


def _is_count(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def _is_time(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


_count = whole_number(0, error=InvalidInput)


def _text(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInput(attribute.name, f"must be non-empty text, got {value!r}")


TERMINAL_CLIENT_STATUSES: Final = frozenset({"complete", "failed", "lost"})
"""Client statuses of an allocation that will never run again."""


class AllocationStatus:
    """What an allocation's two statuses mean, for every record of one that carries them."""

    __slots__ = ()
    client_status: str
    desired_status: str

    @property
    def running(self) -> bool:
        """Its slot server runs and Nomad wants it to."""
        return self.client_status == "running" and self.desired_status == "run"

    @property
    def finished(self) -> bool:
        """It stopped or will stop: terminal on the client or no longer desired."""
        return self.client_status in TERMINAL_CLIENT_STATUSES or self.desired_status != "run"


@attrs.frozen(kw_only=True)
class Allocation(AllocationStatus):
    """One allocation of the job as the pool sees it on one poll.

    Attributes:
        id: Nomad's allocation ID.
        index: The index in its name (``job.group[index]``); Nomad keeps it across
            replacements and stops the highest ones first when the count drops.
        client_status: ``pending``, ``running``, ``complete``, ``failed``, ``lost`` (or newer).
        desired_status: ``run``, ``stop`` or ``evict``.
        restarts: In-place restarts of its task so far.
        held: Slots of the pool's container on it that are leased or resetting (0 when not
            joined).
        quarantined: Slots of that container that are quarantined (0 when not joined).
        ending: Its scheduler ends it soon (a time limit): drain it, join it never.
    """

    id: str = attrs.field(validator=_text)
    index: int = attrs.field(validator=_count)
    client_status: str = attrs.field(validator=_text)
    desired_status: str = attrs.field(default="run", validator=_text)
    restarts: int = attrs.field(default=0, validator=_count)
    held: int = attrs.field(default=0, validator=_count)
    quarantined: int = attrs.field(default=0, validator=_count)
    ending: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


# ============================================================================ actions


@attrs.frozen(kw_only=True)
class Join:
    """Connect to the allocation's slot server, check its health, then call ``joined``."""

    alloc_id: str
    index: int
    restarts: int
    reason: str = "running and not yet joined"


@attrs.frozen(kw_only=True)
class ContainerAction:
    """What to do with one container of the book (the ``alloc_id``'s), and why."""

    alloc_id: str
    reason: str


class Drain(ContainerAction):
    """No new leases on this container; leased slots drain when released."""


class Undrain(ContainerAction):
    """A drained container is wanted again: its slots come back free."""


class Lose(ContainerAction):
    """The container is out of service: its slots leave the book, their leases turn stale."""


class Remove(ContainerAction):
    """A drained container whose allocation stopped: remove it (nothing was held)."""


class Discard(ContainerAction):
    """A join finished for an allocation no longer wanted: close it, never add its slots."""


@attrs.frozen(kw_only=True)
class Replace:
    """Ask Nomad to stop the allocation; its reschedule policy places a replacement.

    ``restarts`` names the run given up on (the allocation's in-place restarts then).
    """

    alloc_id: str
    restarts: int
    reason: str


@attrs.frozen(kw_only=True)
class SetCount:
    """Set the job's count; call ``scaled(count)`` once Nomad accepted it.

    Asked again on every ``observe`` until ``scaled`` confirms the count, so a failed request
    is retried on the next poll.
    """

    count: int
    reason: ScaleReason


Action = Join | Drain | Undrain | Lose | Remove | Discard | Replace | SetCount
"""What ``NomadReconciler`` asks its adapter to do."""


# ============================================================================ the machine


class MemberState(enum.Enum):
    """Where an allocation the pool took up stands."""

    JOINING = "joining"
    JOINED = "joined"
    DRAINING = "draining"


@attrs.frozen(kw_only=True)
class ReconcileConfig:
    """The reconciler's settings.

    Attributes:
        scale: The scaling rules' limits and damping.
        slots_per_container: Slots each allocation's slot server serves.
        restart_attempts: In-place restarts an allocation may have; beyond them it is replaced.
        join_timeout_s: Longest a join may take before the allocation is replaced.
    """

    scale: ScaleSettings = attrs.field(validator=instance_of(ScaleSettings))
    slots_per_container: int = attrs.field(default=1, validator=positive_int)
    restart_attempts: int = attrs.field(default=0, validator=non_negative_int)
    join_timeout_s: float = attrs.field(default=120.0, validator=positive_seconds)


@attrs.define
class _Member:
    index: int
    restarts: int
    state: MemberState
    since: float
    held: int = 0
    ending: bool = False


@attrs.define
class NomadReconciler:
    """The Nomad pool's decisions as a state machine: events in, actions out (module doc).

    The adapter's loop, in outline::

        machine = NomadReconciler(config)
        register the job with config.scale.min_containers; machine.registered(count)
        every poll:
            allocations = [Allocation(id=..., index=..., client_status=..., desired_status=...,
                                      restarts=..., held=book's held, quarantined=...)]
            for action in machine.observe(allocations, leased + waiting, now):
                Join -> connect; on health call machine.joined(id, now) (add the slots first,
                        then apply what it returns) or machine.join_failed(id, why, now)
                Drain / Undrain / Lose / Remove -> the slot book
                Discard -> close the connection, add nothing
                Replace -> POST /v1/allocation/{id}/stop (errors: retried by no one; note them)
                SetCount -> POST /v1/job/{id}/scale, then machine.scaled(count)
        a batch or reset fails: apply machine.failed(id, why, now)

    Every event raises ``InvalidInput`` naming the argument when it is malformed (``now`` going
    backwards, duplicate allocation IDs, a negative demand); an event about an allocation the
    machine does not hold (a late ``joined``) is answered with actions, never an error.

    Attributes:
        config: The settings.
    """

    config: ReconcileConfig
    _policy: ScaleRules = attrs.field(init=False)
    _target: int = attrs.field(init=False)
    _job_count: int | None = attrs.field(init=False, default=None)
    _members: dict[str, _Member] = attrs.field(init=False, factory=dict)
    _retired: set[tuple[str, int]] = attrs.field(init=False, factory=set)
    _unstopped: set[tuple[str, int]] = attrs.field(init=False, factory=set)
    _now: float = attrs.field(init=False, default=-math.inf)

    def __attrs_post_init__(self) -> None:
        self._policy = ScaleRules(self.config.scale, self.config.slots_per_container)
        self._target = self.config.scale.min_containers

    # ------------------------------------------------------------------------- inspection

    @property
    def target(self) -> int:
        """The container count the scaling rules want now."""
        return self._target

    @property
    def job_count(self) -> int | None:
        """The job's count as Nomad last accepted it (``None``: not registered)."""
        return self._job_count

    @property
    def capacity(self) -> int:
        """Members that take leases: JOINED ones (not draining, not joining)."""
        return sum(m.state is MemberState.JOINED for m in self._members.values())

    def members(self) -> dict[str, MemberState]:
        """The allocations taken up, by ID, in the order they were taken up."""
        return {alloc_id: m.state for alloc_id, m in self._members.items()}

    def retired(self, alloc_id: str, restarts: int) -> bool:
        """This run of the allocation was given up on and is never joined again."""
        return (alloc_id, restarts) in self._retired

    def check_valid(self) -> None:
        """The rules of the module doc (raises ``AssertionError``)."""
        scale = self.config.scale
        if not scale.min_containers <= self._target <= scale.max_containers:
            raise AssertionError(f"check_valid: target {self._target} is out of bounds")
        joined = [m.index for m in self._members.values() if m.state is MemberState.JOINED]
        if len(set(joined)) != len(joined):
            raise AssertionError(f"check_valid: two joined members share an index: {joined}")
        if any(index >= self._target for index in joined):
            raise AssertionError(f"check_valid: joined index at or above {self._target}")
        for alloc_id, member in self._members.items():
            if (alloc_id, member.restarts) in self._retired:
                raise AssertionError(f"check_valid: retired {alloc_id} is still a member")

    # ------------------------------------------------------------------------- events

    def registered(self, count: int) -> None:
        """Nomad accepted the job with ``count`` allocations."""
        self.scaled(count)

    def scaled(self, count: int) -> None:
        """Nomad accepted the job's count ``count``."""
        if not _is_count(count):
            raise InvalidInput("count", f"scaled: must be an integer >= 0, got {count!r}")
        self._job_count = count

    def observe(self, allocations: Iterable[Allocation], demand: int, now: float) -> list[Action]:
        """One poll: the job's allocations, the slots wanted, the time. Returns the actions.

        Raises ``InvalidInput`` naming ``allocations`` (not ``Allocation`` values, or an ID
        twice), ``demand`` (not an integer >= 0) or ``now`` (earlier than before, or NaN).
        """
        listing = sorted(_checked(allocations), key=lambda a: (a.index, a.id))
        if not _is_count(demand):
            raise InvalidInput("demand", f"observe: must be an integer >= 0, got {demand!r}")
        self._advance(now)
        by_id = {a.id: a for a in listing}
        actions: list[Action] = []
        for alloc_id, member in list(self._members.items()):
            seen = by_id.get(alloc_id)
            if seen is None:
                self._gone(alloc_id, member, "its allocation is no longer listed", actions)
            elif seen.finished:
                why = f"its allocation is {seen.client_status} (desired {seen.desired_status})"
                self._gone(alloc_id, member, why, actions)
            elif seen.restarts != member.restarts:
                self._gone(alloc_id, member, "its slot server restarted in place", actions)
            else:
                member.held = seen.held if member.state is not MemberState.JOINING else 0
                member.ending = seen.ending
                if member.ending and member.state is MemberState.DRAINING and not member.held:
                    del self._members[alloc_id]
                    self._retired.add((alloc_id, member.restarts))
                    why = "its run ends soon and it drained"
                    actions.append(Remove(alloc_id=alloc_id, reason=why))
                    actions.append(Replace(alloc_id=alloc_id, restarts=member.restarts, reason=why))
        self._join_new(listing, now, actions)
        self._scale(listing, demand, now, actions)
        return actions

    def joined(self, alloc_id: str, now: float) -> list[Action]:
        """A ``Join`` succeeded. Returns ``[Discard]`` when the allocation is no longer a
        joining member (it went away or timed out meanwhile), else the actions for the new
        container (``Drain`` when the target no longer wants its index)."""
        self._advance(now)
        member = self._members.get(alloc_id)
        if member is None or member.state is not MemberState.JOINING:
            return [Discard(alloc_id=alloc_id, reason="it joined after the pool gave it up")]
        member.state = MemberState.JOINED
        member.since = now
        actions: list[Action] = []
        self._drain_unwanted(actions)
        return actions

    def join_failed(self, alloc_id: str, reason: str, now: float) -> list[Action]:
        """A ``Join`` failed (unhealthy, wrong slot count, no sandbox): replace the allocation
        unless the machine gave it up already (then nothing)."""
        self._advance(now)
        member = self._members.get(alloc_id)
        if member is None or member.state is not MemberState.JOINING:
            return []
        return self._retire(alloc_id, member, f"it did not join: {reason}", lose=False)

    def failed(self, alloc_id: str, reason: str, now: float) -> list[Action]:
        """A joined slot server failed a batch or a reset: lose its container and replace
        the allocation (nothing when it is not a joined or draining member)."""
        self._advance(now)
        member = self._members.get(alloc_id)
        if member is None or member.state is MemberState.JOINING:
            return []
        return self._retire(alloc_id, member, reason, lose=True)

    # ------------------------------------------------------------------------- steps

    def _advance(self, now: float) -> None:
        if not (_is_time(now) and now >= self._now):
            raise InvalidInput("now", f"time went backwards or is not a number: {now!r}")
        self._now = now

    def _retire(self, alloc_id: str, member: _Member, reason: str, *, lose: bool) -> list[Action]:
        del self._members[alloc_id]
        self._retired.add((alloc_id, member.restarts))
        actions: list[Action] = []
        if lose:
            actions.append(Lose(alloc_id=alloc_id, reason=reason))
        actions.append(Replace(alloc_id=alloc_id, restarts=member.restarts, reason=reason))
        return actions

    def _gone(self, alloc_id: str, member: _Member, reason: str, actions: list[Action]) -> None:
        del self._members[alloc_id]
        # its server may come back with the old leases' workspaces and processes: never rejoin
        self._retired.add((alloc_id, member.restarts))
        self._unstopped.add((alloc_id, member.restarts))
        if member.state is MemberState.JOINING:
            return  # its join is answered with Discard
        if member.state is MemberState.DRAINING and member.held == 0:
            actions.append(Remove(alloc_id=alloc_id, reason=f"drained and {reason}"))
        else:
            actions.append(Lose(alloc_id=alloc_id, reason=reason))

    def _join_new(self, listing: list[Allocation], now: float, actions: list[Action]) -> None:
        attempts = self.config.restart_attempts
        for alloc_id, member in list(self._members.items()):
            if (
                member.state is MemberState.JOINING
                and now - member.since > self.config.join_timeout_s
            ):
                why = f"not healthy within {self.config.join_timeout_s} s"
                actions.extend(self._retire(alloc_id, member, why, lose=False))
        for seen in listing:
            key = (seen.id, seen.restarts)
            if key in self._unstopped and seen.desired_status == "run":
                if seen.running or seen.client_status == "lost":
                    self._unstopped.discard(key)
                    why = (
                        "it runs again after the pool gave it up"
                        if seen.running
                        else "its scheduler lost it: its server may come back with old leases"
                    )
                    actions.append(Replace(alloc_id=seen.id, restarts=seen.restarts, reason=why))
                continue
            if (
                not seen.running
                or seen.ending
                or seen.id in self._members
                or (seen.id, seen.restarts) in self._retired
            ):
                continue
            if seen.restarts > attempts:
                self._retired.add((seen.id, seen.restarts))
                why = f"restarted in place {seen.restarts} times (restart_attempts {attempts})"
                actions.append(Replace(alloc_id=seen.id, restarts=seen.restarts, reason=why))
                continue
            self._members[seen.id] = _Member(
                index=seen.index, restarts=seen.restarts, state=MemberState.JOINING, since=now
            )
            actions.append(Join(alloc_id=seen.id, index=seen.index, restarts=seen.restarts))

    def _scale(
        self, listing: list[Allocation], demand: int, now: float, actions: list[Action]
    ) -> None:
        decision = self._policy.decide(demand, self._target, now)
        self._target = decision.target
        self._drain_unwanted(actions)
        by_id = {a.id: a for a in listing}
        used = {m.index for m in self._members.values() if m.state is MemberState.JOINED}
        for alloc_id, member in list(self._members.items()):
            if (
                member.state is not MemberState.DRAINING
                or member.ending
                or member.index >= self._target
                or member.index in used
                or member.held
            ):
                continue
            seen = by_id.get(alloc_id)
            if seen is not None and seen.quarantined:
                why = f"{seen.quarantined} quarantined slots when the pool grew again"
                actions.extend(self._retire(alloc_id, member, why, lose=True))
                continue
            member.state = MemberState.JOINED
            used.add(member.index)
            actions.append(Undrain(alloc_id=alloc_id, reason=f"index below {self._target}"))
        count = self._job_count
        if count is None or count == self._target:
            return
        leaving = [
            m
            for m in self._members.values()
            if m.state is not MemberState.JOINING and m.index >= self._target
        ]
        if count < self._target or all(m.held == 0 for m in leaving):
            actions.append(SetCount(count=self._target, reason=decision.reason))

    def _drain_unwanted(self, actions: list[Action]) -> None:
        """Drain JOINED members at or above the target, and all but the first on an index."""
        used: set[int] = set()
        joined = [
            (m.since, a, m) for a, m in self._members.items() if m.state is MemberState.JOINED
        ]
        # (ending members first: their index goes to the run that replaces them)
        for _, alloc_id, member in sorted(
            joined, key=lambda entry: (not entry[2].ending, *entry[:2])
        ):
            if member.ending:
                why = "its run ends soon"
            elif member.index >= self._target:
                why = f"index {member.index} is at or above the target {self._target}"
            elif member.index in used:
                why = f"another container already serves index {member.index}"
            else:
                used.add(member.index)
                continue
            member.state = MemberState.DRAINING
            actions.append(Drain(alloc_id=alloc_id, reason=why))


def _checked(allocations: Iterable[Allocation]) -> list[Allocation]:
    listing = list(allocations)
    seen: set[str] = set()
    for allocation in listing:
        if not isinstance(allocation, Allocation):
            raise InvalidInput("allocations", f"expected Allocation values, got {allocation!r}")
        if allocation.id in seen:
            raise InvalidInput("allocations", f"allocation {allocation.id} is listed twice")
        seen.add(allocation.id)
    return listing
