"""``generation_params`` carry the sampling a group ran with.

``item_rollout`` gives an item its own rollout settings (``ItemLimits`` and the like), its
sampling included. The trainer is told the temperature and ``max_tokens`` the members were
sampled with, not the config's: a trainer that rescales logprobs by temperature reads them.
Before, it was told the config's.
"""

from __future__ import annotations

import attrs
import pytest

from tests.unit.test_agent_env import FileEnv
from tests.unit.test_agent_env_truncation import config, responder
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.rollout.trajectory import RolloutConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ColdEnv(FileEnv):
    def item_rollout(self, item: str) -> RolloutConfig:
        rollout = ItemLimits(max_tokens=128).apply(self.settings.rollout)
        return attrs.evolve(rollout, sampling=attrs.evolve(rollout.sampling, temperature=0.3))


async def test_generation_params_are_the_sampling_the_members_ran_with() -> None:
    env = ColdEnv(config())
    server = FakeTokenServer(policy=responder(env, 0))
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        group = await env.run_task("ok", pool=pool, policy=env.make_policy(token=server))
    assert {(r.sampling.temperature, r.sampling.max_tokens) for r in server.requests} == {
        (0.3, 128)
    }
    scored = env.scored_group(group)
    assert scored is not None
    params = scored["generation_params"]
    assert (params["temperature"], params["max_tokens"], params["mode"]) == (0.3, 128, "managed")
    assert (env.settings.rollout.sampling.temperature, env.config.max_tokens) == (1.0, 256)
