"""The scaling rules: how many containers a pool should run for the demand it sees.

A pool (the Nomad pool above all) asks now and then: with this many slots wanted (*demand*:
leased plus waiting requests) and this many containers running, how many should run? The
rules answer with a target and a reason; the pool starts containers or drains them. Which ones
to drain is ``drain_order``: the containers the scheduler would remove first, so a scale-down
costs as few running trajectories as possible.

Rules it keeps (``needed`` is ``ceil(demand / slots_per_container)``):

- The target is always within ``[min_containers, max_containers]``.
- Scaling up covers the demand: the target is ``needed``, or ``max_containers`` when that is
  less.
- Hysteresis: it scales down only when the spare capacity (``current * slots_per_container -
  demand``) exceeds ``scale_down_margin`` slots, and then only to the smallest count that keeps
  at least that margin spare. Since that count never drops below ``needed``, a steady demand
  settles after at most one move: no flapping between two counts.
- Cooldown: it never changes direction within ``cooldown_s`` of its last change (an up after a
  down, or a down after an up, waits); moves in the same direction are not held back.
- Bounds win over the cooldown: a pool that runs fewer than ``min_containers`` or more than
  ``max_containers`` (settings changed, containers added by hand) is brought inside at once.

Each ``decide`` is one event; the rules remember only its last change (time and direction) and
assumes the pool acts on the target it returns:

    ====================================================  ==========  ========================
    situation                                             reason      target
    ====================================================  ==========  ========================
    current < min or current > max                        BOUNDS      clamped into the range
    needed > current                                      UP          min(needed, max)
    spare > margin and the keep-margin count < current    DOWN        max(min, keep-margin)
    otherwise                                             HOLD        current
    UP or DOWN against the last change, within cooldown   COOLDOWN    current
    ====================================================  ==========  ========================
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, InvalidInput

__all__ = [
    "ContainerLoad",
    "ScaleDecision",
    "ScaleReason",
    "ScaleRules",
    "ScaleSettings",
    "drain_order",
]


@attrs.frozen(kw_only=True)
class ScaleSettings:
    """The limits and damping of scaling: the one value every scheduled pool's config holds as
    its ``scaling`` (the slots each container serves are its slot servers', ``ScaleRules``
    takes them beside). Each pool states its own default value once (``NomadPoolConfig``: up to
    10 containers; ``CloudPoolConfig``: up to 4). A bad value is a ``ConfigError`` naming the
    field as given here (``max_containers``).

    Attributes:
        min_containers: Fewest containers to run, even with no demand.
        max_containers: Most containers to run, whatever the demand.
        scale_down_margin: Spare slots tolerated before scaling down; also the spare a
            scale-down keeps.
        cooldown_s: Seconds after a change during which the opposite change is held back.
    """

    min_containers: int = attrs.field(default=1, validator=validators.non_negative_int)
    max_containers: int = attrs.field(default=1, validator=validators.positive_int)
    scale_down_margin: int = attrs.field(default=0, validator=validators.non_negative_int)
    cooldown_s: float = attrs.field(default=30.0, validator=validators.non_negative_seconds)

    def __attrs_post_init__(self) -> None:
        if self.max_containers < self.min_containers:
            raise ConfigError(
                "max_containers",
                f"must be >= min_containers ({self.min_containers}), got {self.max_containers}",
            )

    def clamp(self, containers: int) -> int:
        """``containers`` brought into ``[min_containers, max_containers]``."""
        return max(self.min_containers, min(self.max_containers, containers))


class ScaleReason(enum.Enum):
    """Why the target is what it is."""

    HOLD = "hold"  # capacity fits the demand within the margin
    UP = "up"  # demand exceeds capacity
    DOWN = "down"  # spare capacity exceeds the margin
    COOLDOWN = "cooldown"  # the move would reverse the last change within the cooldown
    BOUNDS = "bounds"  # the running count was outside [min, max]


@attrs.frozen(kw_only=True)
class ScaleDecision:
    """What to run.

    Attributes:
        target: Containers that should run.
        current: Containers running when decided.
        reason: Why.
    """

    target: int
    current: int
    reason: ScaleReason

    @property
    def delta(self) -> int:
        """Containers to start (positive) or drain (negative)."""
        return self.target - self.current


@attrs.define
class ScaleRules:
    """Decides the container count from demand, with bounds, hysteresis and cooldown.

    Attributes:
        config: The limits and damping.
        slots_per_container: Slots each container serves (its slot servers' setting).
    """

    config: ScaleSettings
    slots_per_container: int = attrs.field(default=1, validator=validators.positive_int)
    _last_change_at: float | None = attrs.field(init=False, default=None)
    _last_direction: int = attrs.field(init=False, default=0)  # +1 up, -1 down, 0 none yet
    _now: float = attrs.field(init=False, default=-math.inf)

    def decide(self, demand: int, current: int, now: float) -> ScaleDecision:
        """The target count for ``demand`` slots wanted while ``current`` containers run.

        A decision whose target differs from ``current`` counts as a change (the rules assume
        the pool acts on it) and starts the cooldown. Raises:
            InvalidInput: ``demand`` or ``current`` is negative or not an integer, or ``now``
                is earlier than a ``now`` seen before.
        """
        given: tuple[tuple[str, object], ...] = (("demand", demand), ("current", current))
        for field, value in given:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(field, f"decide: must be an integer >= 0, got {value!r}")
        if not now >= self._now:  # also refuses NaN
            raise InvalidInput("now", f"decide: time went backwards ({now!r} < {self._now!r})")
        self._now = now
        config = self.config
        if not config.min_containers <= current <= config.max_containers:
            reason = ScaleReason.BOUNDS
            target = config.clamp(max(current, self.needed(demand)))
        else:
            reason, target = self._wanted(demand, current)
            direction = (target > current) - (target < current)
            if (
                direction
                and direction == -self._last_direction
                and self._last_change_at is not None
                and now < self._last_change_at + config.cooldown_s
            ):
                reason, target = ScaleReason.COOLDOWN, current
        if target != current:
            self._last_change_at = now
            self._last_direction = 1 if target > current else -1
        return ScaleDecision(target=target, current=current, reason=reason)

    def needed(self, demand: int) -> int:
        """Containers that hold ``demand`` slots, ignoring the bounds."""
        return -(-demand // self.slots_per_container)

    def _wanted(self, demand: int, current: int) -> tuple[ScaleReason, int]:
        config = self.config
        up = min(config.max_containers, self.needed(demand))
        if up > current:
            return ScaleReason.UP, up
        spare = current * self.slots_per_container - demand
        if spare > config.scale_down_margin:
            down = config.clamp(self.needed(demand + config.scale_down_margin))
            if down < current:
                return ScaleReason.DOWN, down
        return ScaleReason.HOLD, current


@attrs.frozen(kw_only=True)
class ContainerLoad:
    """What the drain order needs to know of one running container.

    Attributes:
        name: The container.
        leased: Its slots leased now.
        added_at: When it joined the pool (the ``now`` of its ``add_container``).
    """

    name: str
    leased: int
    added_at: float


def drain_order(loads: Iterable[ContainerLoad]) -> list[str]:
    """Containers in the order to drain them: fewest leased slots first, then newest first.

    Ties beyond that go by name, so the order is total and repeatable. A pool that must drain
    ``k`` containers drains ``drain_order(loads)[:k]``.
    """
    ordered = sorted(loads, key=lambda load: (load.leased, -load.added_at, load.name))
    return [load.name for load in ordered]
