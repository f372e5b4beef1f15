"""Fakes: shipped, typed, in-memory implementations of every port, for tests and notebooks.

They pass the same contract suites as the real adapters and add inspection (what was sent, what
ran where) and fault injection (errors, hangs, crashes, slow starts).

Every fake an env author needs is importable from here::

    from trajcore.adapters.fakes import FakeChatServer, FakeSandboxPool, FakeTokenServer

``FakeNomadAPI`` is the Nomad agent's HTTP API in one process (it starts real slot servers as
its allocations), for the Nomad pool's tests.
"""

from trajcore.adapters.fakes.llm import (
    ChatRequest,
    ChatResponder,
    FakeChatServer,
    FakeTokenServer,
    FaultKind,
    LLMFault,
    TokenRequest,
    TokenResponder,
    truncate_completion,
)
from trajcore.adapters.fakes.nomad_api import FakeAllocation, FakeNomadAPI, NomadRequest
from trajcore.adapters.fakes.sandbox import (
    CommandHandler,
    CommandOutcome,
    ExecutedCall,
    FakeSandboxPool,
    FakeWorkspace,
    ResetRecord,
    default_command,
)
from trajcore.adapters.fakes.tools import FakeToolServer, RecordedCall, ToolFault, ToolFaultKind

__all__ = [
    "ChatRequest",
    "ChatResponder",
    "CommandHandler",
    "CommandOutcome",
    "ExecutedCall",
    "FakeAllocation",
    "FakeChatServer",
    "FakeNomadAPI",
    "FakeSandboxPool",
    "FakeTokenServer",
    "FakeToolServer",
    "FakeWorkspace",
    "FaultKind",
    "LLMFault",
    "NomadRequest",
    "RecordedCall",
    "ResetRecord",
    "TokenRequest",
    "TokenResponder",
    "ToolFault",
    "ToolFaultKind",
    "default_command",
    "truncate_completion",
]
