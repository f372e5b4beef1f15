"""An env written the hermes-agent way, ported by its imports (``trajcore.compat``).

``format_prompt`` builds the user message; ``compute_reward`` gets hermes's ``AgentResult``
(turns, tool errors, reasoning) and a ``HermesToolContext`` bound to the slot the model used, whose
calls are awaited here.
"""

from __future__ import annotations

import itertools

from trajcore.compat import AgentResult, HermesAgentEnv, HermesToolContext

Item = dict[str, str]


class GreetingFileEnv(HermesAgentEnv[Item]):
    name = "greeting_file"

    async def setup(self) -> None:
        self.items: list[Item] = [
            {"file": "hello.txt", "text": "hello world"},
            {"file": "notes/greeting.txt", "text": "good morning"},
        ]
        self.cursor = itertools.cycle(self.items)

    async def get_next_item(self) -> Item:
        return next(self.cursor)

    def format_prompt(self, item: Item) -> str:
        return f"Create the file {item['file']} containing exactly: {item['text']}"

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: HermesToolContext
    ) -> float:
        if result.turns_used == 0:
            return 0.0
        shown = await ctx.terminal(f"cat {item['file']}")
        if shown["exit_code"] != 0:
            return 0.0
        read = await ctx.read_file(item["file"])
        exact = read.get("content") == item["text"]
        # As in hermes, tool errors along the way cost a little.
        return (1.0 if exact else 0.5) - 0.1 * min(len(result.tool_errors), 5)


if __name__ == "__main__":
    GreetingFileEnv.cli()  # python hermes_seed_style.py serve|process|evaluate ...
