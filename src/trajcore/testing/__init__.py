"""Fakes, contract suites and loopback servers, shipped so env authors can test without a cluster.

``from trajcore.testing import FakeChatServer, FakeSandboxPool, FakeTokenServer`` gives the
fakes: typed, in-memory implementations of every port, which pass the same contract suites as
the real adapters and add inspection (what was sent, what ran where) and fault injection (errors,
hangs, crashes, slow starts). They live in ``trajcore.adapters.fakes`` (``llm``, ``sandbox``,
``tools``, ``unisolated``); the fake of the Nomad agent's HTTP API lives in
``trajcore.testing.fake_nomad``. This module names them once for env authors and loads each on
first use (PEP 562), so importing a contract suite stays light.

Each ``*_contract`` module holds an abstract pytest suite for one port: subclass it, provide the
factory fixture, and your implementation is held to the same behaviour as trajcore's own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from trajcore.testing.fake_nomad.agent import FakeNomadAPI
    from trajcore.testing.fake_nomad.openapi import NomadOpenAPI

_HOMES = {
    "ChatRequest": "trajcore.adapters.fakes.llm",
    "ChatResponder": "trajcore.adapters.fakes.llm",
    "CommandHandler": "trajcore.adapters.fakes.sandbox",
    "CommandOutcome": "trajcore.adapters.fakes.sandbox",
    "ExecutedCall": "trajcore.adapters.fakes.sandbox",
    "FakeChatServer": "trajcore.adapters.fakes.llm",
    "FakeNomadAPI": "trajcore.testing.fake_nomad.agent",
    "FakeSandboxPool": "trajcore.adapters.fakes.sandbox",
    "FakeTokenServer": "trajcore.adapters.fakes.llm",
    "FakeToolServer": "trajcore.adapters.fakes.tools",
    "FakeWorkspace": "trajcore.adapters.fakes.sandbox",
    "FaultKind": "trajcore.adapters.fakes.llm",
    "LLMFault": "trajcore.adapters.fakes.llm",
    "NomadOpenAPI": "trajcore.testing.fake_nomad.openapi",
    "RecordedCall": "trajcore.adapters.fakes.tools",
    "ResetRecord": "trajcore.adapters.fakes.sandbox",
    "TokenRequest": "trajcore.adapters.fakes.llm",
    "TokenResponder": "trajcore.adapters.fakes.llm",
    "ToolFault": "trajcore.adapters.fakes.tools",
    "ToolFaultKind": "trajcore.adapters.fakes.tools",
    "UnisolatedSandboxPool": "trajcore.adapters.fakes.unisolated",
    "default_command": "trajcore.adapters.fakes.sandbox",
    "truncate_completion": "trajcore.adapters.fakes.llm",
}

__all__ = [
    "ChatRequest",
    "ChatResponder",
    "CommandHandler",
    "CommandOutcome",
    "ExecutedCall",
    "FakeChatServer",
    "FakeNomadAPI",
    "FakeSandboxPool",
    "FakeTokenServer",
    "FakeToolServer",
    "FakeWorkspace",
    "FaultKind",
    "LLMFault",
    "NomadOpenAPI",
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


def __getattr__(name: str) -> object:
    """Load a fake from its home module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trajcore.testing' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
