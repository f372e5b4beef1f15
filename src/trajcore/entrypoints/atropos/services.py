"""The services a run shares, and the adapters they are built from.

``RolloutServices`` is what every group of a run uses: the sandbox pool, the batching tool
dispatcher over it, the model side, the tool server, the tools and toolsets the model may be
offered, and the threads of the final renders. ``AgentEnv.rollout_services`` opens them once
per run; the functions here build the adapters its ``make_*`` methods return, from the config
and Atropos's server settings.

Rules it keeps:

- Building an adapter starts nothing: a server, client or tokenizer is opened by the run.
- A setting that cannot work is a ``ConfigError`` naming the env field (``tool_server_url``,
  ``tokenizer_mode``, ``mistral_tokenizer_file``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import attrs
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from trajcore.adapters.generation_config import generation_stop_ids
from trajcore.adapters.llm.atropos import ServerManagerTokenServer, token_server_from_config
from trajcore.adapters.render_pool import DaemonRenderPool
from trajcore.adapters.tool_server import INPROCESS, HTTPToolServer, ToolRegistry
from trajcore.domain.errors import ConfigError
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tools import ToolSpec
from trajcore.domain.toolsets import Toolset, ToolsetCatalog
from trajcore.entrypoints.atropos.config import (
    DEFAULT_TOOLSETS,
    EXTERNAL_TOOLSET,
    AgentEnvConfig,
    RolloutSettings,
)
from trajcore.entrypoints.tool_server import make_app
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.token_server import TokenServer
from trajcore.ports.tokenizer import Tokenizer
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ModelStallCheck, Policy
from trajcore.rollout.render_threads import RenderThreads

__all__ = [
    "SEED_DEFAULT_TOOLSET",
    "RolloutServices",
    "default_toolsets",
    "env_render_threads",
    "join_tool_servers",
    "learn_chat_template",
    "release_tool_sessions",
    "resolve_default_toolset",
    "server_types",
    "token_server_for",
    "tool_server_for",
]

log = logging.getLogger("trajcore.env")

RELEASE_TIMEOUT_S = 10.0
"""Longest a tool server may take to end one trajectory's sessions."""


@functools.cache
def env_render_threads() -> RenderThreads:
    """The process's render threads for its envs' trajectories, made on first use: daemon
    threads (``DaemonRenderPool``), so a render given up on never holds the process's exit."""
    return RenderThreads(make_pool=DaemonRenderPool)


@attrs.frozen(kw_only=True)
class RolloutServices:
    """What every group of a run shares.

    Attributes:
        pool: The sandbox pool slots are leased from.
        dispatcher: The batching tool dispatcher over ``pool``.
        policy: The model side (``ChatPolicy`` or ``TokenPolicy``).
        tool_server: External tools, or ``None``.
        specs: Every tool the model may be offered.
        catalog: The toolsets over ``specs``.
        model_stalled: Whether a model call in flight at a trajectory's turns' deadline is the
            model server's failure; ``None`` for a policy the env did not build.
        render_threads: Where the trajectories' final renders run (``env_render_threads``).
    """

    pool: SandboxPool
    dispatcher: ToolDispatcher
    policy: Policy
    tool_server: ToolServer | None
    specs: tuple[ToolSpec, ...]
    catalog: ToolsetCatalog
    model_stalled: ModelStallCheck | None = None
    render_threads: RenderThreads = attrs.field(factory=env_render_threads)


def server_types(configs: object) -> tuple[str, ...]:
    """The ``server_type`` of each ``--openai.*`` server (``APIServerConfig`` s or a baseline)."""
    items = configs if isinstance(configs, list | tuple) else [configs]
    return tuple(str(t) for c in items if (t := getattr(c, "server_type", None)) is not None)


def token_server_for(
    server_configs: object, server: object, outage_s: float | None = None
) -> TokenServer:
    """Managed mode's server: trajcore's token client for a single ``--openai.*`` server with a
    ``base_url``, else Atropos's ``ServerManager`` (``server``, load-balanced; a call fails once
    every server has been unhealthy for ``outage_s``).

    Raises:
        ConfigError: the server type has no token endpoint (``openai.server_type``).
    """
    configs = server_configs
    if isinstance(configs, APIServerConfig):
        configs = [configs]
    if isinstance(configs, list) and len(configs) == 1 and getattr(configs[0], "base_url", None):
        return token_server_from_config(configs[0])
    return ServerManagerTokenServer(server, outage_s=outage_s)


def tool_server_for(
    config: AgentEnvConfig, registry: ToolRegistry | None, *, env_name: str
) -> ToolServer | None:
    """The external tool server: ``registry`` served in this process when there is one, else
    the one at ``tool_server_url``, else ``None``.

    Raises:
        ConfigError: ``inprocess`` without a registry, or a registry and a remote
            ``tool_server_url`` both (``tool_server_url``).
    """
    url = config.tool_server_url
    if registry is not None and url not in (None, INPROCESS):
        raise ConfigError(
            "tool_server_url",
            f"{env_name}.tool_registry() serves tools in this process and "
            f"tool_server_url={url!r} names a remote tool server: keep one of them",
        )
    if url == INPROCESS and registry is None:
        raise ConfigError(
            "tool_server_url", "'inprocess' serves tool_registry(), which returned None"
        )
    # Each call is bounded by terminal_timeout_s on the server, so a request of n calls may take
    # n times that; the client waits that long and terminal_timeout_s more.
    limit = config.terminal_timeout_s
    if registry is not None:
        app = make_app(registry, call_timeout_s=limit)
        return HTTPToolServer(INPROCESS, app=app, timeout_s=limit, call_timeout_s=limit)
    if url is None:
        return None
    return HTTPToolServer(
        url, token=config.tool_server_token, timeout_s=limit, call_timeout_s=limit
    )


