"""The HTTP/1.1 parsers against h11 on generated messages, well-formed and malformed.

Each message is read by trajcore's reader (``RequestReader`` as the server reads a request,
``ResponseReader`` as the client reads a response) and by h11. On a well-formed message both must
accept it with the same method, target (or status), header fields and body; on a malformed one
both must refuse it. Where trajcore is deliberately stricter than h11, the difference is its own
test below: trajcore refuses, h11 accepts, and the reason is written next to it.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.http1.errors import HTTPError
from trajcore.adapters.http1.parsing import Refusal, RequestReader, ResponseReader
from trajcore.adapters.http1.values import Limits

LIMITS = Limits(max_head_bytes=1024, max_headers=50, max_body_bytes=4096)
REFUSED = "refused"
INCOMPLETE = "incomplete"
Outcome = str | tuple[object, ...]

# ----------------------------------------------------------------------------- the two readers


def _joined(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in fields:
        key, text = name.decode("ascii").lower(), value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


def ours_request(data: bytes) -> Outcome:
    reader = RequestReader(LIMITS)
    try:
        reader.feed(data)
    except Refusal:
        return REFUSED
    if len(reader.ready) != 1:
        return INCOMPLETE
    request, _ = reader.ready[0]
    return (request.method, request.target, dict(request.headers), request.body)


def _h11_message(
    conn: h11.Connection, kind: type[h11.Request] | type[h11.Response]
) -> tuple[h11.Request | h11.Response, bytes] | str:
    """The next whole message of ``kind`` and its body, as h11 reads what ``conn`` received."""
    try:
        event = conn.next_event()
        if not isinstance(event, kind):
            return INCOMPLETE
        body = b""
        while isinstance(part := conn.next_event(), h11.Data):
            body += part.data
    except h11.RemoteProtocolError:
        return REFUSED
    if not isinstance(part, h11.EndOfMessage):
        return INCOMPLETE
    return event, body


def h11_request(data: bytes) -> Outcome:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=LIMITS.max_head_bytes)
    conn.receive_data(data)
    read = _h11_message(conn, h11.Request)
    if isinstance(read, str):
        return read
    event, body = read
    assert isinstance(event, h11.Request)
    target = event.target.decode("ascii")
    return (event.method.decode("ascii"), target, _joined(event.headers), body)


def ours_response(data: bytes) -> Outcome:
    reader = ResponseReader(LIMITS, head_request=False)
    try:
        response = reader.feed(data) or reader.until_close()  # then the connection ends
    except HTTPError:
        return REFUSED
    if response is None:
        return INCOMPLETE
    return (response.status, response.reason, dict(response.headers), response.body)


def h11_response(data: bytes) -> Outcome:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=LIMITS.max_head_bytes)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "h")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")  # the connection ends
    read = _h11_message(conn, h11.Response)
    if isinstance(read, str):
        return read
    event, body = read
    assert isinstance(event, h11.Response)
    reason = event.reason.decode("latin-1")
    return (event.status_code, reason, _joined(event.headers), body)


# ----------------------------------------------------------------------------- generated messages

_TCHAR = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
_FRAMING = {"host", "content-length", "transfer-encoding", "connection", "expect", "upgrade", "te"}
names = st.text(_TCHAR, min_size=1, max_size=12).filter(lambda n: n.lower() not in _FRAMING)
# A field value: visible ASCII with inner spaces (no leading or trailing whitespace to strip).
values = st.text(string.ascii_letters + string.digits + string.punctuation + " ", max_size=24).map(
    str.strip
)
fields = st.lists(st.tuples(names, values), max_size=8)
targets = st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/?%", max_size=30).map(
    lambda path: "/" + path
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
bodies = st.binary(max_size=64)


def _head(start: str, items: Iterable[tuple[str, str]]) -> bytes:
    lines = [start, *(f"{name}: {value}" for name, value in items)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[tuple[str, str]], str, bytes]:
    """The start line, the fields (Host and Content-Length included) and the body."""
    version = draw(st.sampled_from(["1.1", "1.0"]))
    start = f"{draw(methods)} {draw(targets)} HTTP/{version}"
    items = [("Host", "example.test"), *draw(fields)]
    body = draw(bodies)
    if body or draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), ("Content-Length", str(len(body))))
    return items, start, body


def _chunked(body: bytes, sizes: list[int], extension: bool) -> bytes:
    out, start = bytearray(), 0
    for size in [*sizes, len(body)]:
        piece = body[start : start + size]
        if piece:
            out += b"%x%s\r\n%s\r\n" % (len(piece), b";name=value" if extension else b"", piece)
            start += len(piece)
    return bytes(out + b"0\r\n\r\n")


@st.composite
def responses(draw: st.DrawFn) -> tuple[list[tuple[str, str]], str, bytes, bytes]:
    """The fields, the status line, the body and the body's bytes on the wire."""
    status = draw(st.integers(200, 599).filter(lambda s: s not in (204, 304)))
    reason = draw(values)
    version = draw(st.sampled_from(["1.1", "1.0"]))
    items = draw(fields)
    body = draw(bodies)
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    wire = body
    if framing == "length":
        items.insert(draw(st.integers(0, len(items))), ("Content-Length", str(len(body))))
    elif framing == "chunked":
        items.insert(draw(st.integers(0, len(items))), ("Transfer-Encoding", "chunked"))
        sizes = draw(st.lists(st.integers(1, 20), max_size=5))
        wire = _chunked(body, sizes, draw(st.booleans()))
    return items, f"HTTP/{version} {status} {reason}", body, wire


