"""Shell tasks: small jobs at a Unix prompt, verified by running a check in the model's own slot.

Each ``ShellTask`` is data: the task text, the files the workspace starts with, and a shell
``check`` that exits 0 exactly when the job is done. ``ShellTasksEnv`` is the Atropos env over
them: ``prepare_workspace`` writes the files into the slot before the first turn;
``verify_and_score`` runs the check in the same slot after the last one and scores 1.0 or 0.0.
Nothing is judged from the conversation: only what the model left in the workspace. Run it as
any Atropos env: ``python examples/shell_tasks.py serve|process|evaluate --env.tokenizer_name
...``; ``trajcore demo`` runs it in process mode offline.

``SOLUTIONS`` holds, per task, tool calls that solve it; ``solve`` is the model as a script
(``trajcore.rollout.scripted.ModelScript``): one call per turn, then "Done."; and
``ScriptedSolver`` is the same as a ``ChatServer``. So the demo, the tests and
``trajcore run examples/shell_tasks.py:ShellTasksEnv --policy solve`` run the whole pipeline
without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools, ToolCall, ToolSpec
from trajcore.rollout.scripted import ScriptStep, script_message

__all__ = ["SOLUTIONS", "TASKS", "ScriptedSolver", "ShellTask", "ShellTasksEnv", "solve"]

SYSTEM_PROMPT = (
    "You work in a Linux shell. Your current directory is the task's workspace. Use the tools "
    "to inspect and change files; reply without a tool call when the task is done."
)


@attrs.frozen(kw_only=True)
class ShellTask:
    """One task. ``check`` is ``/bin/sh`` run in the workspace; exit 0 means solved."""

    name: str
    prompt: str
    check: str
    files: Mapping[str, str] = attrs.field(factory=dict)


TASKS: tuple[ShellTask, ...] = (
    ShellTask(
        name="hello-file",
        prompt="Create a file hello.txt whose only line is: hello world",
        check='test "$(cat hello.txt)" = "hello world"',
    ),
    ShellTask(
        name="fix-sum-script",
        prompt="sum.sh should print the sum of the numbers in numbers.txt, but it is broken. "
        "Fix sum.sh so that `sh sum.sh` prints just the sum.",
        files={
            "numbers.txt": "4\n8\n15\n16\n23\n42\n",
            "sum.sh": "total=0\nfor n in $(cat numbers.txt) do\n  total=$((total + n))\n"
            "done\necho $total\n",
        },
        check='test "$(sh sum.sh)" = 108 && grep -q numbers.txt sum.sh',
    ),
    ShellTask(
        name="unique-names",
        prompt="names.txt lists names, some more than once. Write every distinct name once, "
        "sorted alphabetically, one per line, to unique.txt.",
        files={"names.txt": "carol\nalice\nbob\nalice\ncarol\ndave\n"},
        check="printf 'alice\\nbob\\ncarol\\ndave\\n' | cmp -s - unique.txt",
    ),
    ShellTask(
        name="project-layout",
        prompt="Create the directories project/src and project/tests, and an empty file "
        "project/README.md.",
        check="test -d project/src && test -d project/tests && test -f project/README.md "
        "&& test ! -s project/README.md",
    ),
    ShellTask(
        name="count-errors",
        prompt="Count the lines of app.log that contain ERROR and write just that number to "
        "errors.txt.",
        files={
            "app.log": "INFO start\nERROR disk full\nWARN slow\nERROR retry failed\n"
            "INFO ok\nERROR gave up\n",
        },
        check='test "$(tr -d " \\n" < errors.txt)" = 3',
    ),
    ShellTask(
        name="executable-script",
        prompt="Make ./run.sh runnable so that executing ./run.sh prints: ready",
        files={"run.sh": "#!/bin/sh\necho ready\n"},
        check='test -x run.sh && test "$(./run.sh)" = ready',
    ),
)


def _bash(command: str) -> ToolCall:
    return ToolCall(id="pending", name="bash", arguments={"command": command})


SOLUTIONS: Mapping[str, tuple[ToolCall, ...]] = {
    "hello-file": (_bash("echo 'hello world' > hello.txt"),),
    "fix-sum-script": (
        _bash("cat sum.sh"),
        ToolCall(
            id="pending",
            name="write_file",
            arguments={
                "path": "sum.sh",
                "content": "total=0\nfor n in $(cat numbers.txt); do\n"
                "  total=$((total + n))\ndone\necho $total\n",
            },
        ),
        _bash("sh sum.sh"),
    ),
    "unique-names": (_bash("sort -u names.txt > unique.txt"),),
    "project-layout": (_bash("mkdir -p project/src project/tests && touch project/README.md"),),
    "count-errors": (_bash("grep -c ERROR app.log > errors.txt"),),
    "executable-script": (_bash("chmod +x run.sh && ./run.sh"),),
}


class ShellTasksEnv(AgentEnv[ShellTask]):
    """The bundled tasks, in order, round and round; scored by each task's check in the slot."""

    name = "shell_tasks"
    _next: int = 0

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())  # shipped: no download
        config.use_wandb = False
        return config, servers

    async def get_next_item(self) -> ShellTask:
        self._next += 1
        return TASKS[(self._next - 1) % len(TASKS)]

    def build_task(self, item: ShellTask) -> list[Message]:
        return [Message.system(SYSTEM_PROMPT), Message.user(item.prompt)]

    async def prepare_workspace(self, item: ShellTask, tools: SlotTools) -> None:
        await tools.upload(item.files)

    async def verify_and_score(
        self, item: ShellTask, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        # An infrastructure failure raises SlotInfraError: the member fails, it is never a 0.
        return 1.0 if await tools.check(item.check) else 0.0

    async def eval_items(self) -> Sequence[ShellTask]:
        return TASKS


def task_for(messages: Sequence[Message]) -> ShellTask | None:
    """The bundled task whose text appears in the conversation's user messages, if any."""
    text = "\n".join(m.content for m in messages if m.role == "user")
    return next((task for task in TASKS if task.prompt in text), None)


def solve(messages: Sequence[Message]) -> ScriptStep:
    """The next step for the bundled task in ``messages``: its scripted calls one per turn, then
    "Done."; for an unknown task it gives up at once."""
    task = task_for(messages)
    steps = SOLUTIONS.get(task.name, ()) if task is not None else ()
    turn = sum(1 for m in messages if m.role == "assistant")
    if turn < len(steps):
        return steps[turn]
    return "Done." if task is not None else "I do not know this task."


@attrs.define
class ScriptedSolver:
    """``solve`` as a ``ChatServer``: one scripted call per turn, then it stops."""

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        turn = sum(1 for m in messages if m.role == "assistant")
        message = script_message(solve(messages), turn)
        if message.tool_calls:
            message = attrs.evolve(message, content=f"Step {turn + 1}.")
            return ChatTurn(message=message, finish_reason=FinishReason.TOOL_CALLS)
        return ChatTurn(message=message, finish_reason=FinishReason.STOP)

    async def aclose(self) -> None:
        return None


if __name__ == "__main__":
    ShellTasksEnv.cli()