def learn_chat_template(tokenizer: Tokenizer, config: AgentEnvConfig) -> ChatTemplate:
    """``tokenizer``'s chat template as the token ledger uses it; a turn ends at the
    tokenizer's end-of-sequence id or any stop id of ``tokenizer_name``'s generation config.

    Raises:
        ConfigError: the template cannot be used for agent turns (``chat_template``).
    """
    eos = tokenizer.eos_token_id
    stops = generation_stop_ids(Path(str(config.tokenizer_name)))
    return ChatTemplate.learn(tokenizer, turn_stops=stops if eos is None else {eos, *stops})


def default_toolsets(
    tools: Sequence[ToolSpec], server_toolsets: Sequence[Toolset]
) -> ToolsetCatalog:
    """The default catalog over ``tools``: ``terminal``, ``stateful_terminal``, ``file`` and
    ``external`` (every tool that is not a slot tool), each only when it has a tool, and then
    each of ``server_toolsets`` (one per MCP server) whose tools are all offered."""
    names = [spec.name for spec in tools]
    slot_names = {name for _, members, _ in DEFAULT_TOOLSETS for name in members}
    toolsets = [
        Toolset(name=name, tools=[t for t in members if t in names], description=about)
        for name, members, about in DEFAULT_TOOLSETS
        if any(t in names for t in members)
    ]
    external = [name for name in names if name not in slot_names]
    if external:
        toolsets.append(
            Toolset(name=EXTERNAL_TOOLSET, tools=external, description="the tool server's")
        )
    toolsets.extend(t for t in server_toolsets if all(n in names for n in t.tools))
    return ToolsetCatalog(toolsets=toolsets)


async def release_tool_sessions(server: ToolServer | None, trajectory_id: str) -> None:
    """End the state a tool server keeps for one trajectory (MCP sessions), if it keeps any.

    Shielded from cancellation and bounded by ``RELEASE_TIMEOUT_S``; a failure or a timeout is
    logged, never raised, because the trajectory's result stands either way.
    """
    if server is None:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_S) as waited:
        try:
            await server.release(trajectory_id)
        except Exception as exc:  # noqa: BLE001 - the trajectory's result stands
            log.warning("releasing %s's tool sessions: %s", trajectory_id, exc)
    if waited.cancelled_caught:
        log.warning("releasing %s's tool sessions took over %g s", trajectory_id, RELEASE_TIMEOUT_S)


@contextlib.asynccontextmanager
async def join_tool_servers(
    config: AgentEnvConfig, single: ToolServer | None
) -> AsyncIterator[tuple[ToolServer | None, Sequence[Toolset]]]:
    """``single`` (the env's tool server) joined with the config's ``tool_servers`` (MCP),
    listed once, with the MCP servers' toolsets; ``single`` is closed on exit.

    Raises:
        ConfigError: a tool name offered twice, naming both owners; a bad setting.
        ToolServerError, WireError: a server cannot be started, reached or listed.
    """
    try:
        if not config.tool_servers:
            yield single, ()
            return
        from trajcore.adapters.mcp.join import JoinedMember
        from trajcore.adapters.mcp.settings import open_tool_servers, parse_tool_servers

        before = [JoinedMember(name="tool_server", server=single)] if single else []
        async with open_tool_servers(
            parse_tool_servers(config.tool_servers),
            default_call_timeout_s=config.terminal_timeout_s,
            reserved={spec.name: "the slot tools" for spec in SLOT_TOOL_SPECS},
            before=before,
        ) as joined:
            await joined.list_tools()  # clashes fail here, at start
            yield joined, joined.toolsets()
    finally:
        if single is not None:
            await single.aclose()


SEED_DEFAULT_TOOLSET = "default"
"""atropos-agent's toolset name for its whole set of tools (its ``enabled_toolsets`` default)."""


def resolve_default_toolset(settings: RolloutSettings, catalog: ToolsetCatalog) -> RolloutSettings:
    """``settings`` with atropos-agent's ``"default"`` toolset, when enabled and the catalog has
    no toolset of that name, replaced by every toolset of the catalog (the seed's default set:
    its slot tools and the tool server's)."""
    enabled = settings.toolsets.enabled
    if (
        enabled is None
        or SEED_DEFAULT_TOOLSET not in enabled
        or SEED_DEFAULT_TOOLSET in catalog.names()
    ):
        return settings
    names = [n for n in enabled if n != SEED_DEFAULT_TOOLSET]
    names += [n for n in catalog.names() if n not in names]
    return attrs.evolve(settings, toolsets=attrs.evolve(settings.toolsets, enabled=names))
