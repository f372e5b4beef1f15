"""The HTTP/1.1 client: one keep-alive pool per origin, or an in-memory transport for tests.

``HTTPClient`` speaks over TCP (TLS with the system's certificate store and host-name checks) or a
Unix socket, keeps connections alive, hands out the most recently used idle connection first, and
optionally caps open connections per origin (requests beyond the cap wait in arrival order).
Responses are framed by ``Content-Length``, ``chunked`` or the end of the connection; interim 1xx
responses are skipped; ``HEAD``, 204 and 304 have no body. No proxies, no redirects, no
compression, no pipelining. A connection is reused only after a complete, well-framed exchange.

Built with ``transport=MemoryTransport(handler)``, the client opens no socket: its connections
are in memory, and each request is encoded, read back by the server's parser, answered by
``handler`` and the answer's bytes parsed by the client's parser, so callers see exactly what the
wire would give them. Those connections go through the same pool as sockets do (kept alive,
capped, replayed when a reused one is lost), so the pool's logic runs in unit tests too.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, cast

import attrs

from trajcore.domain.errors import ConfigError

from .errors import (
    ClientClosed,
    ConnectFailed,
    ConnectionLost,
    HTTPError,
    MalformedMessage,
    MessageTooLarge,
    RequestTimedOut,
)
from .parsing import Refusal, RequestReader, ResponseReader
from .server import AbortConnection, encode_reply
from .values import (
    CRLF,
    TARGET_FORBIDDEN,
    TOKEN_CHARS,
    ClientStatistics,
    Limits,
    Origin,
    Reply,
    Request,
    Response,
    header_block,
)

__all__ = ["HTTPClient", "MemoryHandler", "MemoryTransport"]

_MAX_CACHED_STARTS: Final = 1024

MemoryHandler = Callable[[Request], Awaitable[Reply] | Reply]


@attrs.frozen
class MemoryTransport:
    """Answers an ``HTTPClient``'s requests in memory by calling ``handler`` (sync or async).

    The request reaches ``handler`` as the server would read it (``Request``); the ``Reply``
    reaches the caller as the client would read it (``Response``). An ``HTTPError`` the handler
    raises (``ConnectFailed``, ``ConnectionLost``, ...) is what the caller gets, as if the network
    had failed, and ``AbortConnection`` (as from an ``HTTPServer`` handler) is ``ConnectionLost``;
    any other exception propagates unchanged. The connections are pooled as sockets are: a
    ``ConnectionLost`` on a reused one replays an idempotent request once, on a fresh one.

    Attributes:
        handler: Answers one request.
    """

    handler: MemoryHandler


class _ClientConnection(asyncio.Protocol):
    """One keep-alive connection: at most one exchange at a time, parsed as bytes arrive."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Response] | None = None
        self.reader: ResponseReader | None = None
        self.received = 0  # bytes of the current response seen so far
        self.reusable = False
        self.last_used = 0.0

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not subclasses of asyncio.Transport, and work alike).
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        waiter, reader = self.waiter, self.reader
        if waiter is None or reader is None or waiter.done():
            # Bytes nobody asked for (a late 408, garbage): the connection cannot be trusted.
            self.close()
            return
        self.received += len(data)
        try:
            done = reader.feed(data)
        except HTTPError as error:
            self._fail(error)
            return
        if done is not None:
            self.reusable = reader.reusable
            self.waiter = None
            waiter.set_result(done)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost finishes the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        done = self.reader.until_close() if self.reader is not None else None
        if done is not None:
            self.reusable = False
            waiter.set_result(done)
            return
        why = f": {exc}" if exc is not None else ""
        where = "before the response" if self.received == 0 else "in the middle of the response"
        waiter.set_exception(ConnectionLost(f"the server closed the connection {where}{why}"))

    # -- the exchange

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: HTTPError) -> None:
        waiter, self.waiter = self.waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    async def exchange(self, request: bytes, *, head_request: bool) -> Response:
        """Send ``request`` and wait for its response."""
        return await self.start(request, head_request=head_request)

    def start(self, request: bytes, *, head_request: bool) -> asyncio.Future[Response]:
        """Send ``request`` and return the future of its response."""
        assert self.transport is not None
        reader = self.reader
        if reader is None or not reader.usable or head_request:
            self.reader = ResponseReader(self.limits, head_request=head_request)
        else:
            reader.restart(head_request=head_request)
        self.received = 0
        self.reusable = False
        waiter: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        self.transport.write(request)
        return waiter


