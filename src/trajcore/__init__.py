"""trajcore: reinforcement-learning rollouts for LLM agents that use tools.

``from trajcore import AgentEnv, Message, SlotTools`` gives an env author's names (the list is
``trajcore.env.__all__``). They are loaded lazily, on first use (PEP 562), so ``import
trajcore.domain`` stays cheap and pure: no HTTP clients, no tokenizers, no atroposlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
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
    from trajcore.domain.messages import (
        JSON,
        ExecReport,
        JSONObject,
        Message,
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
    from trajcore.entrypoints.atropos import (
        AgentEnv,
        AgentEnvConfig,
        MemberOverrides,
        ScoredGroup,
        render_transcript,
    )
    from trajcore.entrypoints.item_limits import ItemLimits
    from trajcore.entrypoints.seed_settings import SeedSettingWarning
    from trajcore.rollout.group import GroupResult
    from trajcore.rollout.tools import SlotTools
    from trajcore.rollout.trajectory import (
        ScoreAnswer,
        ToolExchange,
        TrajectoryResult,
        Transcript,
    )

__all__ = [
    "JSON",
    "AcquireTimeout",
    "AgentEnv",
    "AgentEnvConfig",
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
]

_FACADE = frozenset(__all__)


def __getattr__(name: str) -> object:
    """Load an env author's name from ``trajcore.env`` on first use."""
    if name in _FACADE:
        value: object = getattr(importlib.import_module("trajcore.env"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trajcore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
