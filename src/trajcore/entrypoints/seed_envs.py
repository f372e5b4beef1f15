"""Seed-shaped env bases: an env written for atropos-agent or hermes-agent ports by its imports.

Both seeds' envs subclassed a base with hook names of its own. These two bases keep those names,
the arguments each hook got and the seeds' defaults, and map them onto ``AgentEnv``'s hooks, so
porting an env is ``from trajcore.compat import ...`` and, for hermes, an ``await`` before each
HermesToolContext call:

``AtroposAgentEnv`` (atropos-agent's ``AgentEnv``):

- ``build_task(item) -> str``, ``setup_agent_env()`` (run by ``setup``),
- ``setup_trajectory_workspace(item, *, trajectory_id, exec_tool) -> dict`` (its dict is the
  prepare metadata),
- ``verify_and_score_trajectory(item, final_response, *, trajectory_id, exec_tool,
  agent_result=None, workspace_meta=None) -> (score, metadata)``, by default
  ``score_trajectory(item, final_response)`` with empty metadata. Each keyword is passed only
  when the override declares it (or takes ``**kwargs``): the seed's versions declared
  different sets, and an override written as one of them runs unchanged.
- ``build_tools() -> SeedToolRegistry`` and ``self.tools`` (built from it when the env is
  built): the seed's registry of tool objects. Slot tools run in the trajectory's slot, other
  objects in this process as Python tools, ``external`` ones on the tool server
  (``trajcore.entrypoints.seed_tools``). ``self.tools`` is the registry here, so the
  registry itself answers ``AgentEnv``'s ``tools(external)`` hook: change the model's tools by
  overriding ``build_tools()``; a subclass that defines a ``tools`` method is refused.
  ``tool_registry()`` serves the registry's Python tools.
- ``run_agent(task, *, trajectory_id=None) -> (final_response, debug)``: one trajectory of
  the agent on ``task`` in a slot of its own, on the open services (opened for the call when
  none are); ``debug`` has the seed's ``success``, ``error`` and ``tool_calls``, and
  trajcore's ``trajectory_id``, ``status``, ``stop_reason``, ``turns`` and ``messages``.
- ``build_agent_config(item) -> AgentConfig``: every field with the seed's meaning, per item:
  ``max_steps``, ``temperature`` (``None``: the config's), ``max_tokens`` (``None``: the
  backend decides, bounded only by what is left of ``max_token_length``), ``tool_delay_s``,
  ``system_prompt`` (``None``: the config's); ``working_dir`` is refused when set (a slot's
  commands run in its workspace).

``exec_tool(call)`` runs one ``ToolCall`` in the trajectory's slot and returns an
``ExecResult``: its ``ToolResult``'s fields, and the seed's ``success`` (ran, and a command
exited 0) and ``output``; ``agent_result`` is the trajectory's ``Transcript``.

``HermesAgentEnv`` (hermes-agent's ``HermesAgentBaseEnv``):

- ``format_prompt(item) -> str``,
- ``compute_reward(item, result: AgentResult, ctx: HermesToolContext) -> float``, where
  ``AgentResult`` carries hermes's fields (``messages`` as OpenAI dicts, ``turns_used``,
  ``finished_naturally``, ``reasoning_per_turn``, ``tool_errors``) plus ``trajectory_id`` and
  ``stop_reason``, and ``HermesToolContext`` offers hermes's calls (``terminal``, ``read_file``,
  ``write_file``, ``upload_file``, ``upload_dir``, ``download_file``, ``download_dir``,
  ``search``, ``call_tool``, ``cleanup``) bound to the very slot the model used
  (``trajcore.entrypoints.hermes_tool_context``). They are coroutines here: trajcore's tools
  run on the event loop, so ``ctx.terminal(...)`` becomes ``await ctx.terminal(...)``.
- A ``compute_reward`` that raises scores that member ``reward_error_score`` (0.0, as hermes
  did), counted as ``trajcore/reward_errors``, logged with its traceback and kept in the
  member's score metadata (``reward_error``). Set ``reward_error_score = None`` to fail such a
  member as ``env_error`` instead. An ``InfrastructureError`` (the slot died) always fails it as
  ``infra_error``, and a ``ctx`` call made without ``await`` (whether or not it raised) as
  ``env_error`` naming the call and its line: neither is ever a score.

Both: the seeds' tool names work in the env's own calls (``exec_tool``, ``ctx.call_tool``):
``terminal`` is trajcore's ``bash``; a timeout the env's own code gives its command
(``ctx.terminal(cmd, timeout=180)``, ``{"timeout": ...}`` in an ``exec_tool`` call) is honoured
even past ``terminal_timeout_s``, which bounds the model's calls only. Each base's config
(``AtroposAgentEnvConfig``, ``HermesAgentEnvConfig``) has its seed's defaults wherever they are
safe; ``docs/porting.md`` lists every default that differs, and why. atropos-agent let slots
reach the network by default; trajcore does not, and the atropos-agent base says so at start.
"""

