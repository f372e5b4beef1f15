"""A model call through Atropos's ``ServerManager`` while every server is down gives up once
the outage has lasted ``outage_s`` (the env's ``model_wait_s``), a ``ModelServerError`` naming
it; Atropos alone waits for a server to come back with no bound, so a model server that died
mid-run cost every later group its whole deadline. A server that is up is never cut, however
slow its answer. Against a real ``ServerManager``: a port nothing listens on, and the loopback
LLM stub."""

from __future__ import annotations

import socket
import time

import anyio
import pytest

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.adapters.llm.atropos import (
    ServerManagerChatServer,
    close_server_manager,
    server_manager_for,
)
from trajcore.domain.errors import ModelServerError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.testing.llm_stubs import LoopbackLLMServer

pytestmark = pytest.mark.anyio

SAMPLING = SamplingParams(max_tokens=8)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _manager(url: str) -> object:
    return server_manager_for([{"base_url": url, "model_name": "m", "api_key": "x"}])


async def test_a_call_gives_up_once_every_server_has_been_down_for_the_outage_bound() -> None:
    manager = _manager(f"http://127.0.0.1:{_closed_port()}/v1")
    chat = ServerManagerChatServer(manager, outage_s=2.0)
    started = time.monotonic()
    try:
        with anyio.fail_after(60), pytest.raises(ModelServerError) as failed:
            await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)
    finally:
        await close_server_manager(manager)
    message = str(failed.value)
    assert "every model server has been marked unhealthy by Atropos's health check" in message
    assert "past model_wait_s=2 s" in message
    assert time.monotonic() - started >= 2.0  # not before the outage had lasted the bound


async def test_without_a_bound_the_call_waits_as_atropos_does() -> None:
    manager = _manager(f"http://127.0.0.1:{_closed_port()}/v1")
    chat = ServerManagerChatServer(manager)
    try:
        with anyio.move_on_after(6) as waited:
            await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)
    finally:
        await close_server_manager(manager)
    assert waited.cancelled_caught  # still waiting: the deadline around it is what ends it


async def test_a_slow_answer_from_a_server_that_is_up_is_never_cut() -> None:
    async with LoopbackLLMServer() as stub:
        stub.inject(*[LLMFault.delay(3.0)] * 4)  # every request late, the health check's too
        manager = _manager(f"{stub.url}/v1")
        chat = ServerManagerChatServer(manager, outage_s=1.0)
        started = time.monotonic()
        try:
            with anyio.fail_after(30):
                turn = await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)
        finally:
            await close_server_manager(manager)
    assert turn.message.content.startswith("echo: hi")
    assert time.monotonic() - started >= 3.0
