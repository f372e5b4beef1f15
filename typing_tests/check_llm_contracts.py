"""An adapter author's factories for the chat and token server suites type-check (mypy checks
this file; pytest never runs it). Lines marked ``# type: ignore[code]`` must stay errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from trajcore.adapters.fakes.llm import (
    ChatResponder,
    FakeChatServer,
    FakeTokenServer,
    LLMFault,
    TokenResponder,
)
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.token_server import TokenServer
from trajcore.testing.chat_server_contract import ChatServerFactory
from trajcore.testing.llm_server_machine import InjectFaults, ServerUnderTest
from trajcore.testing.llm_stubs import LoopbackLLMServer
from trajcore.testing.token_server_contract import TokenServerFactory


@asynccontextmanager
async def chat(policy: ChatResponder) -> AsyncIterator[ServerUnderTest[ChatServer]]:
    server = FakeChatServer(policy=policy)
    yield ServerUnderTest(server, server.inject)


@asynccontextmanager
async def tokens(policy: TokenResponder) -> AsyncIterator[ServerUnderTest[TokenServer]]:
    async with LoopbackLLMServer(token_policy=policy) as backend:
        yield ServerUnderTest(FakeTokenServer(policy=policy), backend.inject)


@asynccontextmanager
async def with_faults_argument(
    policy: ChatResponder, faults: Sequence[LLMFault]
) -> AsyncIterator[ChatServer]:
    yield FakeChatServer(policy=policy, faults=faults)


def check_factories() -> tuple[ChatServerFactory, TokenServerFactory]:
    return chat, tokens


def check_injectors(fake: FakeChatServer, backend: LoopbackLLMServer) -> list[InjectFaults]:
    return [fake.inject, backend.inject]


def check_a_factory_must_take_the_policy_alone() -> ChatServerFactory:
    return with_faults_argument  # type: ignore[return-value]


def check_a_chat_factory_is_no_token_factory() -> TokenServerFactory:
    return chat  # type: ignore[return-value]
