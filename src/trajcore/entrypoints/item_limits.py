"""Limits for one item's trajectories: turns, tokens per turn, and the deadline.

atropos-agent's ``build_agent_config(item)`` let an env give a hard item more steps or tokens
than an easy one. ``AgentEnv.item_limits(item)`` does the same: the ``ItemLimits`` it returns
replace the config's ``max_turns``, ``max_tokens`` and ``slot_lifetime_s`` for that item's
group; a field left ``None`` keeps the config's value.
"""

from __future__ import annotations

import attrs

from trajcore.domain.validators import optional_positive_int, optional_seconds
from trajcore.rollout.trajectory import RolloutConfig

__all__ = ["ItemLimits"]


@attrs.frozen(kw_only=True)
class ItemLimits:
    """One item's limits; ``None`` keeps the env's setting.

    Attributes:
        max_turns: Most assistant turns (the config's ``max_turns``).
        max_tokens: Most tokens sampled per turn (the config's ``max_tokens``).
        deadline_s: The trajectory's single deadline (the config's ``slot_lifetime_s``); it
            stays below ``worker_timeout`` only if you keep it there.

    Raises (when built):
        ConfigError: a limit that is not a positive number (whole for turns and tokens).
    """

    max_turns: int | None = attrs.field(default=None, validator=optional_positive_int)
    max_tokens: int | None = attrs.field(default=None, validator=optional_positive_int)
    deadline_s: float | None = attrs.field(default=None, validator=optional_seconds)

    def apply(self, rollout: RolloutConfig) -> RolloutConfig:
        """``rollout`` with these limits in place of its own."""
        agent = rollout.agent
        if self.max_turns is not None:
            agent = attrs.evolve(agent, max_turns=self.max_turns)
        sampling = rollout.sampling
        if self.max_tokens is not None:
            sampling = attrs.evolve(sampling, max_tokens=self.max_tokens)
        deadline = rollout.deadline_s if self.deadline_s is None else self.deadline_s
        return attrs.evolve(rollout, agent=agent, sampling=sampling, deadline_s=deadline)
