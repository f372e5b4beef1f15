"""``SlotServerSettings``: what a pool tells each of its slot servers and requires of them.

Every pool runs slot servers somewhere (a child process, a local container, an SSH host, a Nomad
allocation, a Slurm job, a cloud sandbox, ...),
and each tells them the same things: how many slots to serve and under which isolation; and
each requires the same of them before their slots are leased: a usable sandbox when the
isolation says so, tmux when asked, health within the start timeout, resets within the reset
timeout. That is one value, held by each pool's settings as their ``server`` field and given
whole to the job descriptions (``NomadJobSpec``, ``sbatch_argv``) and the pool core, never
restated field by field. A pool whose servers need more or less time to start states its own
default value once (``ContainerPoolConfig``: 60 s, ``NomadPoolConfig``: 120 s).

The pool core reads this value itself (``pool_core.join_rules``).
"""

from __future__ import annotations

import attrs

from trajcore.domain import validators
from trajcore.domain.isolation import SlotIsolation

__all__ = ["SlotServerSettings"]


@attrs.frozen(kw_only=True)
class SlotServerSettings:
    """What every slot server of a pool is told and must show (module doc).

    Attributes:
        slots_per_container: Slots each server serves (N).
        isolation: The sandbox isolation of every server (the env's, never the model's).
        require_tmux: Refuse servers without tmux (the persistent shell of ``bash_stateful``
            and ``tmux`` needs it), as a missing sandbox is refused.
        start_timeout_s: Longest a server may take to start and answer health.
        reset_timeout_s: Longest a release's reset may take before the slot is quarantined.
        acquire_timeout_s: The lease deadline when ``lease`` is given none (``None``: none).
    """

    slots_per_container: int = attrs.field(default=4, validator=validators.positive_int)
    isolation: SlotIsolation = attrs.field(
        factory=SlotIsolation, validator=validators.instance_of(SlotIsolation)
    )
    require_tmux: bool = attrs.field(default=False, validator=validators.flag)
    start_timeout_s: float = attrs.field(default=30.0, validator=validators.positive_seconds)
    reset_timeout_s: float = attrs.field(default=30.0, validator=validators.positive_seconds)
    acquire_timeout_s: float | None = attrs.field(
        default=600.0, validator=validators.optional_seconds
    )
