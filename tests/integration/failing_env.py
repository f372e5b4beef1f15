"""A process-mode env whose every group fails, run as a real program:

    python tests/integration/failing_env.py process --env.total_steps 1 ...

The model (a scripted chat server, no endpoint) answers at once, over the fake pool; with
``FAILING_ENV=score`` the score hook raises (the env author's bug), with ``FAILING_ENV=model``
the model server fails every call. Neither group is ever sent, so only ``max_failed_groups``
ends the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trajcore.adapters.fakes.llm import FakeChatServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.tools import SlotTools

FAILING = os.environ.get("FAILING_ENV", "score")


class FailingEnv(AgentEnv[str]):
    name = "failing_env"

    async def get_next_item(self) -> str:
        return "Say hello."

    def build_task(self, item: str) -> str:
        return item

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        if FAILING == "score":
            raise ValueError("the reward's bug")
        return 1.0

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return FakeSandboxPool(containers=1, slots_per_container=2)

    def make_chat_server(self) -> ChatServer:
        faults = [LLMFault.server_error()] * 1000 if FAILING == "model" else []
        return FakeChatServer(
            policy=lambda _: ChatTurn(
                message=Message.assistant("hello"), finish_reason=FinishReason.STOP
            ),
            faults=faults,
            max_attempts=1,
        )

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        return config.model_copy(update={"group_size": 2, "max_turns": 2}), servers


if __name__ == "__main__":
    FailingEnv.cli()