# ----------------------------------------------------------------------------- well-formed


@given(requests())
def test_well_formed_requests_read_the_same(
    request: tuple[list[tuple[str, str]], str, bytes],
) -> None:
    items, start, body = request
    data = _head(start, items) + body
    ours = ours_request(data)
    assert ours == h11_request(data)
    assert ours != REFUSED
    assert isinstance(ours, tuple)
    assert ours[3] == body


@given(responses())
def test_well_formed_responses_read_the_same(
    response: tuple[list[tuple[str, str]], str, bytes, bytes],
) -> None:
    items, start, body, wire = response
    data = _head(start, items) + wire
    ours = ours_response(data)
    assert ours == h11_response(data)
    assert isinstance(ours, tuple)
    assert ours[3] == body


# ----------------------------------------------------------------------------- malformed


def _replace_line(index: int, line: str) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        return [*lines[:index], line, *lines[index + 1 :]]

    return edit


_BAD_NAME_CHARS = '()<>@,;:\\"/[]?={} \x00\x01\x7f'

# Mutations of a request's head lines (start line first, Host second) that both parsers refuse.
request_mutations = st.one_of(
    # A header name that is not a token.
    st.builds(
        lambda name, bad, at: lambda lines: [*lines, f"{name[:at]}{bad}{name[at:]}: v"],
        names,
        st.sampled_from(_BAD_NAME_CHARS),
        st.integers(0, 12),
    ),
    # Whitespace between a header's name and its colon.
    st.builds(
        lambda name, ws: lambda lines: [*lines, f"{name}{ws}: v"],
        names,
        st.sampled_from([" ", "\t"]),
    ),
    # Conflicting Content-Length values, or one that is not a number.
    st.builds(
        lambda n, m: lambda lines: [*lines, f"Content-Length: {n}", f"Content-Length: {m}"],
        st.integers(0, 9),
        st.integers(10, 99),
    ),
    st.builds(
        lambda text: lambda lines: [*lines, f"Content-Length: {text}"],
        st.sampled_from(["x", "-1", "+1", "0x10", "1 1", "1.0", "", "1,2"]),
    ),
    # A bare CR inside a value.
    st.builds(lambda value: lambda lines: [*lines, f"X-Cr: {value}\rtail"], values),
    # A method that is not a token, a target with a space or a control character.
    st.builds(
        lambda method: _replace_line(0, f"{method} / HTTP/1.1"),
        st.sampled_from(["G T", "GE(T", "GET\x00", "[GET]"]),
    ),
    st.builds(
        lambda bad: _replace_line(0, f"GET /a{bad}b HTTP/1.1"),
        st.sampled_from([" x", "\x7f", "\x00", "\x1b"]),
    ),
    # No Host, or two.
    st.just(lambda lines: [lines[0], *lines[2:]]),
    st.just(lambda lines: [*lines, "Host: other.test"]),
)


@given(requests(), request_mutations)
def test_malformed_requests_are_refused_by_both(
    request: tuple[list[tuple[str, str]], str, bytes], mutate: Callable[[list[str]], list[str]]
) -> None:
    items, start, _ = request
    items = [(n, v) for n, v in items if n != "Content-Length"]
    start = start.replace("HTTP/1.0", "HTTP/1.1")  # an HTTP/1.0 request may leave out Host
    lines = mutate([start, *(f"{n}: {v}" for n, v in items)])
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    assert ours_request(data) == REFUSED
    assert h11_request(data) == REFUSED


