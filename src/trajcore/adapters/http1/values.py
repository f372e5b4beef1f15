"""The values an HTTP/1.1 exchange is made of: limits, headers, origins, requests and replies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Final

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.validators import whole_number

__all__ = [
    "ClientStatistics",
    "Handler",
    "Headers",
    "Limits",
    "Origin",
    "Reply",
    "Request",
    "Response",
    "parse_url",
]

# Shared by the package's modules (not part of its public surface).
CRLF: Final = b"\r\n"
TOKEN_CHARS: Final = frozenset(
    b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
# Header values, reason phrases and request targets may not hold control characters (HT aside).
CONTROL: Final = bytes(range(32)).replace(b"\t", b"") + b"\x7f"
TARGET_FORBIDDEN: Final = CONTROL + b" \t"
REASONS: Final = {
    100: "Continue", 200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
}  # fmt: skip


_positive_int = whole_number(1, prefix="limits.")


@attrs.frozen(kw_only=True)
class Limits:
    """Bounds on what one side accepts from its peer (and, for bodies, sends).

    Attributes:
        max_head_bytes: Start line plus header section, CRLFs included (also bounds a chunked
            body's trailer section).
        max_headers: Header fields in one head.
        max_body_bytes: One body, after de-chunking; also the largest request body sent.
    """

    max_head_bytes: int = attrs.field(default=64 << 10, validator=_positive_int)
    max_headers: int = attrs.field(default=100, validator=_positive_int)
    max_body_bytes: int = attrs.field(default=64 << 20, validator=_positive_int)


class Headers(Mapping[str, str]):
    """A read-only, case-insensitive view of a header section.

    Names are stored lower-case; a name that appears more than once maps to its values joined by
    ``", "`` (RFC 9110 section 5.3), in the order received.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        items = fields.items() if isinstance(fields, Mapping) else fields
        found: dict[str, str] = {}
        for name, value in items:
            key = name.lower()
            found[key] = f"{found[key]}, {value}" if key in found else value
        self._fields = found

    @classmethod
    def _trusted(cls, fields: dict[str, str]) -> Headers:
        made = cls.__new__(cls)
        made._fields = fields
        return made

    def __getitem__(self, name: str) -> str:
        try:
            return self._fields[name]
        except KeyError:
            return self._fields[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


@attrs.frozen(kw_only=True)
class Origin:
    """Where a connection goes: ``host:port`` over TCP (with TLS for ``https``), or a Unix
    socket (``host`` then only fills the ``Host`` header).

    Attributes:
        host: A host name or address.
        port: The TCP port (ignored for a Unix socket).
        unix_path: The Unix socket's path, or ``None`` for TCP.
        tls: Speak TLS (verified against the system's certificates and ``host``).
    """

    host: str
    port: int = 80
    unix_path: str | None = None
    tls: bool = False

    @property
    def authority(self) -> str:
        """The ``Host`` header's value."""
        if self.unix_path is not None or self.port == (443 if self.tls else 80):
            return self.host
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_url(url: str, *, unix_path: str | None = None) -> tuple[Origin, str]:
    """Split an ``http(s)://host[:port][/prefix]`` URL into its origin and its path prefix
    (``""`` or ``/prefix`` without a trailing slash).

    Raises ``ConfigError`` for another scheme, a missing host, a bad port, a query or fragment.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ConfigError("url", f"expected an http:// or https:// URL, got {url!r}")
    tls = scheme == "https"
    authority, slash, path = rest.partition("/")
    prefix = (slash + path).rstrip("/")
    if any(c in prefix for c in "?# ") or _has_control(prefix):
        raise ConfigError("url", f"the path of {url!r} may not hold a query, fragment or space")
    if authority.startswith("["):
        host, bracket, after = authority[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise ConfigError("url", f"bad IPv6 authority in {url!r}")
        port_text = after[1:] if after else ""
    else:
        host, _, port_text = authority.partition(":")
    if not host or "@" in authority or _has_control(host):
        raise ConfigError("url", f"no usable host in {url!r}")
    port = 443 if tls else 80
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError("url", f"bad port {port_text!r} in {url!r}")
        port = int(port_text)
    return Origin(host=host, port=port, unix_path=unix_path, tls=tls), prefix


def _has_control(text: str) -> bool:
    return any(ord(c) < 33 or ord(c) == 127 for c in text)


@attrs.frozen(kw_only=True)
class Response:
    """A complete response.

    Attributes:
        status: The status code (100..599, never 1xx: interim responses are skipped).
        reason: The reason phrase (may be empty).
        headers: The header section.
        body: The body, de-chunked.
    """

    status: int
    reason: str
    headers: Headers
    body: bytes


@attrs.frozen(kw_only=True)
class ClientStatistics:
    """What a client's pools hold and have done.

    Attributes:
        open: Connections open now (idle and busy).
        idle: Open connections waiting for a request.
        waiting: Requests waiting for a connection (``max_connections`` reached).
        requests: Exchanges started.
        connections_opened: Connections ever opened.
        replays: Idempotent requests sent again after a reused connection went stale.
    """

    open: int
    idle: int
    waiting: int
    requests: int
    connections_opened: int
    replays: int


def check_token(value: bytes, what: str) -> None:
    """Raises ``ValueError`` (a caller's mistake, not the peer's) unless ``value`` is a token."""
    if not value or not TOKEN_CHARS.issuperset(value):
        raise ValueError(f"{what} {value[:80]!r} is not a token")


def header_block(items: Iterable[tuple[str, str]]) -> bytes:
    out = bytearray()
    for name, value in items:
        raw_name = name.encode("latin-1", "replace")
        raw_value = value.encode("latin-1")
        check_token(raw_name, "header name")
        if raw_value.translate(None, CONTROL) != raw_value:
            raise ValueError(f"control character in the value of header {name!r}")
        out += raw_name + b": " + raw_value + CRLF
    return bytes(out)


@attrs.frozen(kw_only=True)
class Request:
    """A complete request as the server read it.

    Attributes:
        method: The method token.
        target: The request target (origin-form: it starts with ``/``).
        path: ``target`` without its query.
        headers: The header section.
        body: The body (``Content-Length`` framed).
    """

    method: str
    target: str
    path: str
    headers: Headers
    body: bytes


@attrs.frozen(kw_only=True)
class Reply:
    """What a handler answers.

    Attributes:
        status: The status code (200..599).
        body: The body.
        content_type: Sent as ``Content-Type`` when there is a body.
        headers: More header fields (names and values are not re-validated; keep them constant).
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


# Turns a request into a reply, directly or as an awaitable.
Handler = Callable[[Request], Awaitable[Reply] | Reply]
