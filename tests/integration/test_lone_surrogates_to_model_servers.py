"""A lone surrogate in a conversation (a file name's undecodable byte, as the slot protocol
writes one) goes to an OpenAI-compatible server as the text the tokenizer adapters render in its
place (``escape_lone_surrogates``): through trajcore's own HTTP client and through atroposlib's
``ServerManager`` (the openai client), both against a loopback stub."""

from __future__ import annotations

import random

import anyio
import pytest

from trajcore.adapters.llm.atropos import (
    ServerManagerChatServer,
    close_server_manager,
    server_manager_for,
)
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.domain.messages import Message, escape_lone_surrogates
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tools import ToolCall
from trajcore.testing.llm_stubs import LoopbackLLMServer, messages_from_request

pytestmark = pytest.mark.anyio

SAMPLING = SamplingParams(max_tokens=8)
LISTING = "bad\udcffname.txt\n"
CALL = ToolCall(id="c1", name="read_file", arguments={"path": "bad\udcffname.txt"})
CONVERSATION = [
    Message.user("list the files"),
    Message.assistant("", tool_calls=[CALL]),
    Message(role="tool", content=LISTING, tool_call_id="c1", name="read_file"),
]


def _sent(stub: LoopbackLLMServer) -> list[Message]:
    (request,) = stub.requests
    assert isinstance(request.body, dict)
    return messages_from_request(request.body)


async def test_the_http_client_sends_the_text_a_re_render_tokenizes() -> None:
    """Not JSON's own escape of the character, which the server decodes back to a lone
    surrogate that its tokenizer cannot encode (and a re-render never tokenized)."""
    async with LoopbackLLMServer() as stub:
        server = OpenAIChatServer(
            base_url=f"{stub.url}/v1", model="m", retry=RetryRules(), rng=random.Random(0)
        )
        try:
            await server.chat(CONVERSATION, tools=(), sampling=SAMPLING)
        finally:
            await server.aclose()
    sent = _sent(stub)
    assert sent[-1].content == escape_lone_surrogates(LISTING) == "bad\\udcffname.txt\n"
    assert sent[1].tool_calls[0].arguments == CALL.arguments  # the model's own JSON escape


async def test_the_server_manager_sends_it_too_instead_of_failing_to_encode() -> None:
    """The openai client encodes its body as strict UTF-8: a lone surrogate failed the turn
    (read as a reply atroposlib could not read) before anything was sent."""
    async with LoopbackLLMServer() as stub:
        config: dict[str, object] = {
            "base_url": f"{stub.url}/v1", "model_name": "m", "api_key": "x",
            "server_type": "openai", "health_check": False,
        }  # fmt: skip
        manager = server_manager_for([config])
        server = ServerManagerChatServer(manager)
        try:
            with anyio.fail_after(60):
                turn = await server.chat(CONVERSATION, tools=(), sampling=SAMPLING)
        finally:
            await server.aclose()
            await close_server_manager(manager)
    assert turn.message.content
    assert _sent(stub)[-1].content == "bad\\udcffname.txt\n"
