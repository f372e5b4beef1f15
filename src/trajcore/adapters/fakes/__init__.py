"""Fakes: shipped, typed, in-memory implementations of every port, for tests and notebooks.

They pass the same contract suites as the real adapters and add inspection (what was sent, what
ran where) and fault injection (errors, hangs, crashes, slow starts).

Every fake an env author needs is importable from here::

    from trajcore.adapters.fakes import FakeChatServer, FakeSandboxPool, FakeTokenServer

The fake of the Nomad agent's HTTP API is ``trajcore.testing.fake_nomad.FakeNomadAPI``.
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
from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool

__all__ = [
    "ChatRequest",
    "ChatResponder",
    "CommandHandler",
    "CommandOutcome",
    "ExecutedCall",
    "FakeChatServer",
    "FakeSandboxPool",
    "FakeTokenServer",
    "FakeToolServer",
    "FakeWorkspace",
    "FaultKind",
    "LLMFault",
    "RecordedCall",
    "ResetRecord",
    "TokenRequest",
    "TokenResponder",
    "ToolFault",
    "ToolFaultKind",
    "UnisolatedSandboxPool",
    "default_command",
    "truncate_completion",
]
