"""A slot's idle lifetime (hermes-agent's ``terminal_lifetime``), as a policy wrapper.

hermes-agent killed a terminal sandbox that had seen no command for ``terminal_lifetime``
seconds; a trajectory whose model took that long over one turn came back to a fresh sandbox,
its files and processes gone. trajcore's slot belongs to its trajectory until the trajectory
ends, so nothing reaps it behind the model's back. ``slot_idle_timeout_s`` keeps the bound the
seed's setting gave, without the silent loss: a model turn that keeps the slot idle longer than
the lifetime ends the trajectory on that budget (``IdleLimitExceeded``, stop reason
``idle_limit``, budget exhausted: the work done so far is verified and scored, as when the time
budget runs out), and the slot is released and reset as always.

The wrapper is transparent otherwise: tokens, drift and exactness are the wrapped policy's.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs

from trajcore.domain.errors import IdleLimitExceeded
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tools import ToolSpec
from trajcore.rollout.policy import ModelTurn, Policy, PolicySession, SessionWrapper

__all__ = ["IdleLimitedPolicy"]


@attrs.frozen
class _IdleLimitedSession(SessionWrapper):
    inner: PolicySession
    idle_s: float

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        with anyio.move_on_after(self.idle_s) as scope:
            return await self.inner.sample(messages, sampling=sampling)
        assert scope.cancelled_caught
        raise IdleLimitExceeded(
            f"the slot sat idle past its lifetime (slot_idle_timeout_s={self.idle_s:g}) "
            "waiting for one model turn",
            limit_s=self.idle_s,
        )


@attrs.frozen
class IdleLimitedPolicy:
    """``inner``, with every model turn bounded by the slot's idle lifetime ``idle_s``.

    Attributes:
        inner: The policy that samples.
        idle_s: The longest one turn may keep the trajectory's slot idle, in seconds.
    """

    inner: Policy
    idle_s: float

    @property
    def token_exact(self) -> bool:
        return self.inner.token_exact

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        return _IdleLimitedSession(self.inner.start(messages, tools=tools), self.idle_s)
