"""Seed-shaped env bases: an env written for atropos-agent or hermes-agent ports by its imports.

Both seeds' envs subclassed a base with hook names of its own. These two bases keep those names
and the arguments each hook got, and map them onto ``AgentEnv``'s hooks, so porting an env is
``from trajcore.compat import ...`` and, for hermes, an ``await`` before each ToolContext call:

``AtroposAgentEnv`` (atropos-agent's ``AgentEnv``):

- ``build_task(item) -> str``, ``setup_agent_env()`` (run by ``setup``),
- ``setup_trajectory_workspace(item, *, trajectory_id, exec_tool) -> dict`` (its dict is the
  prepare metadata),
- ``verify_and_score_trajectory(item, final_response, *, trajectory_id, exec_tool,
  agent_result, workspace_meta) -> (score, metadata)``, by default ``score_trajectory(item,
  final_response)`` with empty metadata,
- ``build_agent_config(item) -> AgentConfig`` (per-item steps, tokens, tool delay; the
  temperature is the config's, as one sampling setting serves the whole run).

``exec_tool(call)`` runs one ``ToolCall`` in the trajectory's slot and returns its
``ToolResult``; ``agent_result`` is the trajectory's ``Transcript``.

``HermesAgentEnv`` (hermes-agent's ``HermesAgentBaseEnv``):

- ``format_prompt(item) -> str``,
- ``compute_reward(item, result: AgentResult, ctx: ToolContext) -> float``, where
  ``AgentResult`` carries hermes's fields (``messages`` as OpenAI dicts, ``turns_used``,
  ``finished_naturally``, ``reasoning_per_turn``, ``tool_errors``) plus ``trajectory_id`` and
  ``stop_reason``, and ``ToolContext`` offers hermes's calls (``terminal``, ``read_file``,
  ``write_file``, ``upload_file``, ``upload_dir``, ``download_file``, ``download_dir``,
  ``search``, ``call_tool``) bound to the very slot the model used. They are coroutines here:
  trajcore's tools run on the event loop, so ``ctx.terminal(...)`` becomes
  ``await ctx.terminal(...)``.

Where trajcore differs from the seeds on purpose (``docs/porting.md`` lists every case): a
``TrajcoreError`` raised while scoring fails the member as an infrastructure error instead of
being scored 0 (hermes) or dropping the group (atropos-agent); tokens are the ledger's, not the
seeds' own agent's.
"""

from __future__ import annotations

import abc
import base64
import json
import shlex
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Generic, cast

import anyio
import attrs
from typing_extensions import TypeVar

from trajcore.domain.agent_loop import StopReason
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolResult
from trajcore.entrypoints.atropos import AgentEnv, AgentEnvConfig
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import ScoreAnswer, Transcript

__all__ = [
    "AgentConfig",
    "AgentResult",
    "AtroposAgentEnv",
    "ExecTool",
    "HermesAgentEnv",
    "ToolContext",
    "ToolError",
]

ItemT = TypeVar("ItemT")
ConfigT_co = TypeVar("ConfigT_co", bound=AgentEnvConfig, default=AgentEnvConfig, covariant=True)

ExecTool = Callable[[ToolCall], Awaitable[ToolResult]]
"""atropos-agent's ``exec_tool``: run one call in the trajectory's slot, get its result."""


def _exec_tool(tools: SlotTools) -> ExecTool:
    async def exec_tool(call: ToolCall) -> ToolResult:
        return await tools.call(call.name, call.arguments)

    return exec_tool


# ============================================================================ atropos-agent


@attrs.frozen(kw_only=True)
class AgentConfig:
    """atropos-agent's per-item agent settings (``build_agent_config``).

    Attributes:
        max_steps: Most assistant turns.
        temperature: Kept for the seed's shape; trajcore samples every item with the config's
            ``agent_temperature``.
        max_tokens: Most tokens per turn (``None``: what is left of ``max_token_length``).
        tool_delay_s: Kept for the seed's shape; the config's ``tool_delay_s`` applies.
    """

    max_steps: int
    temperature: float
    max_tokens: int | None
    tool_delay_s: float = 0.0


