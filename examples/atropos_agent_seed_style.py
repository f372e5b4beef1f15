"""An env written the atropos-agent way, ported by its imports (``trajcore.compat``).

Each hook keeps the seed's exact signature. Each item asks the model to count the lines of a
file the workspace hook writes; the workspace hook returns the expected count as metadata,
verification runs ``cat`` in the same slot with the seed's ``terminal`` tool and returns
``(score, metadata)``, and ``build_agent_config`` gives each item its own step budget, a low
temperature and no token cap, as the seed's envs did.
"""

from __future__ import annotations

import itertools

import attrs

from trajcore.compat import AgentConfig, AtroposAgentEnv, ExecTool
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


if __name__ == "__main__":
    CountLinesEnv.cli()  # python atropos_agent_seed_style.py serve|process|evaluate ...
