"""OpenAI mode: a ``ChatServer`` for any server that speaks ``POST /v1/chat/completions``.

vLLM, SGLang, llama.cpp, OpenRouter and OpenAI itself all qualify when they return native
``tool_calls``. The server renders the chat template and parses tool calls, so the tokens are not
exact: data built from these turns is fit for SFT and evaluation, and is marked so by the caller.

The adapter is a few lines on purpose: ``chat_wire`` decides what the bytes mean, ``transport``
moves them and retries. A tool call with broken arguments comes back in ``ChatTurn.problems``
for the agent loop to answer; see ``chat_wire``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, SamplingParams
from trajcore.domain.tools import ToolSpec

from .chat_wire import chat_request, parse_chat_response
from .transport import HTTPModelServer

__all__ = ["OpenAIChatServer"]


@attrs.define
class OpenAIChatServer(HTTPModelServer):
    """A ``ChatServer`` over an OpenAI-compatible chat-completions endpoint.

    Attributes:
        base_url: The API root including ``/v1`` (``http://host:8000/v1``), as for the openai
            client.
        model: The ``model`` field of every request.
        api_key: Bearer token, when the server wants one.
        retry: Retry policy for 429, 5xx and connection failures.
        max_connections: Most connections open at once.
        rng: Source of backoff jitter.
        transport: ``None`` to speak over sockets; a ``MemoryTransport`` answers in memory.
    """

    model: str = attrs.field(kw_only=True)

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        """Sample one assistant turn; see ``trajcore.ports.chat_server.ChatServer.chat``.

        Raises:
            RateLimited, ModelServerError: after retries (or at the deadline).
            ModelServerRejected: a 4xx other than 408/429, with status and body.
            WireError: the response broke the protocol; ``field`` is its JSON path.
            PoolClosed: after ``aclose``.
        """
        body = chat_request(model=self.model, messages=messages, tools=tools, sampling=sampling)
        return await self._client.post_json("/chat/completions", body, parse_chat_response)
