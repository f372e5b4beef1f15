"""The HTTP/1.1 server: keep-alive, pipelined requests answered in order, one handler each.

``HTTPServer`` serves requests with a ``Content-Length`` body (or none), keep-alive, ``Expect:
100-continue`` and pipelined requests (answered in order, one handler per request). A connection
idle for ``idle_timeout_s`` (or stuck half-way through a request head for that long) is closed.
Authentication is the handler's business: the parser runs first, so a malformed request is refused
before any handler (and any credential check) sees it.

The server never runs a handler twice and never cancels one because its client went away (callers
such as the slot server rely on work finishing and being remembered); a handler's exception
becomes a 500, a refused request its status (400, 431 for an oversized head, 413 for an oversized
body, 501 for a request ``Transfer-Encoding``, 505 for another HTTP version), after which the
connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import time
from typing import Any, cast

import attrs

from .parsing import Refusal, RequestReader
from .values import CRLF, REASONS, Handler, Limits, Reply, Request

__all__ = ["AbortConnection", "HTTPServer", "encode_reply"]


class AbortConnection(Exception):
    """Raised by a handler: reset the connection without an answer (test servers use it to play a
    peer that fails mid-exchange)."""


class _Date:
    """The ``Date`` header's value, formatted at most once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.value = email.utils.formatdate(second, usegmt=True).encode("ascii")
            cls.second = second
        return cls.value


def encode_reply(reply: Reply, *, close: bool, head: bool = False) -> bytes:
    """The reply's bytes; for a ``HEAD`` request (``head``) without the body."""
    reason = REASONS.get(reply.status, "")
    parts = [b"HTTP/1.1 %d %s\r\nDate: " % (reply.status, reason.encode("ascii")), _Date.now()]
    if reply.body:
        parts += [b"\r\nContent-Type: ", reply.content_type.encode("latin-1")]
    parts += [b"\r\nContent-Length: ", str(len(reply.body)).encode("ascii"), CRLF]
    for name, value in reply.headers:
        parts += [name.encode("latin-1"), b": ", value.encode("latin-1"), CRLF]
    if close:
        parts.append(b"Connection: close\r\n")
    parts += [CRLF, b"" if head else reply.body]
    return b"".join(parts)


def _error_reply(status: int, reason: str) -> Reply:
    body = json.dumps({"error": reason, "field": "$"}, ensure_ascii=True).encode("ascii")
    return Reply(status=status, body=body)


class _ServerConnection(asyncio.Protocol):
    """One client connection: requests parsed as bytes arrive, answered one at a time in order."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = RequestReader(server.limits)
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a handler is running for this connection
        self.closing = False
        self.paused = False
        self.refusal: Refusal | None = None  # answered once the requests before it are
        self.advancing = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None  # when the connection went idle; None: busy
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not subclasses of asyncio.Transport, and work alike).
        self.transport = cast("asyncio.Transport", transport)
        self.server._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.transport = None
        self._cancel_idle()
        self.server._connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None or self.closing:
            return  # the connection closes once the refusal is answered
        try:
            self.reader.feed(data)
        except Refusal as refusal:
            self.refusal = refusal
        if self.busy:
            if len(self.reader.ready) > 1 or self.refusal is not None:
                self._pause()  # enough queued: let TCP push back
            return
        self._advance()

    def eof_received(self) -> bool:
        # The client is done sending; answer what is in progress, then close.
        self.closing = True
        if not self.busy:
            self._close()
        return True

    # -- idle handling

    def _arm_idle(self) -> None:
        """The connection is idle from now: closed unless a request starts within the timeout.
        One timer per connection, moved on lazily (cheaper than one per request)."""
        loop = self.loop
        self.idle_since = loop.time()
        if self.idle_timer is None:
            deadline = self.idle_since + self.server.idle_timeout_s
            self.idle_timer = loop.call_at(deadline, self._idle_check)

    def _disarm_idle(self) -> None:
        self.idle_since = None  # busy: the timer, when it fires, leaves the connection open

    def _idle_check(self) -> None:
        self.idle_timer = None
        if self.idle_since is None or self.closing:
            return
        loop = self.loop
        deadline = self.idle_since + self.server.idle_timeout_s
        if loop.time() >= deadline:
            self._close()
        else:
            self.idle_timer = loop.call_at(deadline, self._idle_check)

    def _cancel_idle(self) -> None:
        self.idle_since = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _close(self) -> None:
        self.closing = True
        self._cancel_idle()
        if self.transport is not None:
            self.transport.close()

    # -- dispatching

    def _advance(self) -> None:
        """Dispatch complete requests while handlers answer at once; then answer a refusal, or
        wait for more bytes."""
        if self.advancing:
            return  # a handler answered inside the loop below, which goes on by itself
        self.advancing = True
        try:
            ready = self.reader.ready
            while ready and not self.busy and not self.closing:
                request, keep_alive = ready.popleft()
                self._disarm_idle()
                self.busy = True
                self.server._dispatch(self, request, keep_alive)
            if self.busy or self.closing or self.transport is None:
                return
            if self.refusal is not None:
                self._write(_error_reply(self.refusal.status, self.refusal.reason), close=True)
            elif self.reader.expect_continue:
                self.reader.expect_continue = False
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        finally:
            self.advancing = False

    def abort(self) -> None:
        """Reset the connection without an answer."""
        self.closing = True
        self.busy = False
        self._cancel_idle()
        if self.transport is not None:
            self.transport.abort()

    # -- answering

    def _write(self, reply: Reply, *, close: bool, head: bool = False) -> None:
        if self.transport is None:
            return
        self.transport.write(encode_reply(reply, close=close, head=head))
        if close:
            self._close()

    def finish(self, reply: Reply, keep_alive: bool, *, head: bool = False) -> None:
        """Send the handler's reply; go on with the next request or close."""
        self.busy = False
        close = not keep_alive or self.closing or self.server._closing
        self._write(reply, close=close, head=head)
        if close or self.transport is None:
            return
        self._resume()
        self._arm_idle()
        self._advance()


