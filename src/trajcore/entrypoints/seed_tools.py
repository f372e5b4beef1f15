"""atropos-agent's tool objects, their registry (``build_tools()``, ``self.tools``) and its
``run_agent``, on trajcore's tools and trajectories.

atropos-agent's ``AgentEnv`` built ``self.tools = self.build_tools()`` when it was built: a
registry of tool objects, each with a ``schema`` (name, description, JSON-schema properties,
required names, and ``external`` for tools a tool server runs) and an ``async execute(**args)``.
An env changed what the model may call by overriding ``build_tools()`` (usually ``super()``'s
registry plus its own objects). This module keeps those shapes and maps them onto the one tool
system trajcore has, so no second one exists:

- **Slot tools.** The default registry holds trajcore's slot tools (``bash``,
  ``bash_stateful``, ``tmux``, ``read_file``, ``write_file``) as ``SlotTool`` objects. A tool whose
  name is a slot tool's runs in the trajectory's slot, through the batching dispatcher, whatever
  object the registry holds for it (as the seed's executor sent its sandbox tools to the slot).
- **Python tools.** Any other tool object runs in this process: the registry becomes the env's
  ``tool_registry()`` (trajcore's in-process tool server), whose handler awaits the object's
  ``execute(**arguments)``. Its arguments are checked against its schema first (a miss is a
  ``rejected`` result naming the field); a ``SeedToolResult`` with ``success=False`` or an
  exception is a ``tool_error`` result the model sees; a timeout is ``terminal_timeout_s``.
- **External tools** (``schema.external``) are the tool server's: they are offered when the
  server at ``tool_server_url`` lists them, never run here (the seed skipped them without a
  server URL).
- A tool whose ``is_available()`` answers ``(False, reason)`` is not offered (logged once).

Which of the registry's tools a group offers is then trajcore's toolset choice, as for any env
(``enabled_toolsets``, ``disabled_toolsets``, ``toolset_distribution``; ``["default"]`` is every
toolset): the seed applied the same filter when it built the registry.

The registry is read when the run's services open (a CLI command, ``run_task``, ``run_agent``):
tools registered later, in ``setup_agent_env``, are not offered. ``SeedToolResult`` and
``SeedToolRegistry`` are the seed's ``ToolResult`` and ``ToolRegistry`` under names that do not
clash with trajcore's own ``ToolResult`` (whose fields ``exec_tool``'s ``ExecResult`` has) and
``ToolRegistry`` (the Python-tool registry); ``docs/porting.md`` gives the import lines.

``run_agent`` is the seed's ``AgentEnv.run_agent(task)``: one unscored trajectory of trajcore's
agent loop on a task text, in a slot of its own, with the registry's tools.
"""

from __future__ import annotations

import abc
import logging
import random
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.adapters.tool_server import ToolHandler, ToolRegistry
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS, SLOT_TOOLS
from trajcore.domain.tools import ToolCall, ToolContext, ToolSpec
from trajcore.domain.toolsets import select_specs
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.services import release_tool_sessions
from trajcore.entrypoints.idle_slots import IdleLimitedPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import ScoreAnswer, TrajectoryHooks, Transcript, run_trajectory

__all__ = [
    "SeedToolRegistry",
    "SeedToolResult",
    "SlotTool",
    "Tool",
    "ToolFailed",
    "ToolSchema",
    "default_seed_tools",
    "run_agent",
]

log = logging.getLogger("trajcore.env")


@attrs.define
class ToolSchema:
    """atropos-agent's description of a tool.

    Attributes:
        name: The tool's name, as the model calls it.
        description: What it does, for the model.
        parameters: The JSON-schema ``properties`` of its arguments, by argument name.
        required: The argument names that must be given.
        external: Whether a tool server runs it (offered only when the server lists it).
    """

    name: str
    description: str
    parameters: dict[str, Any] = attrs.field(factory=dict)
    required: list[str] = attrs.field(factory=list)
    external: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI function-tool shape."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": self.parameters,
                    "required": self.required,
                },
            },
        }

    def to_prompt_description(self) -> str:
        """The tool in words, as the seed put it into a system prompt."""
        lines = [f"**{self.name}**: {self.description}", "Parameters:"]
        for name, spec in self.parameters.items():
            need = "required" if name in self.required else "optional"
            kind = spec.get("type", "string") if isinstance(spec, dict) else "string"
            about = spec.get("description", "") if isinstance(spec, dict) else ""
            lines.append(f"  - {name} ({kind}) ({need}): {about}")
        if not self.parameters:
            lines.append("  (no parameters)")
        return "\n".join(lines)


