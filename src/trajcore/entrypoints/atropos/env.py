"""``AgentEnv``: the Atropos env whose groups are agent trajectories, and its hooks.

The package docstring (``trajcore.entrypoints.atropos``) says what the env does and the rules it
keeps. This module holds the class an env author subclasses: the hooks they write, the
``make_*`` injection points, the run's services, one group's rollout, evaluation and the
wandb hooks. Settings live in ``config``, the pool in ``pools``, what Atropos is sent in
``scored_data``, counters and tables in ``metrics``, adapter construction in ``services``.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, cast

import anyio
import anyio.lowlevel
import anyio.to_thread
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    ServerBaseline,
)
from typing_extensions import TypeVar

from trajcore.adapters.event_loops import asyncio_hooks
from trajcore.adapters.llm.atropos import ServerManagerChatServer, close_server_manager, stall_check
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolSpec
from trajcore.domain.toolsets import DistributionRegistry, Toolset, ToolsetCatalog, select_specs
from trajcore.entrypoints.atropos import failing_groups, metrics, pools, scored_data, startup, tasks
from trajcore.entrypoints.atropos.config import AgentEnvConfig, RolloutSettings
from trajcore.entrypoints.atropos.scored_data import ScoredGroup
from trajcore.entrypoints.atropos.serve_workers import cap_workers
from trajcore.entrypoints.atropos.services import (
    RolloutServices,
    default_toolsets,
    join_tool_servers,
    learn_chat_template,
    release_tool_sessions,
    resolve_default_toolset,
    server_types,
    token_server_for,
    tool_server_for,
)
from trajcore.entrypoints.atropos.shard_claims import claim_shard
from trajcore.entrypoints.atropos.tokenizer_modes import tokenizer_for
from trajcore.entrypoints.atropos.trainer_api import explained
from trajcore.entrypoints.atropos_bases import BaseEnv
from trajcore.entrypoints.dataset_rows import DatasetRows, builtin_dataset
from trajcore.entrypoints.gc_tuning import young_gc_threshold
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.token_server import TokenServer
from trajcore.ports.tokenizer import Tokenizer
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.group import GroupResult, collect_group, failed_member
from trajcore.rollout.policy import ChatPolicy, Policy, TokenPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    ScoreAnswer,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

__all__ = ["AgentEnv"]

log = logging.getLogger("trajcore.env")
_ITEM_HOOKS = ("get_next_item", "build_task")

ItemT = TypeVar("ItemT")
ConfigT_co = TypeVar("ConfigT_co", bound="AgentEnvConfig", default="AgentEnvConfig", covariant=True)
"""The env's config class: ``AgentEnv[Item, MyConfig]`` types ``self.config`` as ``MyConfig``."""


