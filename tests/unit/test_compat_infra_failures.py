"""A seed-style env's own calls in a slot that cannot answer: never a reward.

hermes's ``ToolContext`` answers a failed command as ``{"exit_code": -1, ...}`` and a failed
read as ``{"error": ...}``; atropos-agent's ``exec_tool`` as ``success=False``. A reward written
the seeds' way (``1.0 if out["exit_code"] == 0 else 0.0``) would turn a slot server that died
while the reward ran into a 0 sent to the trainer. These calls raise instead when the slot (or
a tool server) did not run them, so the member is an infrastructure failure, as a native env's
``tools.check`` makes it; the command's and the file's own failures are still answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import attrs
import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.compat import (
    AgentResult,
    AtroposAgentEnv,
    ExecResult,
    HermesAgentEnv,
    HermesToolContext,
)
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall
from trajcore.rollout.scripted import ScriptedPolicy, ScriptStep, tool_call

Check = Callable[[HermesToolContext], Awaitable[float]]
POOLS: list[FakeSandboxPool] = []


def crash_slot_server_of(slot: object) -> None:
    """The slot server under ``slot`` dies at the next batch (the reward's own call)."""
    POOLS[0].crash_container(str(slot).split("/")[0])


def solve(messages: Sequence[Message]) -> ScriptStep:
    if any(m.role == "tool" for m in messages):
        return "Done."
    return tool_call("write_file", path="a.txt", content="alpha")


class HermesStyle(HermesAgentEnv[dict[str, str]]):
    name = "hermes_style"
    check: Check

    async def get_next_item(self) -> dict[str, str]:
        return {"path": "a.txt"}

    def format_prompt(self, item: dict[str, str]) -> str:
        return "write a.txt"

    async def compute_reward(
        self, item: dict[str, str], result: AgentResult, ctx: HermesToolContext
    ) -> float:
        return await type(self).check(ctx)


class AtroposAgentStyle(AtroposAgentEnv[dict[str, str]]):
    name = "atropos_agent_style"
    crash = True

    async def get_next_item(self) -> dict[str, str]:
        return {"path": "a.txt"}

    def build_task(self, item: dict[str, str]) -> str:
        return "write a.txt"

    async def score_trajectory(self, item: dict[str, str], final_response: str) -> float:
        return 0.0

    async def verify_and_score_trajectory(
        self,
        item: dict[str, str],
        final_response: str,
        *,
        trajectory_id: str,
        exec_tool: Callable[[ToolCall], Awaitable[ExecResult]],
    ) -> tuple[float, dict[str, Any]]:
        if type(self).crash:
            crash_slot_server_of(POOLS[0].container_names()[0])
        command: JSONObject = {"command": "cat a.txt"}
        answer = await exec_tool(ToolCall(id="check", name="terminal", arguments=command))
        return (1.0 if answer.success else 0.0), {"output": answer.output}


def members(env: HermesStyle | AtroposAgentStyle) -> list[tuple[str, float | None]]:
    async def main() -> list[tuple[str, float | None]]:
        async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
            POOLS[:] = [pool]
            item = await env.get_next_item()
            policy = ScriptedPolicy.openai(solve)
            result = await env.run_task(item, policy=policy, pool=pool, group_size=1)
        return [(m.outcome.status.value, m.outcome.score) for m in result.members]

    return anyio.run(main)


def hermes(check: Check) -> HermesStyle:
    config, servers = HermesStyle.config_init()
    config.tokenizer_name = str(qwen3_tokenizer_path())
    config.group_size = 1
    HermesStyle.check = staticmethod(check)
    return HermesStyle(config, servers)


async def terminal_after_a_crash(ctx: HermesToolContext) -> float:
    crash_slot_server_of(ctx.tools.lease.slot)
    return 1.0 if (await ctx.terminal("cat a.txt"))["exit_code"] == 0 else 0.0


async def read_after_a_crash(ctx: HermesToolContext) -> float:
    crash_slot_server_of(ctx.tools.lease.slot)
    return 1.0 if "content" in await ctx.read_file("a.txt") else 0.0


async def write_after_a_crash(ctx: HermesToolContext) -> float:
    crash_slot_server_of(ctx.tools.lease.slot)
    return 1.0 if "success" in await ctx.write_file("b.txt", "beta") else 0.0


async def call_tool_after_a_crash(ctx: HermesToolContext) -> float:
    crash_slot_server_of(ctx.tools.lease.slot)
    return 0.0 if "error" in await ctx.call_tool("terminal", {"command": "cat a.txt"}) else 1.0


@pytest.mark.parametrize(
    "check",
    [terminal_after_a_crash, read_after_a_crash, write_after_a_crash, call_tool_after_a_crash],
)
def test_a_hermes_reward_whose_slot_died_is_an_infrastructure_failure(check: Check) -> None:
    assert members(hermes(check)) == [("infra_error", None)]


async def failures_of_its_own(ctx: HermesToolContext) -> float:
    """The command's and the file's own failures are answers, as hermes's were."""
    failed = await ctx.terminal("exit 3")
    missing = await ctx.read_file("no-such-file.txt")
    outside = await ctx.read_file("../outside.txt")
    written = await ctx.terminal("cat a.txt")
    assert failed["exit_code"] == 3
    assert "error" in missing
    assert "error" in outside
    return 1.0 if written == {"exit_code": 0, "output": "alpha"} else 0.0


def test_a_hermes_rewards_own_failures_are_still_answered_and_scored() -> None:
    assert members(hermes(failures_of_its_own)) == [("finished", 1.0)]


def test_an_atropos_agent_exec_tool_whose_slot_died_is_an_infrastructure_failure() -> None:
    config, servers = AtroposAgentStyle.config_init()
    config.tokenizer_name = str(qwen3_tokenizer_path())
    config.group_size = 1
    AtroposAgentStyle.crash = True
    assert members(AtroposAgentStyle(config, servers)) == [("infra_error", None)]
    AtroposAgentStyle.crash = False  # control: the same check on a live slot scores
    assert members(AtroposAgentStyle(config, servers)) == [("finished", 1.0)]


async def refusals_of_its_own_arguments(ctx: HermesToolContext) -> float:
    """A refusal of the env's own arguments is the call's answer, not the slot's failure."""
    no_command = await ctx.call_tool("terminal", {})
    outside = await ctx.write_file("../outside.txt", "x")
    assert "required @ $.command" in no_command, no_command
    assert "error" in outside
    return 1.0


def test_a_refusal_of_the_hooks_own_arguments_is_still_answered() -> None:
    assert members(hermes(refusals_of_its_own_arguments)) == [("finished", 1.0)]


async def terminal_under_a_stale_lease(ctx: HermesToolContext) -> float:
    """The slot refuses the lease itself (stale or released ``@ $.epoch``): no answer."""
    lease = ctx.tools.lease
    stale = attrs.evolve(lease, epoch=lease.epoch + 1)
    router = attrs.evolve(ctx.tools.router, lease=stale)
    stale_ctx = HermesToolContext(attrs.evolve(ctx.tools, router=router))
    return 1.0 if (await stale_ctx.terminal("cat a.txt"))["exit_code"] == 0 else 0.0


async def read_under_a_stale_lease(ctx: HermesToolContext) -> float:
    lease = ctx.tools.lease
    router = attrs.evolve(ctx.tools.router, lease=attrs.evolve(lease, epoch=lease.epoch + 1))
    stale_ctx = HermesToolContext(attrs.evolve(ctx.tools, router=router))
    return 1.0 if "content" in await stale_ctx.read_file("a.txt") else 0.0


@pytest.mark.parametrize("check", [terminal_under_a_stale_lease, read_under_a_stale_lease])
def test_a_hermes_reward_whose_lease_is_stale_is_an_infrastructure_failure(check: Check) -> None:
    assert members(hermes(check)) == [("infra_error", None)]