@attrs.define
class SeedToolResult:
    """atropos-agent's ``ToolResult``: what a tool object's ``execute`` returns.

    Attributes:
        success: Whether the tool did its work; ``False`` is a ``tool_error`` the model sees.
        output: The text the model sees on success.
        error: Why it failed.
        metadata: Anything else (kept by the tool; the model is sent ``output`` only).
        uniq_id: The id of the call it answers.
    """

    success: bool
    output: str = ""
    error: str = ""
    metadata: dict[str, Any] = attrs.field(factory=dict)
    uniq_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        return attrs.asdict(self)


class ToolFailed(Exception):
    """A tool object answered ``success=False``; the message is its error."""


class Tool(abc.ABC):
    """atropos-agent's tool object: a ``schema`` and an ``async execute(**arguments)``."""

    @property
    @abc.abstractmethod
    def schema(self) -> ToolSchema:
        """The tool's schema."""

    @property
    def name(self) -> str:
        """The tool's name (its schema's)."""
        return self.schema.name

    @abc.abstractmethod
    async def execute(self, **kwargs: Any) -> SeedToolResult | str:
        """Run the tool with the model's arguments; a ``SeedToolResult``, or the text itself."""

    def is_available(self) -> tuple[bool, str | None]:
        """Whether the tool can be offered here, and why not."""
        return True, None

    async def __call__(self, **kwargs: Any) -> SeedToolResult | str:
        return await self.execute(**kwargs)


class SlotTool(Tool):
    """One of trajcore's slot tools in a registry: the model's calls to it run in the
    trajectory's slot (see the module doc), so ``execute`` outside a slot only says so.

    Attributes:
        spec: The slot tool's spec, offered to the model as it is.
    """

    def __init__(self, spec: ToolSpec) -> None:
        if spec.name not in SLOT_TOOLS:
            raise ConfigError("name", f"{spec.name!r} is not a slot tool ({', '.join(SLOT_TOOLS)})")
        self.spec = spec

    @property
    def schema(self) -> ToolSchema:
        properties = self.spec.parameters.get("properties", {})
        required = self.spec.parameters.get("required", [])
        return ToolSchema(
            name=self.spec.name,
            description=self.spec.description,
            parameters=dict(properties) if isinstance(properties, dict) else {},
            required=[str(r) for r in required] if isinstance(required, list) else [],
        )

    async def execute(self, **kwargs: Any) -> SeedToolResult:
        return SeedToolResult(
            success=False,
            error=f"{self.spec.name} runs in a trajectory's slot: call it with exec_tool",
        )


def default_seed_tools() -> SeedToolRegistry:
    """A registry of trajcore's slot tools (atropos-agent's default ``build_tools()``)."""
    registry = SeedToolRegistry()
    for spec in SLOT_TOOL_SPECS:
        registry.register(SlotTool(spec))
    return registry


