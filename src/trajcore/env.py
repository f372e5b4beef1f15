"""Everything an env author writes an env with, from one place.

``from trajcore.env import AgentEnv, Message, SlotTools`` (or ``from trajcore import ...``, which
loads this module on first use) gives the env base and its config, the messages and tool types
the hooks see, the slot toolbox, the tool registry for in-process Python tools, toolsets and
distributions, what a group and a trajectory produced, and the errors a hook may catch or raise.
The fakes for testing an env live in ``trajcore.adapters.fakes``.

This module only re-exports; each name keeps its home (``trajcore.domain.tools.ToolSpec``, ...),
and that is where its documentation is. Importing it loads atroposlib (the env's base class), so
code that must stay light imports from the layer that owns a name instead.
"""

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.adapters.tool_server import ToolRegistry
from trajcore.domain.errors import (
    AcquireTimeout,
    ConfigError,
    InfrastructureError,
    InvalidInput,
    SandboxUnavailable,
    SlotFileError,
    SlotInfraError,
    StateError,
    ToolArgumentError,
    ToolServerError,
    TrajcoreError,
)
from trajcore.domain.groups import GroupStatus, TrajectoryStatus
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tool_schema import ArgumentCheck, ArgumentProblem, ArgumentValidator
from trajcore.domain.tools import (
    ExecReport,
    ToolCall,
    ToolContext,
    ToolOutcome,
    ToolResult,
    ToolSpec,
)
from trajcore.domain.toolsets import (
    DistributionRegistry,
    Toolset,
    ToolsetCatalog,
    ToolsetDistribution,
)
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.scored_data import MemberOverrides, ScoredGroup, render_transcript
from trajcore.entrypoints.atropos.startup import ModelEndpointUnavailable, server_configs
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.entrypoints.seed_settings import SeedSettingWarning
from trajcore.rollout.group import GroupResult
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import ScoreAnswer, ToolExchange, TrajectoryResult, Transcript

__all__ = [
    "JSON",
    "AcquireTimeout",
    "AgentEnv",
    "AgentEnvConfig",
    "ArgumentCheck",
    "ArgumentProblem",
    "ArgumentValidator",
    "ConfigError",
    "DistributionRegistry",
    "ExecReport",
    "GroupResult",
    "GroupStatus",
    "InfrastructureError",
    "InvalidInput",
    "ItemLimits",
    "JSONObject",
    "JSONSchemaValidator",
    "MemberOverrides",
    "Message",
    "ModelEndpointUnavailable",
    "SandboxUnavailable",
    "ScoreAnswer",
    "ScoredGroup",
    "SeedSettingWarning",
    "SlotFileError",
    "SlotInfraError",
    "SlotTools",
    "StateError",
    "ToolArgumentError",
    "ToolCall",
    "ToolContext",
    "ToolExchange",
    "ToolOutcome",
    "ToolRegistry",
    "ToolResult",
    "ToolServerError",
    "ToolSpec",
    "Toolset",
    "ToolsetCatalog",
    "ToolsetDistribution",
    "TrajcoreError",
    "TrajectoryResult",
    "TrajectoryStatus",
    "Transcript",
    "render_transcript",
    "server_configs",
]