class _MemoryConnection(_ClientConnection):
    """A connection to ``handler`` in memory: the request read back by the server's parser, the
    reply's bytes parsed by the client's, kept alive as the request and the reply allow."""

    def __init__(self, limits: Limits, handler: MemoryHandler) -> None:
        super().__init__(limits)
        self.handler = handler

    def usable(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True
        self.reusable = False

    async def exchange(self, request: bytes, *, head_request: bool) -> Response:
        self.received = 0
        self.reusable = False
        incoming = RequestReader(Limits(max_head_bytes=len(request), max_body_bytes=len(request)))
        try:
            incoming.feed(request)
        except Refusal as refusal:  # the encoder and the parser disagree: a bug here
            raise MalformedMessage(f"request refused in memory: {refusal.reason}") from None
        ((parsed, keep),) = incoming.ready
        try:
            answer = self.handler(parsed)
            reply = await answer if inspect.isawaitable(answer) else answer
        except AbortConnection:
            self.close()
            raise ConnectionLost("the server closed the connection before the response") from None
        if self.closed:
            raise ConnectionLost("the connection was closed during the request")
        wire = encode_reply(reply, close=not keep, head=head_request)
        self.received = len(wire)
        reader = ResponseReader(self.limits, head_request=head_request)
        response = reader.feed(wire)
        if response is None:
            self.close()
            raise ConnectionLost("the in-memory answer ended before the response was complete")
        self.reusable = reader.reusable
        return response


@attrs.define(eq=False)
class _Pool:
    """The connections to one origin; the bookkeeping only (opening is ``HTTPClient``'s)."""

    max_connections: int | None
    idle: list[_ClientConnection] = attrs.field(factory=list)
    members: set[_ClientConnection] = attrs.field(factory=set)
    open: int = 0
    waiters: collections.deque[asyncio.Future[_ClientConnection | None]] = attrs.field(
        factory=collections.deque
    )

    def take_idle(self, now: float, idle_timeout_s: float) -> _ClientConnection | None:
        """The most recently used idle connection still fresh, closing the stale ones: those
        at the bottom too (given back first, so oldest), which a steady load reusing the top
        would otherwise keep open, with the server's descriptors, until the pool closes."""
        stale = 0
        while stale < len(self.idle) and now - self.idle[stale].last_used >= idle_timeout_s:
            stale += 1
        if stale:
            old, self.idle[:stale] = self.idle[:stale], []
            for conn in old:
                self.discard(conn)
        while self.idle:
            conn = self.idle.pop()
            if conn.usable() and now - conn.last_used < idle_timeout_s:
                return conn
            self.discard(conn)
        return None

    def discard(self, conn: _ClientConnection) -> None:
        """Forget ``conn`` (closing it) and let one waiter open a connection in its place."""
        conn.close()
        if conn in self.members:
            self.members.discard(conn)
            self.open -= 1
        self._wake(None)

    def give_back(self, conn: _ClientConnection, now: float) -> None:
        conn.last_used = now
        if not self._wake(conn):
            self.idle.append(conn)

    def _wake(self, conn: _ClientConnection | None) -> bool:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False


@attrs.define(eq=False)
class HTTPClient:
    """An HTTP/1.1 client with one keep-alive pool per ``Origin``.

    Attributes:
        limits: What a response may be (and how large a request body may be).
        max_connections: Most connections open at once per origin; ``None`` for no cap.
        connect_timeout_s: Limit on opening one connection.
        idle_timeout_s: An idle connection older than this is closed instead of reused.
        headers: Sent with every request (validated once, here).
        transport: ``None`` to speak over sockets, or a ``MemoryTransport`` answering in memory.
    """

    limits: Limits = attrs.field(factory=Limits)
    max_connections: int | None = None
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    headers: Mapping[str, str] = attrs.field(factory=dict)
    transport: MemoryTransport | None = None
    _pools: dict[Origin, _Pool] = attrs.field(init=False, factory=dict)
    _fixed: bytes = attrs.field(init=False, default=b"")
    _closed: bool = attrs.field(init=False, default=False)
    _requests: int = attrs.field(init=False, default=0)
    _opened: int = attrs.field(init=False, default=0)
    _replays: int = attrs.field(init=False, default=0)
    _tls: ssl.SSLContext | None = attrs.field(init=False, default=None)
    # The validated start of a request (line, Host, fixed headers) per (method, origin, target).
    _starts: dict[tuple[str, Origin, str], bytes] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(
                "max_connections", f"must be >= 1 or None, got {self.max_connections}"
            )
        self._fixed = header_block(self.headers.items())

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` was called."""
        return self._closed

    def statistics(self) -> ClientStatistics:
        """A snapshot of the pools."""
        pools = self._pools.values()
        return ClientStatistics(
            open=sum(p.open for p in pools),
            idle=sum(len(p.idle) for p in pools),
            waiting=sum(len(p.waiters) for p in pools),
            requests=self._requests,
            connections_opened=self._opened,
            replays=self._replays,
        )

    async def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        idempotent: bool | None = None,
    ) -> Response:
        """Send one request and return its complete response (any status).

        ``target`` is the origin-form path (``/v1/x?y=1``). ``Content-Length`` is sent whenever
        there is a body or the method is ``POST``/``PUT``/``PATCH``. ``idempotent`` (default: the
        method is ``GET``, ``HEAD``, ``OPTIONS``, ``PUT`` or ``DELETE``) allows one replay on a
        fresh connection when a reused one turns out stale (see the module doc).

        Raises:
            ConnectFailed, ConnectionLost, MalformedMessage, MessageTooLarge (also for a
            request body over ``limits.max_body_bytes``), RequestTimedOut, ClientClosed: all
            ``HTTPError``.
            ValueError: ``method``, ``target`` or a header would break the request's framing.
        """
        if self._closed:
            raise ClientClosed("the HTTP client is closed")
        if len(body) > self.limits.max_body_bytes:
            raise MessageTooLarge(
                f"request body of {len(body)} bytes exceeds {self.limits.max_body_bytes}"
            )
        wire = self._encode(method, origin, target, body, headers)
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE")
        if timeout_s is None:
            return await self._exchange(origin, wire, method == "HEAD", idempotent)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._exchange(origin, wire, method == "HEAD", idempotent)
        except TimeoutError:
            raise RequestTimedOut(
                f"{method} {target}: no complete answer within {timeout_s:.3g} s"
            ) from None

    def _encode(
        self,
        method: str,
        origin: Origin,
        target: str,
        body: bytes,
        headers: Mapping[str, str] | None,
    ) -> bytes:
        key = (method, origin, target)
        start = self._starts.get(key)
        if start is None:
            start = self._request_start(method, origin, target)
            if len(self._starts) >= _MAX_CACHED_STARTS:
                self._starts.clear()
            self._starts[key] = start
        parts = [start]
        if headers:
            parts.append(header_block(headers.items()))
        if body or method in ("POST", "PUT", "PATCH"):
            parts += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body]
        else:
            parts.append(CRLF)
        return b"".join(parts)

    def _request_start(self, method: str, origin: Origin, target: str) -> bytes:
        """Request line, ``Host`` and the fixed headers, validated."""
        if not method or not TOKEN_CHARS.issuperset(method.encode("latin-1", "replace")):
            raise ValueError(f"bad method {method!r}")
        raw_target = target.encode("utf-8")
        if not raw_target.startswith(b"/") or raw_target.translate(None, TARGET_FORBIDDEN) != (
            raw_target
        ):
            raise ValueError(f"bad request target {target!r}")
        return b"".join([
            method.encode("ascii"), b" ", raw_target, b" HTTP/1.1\r\nHost: ",
            origin.authority.encode("idna"), b"\r\n", self._fixed,
        ])  # fmt: skip

    async def _exchange(
        self, origin: Origin, wire: bytes, head_request: bool, idempotent: bool
    ) -> Response:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _Pool(max_connections=self.max_connections)
        self._requests += 1
        loop = asyncio.get_running_loop()
        conn = await self._acquire(pool, origin)
        reused = conn.last_used > 0
        while True:
            try:
                response = await conn.exchange(wire, head_request=head_request)
            except ConnectionLost as error:
                pool.discard(conn)
                if self._closed:
                    raise ClientClosed("the HTTP client was closed during the request") from error
                if not (reused and idempotent and conn.received == 0):
                    raise
                self._replays += 1
                conn = await self._acquire(pool, origin, fresh=True)
                reused = False
                continue
            except BaseException:
                # Cancelled, timed out or failed: the connection's state is unknown.
                conn.waiter = None
                pool.discard(conn)
                raise
            if conn.reusable and not self._closed and conn.usable():
                pool.give_back(conn, loop.time())
            else:
                pool.discard(conn)
            return response

    async def _acquire(
        self, pool: _Pool, origin: Origin, *, fresh: bool = False
    ) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        while True:
            if not fresh:
                conn = pool.take_idle(loop.time(), self.idle_timeout_s)
                if conn is not None:
                    return conn
            if pool.max_connections is None or pool.open < pool.max_connections:
                pool.open += 1
                try:
                    conn = await self._connect(origin)
                except BaseException:
                    pool.open -= 1
                    pool._wake(None)
                    raise
                pool.members.add(conn)
                return conn
            waiter: asyncio.Future[_ClientConnection | None] = loop.create_future()
            pool.waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    got = waiter.result()
                    if got is not None:
                        pool.give_back(got, got.last_used)
                    else:
                        pool._wake(None)
                raise
            if handed is not None:
                if handed.usable():
                    return handed
                pool.discard(handed)  # lost while it was being handed over
            fresh = False

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def _connect(self, origin: Origin) -> _ClientConnection:
        if self._closed:
            raise ClientClosed("the HTTP client is closed")
        if self.transport is not None:
            self._opened += 1
            return _MemoryConnection(self.limits, self.transport.handler)
        loop = asyncio.get_running_loop()
        limits = self.limits
        where = origin.unix_path or f"{origin.host}:{origin.port}"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if origin.unix_path is not None:
                    _, conn = await loop.create_unix_connection(
                        lambda: _ClientConnection(limits), origin.unix_path
                    )
                else:
                    _, conn = await loop.create_connection(
                        lambda: _ClientConnection(limits),
                        origin.host,
                        origin.port,
                        ssl=self._tls_context() if origin.tls else None,
                    )
        except TimeoutError:
            raise ConnectFailed(
                f"cannot connect to {where}: no answer within {self.connect_timeout_s:.3g} s"
            ) from None
        except OSError as error:
            raise ConnectFailed(f"cannot connect to {where}: {error.strerror or error}") from None
        self._opened += 1
        if self.closed:
            conn.close()
            raise ClientClosed("the HTTP client was closed while connecting")
        return conn

    async def aclose(self) -> None:
        """Close every connection; requests in flight fail with ``ClientClosed`` (or
        ``ConnectionLost``). Idempotent."""
        self._closed = True
        for pool in self._pools.values():
            pool.idle = []
            for conn in list(pool.members):
                conn.close()
            while pool.waiters:
                waiter = pool.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(ClientClosed("the HTTP client was closed"))
        await asyncio.sleep(0)  # let the transports run their connection_lost
