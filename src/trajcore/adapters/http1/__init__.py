"""A small, strict HTTP/1.1 client and server on asyncio protocols, for trajcore's hot paths.

Why this exists. Two of trajcore's paths are all HTTP overhead: a tool call through a slot server
costs one spawn inside the slot's sandbox plus one HTTP exchange, and OpenAI-mode chat at high
concurrency is a stream of small JSON exchanges. aiohttp's client and ``aiohttp.web`` spend more
time per exchange than the work they carry (timers, tracing hooks, multidicts, middleware chains,
several layers of futures); what these paths need is one keep-alive exchange at a time per
connection, with bodies framed by ``Content-Length`` or ``chunked``. ``bench/llm.py`` and
``bench/tools.py`` measure the difference; the decision follows the measurement.

What it speaks:

- **Client** (``HTTPClient``): one connection pool per origin (TCP ``host:port``, TLS over TCP
  with the system's certificate store and host-name checks, or a Unix socket), keep-alive, the
  most recently used idle connection first, an optional cap on open connections per origin
  (requests beyond it wait in arrival order). Responses framed by ``Content-Length``,
  ``chunked`` or the end of the connection; interim 1xx responses skipped; no body for ``HEAD``,
  204 and 304. No proxies, no redirects, no compression, no pipelining.
- **Server** (``HTTPServer``): requests with a ``Content-Length`` body (or none), keep-alive,
  ``Expect: 100-continue``, pipelined requests answered in order, one handler per request; a
  connection idle for ``idle_timeout_s`` (or stuck half-way through a request head for that
  long) is closed. Authentication is the handler's business.

Rules it keeps:

- **Strict parsing, bounded reads.** Messages are parsed by llhttp (``httptools``) with the rules
  of ``parsing`` on top. A head (start line and header section) and a chunked body's trailer
  section are bounded in bytes, the header section in count (``Limits``); a chunk size is at most
  16 hex digits. Lines end in CRLF; a bare CR or LF, a NUL or other control character, a space
  before a header's colon, an obsolete line fold, a non-token header name or method, a repeated,
  malformed or conflicting ``Content-Length``, a ``Transfer-Encoding`` other than ``chunked``, a
  message with both, a second ``Host``, a chunk size that is not hex or a chunk not followed by
  CRLF: each is refused, never guessed at. A body beyond ``max_body_bytes`` is refused as soon as
  its declared length (or its chunk data so far) says so, before it is buffered.
- **A connection is reused only after a complete, well-framed exchange.** Anything else -- a
  parse error, a timeout, a cancellation, a response that ends with the connection -- closes it.
- **Typed errors.** Every failure of an exchange is an ``HTTPError`` (an ``InfrastructureError``);
  the subclasses say what happened (``ConnectFailed``, ``ConnectionLost``, ``MalformedMessage``,
  ``MessageTooLarge``, ``RequestTimedOut``, ``ClientClosed``). Callers map them to their own
  errors (``SlotServerError``, ``ModelServerError``); nothing here knows what a slot or a model is.
- **Deadlines.** ``request(..., timeout_s=...)`` bounds the whole exchange (waiting for a
  connection, connecting, sending, receiving) with ``asyncio.timeout``; a caller's own anyio or
  asyncio cancel scope bounds it too, and a cancelled exchange never returns its connection.
- **Replays.** A request marked ``idempotent`` (``GET``/``HEAD`` by default) that fails on a
  *reused* connection before a single byte of the answer arrived -- the server closed the idle
  connection just as the request went out -- is sent once more on a fresh connection. Nothing else
  is ever resent here; retry policies belong to the callers.
- **The server never runs a handler twice and never cancels one** because its client went away
  (callers such as the slot server rely on work finishing and being remembered); a handler's
  exception becomes a 500, a malformed request a 400 (431 for an oversized head, 413 for an
  oversized body, 501 for a request ``Transfer-Encoding``) followed by closing the connection.

The package, by concern: ``values`` (limits, headers, origins, requests, replies), ``errors``,
``parsing`` (llhttp through ``httptools``, with the rules above layered on top), ``client`` and
``server``.
"""