@given(requests(), st.integers(1200, 4000))
def test_a_head_beyond_the_limit_is_refused_by_both_before_it_ends(
    request: tuple[list[tuple[str, str]], str, bytes], size: int
) -> None:
    items, start, _ = request
    data = _head(start, items)[:-2] + b"X-Big: " + b"a" * size  # no end in sight
    assert ours_request(data) == REFUSED
    assert h11_request(data) == REFUSED


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",  # size not hex
        b"\r\nhello\r\n0\r\n\r\n",  # no size
        b"-5\r\nhello\r\n0\r\n\r\n",  # a sign
        b"5\r\nhelloXX0\r\n\r\n",  # data not followed by CRLF
        b"5\x00\r\nhello\r\n0\r\n\r\n",  # a control character in the size line
        b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",  # a trailer that is not a field
    ],
)
def test_chunk_size_garbage_is_refused_by_both(body: bytes) -> None:
    assert ours_response(_CHUNKED_HEAD + body) == REFUSED
    assert h11_response(_CHUNKED_HEAD + body) == REFUSED


@given(
    st.binary(min_size=1, max_size=8).filter(
        lambda b: not all(c in b"0123456789abcdefABCDEF" for c in b)
    )
)
def test_generated_chunk_size_garbage_is_refused_by_both(size: bytes) -> None:
    data = _CHUNKED_HEAD + size + b"\r\nhello\r\n0\r\n\r\n"
    assert ours_response(data) == REFUSED
    assert h11_response(data) == REFUSED


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 abc OK",
        b"ICY 200 OK",
    ],
)
def test_bad_status_lines_are_refused_by_both(status_line: bytes) -> None:
    data = status_line + b"\r\nContent-Length: 0\r\n\r\n"
    assert ours_response(data) == REFUSED
    assert h11_response(data) == REFUSED


# ----------------------------------------------------------------------- deliberate differences

_GET = b"GET / HTTP/1.1\r\nHost: h\r\n"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        # A bare LF ends a line for h11; here only CRLF does (a proxy reading it otherwise would
        # see other messages in the same bytes).
        (b"GET / HTTP/1.1\nHost: h\n\n", "bare LF"),
        (_GET + b"X-A: 1\nX-B: 2\r\n\r\n", "bare LF in the header section"),
        # h11 unfolds an obsolete line fold; RFC 9112 lets a server refuse it, and it is refused.
        (_GET + b"X-A: a\r\n folded\r\n\r\n", "obsolete line fold"),
        # Control characters in a field value: h11 lets them through to the handler.
        (_GET + b"X-A: a\x01b\r\n\r\n", "control character in a value"),
        # Repeated Content-Length, even equal, or next to Transfer-Encoding: one framing or none.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
            "CL twice",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\n",
            "CL with TE",
        ),
        # A chunked request body is not served (501): the model and slot clients send lengths.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "chunked request",
        ),
        # Only methods llhttp knows, only origin-form targets, only HTTP/1.0 and 1.1.
        (b"FROB / HTTP/1.1\r\nHost: h\r\n\r\n", "unknown method"),
        (b"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", "absolute-form target"),
        (b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "asterisk-form target"),
        (b"GET / HTTP/1.2\r\nHost: h\r\n\r\n", "HTTP/1.2"),
        # A complete head beyond the limit: h11 bounds only what it has buffered so far.
        (_GET + b"X-Big: " + b"a" * 2000 + b"\r\n\r\n", "complete oversized head"),
    ],
)
def test_requests_refused_here_that_h11_accepts(data: bytes, why: str) -> None:
    assert ours_request(data) == REFUSED, why
    assert isinstance(h11_request(data), tuple), why


def test_an_empty_line_before_the_request_line_is_skipped_here_and_refused_by_h11() -> None:
    # RFC 9112 section 2.2: a server SHOULD ignore at least one empty line before a request line.
    data = b"\r\n" + _GET + b"\r\n"
    assert ours_request(data) == ("GET", "/", {"host": "h"}, b"")
    assert h11_request(data) == REFUSED


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "bare LF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: a\r\n folded\r\n\r\n", "obsolete line fold"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "CL twice"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n0\r\n\r\n",
            "CL with TE",
        ),
        (b"HTTP/1.1 600 Nope\r\nContent-Length: 0\r\n\r\n", "status beyond 599"),
        (b"HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n", "control character in the reason"),
    ],
)
def test_responses_refused_here_that_h11_accepts(data: bytes, why: str) -> None:
    assert ours_response(data) == REFUSED, why
    assert isinstance(h11_response(data), tuple), why
