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
import attrs
import pytest

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.adapters.llm.atropos import (
    ServerManagerChatServer,
    close_server_manager,
    server_manager_for,
)
from trajcore.domain.errors import ModelServerError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.testing.llm_stubs import LoopbackLLMServer, chat_completion_json

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


@attrs.define
class _Server:
    server_healthy: bool = True


@attrs.define
class _Completion:
    body: JSONObject

    def model_dump(self, mode: str) -> JSONObject:
        return self.body


@attrs.define
class _Manager:
    """A ``ServerManager`` in shape: its servers' health set by the test, each call answered
    when the test says."""

    servers: list[_Server] = attrs.field(factory=lambda: [_Server()])
    answer: anyio.Event = attrs.field(factory=anyio.Event)

    def down(self, down: bool) -> None:
        for server in self.servers:
            server.server_healthy = not down

    async def chat_completion(self, **kwargs: object) -> _Completion:
        await self.answer.wait()
        turn = ChatTurn(message=Message.assistant("ok"), finish_reason=FinishReason.STOP)
        return _Completion(chat_completion_json(turn, model="m", serial=1))


async def test_an_outage_is_measured_from_its_own_start_not_an_earlier_ones() -> None:
    """A call during a short outage waits for it, though an earlier outage, past the bound,
    ended with no call seeing a healthy server (the calls after it answered at once)."""
    manager = _Manager()
    chat = ServerManagerChatServer(manager, outage_s=2.0)
    manager.down(True)
    with anyio.fail_after(30), pytest.raises(ModelServerError):  # the first outage: too long
        await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)
    manager.down(False)
    manager.answer.set()
    await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)  # answered at once
    await anyio.sleep(2.5)  # longer than the bound, with every server up
    manager.down(True)  # a second outage, shorter than the bound
    manager.answer = anyio.Event()

    async def recover() -> None:
        await anyio.sleep(1.5)
        manager.down(False)
        manager.answer.set()

    async with anyio.create_task_group() as group:
        group.start_soon(recover)
        with anyio.fail_after(30):
            turn = await chat.chat([Message.user("hi")], tools=[], sampling=SAMPLING)
    assert turn.message.content == "ok"