from __future__ import annotations

import abc
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, cast

import attrs
from pydantic.fields import FieldInfo
from typing_extensions import TypeVar

from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain import validators
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import ConfigError, InfrastructureError, StateError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolResult
from trajcore.entrypoints.atropos import tasks
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.hermes_tool_context import HermesToolContext, run_env_tool
from trajcore.entrypoints.seed_tools import SeedToolRegistry, default_seed_tools, run_agent
from trajcore.rollout.hook_failures import env_failure
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import RolloutConfig, ScoreAnswer, Transcript

__all__ = [
    "AgentConfig",
    "AgentResult",
    "AtroposAgentEnv",
    "AtroposAgentEnvConfig",
    "ExecResult",
    "ExecTool",
    "HermesAgentEnv",
    "HermesAgentEnvConfig",
    "ToolError",
]

log = logging.getLogger("trajcore.env")

ItemT = TypeVar("ItemT")
ConfigT_co = TypeVar("ConfigT_co", bound=AgentEnvConfig, default=AgentEnvConfig, covariant=True)


@attrs.frozen(kw_only=True)
class ExecResult(ToolResult):
    """What ``exec_tool`` answers: trajcore's ``ToolResult`` (its fields, ``ok`` and
    ``answering``; ``Message.tool`` takes it), read also as atropos-agent's ``ToolResult`` was
    (``success``, ``output``), so that a seed's ``if not res.success:`` after a failing check
    scores it as a failure. (``ToolResult.success`` is a constructor, which is always true when
    read as a flag; here ``success`` is the seed's flag, so build an ``ExecResult`` with ``of``.)
    """

    @classmethod
    def of(cls, result: ToolResult) -> ExecResult:
        """``result``, every field kept."""
        return cls(**attrs.asdict(result, recurse=False))

    @property
    def success(self) -> bool:  # type: ignore[override]  # the seed's flag, not the constructor
        """atropos-agent's ``success``: the call ran and, for a command, exited 0."""
        return self.ok and (self.exec is None or self.exec.exit_code == 0)

    @property
    def output(self) -> str:
        """atropos-agent's ``output``: the text the model would see (``content``)."""
        return self.content


ExecTool = Callable[[ToolCall], Awaitable[ExecResult]]
"""atropos-agent's ``exec_tool``: run one call in the trajectory's slot, get its result."""


def _exec_tool(tools: SlotTools) -> ExecTool:
    async def exec_tool(call: ToolCall) -> ExecResult:
        return ExecResult.of(await run_env_tool(tools, call.name, call.arguments))

    return exec_tool


