"""Small envs for ``trajcore run``'s tests, loaded by path as ``run_envs.py:ClassName``."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools, Transcript


class SetupFailsEnv(AgentEnv[str]):
    """An env whose ``setup`` raises, so no group ever runs."""

    name = "setup_fails"

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())
        config.group_size = 1
        return config, servers

    async def setup(self) -> None:
        raise ConfigError("dataset", "the env's data cannot be read")

    async def get_next_item(self) -> str:
        return "hello"

    def build_task(self, item: str) -> list[Message]:
        return [Message.user(item)]

    async def verify_and_score(self, item: str, tools: SlotTools, transcript: Transcript) -> float:
        return 1.0


class SlowSetupEnv(SetupFailsEnv):
    """An env whose ``setup`` takes a minute, to stop by a signal before the first group."""

    name = "slow_setup"

    async def setup(self) -> None:
        print("setting up", flush=True)
        await anyio.sleep(60)


class OneItemEnv(SetupFailsEnv):
    """An env with one item: ``get_next_item`` gives ``None`` after it."""

    name = "one_item"
    _served: int = 0

    async def setup(self) -> None:
        pass

    async def get_next_item(self) -> str | None:  # type: ignore[override]  # None: no more items
        self._served += 1
        return "hello" if self._served == 1 else None


def answer(messages: Sequence[Message]) -> str:
    """The model's script for these envs: it answers at once."""
    return "Done."
