"""A process-mode env for the signal tests, run as a real program:

    python tests/integration/signal_env.py process --env.total_steps 1 ...

It is ``examples/shell_tasks.py``'s env with two changes, both for observing a run from outside:

- the model (a scripted chat server, no endpoint) makes one ``bash`` call that leaves a
  background process in the slot, one ``bash_stateful`` call when tmux is installed (a tmux
  server in the slot), then writes ``$SIGNAL_ENV_READY`` (a JSON file: this pid, the pool's
  directory, its slot servers' pids) and waits forever, so a signal always lands mid-trajectory;
- with ``SIGNAL_ENV_STUCK_CLOSE=1`` the pool's close first waits forever, shielded (a close
  that hangs: only a second signal ends the run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.shell_tasks import ShellTasksEnv

from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.entrypoints.atropos import pools
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool

_POOLS: list[LocalSandboxPool] = []


def _calls() -> list[ToolCall]:
    calls = [ToolCall(id="c0", name="bash", arguments={"command": "sleep 600 & echo started"})]
    if shutil.which("tmux") is not None:
        calls.append(ToolCall(id="c1", name="bash_stateful", arguments={"command": "echo hi"}))
    return calls


class _HangingChat:
    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        turn = sum(1 for m in messages if m.role == "assistant")
        calls = _calls()
        if turn < len(calls):
            return ChatTurn(
                message=Message.assistant("working", tool_calls=[calls[turn]]),
                finish_reason=FinishReason.TOOL_CALLS,
            )
        pool = _POOLS[0]
        ready = {
            "pid": os.getpid(),
            "run_dir": str(pool.run_dir),
            "servers": [pool.server_pid(name) for name in pool.container_names()],
        }
        await anyio.Path(os.environ["SIGNAL_ENV_READY"]).write_text(json.dumps(ready))
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None


class SignalEnv(ShellTasksEnv):
    name = "signal_env"

    def make_chat_server(self) -> ChatServer:
        return _HangingChat()

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return _recorded(pools.make_pool(self.config))


@contextlib.asynccontextmanager
async def _recorded(
    opened: AbstractAsyncContextManager[SandboxPool],
) -> AsyncIterator[SandboxPool]:
    async with opened as pool:
        assert isinstance(pool, LocalSandboxPool)
        _POOLS.append(pool)
        try:
            yield pool
        finally:
            if os.environ.get("SIGNAL_ENV_STUCK_CLOSE") == "1":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep_forever()


if __name__ == "__main__":
    SignalEnv.cli()