class AtroposAgentEnv(AgentEnv[ItemT, ConfigT_co], Generic[ItemT, ConfigT_co]):
    """atropos-agent's ``AgentEnv`` hooks on trajcore (see the module doc)."""

    @abc.abstractmethod
    def build_task(self, item: ItemT) -> str:
        """The user-facing task string for the agent."""

    @abc.abstractmethod
    async def score_trajectory(self, item: ItemT, final_response: str) -> float:
        """A scalar score from the final response (the default verification's)."""

    async def setup_agent_env(self) -> None:
        """Env-specific setup (atropos-agent's ``setup`` called it after starting tools)."""

    async def setup(self) -> None:
        await self.setup_agent_env()

    async def setup_trajectory_workspace(
        self, item: ItemT, *, trajectory_id: str, exec_tool: ExecTool
    ) -> dict[str, Any]:
        """Prepare the slot before the agent starts; the dict returned is the workspace
        metadata verification gets. Default: nothing, ``{}``."""
        return {}

    async def verify_and_score_trajectory(
        self,
        item: ItemT,
        final_response: str,
        *,
        trajectory_id: str,
        exec_tool: ExecTool,
        agent_result: Transcript | None = None,
        workspace_meta: dict[str, Any] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        """Verify in the slot and score; default: ``score_trajectory`` and no metadata."""
        return await self.score_trajectory(item, final_response), {}

    def build_agent_config(self, item: ItemT) -> AgentConfig:
        """The agent's limits for ``item``; default: the config's."""
        config = self.config
        return AgentConfig(
            max_steps=config.max_turns,
            temperature=config.agent_temperature,
            max_tokens=config.max_tokens,
            tool_delay_s=config.tool_delay_s,
        )

    # -- the mapping onto AgentEnv's hooks

    async def prepare_workspace(self, item: ItemT, tools: SlotTools) -> JSONObject | None:
        meta: object = await self.setup_trajectory_workspace(
            item, trajectory_id=tools.router.trajectory_id, exec_tool=_exec_tool(tools)
        )
        # As the seed did, anything but a dict counts as no metadata; the rollout checks JSON.
        return cast("JSONObject", dict(meta)) if isinstance(meta, dict) else {}

    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        score, metadata = await self.verify_and_score_trajectory(
            item,
            messages.final_response,
            trajectory_id=messages.trajectory_id,
            exec_tool=_exec_tool(tools),
            agent_result=messages,
            workspace_meta=dict(messages.prepare_metadata or {}),
        )
        return score, cast("JSONObject", dict(metadata))  # the rollout checks it is JSON

    def item_limits(self, item: ItemT) -> ItemLimits | None:
        agent = self.build_agent_config(item)
        return ItemLimits(max_turns=agent.max_steps, max_tokens=agent.max_tokens)


# ============================================================================= hermes-agent


@attrs.frozen(kw_only=True)
class ToolError:
    """hermes-agent's record of one failed tool call.

    Attributes:
        turn: The assistant turn (1-based) whose call failed.
        tool_name: The tool called.
        arguments: Its arguments as JSON text.
        error: Why it failed (the outcome and the error line).
        tool_result: What the model was sent back.
    """

    turn: int
    tool_name: str
    arguments: str
    error: str
    tool_result: str


@attrs.frozen(kw_only=True)
class AgentResult:
    """hermes-agent's ``AgentResult``, from a trajectory's ``Transcript``.

    Attributes:
        messages: The conversation as OpenAI chat dicts.
        turns_used: Assistant turns.
        finished_naturally: The model stopped calling tools by itself (not a budget).
        reasoning_per_turn: Each assistant turn's reasoning, ``None`` where it had none.
        tool_errors: Every tool call that did not end OK.
        trajectory_id: trajcore's id of the trajectory (hermes's ``task_id``).
        stop_reason: Why the loop stopped (``natural``, ``max_turns``, ...).
        managed_state: Always ``None``: trajcore keeps tokens in its own ledger.
    """

    messages: list[dict[str, Any]]
    turns_used: int
    finished_naturally: bool
    reasoning_per_turn: list[str | None]
    tool_errors: list[ToolError]
    trajectory_id: str
    stop_reason: str | None
    managed_state: None = None

    @classmethod
    def of(cls, transcript: Transcript) -> AgentResult:
        """The hermes view of ``transcript``."""
        stats = transcript.stats
        return cls(
            messages=[dict(m.to_chat_dict(arguments_as_json=True)) for m in transcript],
            turns_used=stats.turns,
            finished_naturally=stats.stop_reason is StopReason.NATURAL,
            reasoning_per_turn=list(transcript.reasoning),
            tool_errors=[
                ToolError(
                    turn=e.turn,
                    tool_name=e.call.name,
                    arguments=e.call.arguments_json(),
                    error=f"{e.result.outcome.value}: {e.result.error}",
                    tool_result=Message.tool(e.result).content,
                )
                for e in transcript.tool_errors
            ],
            trajectory_id=transcript.trajectory_id,
            stop_reason=None if stats.stop_reason is None else stats.stop_reason.value,
        )


@attrs.frozen
class ToolContext:
    """hermes-agent's ``ToolContext``: its calls, bound to the trajectory's slot.

    Every method is a coroutine (``await ctx.terminal("pytest -q")``) and answers as hermes's
    did: a dict (``{"exit_code", "output"}`` from the terminal, ``{"content"}`` or
    ``{"error"}`` from files), or the raw text from ``call_tool``.

    Attributes:
        tools: The slot's toolbox (trajcore's ``SlotTools``).
    """

    tools: SlotTools

    @property
    def task_id(self) -> str:
        """The trajectory's id (hermes's ``task_id``)."""
        return self.tools.router.trajectory_id

    async def terminal(
        self,
        command: str,
        timeout: int = 180,  # noqa: ASYNC109 - hermes's signature; the slot server enforces it
    ) -> dict[str, Any]:
        """Run ``command`` in the slot: ``{"exit_code", "output"}`` (stdout then stderr).

        ``timeout`` may only shorten the env's ``terminal_timeout_s``, as for the model.
        """
        result = await self.tools.call("bash", {"command": command, "timeout": timeout})
        report = result.exec
        if report is None:
            return {"exit_code": -1, "output": result.error or result.content}
        code = -1 if report.exit_code is None else report.exit_code  # killed: as hermes's -1
        return {"exit_code": code, "output": report.stdout + report.stderr}

    async def read_file(self, path: str) -> dict[str, Any]:
        """``{"content": text}``, or ``{"error": why}``."""
        result = await self.tools.call("read_file", {"path": path})
        return {"content": result.content} if result.ok else {"error": result.error}

    async def write_file(self, path: str, content: str) -> dict[str, Any]:
        """``{"success": True}``, or ``{"error": why}``."""
        result = await self.tools.call("write_file", {"path": path, "content": content})
        return {"success": True} if result.ok else {"error": result.error}

    async def upload_file(self, local_path: str, remote_path: str) -> dict[str, Any]:
        """Copy a host file into the slot, binary-safe: ``{"exit_code", "output"}``."""
        local = anyio.Path(local_path)
        if not await local.is_file():
            return {"exit_code": -1, "output": f"Local file not found: {local_path}"}
        data = base64.b64encode(await local.read_bytes()).decode("ascii")
        target = shlex.quote(remote_path)
        parent = shlex.quote(str(Path(remote_path).parent))
        return await self.terminal(
            f"mkdir -p {parent} && printf '%s' {shlex.quote(data)} | base64 -d > {target}"
        )

    async def upload_dir(self, local_dir: str, remote_dir: str) -> list[dict[str, Any]]:
        """``upload_file`` for every file under ``local_dir``, keeping the layout."""
        local = anyio.Path(local_dir)
        if not await local.is_dir():
            return [{"exit_code": -1, "output": f"Local directory not found: {local_dir}"}]
        files = sorted([path async for path in local.rglob("*") if await path.is_file()])
        return [
            await self.upload_file(str(path), f"{remote_dir}/{path.relative_to(local)}")
            for path in files
        ]

    async def download_file(self, remote_path: str, local_path: str) -> dict[str, Any]:
        """Copy a slot file to the host, binary-safe: ``{"success", "bytes"}`` or an error."""
        answer = await self.terminal(f"base64 {shlex.quote(remote_path)}")
        if answer["exit_code"] != 0:
            return {"success": False, "error": f"Failed to read remote file: {answer['output']}"}
        raw = base64.b64decode(str(answer["output"]))
        local = anyio.Path(local_path)
        await local.parent.mkdir(parents=True, exist_ok=True)
        await local.write_bytes(raw)
        return {"success": True, "bytes": len(raw)}

    async def download_dir(self, remote_dir: str, local_dir: str) -> list[dict[str, Any]]:
        """``download_file`` for every file under ``remote_dir``, keeping the layout."""
        listing = await self.terminal(f"find {shlex.quote(remote_dir)} -type f")
        if listing["exit_code"] != 0:
            return [{"success": False, "error": f"Failed to list remote dir: {remote_dir}"}]
        out: list[dict[str, Any]] = []
        for remote in str(listing["output"]).split("\n"):
            if remote.strip():
                relative = Path(remote).relative_to(remote_dir)
                out.append(await self.download_file(remote, str(Path(local_dir) / relative)))
        return out

    async def search(self, query: str, path: str = ".") -> dict[str, Any]:
        """Lines matching ``query`` under ``path``: ``{"matches": ["file:line:text", ...]}``."""
        answer = await self.terminal(
            f"grep -rn -- {shlex.quote(query)} {shlex.quote(path)} || test $? -eq 1"
        )
        if answer["exit_code"] != 0:
            return {"error": answer["output"]}
        return {"matches": [line for line in str(answer["output"]).splitlines() if line]}

    async def call_tool(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """Any tool by name (slot or tool server); its raw text answer (an error as JSON)."""
        result = await self.tools.call(tool_name, arguments)
        return result.content if result.ok else json.dumps({"error": result.error})


class HermesAgentEnv(AgentEnv[ItemT, ConfigT_co], Generic[ItemT, ConfigT_co]):
    """hermes-agent's ``HermesAgentBaseEnv`` hooks on trajcore (see the module doc)."""

    @abc.abstractmethod
    def format_prompt(self, item: ItemT) -> str:
        """The user message for ``item``."""

    @abc.abstractmethod
    async def compute_reward(self, item: ItemT, result: AgentResult, ctx: ToolContext) -> float:
        """Score the rollout with full access to its slot through ``ctx``."""

    def build_task(self, item: ItemT) -> str | Sequence[Message]:
        return self.format_prompt(item)

    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        return await self.compute_reward(item, AgentResult.of(messages), ToolContext(tools))
