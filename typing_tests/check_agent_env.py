"""An env author's typed subclass of ``AgentEnv`` type-checks under mypy --strict.

The hooks are bound to ``Callable`` types below, so a change of a hook's signature in
``AgentEnv`` breaks this file. Lines marked ``# type: ignore[code]`` must stay errors: with
``warn_unused_ignores`` on, mypy fails here if the env starts accepting what they pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager

import attrs

from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.errors import ToolServerError
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolSpec
from trajcore.domain.toolsets import Toolset, ToolsetCatalog
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.scored_data import ScoredGroup
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.group import GroupResult
from trajcore.rollout.policy import Policy
from trajcore.rollout.tools import SlotTools


@attrs.frozen
class Task:
    prompt: str
    expected: str


class TaskConfig(AgentEnvConfig):
    tasks_file: str = "tasks.jsonl"


class TaskEnv(AgentEnv[Task, TaskConfig]):
    name = "tasks"
    env_config_cls = TaskConfig

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        _, servers = super().config_init()
        return TaskConfig(tokenizer_name="/models/qwen3", group_size=8, max_turns=12), servers

    async def setup(self) -> None:
        self.tasks = [Task(prompt="say hi", expected="hi")]

    async def get_next_item(self) -> Task:
        tasks_file: str = self.config.tasks_file  # the subclass's own field, typed, no cast
        del tasks_file
        return self.tasks[0]

    def build_task(self, item: Task) -> list[Message]:
        return [Message.system("Be brief."), Message.user(item.prompt)]

    async def prepare_workspace(self, item: Task, tools: SlotTools) -> None:
        await tools.write_file("task.txt", item.prompt)

    async def verify_and_score(
        self, item: Task, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        try:
            return float((await tools.read_file("answer.txt")).strip() == item.expected)
        except ToolServerError:
            return 0.0

    async def eval_items(self) -> Sequence[Task]:
        return self.tasks

    def tools(self, external: Sequence[ToolSpec]) -> Sequence[ToolSpec]:
        return [spec for spec in super().tools(external) if spec.name != "tmux"]

    def toolsets(self, tools: Sequence[ToolSpec]) -> ToolsetCatalog:
        return ToolsetCatalog(toolsets=[Toolset(name="all", tools=[t.name for t in tools])])

    def tool_registry(self) -> ToolRegistry | None:
        return ToolRegistry()

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return FakeSandboxPool(containers=1, slots_per_container=8)

    def make_chat_server(self) -> ChatServer:
        return FakeChatServer(script=[Message.assistant("hi")])


def check_hooks_keep_their_signatures(env: TaskEnv) -> None:
    next_item: Callable[[], Awaitable[Task]] = env.get_next_item
    build: Callable[[Task], str | Sequence[Message]] = env.build_task
    prepare: Callable[[Task, SlotTools], Awaitable[None]] = env.prepare_workspace
    score: Callable[[Task, SlotTools, Sequence[Message]], Awaitable[float]] = env.verify_and_score
    evaluate_on: Callable[[], Awaitable[Sequence[Task]]] = env.eval_items
    collect: Callable[[Task], Awaitable[tuple[ScoredGroup | None, list[Task]]]] = (
        env.collect_trajectories
    )
    to_scored: Callable[[GroupResult], ScoredGroup | None] = env.scored_group
    messages: Callable[[Task], list[Message]] = env.task_messages
    del next_item, build, prepare, score, evaluate_on, collect, to_scored, messages


def check_a_base_hook_takes_the_item_type(env: AgentEnv[Task]) -> None:
    build: Callable[[Task], str | Sequence[Message]] = env.build_task
    env.build_task("not a task")  # type: ignore[arg-type]
    del build


async def check_run_task_with_fakes(env: TaskEnv) -> None:
    policy: Policy = env.make_policy(chat=FakeChatServer(script=[Message.assistant("hi")]))
    async with FakeSandboxPool() as pool:
        result: GroupResult = await env.run_task(
            Task(prompt="say hi", expected="hi"), policy=policy, pool=pool, group_size=2
        )
        await env.run_task("say hi", pool=pool)  # type: ignore[arg-type]
    group = env.scored_group(result)
    if group is not None:
        tokens: list[list[int]] = group["tokens"]
        logprobs: list[list[float]] | None = group["inference_logprobs"]
        exact: bool = group["overrides"][0]["token_exact"]
        del tokens, logprobs, exact


def check_config_fields_are_typed() -> None:
    config = TaskConfig(tokenizer_name="/models/qwen3")
    turns: int = config.max_turns
    parser: str | None = config.tool_call_parser
    mode: str = config.resolved_mode
    file: str = config.tasks_file
    env = TaskEnv(config)
    same: TaskConfig = env.config
    base: AgentEnv[Task] = env  # the config parameter defaults to AgentEnvConfig
    general: AgentEnvConfig = base.config
    del turns, parser, mode, file, same, general


async def ask_the_model_directly(env: TaskEnv) -> str | None:
    """A seed env's own evaluation calls atroposlib's server manager, typed."""
    completion = await env.server.chat_completion(
        messages=[{"role": "user", "content": "hi"}], n=1, max_tokens=16, split="eval"
    )
    text = (await env.server.completion(prompt="hi", max_tokens=4)).choices[0].text
    return completion.choices[0].message.content or text