@attrs.define(eq=False)
class HTTPServer:
    """An HTTP/1.1 server calling one ``handler`` per request.

    Attributes:
        handler: Turns a ``Request`` into a ``Reply``, directly (answered inside the read, no
            task), as an ``asyncio.Future`` (answered from its done callback, no task) or as
            another awaitable (run as a task); an exception becomes a 500,
            ``AbortConnection`` resets the connection without an answer.
        limits: What a request may be.
        idle_timeout_s: A connection idle (or half-way through a request head) this long is
            closed.
    """

    handler: Handler
    limits: Limits = attrs.field(factory=Limits)
    idle_timeout_s: float = 75.0
    _servers: list[asyncio.Server] = attrs.field(init=False, factory=list)
    _connections: set[_ServerConnection] = attrs.field(init=False, factory=set)
    _tasks: set[asyncio.Future[Any]] = attrs.field(init=False, factory=set)  # answers due
    _closing: bool = attrs.field(init=False, default=False)

    async def listen_tcp(self, host: str, port: int, *, backlog: int = 100) -> tuple[str, int]:
        """Listen on ``host:port`` (0: any free port) with a ``backlog`` of connections not yet
        accepted; returns the bound host and port. Raises ``OSError``."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _ServerConnection(self), host, port, backlog=backlog
        )
        self._servers.append(server)
        bound = server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def listen_unix(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (which must not exist). Raises ``OSError``."""
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: _ServerConnection(self), path)
        self._servers.append(server)

    def _dispatch(self, conn: _ServerConnection, request: Request, keep_alive: bool) -> None:
        head = request.method == "HEAD"
        try:
            answer = self.handler(request)
        except AbortConnection:
            conn.abort()
            return
        except Exception as error:  # noqa: BLE001 - every request gets an answer
            answer = _error_reply(500, f"internal error: {type(error).__name__}")
        if isinstance(answer, Reply):  # answered at once: no task
            conn.finish(answer, keep_alive, head=head)
            return
        # A future is answered when it is done (no task); any other awaitable runs as a task,
        # answered the same way when it ends.
        pending = asyncio.ensure_future(answer, loop=conn.loop)
        self._tasks.add(pending)
        pending.add_done_callback(functools.partial(self._answered, conn, keep_alive, head))

    def _answered(
        self, conn: _ServerConnection, keep_alive: bool, head: bool, answer: asyncio.Future[Reply]
    ) -> None:
        """A handler's future (or task) is done: its reply, a 500 for its exception, a reset for
        ``AbortConnection``, or nothing when it was cancelled (``aclose``)."""
        self._tasks.discard(answer)
        if answer.cancelled():
            return
        error = answer.exception()
        if error is None:
            reply = answer.result()
        elif isinstance(error, AbortConnection):
            conn.abort()
            return
        elif isinstance(error, Exception):
            reply = _error_reply(500, f"internal error: {type(error).__name__}")
        else:
            conn.abort()  # no answer will come: the client is not left waiting
            raise error  # SystemExit, KeyboardInterrupt: out of the loop, as from a task
        conn.finish(reply, keep_alive, head=head)

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop listening, let running handlers finish for up to ``grace_s`` (then cancel them),
        close every connection. Idempotent."""
        self._closing = True
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            if not conn.busy:
                conn._close()
        if self._tasks:
            _, running = await asyncio.wait(list(self._tasks), timeout=grace_s)
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running, timeout=1.0)
        for conn in list(self._connections):
            conn._close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=1.0)
        self._servers.clear()
