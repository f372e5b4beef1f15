"""``from trajcore import ...`` gives type checkers the same types as ``trajcore.env``.

The package loads these names lazily at run time; type checkers follow its ``TYPE_CHECKING``
import of ``trajcore.env``.
"""

from __future__ import annotations

import trajcore
import trajcore.env
from trajcore import AgentEnv, Message, SlotTools, ToolSpec


def same_env(env: trajcore.env.AgentEnv[object]) -> AgentEnv[object]:
    return env


def same_toolbox(tools: SlotTools) -> trajcore.env.SlotTools:
    return tools


greeting: trajcore.env.Message = Message.user("hello")
spec: trajcore.env.ToolSpec = ToolSpec(name="t", description="d", parameters={"type": "object"})
names: list[str] = trajcore.__all__
