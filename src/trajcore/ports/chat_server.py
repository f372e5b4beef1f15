"""ChatServer: OpenAI mode, where the server renders the template and parses tool calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, SamplingParams
from trajcore.domain.tools import ToolSpec

__all__ = ["ChatServer"]


class ChatServer(Protocol):
    """An OpenAI-compatible chat endpoint with native tool calls.

    Its answers are not token-exact; data built from them is marked so.
    """

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        """Sample one assistant turn for ``messages``, offering ``tools``.

        Returns the assistant message (content, reasoning, tool calls in the order the server
        gave them) and the finish reason. Transient failures (429, 5xx, connection errors) are
        retried with backoff inside the caller's cancel scope / deadline.

        Raises:
            ModelServerError: the server failed and retries did not help (``RateLimited`` for 429).
            ModelServerRejected: the server refused the request (4xx), with its status and body.
            WireError: the response did not match the protocol; ``field`` names the bad part.
            PoolClosed: after ``aclose``.
        """
        ...

    async def aclose(self) -> None:
        """Release connections. Idempotent; later calls raise ``PoolClosed``."""
        ...
