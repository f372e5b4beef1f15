"""Seed-shaped env bases, so an env written for a seed ports by changing its imports.

``from trajcore.compat import AtroposAgentEnv`` for an atropos-agent env (``build_task``,
``setup_trajectory_workspace``, ``verify_and_score_trajectory``, ``score_trajectory``,
``build_agent_config``, ``run_agent``, and ``build_tools()``/``self.tools`` with the seed's tool
objects: ``Tool``, ``ToolSchema``, ``SeedToolResult``, ``SeedToolRegistry``),
``from trajcore.compat import HermesAgentEnv, AgentResult, HermesToolContext`` for a hermes-agent
env (``format_prompt``, ``compute_reward`` with hermes's ``ToolContext``, here
``HermesToolContext`` because ``trajcore.env.ToolContext`` is the tool server's call context,
whose calls are awaited). Each
base's config class (``AtroposAgentEnvConfig``, ``HermesAgentEnvConfig``) has its seed's
defaults where they are safe; ``server_configs`` names the model server in ``config_init``. The
implementation and its rules are in ``trajcore.entrypoints.seed_envs``, ``hermes_tool_context``
and ``seed_tools``;
``docs/porting.md`` sets both seeds beside trajcore, setting by setting and hook by hook.
"""

from trajcore.entrypoints.atropos.startup import server_configs
from trajcore.entrypoints.hermes_tool_context import HermesToolContext
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.entrypoints.seed_envs import (
    AgentConfig,
    AgentResult,
    AtroposAgentEnv,
    AtroposAgentEnvConfig,
    ExecResult,
    ExecTool,
    HermesAgentEnv,
    HermesAgentEnvConfig,
    ToolError,
)
from trajcore.entrypoints.seed_settings import SEED_FIELDS, SeedSettingWarning
from trajcore.entrypoints.seed_tools import (
    SeedToolRegistry,
    SeedToolResult,
    SlotTool,
    Tool,
    ToolFailed,
    ToolSchema,
)

__all__ = [
    "SEED_FIELDS",
    "AgentConfig",
    "AgentResult",
    "AtroposAgentEnv",
    "AtroposAgentEnvConfig",
    "ExecResult",
    "ExecTool",
    "HermesAgentEnv",
    "HermesAgentEnvConfig",
    "HermesToolContext",
    "ItemLimits",
    "SeedSettingWarning",
    "SeedToolRegistry",
    "SeedToolResult",
    "SlotTool",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolSchema",
    "server_configs",
]