class AgentEnv(BaseEnv, Generic[ItemT, ConfigT_co]):
    """An Atropos env whose groups are agent trajectories in sandbox slots; see the module doc.

    Hooks to write: ``get_next_item``, ``build_task``, ``verify_and_score``; optionally
    ``setup``, ``prepare_workspace``, ``eval_items`` (or ``evaluate`` itself), ``tools``,
    ``toolsets`` and ``tool_registry``. Construct it as Atropos does,
    ``Env(config, server_configs)``; ``server_configs`` defaults to Atropos's ``ServerBaseline``.

    Raises (when built):
        ConfigError: an invalid setting, naming its field, before the tokenizer is loaded.
    """

    env_config_cls: type[AgentEnvConfig] = AgentEnvConfig
    config: ConfigT_co

    def __init__(
        self,
        config: ConfigT_co,
        server_configs: object = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        if not isinstance(config, AgentEnvConfig):
            raise ConfigError("config", f"expected an AgentEnvConfig, got {type(config).__name__}")
        self.config = config  # for toolset_distributions() and the dataset, before Atropos's
        self.server_configs: object = startup.normalize_servers(
            ServerBaseline() if server_configs is None else server_configs
        )
        self.settings: RolloutSettings = config.settings(
            self.toolset_distributions(), server_types=server_types(self.server_configs)
        )
        if self.settings.ignored_parser and config.parser_given():
            log.warning("%s", self.settings.mode_line())
        builtin = [h for h in _ITEM_HOOKS if getattr(type(self), h) is getattr(AgentEnv, h)]
        self._dataset = builtin_dataset(config, env_name=type(self).__name__, builtin=builtin)
        with startup.tokenizer_errors(config.tokenizer_name, self.server_configs):
            super().__init__(config, self.server_configs, slurm=slurm, testing=testing)
        self._services: RolloutServices | None = None
        self._server_toolsets: list[Toolset] = []
        self._template: ChatTemplate | None = None
        self._tokenizer_port: Tokenizer | None = None
        self._rng = random.Random(config.toolset_seed)  # noqa: S311 - toolset draws, not secrets
        self._counters = metrics.RolloutCounters()
        self._table = metrics.RolloutTable()
        self._failing = failing_groups.FailingGroups(config.max_failed_groups)
        self._stop = failing_groups.RunStop()  # serve: GroupsFailing from a worker ends the run

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        """The defaults the CLI starts from: the env's config and its ``--openai.*`` server
        settings (``APIServerConfig`` s, or Atropos's ``ServerBaseline``). Override it to set
        ``tokenizer_name``, ``group_size`` and the rest for your env."""
        config: AgentEnvConfig = cls.env_config_cls()
        return config, ServerBaseline()

    # Atropos's commands, with every --openai.* flag honoured whatever config_init returns and
    # seed-named --env.* flags accepted (startup.cli_command).
    @classmethod
    def get_cli_serve_config_cls(cls) -> type:
        return startup.cli_command(cls, super().get_cli_serve_config_cls)

    @classmethod
    def get_cli_process_config_cls(cls) -> type:
        return startup.cli_command(cls, super().get_cli_process_config_cls)

    @classmethod
    def get_cli_evaluate_config_cls(cls) -> type:
        return startup.cli_command(cls, super().get_cli_evaluate_config_cls)

    # --------------------------------------------------------------- hooks for env authors

    async def setup(self) -> None:
        """Load data and anything else the env needs; runs once, after the services start."""

    async def get_next_item(self) -> ItemT:
        """The next dataset item to run a group on.

        Built in when ``dataset`` is set: the dataset's rows (``dict[str, JSON]``, so such an
        env is an ``AgentEnv[dict[str, JSON]]``), in order, cycling. Without ``dataset`` an env
        must override it (``AgentEnv`` refuses to start otherwise)."""
        if self._dataset is None:
            raise ConfigError("dataset", "set dataset or override get_next_item")
        return cast("ItemT", self._dataset.next_row())

    def build_task(self, item: ItemT) -> str | Sequence[Message]:
        """The task: the user's text, or the whole opening conversation.

        A string becomes one user message; ``system_prompt`` is put first when set and the task
        has no system message of its own. Built in when ``dataset`` is set: the row's
        ``prompt_field``. Without ``dataset`` an env must override it."""
        if self.config.dataset is None or not isinstance(item, dict):
            raise ConfigError("dataset", "set dataset or override build_task")
        return DatasetRows.prompt_of(item, self.config.prompt_field)

    async def prepare_workspace(self, item: ItemT, tools: SlotTools) -> JSONObject | None:
        """Set up the slot before the first turn (write files, clone a repository).

        May return metadata (a JSON object): the score hook sees it
        (``messages.prepare_metadata``), and the member's overrides and the log keep it.
        """
        return None

    def task_environment(self, item: ItemT) -> str | None:
        """The root filesystem ``item``'s trajectories run over: an image reference
        (``oci:/images/task-17``, ``containers-storage:NAME``; docs/environments.md), or
        ``None`` for the slot servers' own. Called once per group; every member's lease names
        it. Built in: with ``environment_field`` set, the dataset row's field (``null``: none).

        A malformed reference fails the group's members as ``env_error`` naming the field; an
        image the pool cannot run fails each member as ``infra_error`` naming the image.
        """
        return tasks.row_environment(item, self.config.environment_field)

    def item_limits(self, item: ItemT) -> ItemLimits | None:
        """Limits for ``item``'s trajectories (turns, tokens per turn, deadline), or ``None``
        for the config's. Called once per group."""
        return None

    def item_rollout(self, item: ItemT) -> RolloutConfig:
        """How ``item``'s trajectories run: the config's settings with ``item_limits(item)``
        applied. Called once per group; override it for per-item sampling."""
        limits = self.item_limits(item)
        rollout = self.settings.rollout
        return rollout if limits is None else limits.apply(rollout)

    @abc.abstractmethod
    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        """Check the work in the very slot the model used, and return a finite score, or
        ``(score, metadata)`` with a JSON object the member's overrides and the log keep.

        ``messages`` is the conversation (a ``Sequence[Message]``, so an override may take
        that) and the trajectory's story: ``trajectory_id``, ``stats`` (turns, stop reason,
        tool calls and errors), ``exchanges`` (each tool call with its result),
        ``final_response``, ``reasoning``, ``tool_errors`` and ``prepare_metadata``.

        Runs only when the trajectory ended healthy and the model produced something. Verify
        with ``tools.check``/``tools.run``, which raise ``SlotInfraError`` when the slot cannot
        answer. An ``InfrastructureError`` raised here (``SlotInfraError``) fails the member as
        ``infra_error``; any other exception (a bug, an uncaught ``SlotFileError`` from
        ``tools.read_file``) as ``env_error``, with the traceback's last frame. Neither is
        ever a zero: catch what you mean as 0 (a ``SlotFileError`` for a file the model did
        not write)."""

    async def eval_items(self) -> Sequence[ItemT]:
        """Items the default ``evaluate`` runs, one trajectory each (default: none)."""
        return ()

    def tools(self, external: Sequence[ToolSpec]) -> Sequence[ToolSpec]:
        """Every tool the model may be offered: by default the slot tools and ``external``
        (what the tool server lists)."""
        return (*SLOT_TOOL_SPECS, *external)

    def toolsets(self, tools: Sequence[ToolSpec]) -> ToolsetCatalog:
        """The toolsets over ``tools``: by default ``terminal`` (bash), ``stateful_terminal``
        (bash_stateful, tmux), ``file`` (read_file, write_file) and ``external`` (every tool
        that is not a slot tool), each only when it has a tool."""
        return default_toolsets(tools, self._server_toolsets)

    def tool_registry(self) -> ToolRegistry | None:
        """Python tools served in this process (default: none).

        When it returns a registry they are offered with no further setting
        (``tool_server_url`` unset or ``inprocess``); a synchronous tool runs in one of
        ``tool_threads`` worker threads. A registry together with a remote ``tool_server_url``
        is refused when the services start.
        """
        return None

    def toolset_distributions(self) -> DistributionRegistry:
        """Named toolset distributions, for ``toolset_distribution`` given by name (hermes's
        ``distribution``). Default: none. Called once, when the env is built."""
        return DistributionRegistry(distributions=())

    @classmethod
    def cli(cls) -> None:
        """``python my_env.py serve|process|evaluate ...``, as with any Atropos env: trajcore's
        log goes to stderr at INFO unless the program configured logging; SIGINT and SIGTERM
        stop the run with the pool closed, a second one forces it (``entrypoints.signals``); a
        setting that cannot work, or an error that ends the run, is one line (``startup``)."""
        metrics.log_to_stderr_unless_configured()
        from trajcore.entrypoints.signals import closing_on_signals

        with closing_on_signals(cls.__name__), startup.errors_in_one_line(cls.__name__):
            super().cli()

    # --------------------------------------------------------------------- injection points

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        """The sandbox pool of a run, as an async context manager (entered once, at start):
        ``local_containers`` slot servers here (``sandbox="local"``), slot-server containers
        (``"container"``) or a ``NomadSandboxPool`` (``"nomad"``, ``docs/nomad.md``).

        Raises:
            ConfigError: a Nomad setting that cannot work, named by its env field.
            SandboxUnavailable: tmux missing for ``require_stateful_sandbox``, or bubblewrap
                unusable for ``require_sandbox`` (when the pool starts); ``NomadUnavailable``
                when the Nomad agent cannot be used (when the pool starts).
        """
        return pools.make_pool(self.config)

    def make_chat_server(self) -> ChatServer:
        """OpenAI mode's server: Atropos's ``ServerManager``, an outage bounded by model_wait_s."""
        return ServerManagerChatServer(self.server, outage_s=self.config.model_wait_s)

    def make_token_server(self) -> TokenServer:
        """Managed mode's server: trajcore's fast token client for a single ``--openai.*``
        server with a ``base_url``, else Atropos's ``ServerManager`` (load-balanced).

        Raises:
            ConfigError: the server type has no token endpoint (``openai.server_type``).
        """
        return token_server_for(self.server_configs, self.server, self.config.model_wait_s)

    def make_tool_server(self) -> ToolServer | None:
        """The external tool server: ``tool_registry()`` served in this process when it returns
        a registry, else the one at ``tool_server_url``, else ``None``.

        Raises:
            ConfigError: ``inprocess`` without a ``tool_registry()``, or a registry and a
                remote ``tool_server_url`` both (``tool_server_url``).
        """
        return tool_server_for(self.config, self.tool_registry(), env_name=type(self).__name__)

    @contextlib.asynccontextmanager
    async def open_tool_server(self) -> AsyncIterator[ToolServer | None]:
        """``make_tool_server()`` joined with the ``tool_servers`` (MCP), listed once; closed on
        exit. Open and close in the same task.

        Raises:
            ConfigError: a tool name offered twice, naming both owners; a bad setting.
            ToolServerError, WireError: a server cannot be started, reached or listed.
        """
        single = self.make_tool_server()
        async with join_tool_servers(self.config, single) as (joined, server_toolsets):
            self._server_toolsets = list(server_toolsets)
            try:
                yield joined
            finally:
                self._server_toolsets = []

    def tokenizer_port(self) -> Tokenizer:
        """The env's tokenizer as trajcore's ``Tokenizer``: Atropos's ``tokenizer_name`` with its
        chat template, or Mistral's own encoder with ``tokenizer_mode="mistral"``.

        Raises:
            ConfigError: ``mistral_tokenizer_file`` is missing or cannot be loaded, or the
                ``mistral`` extra is not installed.
        """
        if self._tokenizer_port is None:
            self._tokenizer_port = tokenizer_for(self.config, self.tokenizer)
        return self._tokenizer_port

    def chat_template(self) -> ChatTemplate:
        """The tokenizer's chat template as the token ledger uses it (learnt once).

        Raises:
            ConfigError: the template cannot be used for agent turns (``chat_template``).
        """
        if self._template is None:
            self._template = learn_chat_template(self.tokenizer_port(), self.config)
        return self._template

    def make_policy(
        self, *, chat: ChatServer | None = None, token: TokenServer | None = None
    ) -> Policy:
        """The model side for ``mode``: ``ChatPolicy`` (with the template, for inexact tokens)
        or ``TokenPolicy`` (exact tokens, the configured parser)."""
        if self.settings.mode == "managed":
            parser_name = self.settings.parser
            assert parser_name is not None  # settings() checked it
            return TokenPolicy(
                server=token if token is not None else self.make_token_server(),
                tokenizer=self.tokenizer_port(),
                template=self.chat_template(),
                parser=get_parser(parser_name),
            )
        return ChatPolicy(
            server=chat if chat is not None else self.make_chat_server(),
            template=self.chat_template(),
        )

    # ------------------------------------------------------------------------------ services

    @property
    def services(self) -> RolloutServices:
        """The running services.

        Raises:
            StateError: none are open (use ``rollout_services`` or a CLI command).
        """
        if self._services is None:
            raise StateError("the env's rollout services are not open: use rollout_services()")
        return self._services

    @contextlib.asynccontextmanager
    async def rollout_services(
        self,
        *,
        policy: Policy | None = None,
        pool: SandboxPool | None = None,
        tool_server: ToolServer | None = None,
    ) -> AsyncIterator[RolloutServices]:
        """Open the services every group shares, and close them on exit.

        What is passed in is used as is and left open; what is not is built with the
        ``make_*`` methods and closed here. Inside an already open block it yields the open
        services (and ignores the arguments). Open and close in the same task.

        Raises:
            ConfigError: a toolset or tool name that does not fit the catalog, or a setting the
                ``make_*`` methods refuse.
            SandboxUnavailable, SlotServerError: the pool cannot start.
            ToolServerError, WireError: the tool server cannot list its tools.
        """
        if self._services is not None:
            yield self._services
            return
        log.info("%s", self.mode_line())
        # Synchronous tool_registry() tools run in anyio's default worker threads.
        anyio.to_thread.current_default_thread_limiter().total_tokens = self.config.tool_threads
        async with contextlib.AsyncExitStack() as stack:
            if tool_server is None:
                tool_server = await stack.enter_async_context(self.open_tool_server())
            external = await tool_server.list_tools() if tool_server is not None else []
            specs = tuple(self.tools(external))
            catalog = self.toolsets(specs)
            select_specs(catalog.all_tools(), specs)  # every toolset tool has a spec
            self.settings = resolve_default_toolset(self.settings, catalog)
            self.settings.toolsets.check_against(catalog)
            stalled = None  # a policy passed in is not the env's model server
            if policy is None:
                chat = token = None
                stalled = stall_check(self.server, deadline_s=self.config.slot_lifetime_s)
                if self.settings.mode == "managed":
                    token = self.make_token_server()
                    stack.push_async_callback(token.aclose)
                else:
                    chat = self.make_chat_server()
                    stack.push_async_callback(chat.aclose)
                policy = self.make_policy(chat=chat, token=token)
            if pool is None:
                pool = await stack.enter_async_context(self.make_pool())
            dispatcher = await stack.enter_async_context(
                ToolDispatcher(pool, self.settings.batching, loop_hooks=asyncio_hooks)
            )
            await anyio.lowlevel.checkpoint()  # the dispatcher's loop starts before any exit
            self._services = RolloutServices(
                pool=pool, dispatcher=dispatcher, policy=policy, tool_server=tool_server,
                specs=specs, catalog=catalog, model_stalled=stalled,
            )  # fmt: skip
            try:
                yield self._services
            finally:
                self._services = None

    async def _run_with_services(self, run: Any) -> None:
        startup.check_wandb(self.config.use_wandb)  # before the wait on the model
        async with contextlib.AsyncExitStack() as stack:  # unwound last to first
            # serve's rows go to the trainer (docs/deploy.md), process's and evaluate's do not
            if run not in (super().process_manager, super()._run_evaluate):
                stack.enter_context(claim_shard(self.config, type(self).__name__))
            stack.push_async_callback(close_server_manager, self.server)
            await self.wait_for_model()
            stack.enter_context(young_gc_threshold(self.config.gc_young_threshold))
            await stack.enter_async_context(self.rollout_services())
            stack.push_async_callback(failing_groups.stop_workers, self)
            await run()

    async def wait_for_model(self) -> None:
        """Before a run: wait until the ``--openai.*`` endpoint answers as a model server,
        at most ``model_wait_s`` (``startup.wait_for_model``); skipped when the env builds its
        own model server (an overridden ``make_chat_server`` / ``make_token_server``).

        Raises:
            ModelEndpointUnavailable: it answered the wrong thing, or not before the deadline.
        """
        managed = self.settings.mode == "managed"
        maker = "make_token_server" if managed else "make_chat_server"
        if getattr(type(self), maker) is getattr(AgentEnv, maker):
            prompt = self.tokenizer_port().encode("hi") if managed else [0]
            probes = startup.model_probes(self.server, mode=self.settings.mode, prompt_ids=prompt)
            await startup.wait_for_model(probes, wait_s=self.config.model_wait_s)

    async def get_server_info(self) -> None:
        """Atropos's: the trainer's batch size and ``max_token_len`` (``tasks.trainer_limited``)."""
        await super().get_server_info()
        tasks.log_token_limit(self.config.max_token_length, self.max_token_len)

    def mode_line(self) -> str:
        """One line for the start-up log: the mode, why, and whether tokens are exact."""
        return self.settings.mode_line()

    async def env_manager(self) -> None:
        """``serve``: Atropos's loop, inside the rollout services (``serve_workers``,
        ``failing_groups.RunStop``); OpenAI mode's inexact tokens are warned about here, once."""
        if self.settings.mode == "openai":
            log.warning(
                "serve sends inexact tokens to the trainer: %s. For RL set an --openai.server_type "
                "of vllm or sglang (or tool_call_parser) so that mode auto picks managed mode",
                self.mode_line(),
            )
        loop = super().env_manager

        async def serve() -> None:  # Atropos's loop, its workers capped to the pool's slots
            cap_workers(self.config, self.server, self.services.pool)
            await self._stop.run(explained(loop, self.config.rollout_server_url))

        await self._run_with_services(serve)

    async def process_manager(self) -> None:
        """``process``: Atropos's loop, inside the rollout services."""
        await self._run_with_services(super().process_manager)

    async def _run_evaluate(self) -> None:
        """``evaluate``: setup and evaluate, inside the rollout services."""
        await self._run_with_services(super()._run_evaluate)

    # -------------------------------------------------------------------------- rollouts

    def task_messages(self, item: ItemT) -> list[Message]:
        """The opening conversation of ``item``'s trajectories (``build_task`` and the system
        prompt). Raises ``ConfigError`` when ``build_task`` gave no text or messages."""
        config = self.config
        prompt = config.system_prompt
        if config.thinking_mode and config.custom_thinking_prompt:
            prompt = "\n\n".join(p for p in (config.custom_thinking_prompt, prompt) if p)
        return tasks.task_messages(self.build_task(item), prompt)

    async def run_group(
        self, item: ItemT, *, group_size: int | None = None, for_eval: bool = False
    ) -> GroupResult:
        """Run one group of ``item`` on the open services and judge it.

        ``build_task``, ``item_limits`` or ``task_environment`` raising (or ``item_rollout``
        not returning a ``RolloutConfig``) fails the members as ``env_error``, naming the hook
        (``tasks.env_hook``). Tokens are cut below the trainer's ``max_token_len`` too.

        Raises:
            StateError: no services are open.
            ConfigError: the toolset draw failed.
        """
        services = self.services
        size = self.config.group_size if group_size is None else group_size
        rules = self.settings.eval_rules(size) if for_eval else self.settings.group_rules(size)
        messages, problem = tasks.env_hook("build_task", lambda: self.task_messages(item),
                                           list[Message]())  # fmt: skip
        rollout, limits = tasks.group_rollout(lambda: self.item_rollout(item),
            self.settings.rollout, trainer_max_token_len=self.max_token_len,
            overridden=type(self).item_rollout is not AgentEnv.item_rollout)  # fmt: skip
        built_in = type(self).task_environment is AgentEnv.task_environment
        environment, found = tasks.group_environment(
            lambda: self.task_environment(item),
            field=str(self.config.environment_field) if built_in else "task_environment",
        )
        problem = problem or limits or found
        drawn = self.settings.toolsets.draw(services.catalog, self._rng)
        specs = select_specs(drawn.tools, services.specs)

        async def prepare(tools: SlotTools) -> JSONObject | None:
            return await self.prepare_workspace(item, tools)

        async def score(tools: SlotTools, transcript: Transcript) -> ScoreAnswer:
            return await self.verify_and_score(item, tools, transcript)

        hooks = TrajectoryHooks(prepare=prepare, score=score)
        agent_policy = tasks.idle_limited(services.policy, self.config.slot_idle_timeout_s)
        started = anyio.current_time()

        async def member(trajectory_id: str) -> TrajectoryResult:
            if problem is not None:
                return failed_member(trajectory_id, StopReason.ENV_ERROR, problem)
            config = tasks.member_rollout(rollout, started)  # what the group's deadline left
            if isinstance(config, str):
                return failed_member(trajectory_id, StopReason.INFRA_ERROR, config)
            try:
                return await run_trajectory(
                    trajectory_id=trajectory_id, messages=messages, tools=specs, hooks=hooks,
                    policy=agent_policy, pool=services.pool, dispatcher=services.dispatcher,
                    tool_server=services.tool_server, config=config, environment=environment,
                    prepared=prepared, model_stalled=services.model_stalled,
                    render_threads=services.render_threads,
                )  # fmt: skip
            finally:
                await release_tool_sessions(services.tool_server, trajectory_id)

        group_id = f"{type(self).__name__}-{uuid.uuid4().hex[:10]}"
        once = self.config.prepare_once and problem is None
        async with tasks.preparing(
            once=once, group_id=group_id, environment=environment, prepare=prepare,
            services=services, rollout=rollout,
        ) as prepared:  # fmt: skip
            result = await collect_group(
                group_id=group_id, rules=rules, run_member=member, environment=environment,
                sampling=rollout.sampling,
            )  # fmt: skip
        if not for_eval:  # the trajcore/* counters count training groups only
            self._counters.record(result)
        metrics.log_group(result, drawn.toolsets)
        return result

    def scored_group(self, group: GroupResult) -> ScoredGroup | None:
        """The Atropos ``ScoredDataGroup`` of a judged group, or ``None`` when it is not sent
        (its verdict dropped it, or too few kept members have tokens); the reason is logged."""
        conversion = scored_data.scored_group(group, self.settings)
        metrics.log_conversion(group, conversion)
        self._counters.record_conversion(conversion)
        return conversion.scored

    async def collect_trajectories(self, item: ItemT) -> tuple[ScoredGroup | None, list[ItemT]]:
        """Atropos's hook: one group of ``item``, scored, or ``None`` when it is not sent.
        Raises ``GroupsFailing`` at ``max_failed_groups`` failed groups in a row."""
        result = await self.run_group(item)
        scored = self.scored_group(result)
        try:
            self._failing.record(result)
        except failing_groups.GroupsFailing as exc:
            self._stop.stop(exc)  # Atropos's serve loop drops a worker's exception
            raise
        return scored, []

    async def run_task(
        self,
        item: ItemT,
        *,
        policy: Policy | None = None,
        pool: SandboxPool | None = None,
        tool_server: ToolServer | None = None,
        group_size: int | None = None,
    ) -> GroupResult:
        """Run one item as one group without Atropos's API server, for tests and notebooks.

        ``policy``, ``pool`` and ``tool_server`` replace the configured ones (pass fakes); the
        services are opened for this call unless they are already open. Returns the judged
        ``GroupResult``; ``scored_group(result)`` gives what Atropos would be sent.

        Raises:
            ConfigError, SandboxUnavailable, SlotServerError: as ``rollout_services``.
        """
        async with self.rollout_services(policy=policy, pool=pool, tool_server=tool_server):
            return await self.run_group(item, group_size=group_size)

    # -------------------------------------------------------------------------- evaluate

    async def evaluate(self, *args: object, **kwargs: object) -> None:
        """Run each of ``eval_items()`` once, at most ``max_eval_workers`` at a time (an item
        whose run raises is a failed sample), and log ``eval/*`` to wandb when enabled, to
        ``data_dir_to_save_evals`` when set, and to the log; training counters and the rollout
        table are left alone. Raises ``ConfigError`` when ``max_eval_workers`` is below 1."""
        items = list(await self.eval_items())
        if not items:
            log.info("evaluate: eval_items() is empty; nothing to evaluate")
            return
        started = anyio.current_time()

        async def one(item: ItemT) -> GroupResult:
            return await self.run_group(item, group_size=1, for_eval=True)

        done = await metrics.evaluate_items(items, one, workers=self.config.max_eval_workers)
        eval_metrics = metrics.eval_metrics(len(items), done)
        log.info("evaluate: %s", json.dumps(eval_metrics))
        if self.config.data_dir_to_save_evals is not None:
            await self.evaluate_log(
                metrics=eval_metrics, start_time=started, end_time=anyio.current_time(),
                samples=metrics.eval_samples(done), verbose=False,
            )  # fmt: skip
        if self.config.use_wandb:
            metrics.log_eval_to_wandb(eval_metrics, step=self.curr_step, prefix=self.wandb_prepend)

    # ------------------------------------------------------------------------ logging

    def tool_error_metrics(self) -> dict[str, float]:
        """The ``trajcore/*`` counters since the last ``wandb_log`` (groups, trajectories,
        tool calls and errors, parse errors, drift), and ``train/tool_errors_count``."""
        return self._counters.metrics()

    def service_metrics(self) -> dict[str, float]:
        """The pool's and the dispatcher's statistics now: ``trajcore/pool/*`` (slots by state,
        waiting, leases granted and expired, containers), ``trajcore/environments/*`` (leases
        over task environments, refused, cache hits, misses, seconds) once there were any, and
        ``trajcore/dispatcher/*`` (batches, calls, failed and withdrawn, largest batch, calls
        per batch); empty while no services are open."""
        return metrics.running_service_metrics(self._services)

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Atropos's metrics plus the ``trajcore/*`` counters (which then start again), the
        pool's and dispatcher's statistics (the slot servers' figures read first), and hermes's
        ``train/tool_errors_count`` and ``train/tool_error_details`` (one line per failed call
        since the last log)."""
        await metrics.refresh_server_figures(self._services)
        logged = metrics.training_metrics(self._counters, self.service_metrics(), wandb_metrics)
        self._counters = metrics.RolloutCounters()
        await super().wandb_log(logged)

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """Keep the group's conversations, as readable text, for the rollout table."""
        self._table.add(
            cast("ScoredGroup", scored_data),
            per_group=int(self.config.num_rollouts_per_group_for_logging),
            keep=int(self.config.num_rollouts_to_keep),
        )

    async def create_rollout_table(self, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
        """The rollout table: id, score, turns, tool calls, tool errors, stop, conversation."""
        if self._table.rows and self.config.use_wandb:
            wandb_metrics["train/rollouts"] = self._table.wandb_table()
        self._table = metrics.RolloutTable()
        return wandb_metrics
