"""What the MCP client learns from beneath the SDK's session: each POST's HTTP status, the end of
a transport's read stream, a refusal inside the SDK's exception groups.

The SDK turns an HTTP error into a generic JSON-RPC error, answers with its own JSON-RPC errors
for a body it cannot read, and lets the session's read loop end quietly when a server exits; the
client (``trajcore.adapters.mcp.client``) needs each of these to label a call. The rules kept:

- A caller puts an ``Exchange`` in ``EXCHANGE`` before it sends a request; the SDK copies the
  sender's context to the task that POSTs it, where ``note_post`` (an httpx event hook) writes
  that POST's status into it. Requests of other callers and the transport's own GET and DELETE
  never touch it.
- ``WatchedReadStream`` passes every item through unchanged and calls its ``on_end`` once the
  stream ends or is closed under the reader.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Final, Self

import anyio
import attrs
import httpx2
from mcp.shared._stream_protocols import ReadStream
from mcp.shared.message import SessionMessage

from trajcore.adapters.lifetime import ClosedOnExit
from trajcore.domain.errors import WireError

__all__ = ["EXCHANGE", "Exchange", "WatchedReadStream", "note_post", "refusal_in"]


@attrs.define(eq=False)
class Exchange:
    """What HTTP said to the POSTs of one caller's requests (the last one wins)."""

    status: int | None = None
    json_body: bool = False


EXCHANGE: Final = contextvars.ContextVar[Exchange | None]("trajcore_mcp_exchange", default=None)


async def note_post(response: httpx2.Response) -> None:
    """An httpx event hook: keep the status of a POST for the request that sent it."""
    exchange = EXCHANGE.get()
    if exchange is not None and response.request.method == "POST":
        exchange.status = response.status_code
        content_type = response.headers.get("content-type", "")
        exchange.json_body = content_type.lower().startswith("application/json")


@attrs.define(eq=False)
class WatchedReadStream(ClosedOnExit):
    """A transport's read stream that calls ``on_end`` when it ends (the server went away)."""

    inner: ReadStream[SessionMessage | Exception]
    on_end: Callable[[], None]

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context of the last item, where the transport keeps one."""
        context: contextvars.Context | None = getattr(self.inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.on_end()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self


def refusal_in(exc: BaseException) -> WireError | None:
    """The ``WireError`` that ended a session, also from inside the SDK's exception groups."""
    if isinstance(exc, WireError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return refusal_in(exc.exceptions[0])
    return None
