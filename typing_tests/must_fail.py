"""Env-author mistakes that mypy --strict must report, each with the error code it must give.

``tests/unit/test_typing_must_fail.py`` writes each case to its own file and runs mypy over them
through ``mypy.api.run``: the case passes when mypy reports its code in its file. ``CONTROL`` is
the same kind of code written correctly, and must give no error at all (so a broken run, or a
checker that reports everything, cannot pass). The cases are text, not code, so the project's
own mypy run (which must pass) never sees them as errors.
"""

from __future__ import annotations

PRELUDE = """
from __future__ import annotations

from collections.abc import Sequence

from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools


class TasksConfig(AgentEnvConfig):
    tasks_file: str = "tasks.jsonl"


class TasksEnv(AgentEnv[str, TasksConfig]):
    async def get_next_item(self) -> str:
        return self.config.tasks_file

    def build_task(self, item: str) -> str:
        return item

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return 1.0
"""

CONTROL = """
def turns(env: TasksEnv) -> int:
    return env.config.max_turns


def tasks_file(env: TasksEnv) -> str:
    return env.config.tasks_file


def build(env: AgentEnv[str]) -> object:
    return env.build_task("hello")
"""

CASES: dict[str, tuple[str, str]] = {
    "misspelt_config_field": (
        "attr-defined",
        """
def turns(env: AgentEnv[str]) -> int:
    return env.config.max_turn
""",
    ),
    "misspelt_subclass_config_field": (
        "attr-defined",
        """
def tasks(env: TasksEnv) -> str:
    return env.config.task_file
""",
    ),
    "subclass_config_field_is_typed": (
        "return-value",
        """
def tasks(env: TasksEnv) -> int:
    return env.config.tasks_file
""",
    ),
    "misspelt_config_keyword": (
        "call-arg",
        """
config = TasksConfig(tokenizer_name="/models/qwen3", task_file="x.jsonl")
""",
    ),
    "wrong_score_hook_signature": (
        "override",
        """
class BadScore(TasksEnv):
    async def verify_and_score(self, item: str, tools: SlotTools) -> float:
        return 0.0
""",
    ),
    "wrong_score_hook_return": (
        "override",
        """
class BadReturn(TasksEnv):
    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> str:
        return "1"
""",
    ),
    "wrong_item_type_in_a_hook": (
        "override",
        """
class BadItem(TasksEnv):
    def build_task(self, item: int) -> str:
        return str(item)
""",
    ),
    "item_of_the_wrong_type": (
        "arg-type",
        """
def build(env: AgentEnv[str]) -> object:
    return env.build_task(3)
""",
    ),
    "unknown_env_attribute": (
        "attr-defined",
        """
def steps(env: TasksEnv) -> int:
    return env.curr_stepp
""",
    ),
}
"""name -> (the error code mypy must report, the code after ``PRELUDE``)."""
