"""An ``--openai.*`` server's ``timeout`` and ``num_max_requests_at_once`` hold on trajcore's
own model-server path (``token_server_for`` with one server that has a ``base_url``, as managed
mode builds it), as they do in atroposlib's ``ServerManager``: requests past the count wait for
one to end, and an attempt past the timeout is given up and retried. Checked against a real
HTTP server on loopback, which records the requests that reached it."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from trajcore.adapters.fakes.llm import FaultKind, LLMFault
from trajcore.adapters.llm.atropos import chat_server_from_config
from trajcore.adapters.llm.tokens import AtroposTokenServer
from trajcore.adapters.llm.transport import DEFAULT_CONNECTIONS
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.entrypoints.atropos.services import token_server_for
from trajcore.ports.token_server import TokenServer
from trajcore.testing.llm_stubs import LoopbackLLMServer

SAMPLING = SamplingParams(max_tokens=4)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(url: str, **fields: object) -> APIServerConfig:
    return APIServerConfig(base_url=f"{url}/v1", model_name="stub-model", **fields)


async def test_no_more_requests_are_in_flight_than_num_max_requests_at_once() -> None:
    async with LoopbackLLMServer() as stub:
        stub.inject(*[LLMFault(kind=FaultKind.DELAY, delay_s=1.0)] * 6)
        server: TokenServer = token_server_for(_config(stub.url, num_max_requests_at_once=2), None)
        try:
            async with anyio.create_task_group() as group:
                for _ in range(6):
                    group.start_soon(lambda: server.generate([1, 2, 3], sampling=SAMPLING))
                await anyio.sleep(0.5)
                # the first two are held for 1 s; the other four wait for them in the client
                assert len(stub.requests) == 2
        finally:
            await server.aclose()
        assert len(stub.requests) == 6


async def test_an_attempt_past_the_timeout_is_given_up_and_tried_again() -> None:
    async with LoopbackLLMServer() as stub:
        stub.inject(LLMFault(kind=FaultKind.DELAY, delay_s=3.0))
        server = token_server_for(_config(stub.url, timeout=1), None)
        try:
            with anyio.fail_after(10):
                completion = await server.generate([1, 2, 3], sampling=SAMPLING)
        finally:
            await server.aclose()
        assert completion.token_ids
        assert len(stub.requests) == 2  # the held one, then its retry answered at once


async def test_the_chat_adapter_built_from_a_config_keeps_both_limits() -> None:
    async with LoopbackLLMServer() as stub:
        stub.inject(LLMFault(kind=FaultKind.DELAY, delay_s=3.0))
        chat = chat_server_from_config(_config(stub.url, timeout=1, num_max_requests_at_once=1))
        try:
            with anyio.fail_after(10):
                await chat.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        finally:
            await chat.aclose()
        assert len(stub.requests) == 2


@pytest.mark.parametrize("field", ["timeout", "num_max_requests_at_once"])
def test_a_limit_that_cannot_work_is_named(field: str) -> None:
    config = _config("http://127.0.0.1:9")
    setattr(config, field, 0)  # pydantic does not check assignments: a hand-edited config
    with pytest.raises(ConfigError, match=f"openai.{field}"):
        token_server_for(config, None)


def test_a_config_without_the_limits_keeps_the_clients_defaults() -> None:
    """A config object that is not atroposlib's (no ``timeout``, no request count) is taken:
    the client keeps its own defaults (no limit on one attempt, DEFAULT_CONNECTIONS)."""
    config = SimpleNamespace(base_url="http://127.0.0.1:9/v1", model_name="m", server_type="vllm")
    server = token_server_for([config], None)
    assert isinstance(server, AtroposTokenServer)
    assert server.retry.attempt_timeout_s is None
    assert server.max_connections == DEFAULT_CONNECTIONS
