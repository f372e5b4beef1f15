"""An env written the atropos-agent way, ported by its imports (``trajcore.compat``).

Each hook keeps the seed's exact signature. Each item asks the model to count the lines of a
file the workspace hook writes; the workspace hook returns the expected count as metadata,
verification runs ``cat`` in the same slot with the seed's ``terminal`` tool and returns
``(score, metadata)``, and ``build_agent_config`` gives each item its own step budget, a low
temperature and no token cap, as the seed's envs did.

``SumEnv`` shows the seed's tool objects and ``run_agent``: ``build_tools()`` adds a Python tool
object (``AddTool``: a ``ToolSchema`` and an ``async execute``) to the default slot tools, the
model calls it like any tool and it runs in this process, and ``solve`` runs the agent on one
item with ``self.run_agent(task)`` outside any group, as simple seed envs and their tests did.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from trajcore.compat import (
    AgentConfig,
    AtroposAgentEnv,
    ExecTool,
    SeedToolRegistry,
    SeedToolResult,
    Tool,
    ToolSchema,
)
from trajcore.env import AgentEnvConfig, ToolCall


@attrs.frozen
class CountTask:
    lines: int
    max_steps: int = 4


class CountLinesEnv(AtroposAgentEnv[CountTask]):
    name = "count_lines"

    async def setup_agent_env(self) -> None:
        self.tasks = [CountTask(lines=3), CountTask(lines=5, max_steps=6)]
        self.cursor = itertools.cycle(self.tasks)

    async def get_next_item(self) -> CountTask:
        return next(self.cursor)

    def build_task(self, item: CountTask) -> str:
        return "Count the lines of data.txt and write the number alone into answer.txt."

    async def setup_trajectory_workspace(
        self, item: CountTask, *, trajectory_id: str, exec_tool: ExecTool
    ) -> dict[str, object]:
        content = "".join(f"row {i}\n" for i in range(item.lines))
        call = ToolCall(
            id=f"{trajectory_id}-setup",
            name="write_file",
            arguments={"path": "data.txt", "content": content},
        )
        result = await exec_tool(call)
        return {"expected_lines": item.lines, "written": result.ok}

    async def verify_and_score_trajectory(
        self,
        item: CountTask,
        final_response: str,
        *,
        trajectory_id: str,
        exec_tool: ExecTool,
        agent_result: object = None,
    ) -> tuple[float, dict[str, object]]:
        check = ToolCall(
            id=f"{trajectory_id}-verify", name="terminal", arguments={"command": "cat answer.txt"}
        )
        result = await exec_tool(check)
        answer = result.exec.stdout.strip() if result.exec is not None else ""
        score = 1.0 if answer == str(item.lines) else 0.0
        return score, {"expected": item.lines, "answer": answer}

    async def score_trajectory(self, item: CountTask, final_response: str) -> float:
        return 0.0  # verify_and_score_trajectory does the work in the slot

    def build_agent_config(self, item: CountTask) -> AgentConfig:
        return AgentConfig(max_steps=item.max_steps, temperature=0.2, max_tokens=None)

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        return config.model_copy(update={"group_size": 4, "max_turns": 8}), servers


@attrs.frozen
class SumTask:
    a: int
    b: int


class AddTool(Tool):
    """A Python tool object, as the seed wrote them: it runs in the env's process."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(
            name="add",
            description="Add two integers.",
            parameters={"a": {"type": "integer"}, "b": {"type": "integer"}},
            required=["a", "b"],
        )

    async def execute(self, **kwargs: Any) -> SeedToolResult:
        self.calls.append(kwargs)
        return SeedToolResult(success=True, output=str(kwargs["a"] + kwargs["b"]))


class SumEnv(AtroposAgentEnv[SumTask]):
    name = "sums"

    async def setup_agent_env(self) -> None:
        self.cursor = itertools.cycle([SumTask(a=2, b=3), SumTask(a=40, b=2)])

    async def get_next_item(self) -> SumTask:
        return next(self.cursor)

    def build_tools(self) -> SeedToolRegistry:
        tools = super().build_tools()  # the slot tools (bash, read_file, write_file, ...)
        tools.register(AddTool())
        return tools

    def build_task(self, item: SumTask) -> str:
        return f"Use the add tool: what is {item.a} + {item.b}? Write it alone into answer.txt."

    async def verify_and_score_trajectory(
        self, item: SumTask, final_response: str, *, trajectory_id: str, exec_tool: ExecTool
    ) -> tuple[float, dict[str, object]]:
        read = ToolCall(id=f"{trajectory_id}-v", name="read_file", arguments={"path": "answer.txt"})
        result = await exec_tool(read)
        answer = result.content.strip() if result.ok else ""
        return (1.0 if answer == str(item.a + item.b) else 0.0), {"answer": answer}

    async def score_trajectory(self, item: SumTask, final_response: str) -> float:
        return 1.0 if str(item.a + item.b) in final_response else 0.0

    async def solve(self, item: SumTask) -> tuple[float, dict[str, Any]]:
        """One agent run on ``item`` without a group, scored from its final response."""
        final_response, debug = await self.run_agent(self.build_task(item))
        return await self.score_trajectory(item, final_response), debug


if __name__ == "__main__":
    CountLinesEnv.cli()  # python atropos_agent_seed_style.py serve|process|evaluate ...
