"""Incremental parsing of HTTP/1.1 messages: llhttp (through ``httptools``) plus the rules on top.

llhttp does the byte-level work and refuses, by itself: a bare CR or LF, a NUL or another control
character in a header, a space before a header's colon, an obsolete line fold, a non-token header
name or method, a malformed, repeated or comma-joined ``Content-Length``, ``Content-Length``
together with ``Transfer-Encoding``, a chunk size that is not hex (or overflows), chunk data not
followed by CRLF and a trailer that is not a header field. The readers here add what llhttp leaves
open:

- **Bounds.** The head (start line and header section) is bounded by ``Limits.max_head_bytes`` and
  ``Limits.max_headers``, a chunked body's trailer section by ``max_head_bytes`` too, a body by
  ``max_body_bytes`` as soon as its declared length (or its chunks so far) says so. A head that has
  not ended after ``max_head_bytes`` bytes is refused without waiting for its end.
- **Versions and statuses.** Only HTTP/1.1 and HTTP/1.0; a status from 100 to 599, a reason
  phrase without control characters, no ``101`` (nothing here asks to switch protocols).
- **Framing.** ``Transfer-Encoding`` is ``chunked`` or absent; a ``Content-Length`` has at most 18
  digits; a response body framed by neither runs to the end of the connection (never reused).
- **Requests.** The target is in origin-form (starts with ``/``), an HTTP/1.1 request has one
  ``Host`` (never two), a request body is framed by ``Content-Length`` only
  (``Transfer-Encoding``: 501).

A refused response raises ``MalformedMessage`` or ``MessageTooLarge``; a refused request raises
``Refusal`` with the status the server answers before closing the connection.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Final

import httptools

from .errors import HTTPError, MalformedMessage, MessageTooLarge
from .values import CONTROL, TARGET_FORBIDDEN, Headers, Limits, Request, Response

__all__ = ["Refusal", "RequestReader", "ResponseReader"]

MAX_INTERIM: Final = 8
_MAX_LENGTH_DIGITS: Final = 18

# How a response body is framed.
LENGTH: Final = 0
CHUNKED: Final = 1
UNTIL_CLOSE: Final = 2
_IN_HEAD: Final = -1


class Refusal(Exception):
    """A request the server answers with ``status`` and then closes the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def content_length(fields: Mapping[str, str]) -> int | None:
    """The declared body length, or ``None``; raises ``MalformedMessage`` for a bad one."""
    raw = fields.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit() or not raw.isascii() or len(raw) > _MAX_LENGTH_DIGITS:
        raise MalformedMessage(f"bad Content-Length {raw!r}")
    return int(raw)


def is_chunked(fields: Mapping[str, str]) -> bool:
    """Whether the body is chunked; raises ``MalformedMessage`` for another transfer coding."""
    raw = fields.get("transfer-encoding")
    if raw is None:
        return False
    if raw.lower() != "chunked":
        raise MalformedMessage(f"unsupported Transfer-Encoding {raw!r} (only chunked)")
    return True


def keep_alive(version: str, fields: Mapping[str, str]) -> bool:
    """Whether the connection stays open after this message."""
    raw = fields.get("connection")
    if raw is None:
        return version == "1.1"
    tokens = {t.strip().lower() for t in raw.split(",")}
    if "close" in tokens:
        return False
    return version == "1.1" or "keep-alive" in tokens


class _HeadDone(Exception):
    """The head of a response to ``HEAD`` is complete: stop parsing."""


def _feed(parser: httptools.HttpRequestParser | httptools.HttpResponseParser, data: bytes) -> None:
    """Feed ``data``; a refusal raised in a callback comes out as itself."""
    try:
        parser.feed_data(data)
    except httptools.HttpParserCallbackError as error:
        cause = error.__context__
        if isinstance(cause, HTTPError | Refusal | _HeadDone):
            raise cause from None
        raise MalformedMessage(f"malformed message: {error}") from cause
    except httptools.HttpParserUpgrade:
        raise MalformedMessage("a protocol upgrade was not asked for") from None
    except httptools.HttpParserError as error:
        raise MalformedMessage(f"malformed message: {error}") from None


