"""The ChatServer contract against the fake, the HTTP adapter on a loopback stub, and
atroposlib's ServerManager on a loopback stub; then the fake and the HTTP adapter in lockstep."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from trajcore.adapters.fakes.llm import ChatResponder, FakeChatServer
from trajcore.adapters.llm.atropos import (
    ServerManagerChatServer,
    close_server_manager,
    server_manager_for,
)
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.ports.chat_server import ChatServer
from trajcore.testing.chat_server_contract import (
    ChatServerContract,
    ChatServerFactory,
    ChatServerFaultContract,
)
from trajcore.testing.chat_server_machine import run_chat_server_machine
from trajcore.testing.llm_server_machine import ServerUnderTest
from trajcore.testing.llm_stubs import LoopbackLLMServer

UnderTest = AsyncIterator[ServerUnderTest[ChatServer]]

FAST_RETRY = RetryRules(max_attempts=5, base_delay_s=0.001, max_delay_s=0.01)


@asynccontextmanager
async def fake(policy: ChatResponder) -> UnderTest:
    server = FakeChatServer(policy=policy, max_attempts=5)
    try:
        yield ServerUnderTest(server, server.inject)
    finally:
        await server.aclose()


@asynccontextmanager
async def openai_on_loopback(policy: ChatResponder) -> UnderTest:
    async with LoopbackLLMServer(chat_policy=policy) as stub:
        server = OpenAIChatServer(
            base_url=f"{stub.url}/v1", model="m", retry=FAST_RETRY, rng=random.Random(0)
        )
        try:
            yield ServerUnderTest(server, stub.inject)
        finally:
            await server.aclose()


@asynccontextmanager
async def manager_on_loopback(policy: ChatResponder) -> UnderTest:
    async with LoopbackLLMServer(chat_policy=policy) as stub:
        config: dict[str, object] = {
            "base_url": f"{stub.url}/v1", "model_name": "m", "api_key": "x",
            "server_type": "openai", "health_check": False,
        }  # fmt: skip
        manager = server_manager_for([config])
        server = ServerManagerChatServer(manager)
        try:
            yield ServerUnderTest(server)
        finally:
            await server.aclose()
            await close_server_manager(manager)


class TestFakeChatServer(ChatServerFaultContract):
    machine_scale = 0.05  # the lockstep test below drives the fake too

    @pytest.fixture
    def chat_server_factory(self) -> ChatServerFactory:
        return fake


class TestOpenAIChatServer(ChatServerFaultContract):
    machine_scale = 0.05  # the lockstep test below drives the adapter too

    @pytest.fixture
    def chat_server_factory(self) -> ChatServerFactory:
        return openai_on_loopback


class TestServerManagerChatServer(ChatServerContract):
    # Contract only: atroposlib retries on its own schedule (up to 10 s a try), so faults
    # cannot be staged quickly; the adapters it wraps pass the fault suite above.

    @pytest.fixture
    def chat_server_factory(self) -> ChatServerFactory:
        return manager_on_loopback


def test_the_fake_and_the_openai_adapter_agree() -> None:
    """The same generated sequences on the fake and on the HTTP adapter over the loopback stub:
    every answer and every error must be the same on both (and each checked on its own)."""
    run_chat_server_machine([fake, openai_on_loopback], scale=0.1)
