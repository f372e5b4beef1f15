"""Envs for ``test_run_interrupts``, loaded by ``trajcore run`` as ``interrupt_envs.py:Class``.

- With ``INTERRUPT_ENVS_SLOW_IMPORT=1``, loading this module prints ``importing`` on stdout
  and then takes a minute, so a Ctrl-C lands while the env loads. With
  ``INTERRUPT_ENVS_IMPORT_UNTIL=PATH`` it prints ``importing`` and then waits until ``PATH``
  exists (at most ten minutes), so a signal lands while the env loads however slow the machine.
- ``TwoGroupsEnv`` with the script ``play``: the first group ends at once; in the second,
  the model's call leaves a background process in the slot and runs for ten minutes, after
  ``slow call`` on stderr, so a signal lands mid-trajectory with one group done. With
  ``INTERRUPT_ENVS_STUCK_CLOSE=1`` the pool's close then waits forever (only a second signal
  ends the run).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos import pools
from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools, Transcript
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.scripted import ScriptStep

if os.environ.get("INTERRUPT_ENVS_SLOW_IMPORT") == "1":
    print("importing", flush=True)
    time.sleep(60)
if os.environ.get("INTERRUPT_ENVS_IMPORT_UNTIL"):
    print("importing", flush=True)
    _told = Path(os.environ["INTERRUPT_ENVS_IMPORT_UNTIL"])
    _deadline = time.monotonic() + 600
    while not _told.exists() and time.monotonic() < _deadline:
        time.sleep(0.05)


class TwoGroupsEnv(AgentEnv[str]):
    """Items ``quick``, then ``slow``; each member scores 1 when its slot answers."""

    name = "two_groups"
    _served: int = 0

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())
        config.group_size = 2
        config.local_containers = 1
        config.slots_per_container = 2
        return config, servers

    async def get_next_item(self) -> str:
        self._served += 1
        return "quick" if self._served == 1 else "slow"

    def build_task(self, item: str) -> list[Message]:
        return [Message.user(item)]

    async def verify_and_score(self, item: str, tools: SlotTools, transcript: Transcript) -> float:
        return 1.0 if await tools.check("true") else 0.0

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        opened = pools.make_pool(self.config)
        if os.environ.get("INTERRUPT_ENVS_STUCK_CLOSE") == "1":
            return _stuck_close(opened)
        return opened


@contextlib.asynccontextmanager
async def _stuck_close(
    opened: AbstractAsyncContextManager[SandboxPool],
) -> AsyncIterator[SandboxPool]:
    async with opened as pool:
        try:
            yield pool
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep_forever()


def play(messages: Sequence[Message]) -> ScriptStep:
    """One ``bash`` call, then "Done."; the ``slow`` task's call runs for ten minutes."""
    task = next(m.content for m in messages if m.role == "user")
    if any(m.role == "assistant" for m in messages):
        return "Done."
    if task == "slow":
        sys.stderr.write("slow call\n")
        sys.stderr.flush()
        return ToolCall(id="c0", name="bash", arguments={"command": "sleep 600 & sleep 600"})
    return ToolCall(id="c0", name="bash", arguments={"command": "echo done > done.txt"})