def _declared(method: Callable[..., object], offered: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``offered`` that ``method`` declares (all of them for ``**kwargs``)."""
    parameters = inspect.signature(method).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    return {key: value for key, value in offered.items() if key in names}


def _with_default(name: str, default: object) -> Any:
    """``AgentEnvConfig``'s field ``name`` (checks and description) with another default."""
    info: FieldInfo = copy.copy(AgentEnvConfig.model_fields[name])
    if isinstance(default, list):
        kept = list(default)
        info.default = FieldInfo().default  # PydanticUndefined
        info.default_factory = lambda: list(kept)
    else:
        info.default = default
        info.default_factory = None
    return info


def _say_network_is_off(env: AgentEnv[Any, AgentEnvConfig], seed: str) -> None:
    config = env.config
    if not config.allow_network and "allow_network" not in config.model_fields_set:
        log.warning(
            "%s: allow_network is off, so slots have no network (%s's default was on); set "
            "allow_network: true (--env.allow_network true) if the tasks need it",
            type(env).__name__,
            seed,
        )


# ============================================================================ atropos-agent


_non_negative_temperature = validators.finite_number(None, at_least=0.0, optional=True)


def _no_working_dir(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        raise ConfigError(
            attribute.name,
            f"{value!r}: a slot's commands run in its workspace; cd in the command instead",
        )


@attrs.frozen(kw_only=True)
class AgentConfig:
    """atropos-agent's per-item agent settings (``build_agent_config``), with its defaults.

    Attributes:
        temperature: Sampling temperature; ``None``: the config's ``agent_temperature``.
        max_tokens: Most tokens per turn; ``None``: the backend decides (each turn may use what
            is left of ``max_token_length``).
        max_steps: Most assistant turns.
        system_prompt: The system prompt of this item's trajectories; ``None``: the config's.
        tool_delay_s: Pause before each batch of one turn's tool calls.
        working_dir: Must be ``None``: a slot's commands run in its workspace.

    Raises (when built):
        ConfigError: a value out of range, naming the field.
    """

    temperature: float | None = attrs.field(default=0.7, validator=_non_negative_temperature)
    max_tokens: int | None = attrs.field(default=None, validator=validators.optional_positive_int)
    max_steps: int = attrs.field(default=50, validator=validators.positive_int)
    system_prompt: str | None = attrs.field(default=None, validator=validators.optional_text)
    tool_delay_s: float = attrs.field(default=0.0, validator=validators.non_negative_seconds)
    working_dir: str | None = attrs.field(default=None, validator=_no_working_dir)


class AtroposAgentEnvConfig(AgentEnvConfig):
    """``AgentEnvConfig`` with atropos-agent's defaults where they are safe (``docs/porting.md``
    lists the rest): 50 turns, temperature 0.7, no per-turn token cap, the ``default`` toolset,
    a 20 ms batch window of up to 200 calls, 10 slots per container."""

    max_turns: int = _with_default("max_turns", 50)
    agent_temperature: float = _with_default("agent_temperature", 0.7)
    max_tokens: int | None = _with_default("max_tokens", None)
    enabled_toolsets: list[str] | str | None = _with_default("enabled_toolsets", ["default"])
    batch_window_ms: float = _with_default("batch_window_ms", 20.0)
    max_batch_size: int = _with_default("max_batch_size", 200)
    slots_per_container: int = _with_default("slots_per_container", 10)


class AtroposAgentEnv(AgentEnv[ItemT, ConfigT_co], Generic[ItemT, ConfigT_co]):
    """atropos-agent's ``AgentEnv`` hooks on trajcore (see the module doc)."""

    env_config_cls: type[AgentEnvConfig] = AtroposAgentEnvConfig

    def __init__(
        self,
        config: ConfigT_co,
        server_configs: object = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        if not isinstance(inspect.getattr_static(type(self), "tools"), property):
            raise ConfigError(
                "tools",
                f"{type(self).__name__} defines tools(); on AtroposAgentEnv self.tools is "
                "atropos-agent's tool registry: override build_tools() instead",
            )
        self.tools = self.build_tools()
        _say_network_is_off(self, "atropos-agent")

    # AgentEnv's tools(external) hook is a method; atropos-agent's self.tools is the registry
    # build_tools() returned. Here it is the registry, which answers the hook when called.
    @property
    def tools(self) -> SeedToolRegistry:
        """atropos-agent's ``self.tools``: the registry ``build_tools()`` returned."""
        registry = self.__dict__.get("_seed_tools")
        if registry is None:
            raise StateError("self.tools is set by AtroposAgentEnv.__init__ (build_tools())")
        return cast("SeedToolRegistry", registry)

    @tools.setter
    def tools(self, registry: SeedToolRegistry) -> None:
        if not isinstance(registry, SeedToolRegistry):
            raise ConfigError(
                "tools",
                f"expected a SeedToolRegistry (from build_tools()), got {type(registry).__name__}",
            )
        self.__dict__["_seed_tools"] = registry

    def build_tools(self) -> SeedToolRegistry:
        """The tool objects the model may call (atropos-agent's ``build_tools``); default:
        trajcore's slot tools. Override it to add tool objects (``super().build_tools()``,
        then ``register``); which of them a group offers is the toolsets' choice."""
        return default_seed_tools()

    def tool_registry(self) -> ToolRegistry | None:
        """The Python tools of ``self.tools`` (neither slot tools nor external), served in this
        process; ``None`` when there are none."""
        return self.tools.python_tools()

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
        self, item: ItemT, final_response: str, *, trajectory_id: str, exec_tool: ExecTool
    ) -> tuple[float, dict[str, Any]]:
        """Verify in the slot and score; default: ``score_trajectory`` and no metadata.

        Declared as the seed first declared it; an override may add the later keywords
        ``agent_result`` (the ``Transcript``) and ``workspace_meta`` (what
        ``setup_trajectory_workspace`` returned), or ``**kwargs``: each is passed only when
        declared.
        """
        return await self.score_trajectory(item, final_response), {}

    def build_agent_config(self, item: ItemT) -> AgentConfig:
        """The agent's settings for ``item``; default: the config's."""
        config = self.config
        return AgentConfig(
            max_steps=config.max_turns,
            temperature=config.agent_temperature,
            max_tokens=config.max_tokens,
            tool_delay_s=config.tool_delay_s,
        )

    async def run_agent(
        self, task: str, *, trajectory_id: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Run the agent on ``task`` in a slot of its own and return ``(final_response,
        debug)``, as atropos-agent's ``run_agent`` did.

        The trajectory runs on the open services (those of a CLI command or of
        ``rollout_services``), which are opened for this call when none are; it is offered the
        config's toolsets, runs under the config's limits (``max_turns``,
        ``agent_temperature``, ``max_tokens``, ``tool_delay_s``) and the config's system prompt,
        and is not scored; its slot is reset after it. ``debug``: ``success`` (it ended as a
        finished or budget-exhausted trajectory), ``error`` (why not, else ``None``),
        ``tool_calls``, ``trajectory_id``, ``status``, ``stop_reason``, ``turns`` and
        ``messages`` (OpenAI chat dicts).

        Raises:
            ConfigError, SandboxUnavailable, SlotServerError: the services cannot open.
        """
        return await run_agent(self, task, trajectory_id=trajectory_id, rng=self._rng)

    # -- the mapping onto AgentEnv's hooks

    async def prepare_workspace(self, item: ItemT, tools: SlotTools) -> JSONObject | None:
        offered = {"trajectory_id": tools.router.trajectory_id, "exec_tool": _exec_tool(tools)}
        hook = self.setup_trajectory_workspace
        meta: object = await hook(item, **_declared(hook, offered))
        # As the seed did, anything but a dict counts as no metadata; the rollout checks JSON.
        return cast("JSONObject", dict(meta)) if isinstance(meta, dict) else {}

    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        offered = {
            "trajectory_id": messages.trajectory_id,
            "exec_tool": _exec_tool(tools),
            "agent_result": messages,
            "workspace_meta": dict(messages.prepare_metadata or {}),
        }
        hook = self.verify_and_score_trajectory
        answer: object = await hook(item, messages.final_response, **_declared(hook, offered))
        if isinstance(answer, tuple) and len(answer) == 2:
            score, metadata = answer
            # The rollout checks both: a finite score, a JSON object (None: no metadata).
            return cast("float", score), cast("JSONObject", dict(metadata or {}))
        return cast("float", answer)

    def task_messages(self, item: ItemT) -> list[Message]:
        prompt = self.build_agent_config(item).system_prompt
        if prompt is None:
            return super().task_messages(item)
        # The item's prompt replaces the config's, behind the thinking prompt as that one is.
        config = self.config
        if config.thinking_mode and config.custom_thinking_prompt:
            prompt = f"{config.custom_thinking_prompt}\n\n{prompt}"
        return tasks.task_messages(self.build_task(item), prompt)

    def item_rollout(self, item: ItemT) -> RolloutConfig:
        agent = self.build_agent_config(item)
        rollout = super().item_rollout(item)
        sampling = rollout.sampling
        sampling = attrs.evolve(
            sampling,
            max_tokens=self.config.max_token_length
            if agent.max_tokens is None
            else agent.max_tokens,
            temperature=sampling.temperature if agent.temperature is None else agent.temperature,
        )
        return attrs.evolve(
            rollout,
            agent=attrs.evolve(rollout.agent, max_turns=agent.max_steps),
            sampling=sampling,
            tool_delay_s=agent.tool_delay_s,
        )


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


class HermesAgentEnvConfig(AgentEnvConfig):
    """``AgentEnvConfig`` with hermes-agent's defaults where they are safe (``docs/porting.md``
    lists the rest): parser ``hermes`` (used in managed mode, ignored in OpenAI mode as hermes
    did), a slot idle lifetime of 3600 s, 128 tool threads."""

    tool_call_parser: str | None = _with_default("tool_call_parser", "hermes")
    slot_idle_timeout_s: float | None = _with_default("slot_idle_timeout_s", 3600.0)
    tool_threads: int = _with_default("tool_threads", 128)


class HermesAgentEnv(AgentEnv[ItemT, ConfigT_co], Generic[ItemT, ConfigT_co]):
    """hermes-agent's ``HermesAgentBaseEnv`` hooks on trajcore (see the module doc).

    Attributes:
        reward_error_score: What a member whose ``compute_reward`` raised scores (hermes: 0.0);
            ``None`` fails it as ``env_error`` instead.
    """

    env_config_cls: type[AgentEnvConfig] = HermesAgentEnvConfig
    reward_error_score: ClassVar[float | None] = 0.0

    @abc.abstractmethod
    def format_prompt(self, item: ItemT) -> str:
        """The user message for ``item``."""

    @abc.abstractmethod
    async def compute_reward(
        self, item: ItemT, result: AgentResult, ctx: HermesToolContext
    ) -> float:
        """Score the rollout with full access to its slot through ``ctx``."""

    def build_task(self, item: ItemT) -> str | Sequence[Message]:
        return self.format_prompt(item)

    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        ctx = HermesToolContext(tools)
        try:
            reward = await self.compute_reward(item, AgentResult.of(messages), ctx)
        except InfrastructureError:
            raise  # the slot or a server failed: never a score
        except Exception as exc:
            ctx.check_awaited("compute_reward")  # a forgotten await is a bug, never a 0
            score = self.reward_error_score
            if score is None:
                raise
            why = env_failure("compute_reward", exc)
            log.exception(
                "%s: %s; scored %g, as hermes-agent did", messages.trajectory_id, why, score
            )
            self._counters.reward_errors += 1
            return score, {"reward_error": why}
        ctx.check_awaited("compute_reward")
        return reward