class SeedToolRegistry:
    """atropos-agent's ``ToolRegistry``: tool objects by name, in registration order.

    Called with the tool server's listing, it answers ``AgentEnv``'s ``tools(external)`` hook on
    ``AtroposAgentEnv`` (whose ``self.tools`` it is): see ``offered``.
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._unavailable_said: set[str] = set()

    def register(self, tool: Tool) -> None:
        """Add ``tool``; one of the same name is replaced, as the seed did.

        Raises:
            ConfigError: ``tool`` is not a ``Tool`` (field ``build_tools()``).
        """
        if not isinstance(tool, Tool):
            raise ConfigError(
                "build_tools()", f"expected a trajcore.compat.Tool, got {type(tool).__name__}"
            )
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def list_tools(self) -> list[Tool]:
        """Every tool, in registration order."""
        return list(self._tools.values())

    def get_schemas(self) -> list[ToolSchema]:
        """Every tool's schema, in registration order."""
        return [tool.schema for tool in self._tools.values()]

    def get_prompt_description(self) -> str:
        """Every tool in words, for a system prompt."""
        return "\n\n".join(schema.to_prompt_description() for schema in self.get_schemas())

    async def execute(self, call: ToolCall) -> SeedToolResult:
        """Run ``call`` with the tool object in this process (a slot tool only says where it
        runs); an unknown tool or an exception is a failed result."""
        tool = self.get(call.name)
        if tool is None:
            return SeedToolResult(
                success=False, error=f"Unknown tool: {call.name}", uniq_id=call.id
            )
        try:
            answer = await tool.execute(**call.arguments)
        except Exception as exc:  # noqa: BLE001 - the seed's registry answered it as a result
            return SeedToolResult(
                success=False, error=f"Tool execution error: {exc}", uniq_id=call.id
            )
        if isinstance(answer, str):
            return SeedToolResult(success=True, output=answer, uniq_id=call.id)
        if answer.uniq_id is None:
            answer.uniq_id = call.id
        return answer

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    # -- onto trajcore's tools

    def _available(self) -> list[Tool]:
        kept: list[Tool] = []
        for tool in self._tools.values():
            ok, why = tool.is_available()
            if ok:
                kept.append(tool)
            elif tool.name not in self._unavailable_said:
                self._unavailable_said.add(tool.name)
                log.info("tool %s is not offered: %s", tool.name, why or "is_available() is False")
        return kept

    def offered(self, external: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
        """The specs the model may be offered: this registry's available slot tools, then
        ``external`` (what the tool servers list, this registry's Python tools among them).

        Raises:
            ConfigError: a tool's schema is not a valid tool spec (field ``build_tools()[name]``).
        """
        slot = tuple(
            _spec_of(tool)
            for tool in self._available()
            if tool.name in SLOT_TOOLS and not tool.schema.external
        )
        return (*slot, *external)

    def __call__(self, external: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
        """``offered(external)``: ``AgentEnv.tools(external)``, answered by the registry."""
        return self.offered(external)

    def python_tools(self) -> ToolRegistry | None:
        """The available tools that run in this process (neither slot tools nor external), as
        trajcore's ``ToolRegistry`` (the env's ``tool_registry()``); ``None`` when there are none.

        Raises:
            ConfigError: a tool's schema is not a valid tool spec (field ``build_tools()[name]``).
        """
        registry = ToolRegistry()
        for tool in self._available():
            if tool.name not in SLOT_TOOLS and not tool.schema.external:
                registry.register(_spec_of(tool), _handler(tool))
        return registry if len(registry) else None


def _spec_of(tool: Tool) -> ToolSpec:
    if isinstance(tool, SlotTool):
        return tool.spec
    schema = tool.schema
    where = f"build_tools()[{schema.name!r}]"
    properties: object = schema.parameters  # the env's own object: checked, not trusted
    required: object = schema.required
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise ConfigError(where, "parameters must be a dict and required a list")
    parameters: JSONObject = {
        "type": "object",
        "properties": properties,
        "required": list(required),
    }
    try:
        return ToolSpec(
            name=schema.name,
            description=schema.description,
            parameters=parameters,
            validator=JSONSchemaValidator(),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.reason) from exc


def _handler(tool: Tool) -> ToolHandler:
    async def run(arguments: JSONObject, context: ToolContext) -> JSON:
        answer = await tool.execute(**arguments)
        if isinstance(answer, str):
            return answer
        if not answer.success:
            raise ToolFailed(answer.error or answer.output or "the tool failed")
        return answer.output

    return run


async def run_agent(
    env: AgentEnv[Any, AgentEnvConfig],
    task: str,
    *,
    trajectory_id: str | None,
    rng: random.Random,
) -> tuple[str, dict[str, Any]]:
    """``env``'s agent on ``task``, one unscored trajectory: ``(final_response, debug)``.

    ``AtroposAgentEnv.run_agent`` says what it does; ``rng`` draws the toolsets.
    """
    tid = trajectory_id or f"{type(env).__name__}-agent-{uuid.uuid4().hex[:10]}"
    config = env.config
    prompt = config.system_prompt
    if config.thinking_mode and config.custom_thinking_prompt:
        prompt = "\n\n".join(p for p in (config.custom_thinking_prompt, prompt) if p)
    messages = [*([Message.system(prompt)] if prompt else []), Message.user(task)]

    async def no_workspace(_: SlotTools) -> JSONObject | None:
        return None

    async def not_scored(_: SlotTools, __: Transcript) -> ScoreAnswer:
        return 0.0

    async with env.rollout_services() as services:
        drawn = env.settings.toolsets.draw(services.catalog, rng)
        idle_s = config.slot_idle_timeout_s
        try:
            result = await run_trajectory(
                trajectory_id=tid,
                messages=messages,
                tools=select_specs(drawn.tools, services.specs),
                hooks=TrajectoryHooks(prepare=no_workspace, score=not_scored),
                policy=services.policy
                if idle_s is None
                else IdleLimitedPolicy(services.policy, idle_s),
                pool=services.pool,
                dispatcher=services.dispatcher,
                tool_server=services.tool_server,
                config=env.settings.rollout,
                render_threads=services.render_threads,
                model_stalled=services.model_stalled,
            )
        finally:
            await release_tool_sessions(services.tool_server, tid)
    outcome = result.outcome
    stop = result.stats.stop_reason
    final = Transcript(
        trajectory_id=tid, messages=result.messages, stats=result.stats, exchanges=()
    ).final_response
    return final, {
        "success": outcome.status.healthy,
        "error": None if outcome.status.healthy else (outcome.detail or outcome.status.value),
        "tool_calls": result.stats.tool_calls,
        "trajectory_id": tid,
        "status": outcome.status.value,
        "stop_reason": None if stop is None else stop.value,
        "turns": result.stats.turns,
        "messages": [dict(m.to_chat_dict(arguments_as_json=True)) for m in result.messages],
    }
