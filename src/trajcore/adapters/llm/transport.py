"""The HTTP layer every LLM adapter shares: one keep-alive connection pool, retries, deadlines.

``ModelServerClient.post_json`` sends one JSON request and hands ``(status, headers, body)`` to a
pure parser from ``chat_wire`` / ``token_wire``. It owns the I/O and nothing else: what a status
or a body means is the parser's business.

Rules it keeps:

- **Retries.** A transient failure -- HTTP 429, 5xx, 408, a refused or dropped connection, a
  truncated body, an attempt that outran ``RetryRules.attempt_timeout_s`` -- is retried with
  exponential backoff and jitter (each delay drawn uniformly from the upper half of
  ``base_delay_s * 2**(attempt-1)``, capped at ``max_delay_s``; the randomness is an injected
  ``random.Random``). A ``Retry-After`` header is honoured: the delay is at least what the server
  asked for. Anything else (4xx, a body that breaks the protocol) is raised at once.
- **Deadlines.** There is no client-wide timeout (a fixed 30 s timeout killed long generations
  upstream). Every wait happens inside the caller's anyio cancel scope, so the trajectory's one
  deadline bounds the whole call, retries included. Before sleeping, the client compares the
  backoff with ``anyio.current_effective_deadline()``: when the next attempt could not start
  before the deadline, it raises the last failure now (``RateLimited`` for 429, else
  ``ModelServerError``) instead of sleeping into a cancellation, so the caller learns *why*.
  After ``max_attempts`` attempts the last failure is raised likewise.
- **Close.** ``aclose`` is idempotent and shielded from cancellation; a request issued after it, or
  interrupted by it, raises ``PoolClosed``.

Which HTTP client, and why. The exchange runs on ``adapters.http1.HTTPClient``: an asyncio
protocol per keep-alive connection, the response parsed as its bytes arrive, the most recently
used idle connection handed over first. httpx's pool does per-request work that grows with the
number of waiting requests, and aiohttp's client builds timers, tracing hooks and several futures
per exchange; at the concurrency a rollout runs, that overhead is larger than the exchange.
``bench/llm.py`` measures all three beside a raw asyncio ceiling; the figures are in
``docs/benchmarks.md``. ``HTTPClient`` runs on asyncio, which is the backend trajcore runs on;
cancellation still comes from anyio scopes, which on asyncio cancel the task the request runs in,
and a cancelled request never returns its connection to the pool. Built with a
``MemoryTransport``, the client answers in memory (unit tests).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

import anyio
import attrs

from trajcore.adapters.http1.client import HTTPClient, MemoryTransport
from trajcore.adapters.http1.errors import HTTPError
from trajcore.adapters.http1.values import Limits, Origin, parse_url
from trajcore.domain.errors import ConfigError, ModelServerError, PoolClosed, RateLimited
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import escape_lone_surrogates
from trajcore.domain.validators import finite_number, whole_number

from .wire import is_transient, retry_after_s

__all__ = [
    "DEFAULT_CONNECTIONS",
    "HTTPModelServer",
    "ModelServerClient",
    "RetryRules",
    "TransportStatistics",
    "with_lone_surrogates_escaped",
]

T = TypeVar("T")

ResponseParser = Callable[[int, Mapping[str, str], bytes], T]


def with_lone_surrogates_escaped(value: JSON) -> JSON:
    """``value`` with each lone surrogate of its text (keys too) written as its JSON escape,
    six characters of text (``escape_lone_surrogates``): what the tokenizer adapters render in
    its place, so the server tokenizes what a re-render does. (JSON's own escape, ``"\\udcff"``
    on the wire, gives the server the lone surrogate back, which its tokenizer cannot take.)"""
    if isinstance(value, str):
        return escape_lone_surrogates(value)
    if isinstance(value, list):
        return [with_lone_surrogates_escaped(item) for item in value]
    if isinstance(value, dict):
        return {
            escape_lone_surrogates(key): with_lone_surrogates_escaped(item)
            for key, item in value.items()
        }
    return value


DEFAULT_CONNECTIONS = 1024
"""Connections a model-server client opens at most unless told (requests beyond it queue)."""

# Long generations with logprobs make large bodies; anything beyond this is refused, not buffered.
_LIMITS = Limits(max_body_bytes=512 << 20)


_positive = finite_number(0.0, prefix="retry.")
_optional_positive = finite_number(0.0, optional=True, prefix="retry.")
_at_least_one = whole_number(1, prefix="retry.")


@attrs.frozen(kw_only=True)
class RetryRules:
    """How transient failures are retried.

    Attributes:
        max_attempts: Attempts in all, the first included.
        base_delay_s: Backoff before the second attempt (upper bound; jitter draws from its
            upper half).
        max_delay_s: Cap on one backoff (a ``Retry-After`` may ask for more and is honoured).
        attempt_timeout_s: Limit on one attempt, or ``None`` to rely on the caller's deadline.
    """

    max_attempts: int = attrs.field(default=6, validator=_at_least_one)
    base_delay_s: float = attrs.field(default=0.5, validator=_positive)
    max_delay_s: float = attrs.field(default=30.0, validator=_positive)
    attempt_timeout_s: float | None = attrs.field(default=None, validator=_optional_positive)

    def backoff_s(self, attempt: int, rng: random.Random, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        cap = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        delay = rng.uniform(cap / 2, cap)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay


@attrs.frozen(kw_only=True)
class TransportStatistics:
    """What a client has done so far.

    Attributes:
        attempts: HTTP requests sent (each retry counts).
        retries: Attempts that followed a transient failure.
        failures: Calls that ended in an error.
    """

    attempts: int
    retries: int
    failures: int


def _strip_slash(url: str) -> str:
    return url.rstrip("/")


def _check_url(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise ConfigError(attribute.name, f"expected an http(s) URL, got {value!r}")


@attrs.define
class ModelServerClient:
    """A keep-alive HTTP client for one model server, with retries inside the caller's deadline.

    Attributes:
        base_url: The server's base URL; request paths are appended to it.
        api_key: Sent as ``Authorization: Bearer <api_key>`` when set.
        retry: The retry rules.
        max_connections: Most connections open at once (requests beyond it queue).
        rng: Source of backoff jitter.
        transport: ``None`` to speak over sockets; a ``MemoryTransport`` answers in memory.
    """

    base_url: str = attrs.field(validator=_check_url, converter=_strip_slash)
    api_key: str | None = None
    retry: RetryRules = attrs.field(factory=RetryRules)
    max_connections: int = DEFAULT_CONNECTIONS
    rng: random.Random = attrs.field(factory=random.Random)
    transport: MemoryTransport | None = None
    _http: HTTPClient | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _attempts: int = attrs.field(default=0, init=False)
    _retries: int = attrs.field(default=0, init=False)
    _failures: int = attrs.field(default=0, init=False)
    _origin: Origin = attrs.field(init=False)
    _prefix: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        try:
            self._origin, self._prefix = parse_url(self.base_url)
        except ConfigError as error:
            raise ConfigError("base_url", error.reason) from None

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        return TransportStatistics(
            attempts=self._attempts, retries=self._retries, failures=self._failures
        )

    def _open(self) -> HTTPClient:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = HTTPClient(
            limits=_LIMITS,
            max_connections=self.max_connections,
            headers=headers,
            transport=self.transport,
        )
        return self._http

    async def _send(self, target: str, payload: bytes) -> tuple[int, Mapping[str, str], bytes]:
        http = self._http or self._open()
        self._attempts += 1
        # Not idempotent: a failed attempt is retried by the policy here, and counted.
        response = await http.request("POST", self._origin, target, body=payload, idempotent=False)
        # ``Headers`` is case-insensitive, so the parsers' lower-case lookups work.
        return response.status, response.headers, response.body

    async def _attempt(self, target: str, payload: bytes) -> tuple[int, Mapping[str, str], bytes]:
        limit = self.retry.attempt_timeout_s
        if limit is None:
            return await self._send(target, payload)
        with anyio.fail_after(limit):
            return await self._send(target, payload)

    async def post_json(self, path: str, body: JSONObject, parse: ResponseParser[T]) -> T:
        """POST ``body`` to ``base_url + path`` and return ``parse(status, headers, body)``.

        Transient failures are retried as the module doc says.

        Raises:
            RateLimited: 429 until the attempts or the deadline ran out.
            ModelServerError: 5xx, 408 or connection failures until the attempts or the deadline
                ran out (``status`` is ``None`` for connection failures).
            ModelServerRejected, WireError: whatever ``parse`` raises that is not transient.
            PoolClosed: the client was closed before or during the call.
        """
        if self._closed:
            raise PoolClosed(f"model server client for {self.base_url} is closed")
        url = self.base_url + path
        target = self._prefix + path
        try:
            payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:  # a lone surrogate (a file name's byte): see the helper
            escaped = with_lone_surrogates_escaped(body)
            payload = json.dumps(escaped, ensure_ascii=False, separators=(",", ":")).encode()
        attempt = 0
        while True:
            attempt += 1
            headers: Mapping[str, str] = {}
            try:
                status, headers, data = await self._attempt(target, payload)
            except (HTTPError, OSError, TimeoutError) as exc:
                if self._closed:
                    raise PoolClosed(f"model server client for {self.base_url} closed") from exc
                error: ModelServerError = ModelServerError(
                    f"request to {url} failed: {type(exc).__name__}: {exc}", status=None
                )
            else:
                try:
                    return parse(status, headers, data)
                except ModelServerError as exc:
                    error = exc
                except Exception:
                    self._failures += 1
                    raise
            if not is_transient(error) or attempt >= self.retry.max_attempts:
                self._give_up(error, attempt)
            delay = self.retry.backoff_s(attempt, self.rng, retry_after_s(headers, now=time.time()))
            if anyio.current_time() + delay >= anyio.current_effective_deadline():
                self._give_up(error, attempt, deadline=True)
            self._retries += 1
            await anyio.sleep(delay)

    def _give_up(
        self, error: ModelServerError, attempts: int, *, deadline: bool = False
    ) -> NoReturn:
        self._failures += 1
        if attempts == 1 and not deadline:
            raise error
        why = "before the deadline" if deadline else f"after {attempts} attempts"
        kind = RateLimited if isinstance(error, RateLimited) else ModelServerError
        raise kind(f"{error} (gave up {why})", status=error.status) from error

    async def aclose(self) -> None:
        """Close the connections. Idempotent and shielded; later calls raise ``PoolClosed``."""
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            with anyio.CancelScope(shield=True):
                await http.aclose()


@attrs.define
class HTTPModelServer:
    """What every model-server adapter over HTTP shares: one ``ModelServerClient``.

    Attributes:
        base_url: Where the adapter's request paths are appended (each adapter says what).
        api_key: Sent as ``Authorization: Bearer <api_key>`` when set.
        retry: Retry policy for 429, 5xx and connection failures.
        max_connections: Most connections open at once.
        rng: Source of backoff jitter.
        transport: ``None`` to speak over sockets; a ``MemoryTransport`` answers in memory.
    """

    base_url: str
    api_key: str | None = None
    retry: RetryRules = attrs.field(factory=RetryRules)
    max_connections: int = DEFAULT_CONNECTIONS
    rng: random.Random = attrs.field(factory=random.Random)
    transport: MemoryTransport | None = None
    _client: ModelServerClient = attrs.field(init=False)

    def _root(self) -> str:
        """The client's base URL."""
        return self.base_url

    def __attrs_post_init__(self) -> None:
        self._client = ModelServerClient(
            base_url=self._root(),
            api_key=self.api_key,
            retry=self.retry,
            max_connections=self.max_connections,
            rng=self.rng,
            transport=self.transport,
        )

    def statistics(self) -> TransportStatistics:
        """Attempts, retries and failures so far."""
        return self._client.statistics()

    async def aclose(self) -> None:
        """Close the connections. Idempotent; later calls raise ``PoolClosed``."""
        await self._client.aclose()