class _Reader:
    """What both readers share: header fields collected under the head bounds."""

    single: frozenset[str] = frozenset()  # fields that may appear only once

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.in_head = True
        self.head_bytes = 0  # bytes of the head (then of the trailers) seen through callbacks
        self.head_fed = 0  # bytes fed while the current head was incomplete
        self.completed = False  # a message completed during the current feed
        self.raw: list[tuple[bytes, bytes]] = []  # the head's fields, read at its end
        self.fields: dict[str, str] = {}
        self.body = bytearray()

    def _begin(self) -> None:
        self.in_head = True
        self.head_bytes = 0
        self.head_fed = 0
        self.raw = []
        self.fields = {}
        self.body = bytearray()

    def _too_large(self, what: str) -> HTTPError:
        return MessageTooLarge(f"{what} exceeds {self.limits.max_head_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:
            # Bounded by ``_after_feed`` until the head ends, then checked by ``_collect``.
            self.raw.append((name, value))
            return
        # A trailer: validated by llhttp, bounded here, then dropped.
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.limits.max_head_bytes:
            raise self._too_large("the trailer section")

    def _collect(self) -> None:
        """The head's fields into ``fields`` (names lower-cased, repeats joined), within the
        bounds; adds their bytes to ``head_bytes``."""
        raw, limits = self.raw, self.limits
        if len(raw) > limits.max_headers:
            raise MessageTooLarge(f"more than {limits.max_headers} header fields")
        fields = self.fields
        size = 4 * len(raw)
        for name, value in raw:
            size += len(name) + len(value)
            key = name.decode("ascii").lower()
            text = value.decode("latin-1").strip(" \t")
            if key in fields:
                if key in self.single:
                    raise MalformedMessage(f"more than one {name.decode('ascii')!r} header field")
                fields[key] = f"{fields[key]}, {text}"
            else:
                fields[key] = text
        self.head_bytes += size

    def _after_feed(self, data_len: int, what: str) -> None:
        """Bound a head that has not ended yet (llhttp buffers nothing, ``httptools`` does)."""
        if self.in_head and not self.completed:
            self.head_fed += data_len
            if self.head_fed > self.limits.max_head_bytes:
                raise self._too_large(what)
        self.completed = False

    def _body_piece(self, piece: bytes, what: str) -> None:
        if len(self.body) + len(piece) > self.limits.max_body_bytes:
            raise MessageTooLarge(f"{what} body exceeds {self.limits.max_body_bytes} bytes")
        self.body += piece


class ResponseReader(_Reader):
    """Reads the response to one request; ``feed`` returns it once complete.

    A fresh reader per exchange: a response is complete when llhttp says so, or -- for ``HEAD`` --
    when its head is (whatever length it declares).
    """

    def __init__(self, limits: Limits, *, head_request: bool) -> None:
        super().__init__(limits)
        self._parser = httptools.HttpResponseParser(self)
        self.usable = True  # the parser can read another response (see ``restart``)
        self.restart(head_request=head_request)

    def restart(self, *, head_request: bool) -> None:
        """Get ready for the response to the next request on the same connection (cheaper than
        a new reader; only after a complete response, and never after ``HEAD``)."""
        self.head_request = head_request
        self.framing = _IN_HEAD
        self.interim = 0
        self.status = 0
        self.reason = ""
        self.reusable = False
        self.done: Response | None = None
        self.quiet = 0  # bytes of a chunked body fed without chunk data (framing, trailers)
        self.moved = False  # chunk data arrived (or the head ended) during the current feed

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.done is not None:
            raise MalformedMessage("bytes after the end of the response")
        self._begin()
        self.reason = ""

    def on_status(self, reason: bytes) -> None:
        self.head_bytes += len(reason)
        if reason.translate(None, CONTROL) != reason:
            raise MalformedMessage(f"control character in the reason phrase {reason[:80]!r}")
        self.reason += reason.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._collect()
        self.head_bytes += 17  # "HTTP/1.1 200 " and the CRLFs around the section
        if self.head_bytes > self.limits.max_head_bytes:
            raise self._too_large("the response head")
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise MalformedMessage(f"bad status line: HTTP/{version}")
        status = parser.get_status_code()
        if not 100 <= status <= 599:
            raise MalformedMessage(f"bad status code {status}")
        self.in_head = False
        self.status = status
        fields = self.fields
        if status < 200:
            if status == 101:
                raise MalformedMessage("101 Switching Protocols was not asked for")
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise MalformedMessage(f"more than {MAX_INTERIM} interim responses")
            return
        chunked = is_chunked(fields)
        length = content_length(fields)
        self.reusable = keep_alive(version, fields)
        self.head_bytes = 0  # from here on: the trailer section's bytes
        self.moved = True  # the head's bytes are not the framing's
        if self.head_request:
            self.framing = LENGTH
            self._finish()
            raise _HeadDone
        if status in (204, 304):
            self.framing = LENGTH
        elif chunked:
            self.framing = CHUNKED
        elif length is not None:
            if length > self.limits.max_body_bytes:
                raise MessageTooLarge(
                    f"response body of {length} bytes exceeds {self.limits.max_body_bytes}"
                )
            self.framing = LENGTH
        else:
            self.framing = UNTIL_CLOSE
            self.reusable = False

    def on_body(self, piece: bytes) -> None:
        self.moved = True
        self._body_piece(piece, "response")

    def on_message_complete(self) -> None:
        self.completed = True
        if self.status < 200:  # interim: the real response follows
            self.framing = _IN_HEAD
            return
        self._finish()

    # -- the reader

    def _finish(self) -> None:
        self.done = Response(
            status=self.status,
            reason=self.reason,
            headers=Headers._trusted(self.fields),
            body=bytes(self.body),
        )

    def feed(self, data: bytes) -> Response | None:
        """Parse ``data``; the response once it is complete, else ``None``.

        Raises:
            MalformedMessage, MessageTooLarge: the response is refused (the connection with it).
        """
        if self.done is not None:
            raise MalformedMessage("bytes after the end of the response")
        try:
            _feed(self._parser, data)
            self._after_feed(len(data), "the response head")
            if self.framing == CHUNKED and self.done is None:
                self._bound_framing(len(data))
        except _HeadDone:
            self.usable = False  # llhttp stopped in the middle of the message
            return self.done
        except BaseException:
            self.usable = False
            raise
        return self.done

    def _bound_framing(self, data_len: int) -> None:
        """Bound what a chunked body sends besides data: ``httptools`` buffers a trailer field
        until it ends, so reads without chunk data count against ``max_head_bytes`` (a read that
        also carried data or the head is bounded by its own size)."""
        if self.moved:
            self.quiet, self.moved = 0, False
            return
        self.quiet += data_len
        if self.quiet > self.limits.max_head_bytes:
            raise self._too_large("the chunked framing or trailer section")

    def until_close(self) -> Response | None:
        """The response when the connection ended, if its body runs to the end of it."""
        if self.framing == UNTIL_CLOSE and self.done is None:
            self._finish()
            return self.done
        return None


class RequestReader(_Reader):
    """Reads the requests of one connection, pipelined ones included, into ``ready``.

    After a ``Refusal`` the reader is dead: the server answers it and closes the connection.
    """

    single = frozenset({"host"})

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.ready: collections.deque[tuple[Request, bool]] = (
            collections.deque()
        )  # complete requests and their keep-alive
        self.expect_continue = False  # the request in progress waits for 100 Continue
        self.url = bytearray()
        self.method = b""
        self._keep = True
        self._parser = httptools.HttpRequestParser(self)

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._begin()
        self.url = bytearray()

    def on_url(self, piece: bytes) -> None:
        self.url += piece
        self.head_bytes += len(piece)

    def on_headers_complete(self) -> None:
        self._collect()
        parser = self._parser
        method = self.method = parser.get_method()
        self.head_bytes += len(method) + 14  # " HTTP/1.1" and the CRLFs around the section
        limits = self.limits
        if self.head_bytes > limits.max_head_bytes:
            raise Refusal(431, f"request head exceeds {limits.max_head_bytes} bytes")
        target = self.url
        if not target.startswith(b"/") or target.translate(None, TARGET_FORBIDDEN) != target:
            raise Refusal(400, "bad request target")
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise Refusal(505, "only HTTP/1.1 and HTTP/1.0 are served")
        fields = self.fields
        if "transfer-encoding" in fields:
            raise Refusal(501, "request bodies must be sent with Content-Length")
        if version == "1.1" and "host" not in fields:
            raise Refusal(400, "an HTTP/1.1 request needs a Host header")
        if parser.should_upgrade():
            raise Refusal(400, "protocol upgrades are not served")
        length = content_length(fields) or 0
        if length > limits.max_body_bytes:
            raise Refusal(413, f"request body of {length} bytes exceeds {limits.max_body_bytes}")
        self.in_head = False
        self._keep = keep_alive(version, fields)
        self.expect_continue = length > 0 and fields.get("expect", "").lower() == "100-continue"

    def on_body(self, piece: bytes) -> None:
        self.expect_continue = False
        self._body_piece(piece, "request")

    def on_message_complete(self) -> None:
        self.completed = True
        self.expect_continue = False
        target = self.url.decode("utf-8", "replace")
        request = Request(
            method=self.method.decode("ascii"),
            target=target,
            path=target.partition("?")[0],
            headers=Headers._trusted(self.fields),
            body=bytes(self.body),
        )
        self.ready.append((request, self._keep))
        self.body = bytearray()

    # -- the reader

    def feed(self, data: bytes) -> None:
        """Parse ``data``; complete requests are appended to ``ready``.

        Raises:
            Refusal: the request is refused with a status (and the connection closed after it).
        """
        try:
            _feed(self._parser, data)
            self._after_feed(len(data), "the request head")
        except MessageTooLarge as error:
            status = 431 if self.in_head else 413
            raise Refusal(status, str(error)) from None
        except MalformedMessage as error:
            raise Refusal(400, str(error)) from None
