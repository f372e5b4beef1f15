"""The strict HTTP/1.1 client and server: framing, bad input, keep-alive, deadlines, concurrency.

The client is tested against scripted servers written with plain asyncio streams (so every byte
of a bad response is exactly what the test says), the server with raw sockets, and the
incremental response parser with bytes fed in arbitrary fragments. Every test is bounded by a
deadline of a few seconds.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.http1.client import HTTPClient, _ClientConnection
from trajcore.adapters.http1.errors import (
    ClientClosed,
    ConnectFailed,
    ConnectionLost,
    MalformedMessage,
    MessageTooLarge,
    RequestTimedOut,
)
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import (
    Headers,
    Limits,
    Origin,
    Reply,
    Request,
    Response,
    parse_url,
)
from trajcore.domain.errors import ConfigError, InfrastructureError

pytestmark = pytest.mark.anyio
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body) as the client sent it."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


@asynccontextmanager
async def scripted(*scripts: Script) -> AsyncIterator[tuple[Origin, list[bytes]]]:
    """A server whose n-th connection runs ``scripts[n]`` (the last one repeats); yields its
    origin and the requests it has read so far (scripts append to it)."""
    seen: list[bytes] = []
    count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        script = scripts[min(count, len(scripts) - 1)]
        count += 1
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin(host="127.0.0.1", port=port), seen
    finally:
        server.close()
        await server.wait_closed()


def answer_with(
    *responses: bytes, keep_open: bool = False, seen: list[bytes] | None = None
) -> Script:
    """A script that answers each request on its connection with the next of ``responses``."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            request = await read_request(reader)
            if seen is not None:
                seen.append(request)
            writer.write(response)
            await writer.drain()
        if keep_open:
            await reader.read()

    return script


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


# ----------------------------------------------------------------------------- client: framing


async def test_content_length_responses_reuse_one_connection() -> None:
    async with scripted(answer_with(OK, OK, OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            for _ in range(3):
                response = await client.request("GET", origin, "/x")
                assert (response.status, response.reason, response.body) == (200, "OK", b"ok")
        stats = client.statistics()
        await client.aclose()
    assert (stats.connections_opened, stats.requests, stats.open, stats.idle) == (1, 3, 1, 1)


async def test_request_bytes_carry_host_headers_and_length() -> None:
    seen: list[bytes] = []
    async with scripted(answer_with(OK, keep_open=True, seen=seen)) as (origin, _):
        client = HTTPClient(headers={"Authorization": "Bearer t"})
        with anyio.fail_after(5):
            await client.request("POST", origin, "/v1/x?q=1", body=b"{}", headers={"X-A": "b"})
        await client.aclose()
    assert seen == [
        b"POST /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer t\r\n"
        b"X-A: b\r\nContent-Length: 2\r\n\r\n{}" % origin.port
    ]


async def test_chunked_body_with_extensions_and_trailers_is_joined() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: yes\r\n\r\n"
    )
    async with scripted(answer_with(chunked, OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            first = await client.request("GET", origin, "/")
            second = await client.request("GET", origin, "/")
        await client.aclose()
    assert first.body == b"hello world"
    assert second.body == b"ok"
    assert client.statistics().connections_opened == 1


async def test_a_body_framed_by_the_end_of_the_connection_is_read_and_not_reused() -> None:
    until_close = b"HTTP/1.0 200 OK\r\n\r\nall of it"
    async with scripted(answer_with(until_close), answer_with(OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            first = await client.request("GET", origin, "/")
            second = await client.request("GET", origin, "/")
        await client.aclose()
    assert (first.body, second.body) == (b"all of it", b"ok")
    assert client.statistics().connections_opened == 2


async def test_head_and_204_have_no_body_and_keep_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    empty = b"HTTP/1.1 204 No Content\r\n\r\n"
    async with scripted(answer_with(head, empty, OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            first = await client.request("HEAD", origin, "/")
            second = await client.request("DELETE", origin, "/")
            third = await client.request("GET", origin, "/")
        await client.aclose()
    assert (first.status, first.body, first.headers["content-length"]) == (200, b"", "1000")
    assert (second.status, second.body) == (204, b"")
    assert third.body == b"ok"
    assert client.statistics().connections_opened == 1


async def test_interim_responses_are_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK
    async with scripted(answer_with(interim, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            response = await client.request("POST", origin, "/", body=b"x")
        await client.aclose()
    assert (response.status, response.body) == (200, b"ok")


async def test_connection_close_in_the_response_is_honoured() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with scripted(answer_with(closing, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            await client.request("GET", origin, "/")
            await client.request("GET", origin, "/")
        await client.aclose()
    assert client.statistics().connections_opened == 2


# ----------------------------------------------------------------------------- client: bad input


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 abc OK",
        b"HTTP/1.1 600 Nope",
        b"HTTP/1.1 200 O\x01K",
        b"ICY 200 OK",
        b"garbage",
        b"",
        b"HTTP/1.1 101 Switching Protocols",
    ],
)
async def test_malformed_status_lines_are_refused(status_line: bytes) -> None:
    async with scripted(answer_with(status_line + b"\r\nContent-Length: 0\r\n\r\n")) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(MalformedMessage):
            await client.request("GET", origin, "/")
        assert client.statistics().open == 0
        await client.aclose()


@pytest.mark.parametrize(
    "fields",
    [
        b"No-Colon-Here",
        b"Name : value",
        b" Folded: value",
        b"Content-Length: 2\r\n\tobsolete fold",
        b"Bad\x00Name: v",
        b"X-Ctl: a\x01b",
        b"X-Bare: a\rb",
        b"Content-Length: abc",
        b"Content-Length: -1",
        b"Content-Length: 2, 3",
        b"Content-Length: 2\r\nContent-Length: 3",
        b"Content-Length: 1234567890123456789",
        b"Transfer-Encoding: gzip",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: chunked\r\nContent-Length: 2",
        b"Content-Length: 2\nX-Bare-LF: yes",
    ],
)
async def test_malformed_header_sections_are_refused(fields: bytes) -> None:
    response = b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n\r\nok"
    async with scripted(answer_with(response)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(MalformedMessage):
            await client.request("GET", origin, "/")
        await client.aclose()


@pytest.mark.parametrize(
    "fields", [b"Content-Length: 2\r\nContent-Length: 2", b"Content-Length: 2, 2"]
)
async def test_a_repeated_content_length_is_refused_even_when_equal(fields: bytes) -> None:
    # RFC 9110 lets a recipient merge equal values or refuse; refusing leaves no room for a
    # framing disagreement with a proxy in front.
    response = b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n\r\nok"
    async with scripted(answer_with(response)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(MalformedMessage):
            await client.request("GET", origin, "/")
        await client.aclose()


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",  # size not hex
        b"\r\nhello\r\n0\r\n\r\n",  # empty size
        b"5\r\nhelloXX0\r\n\r\n",  # data not followed by CRLF
        b"5\x00\r\nhello\r\n0\r\n\r\n",  # control character in the size line
        b"1" * 2000 + b"\r\n",  # size line beyond its bound
        b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",  # trailer without a colon
        b"2\r\nok\r\n0\r\n\r\nextra",  # bytes after the end
    ],
)
async def test_chunked_encoding_errors_are_refused(body: bytes) -> None:
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    async with scripted(answer_with(response, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(MalformedMessage):
            await client.request("GET", origin, "/")
        await client.aclose()


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n",  # head beyond 1 KiB
        b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 20 + b"Content-Length: 0\r\n\r\n",  # 21 fields
        b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n",  # declared body beyond 100
        # chunks beyond 100 bytes so far (refused before the second chunk is complete)
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n"
        + b"a" * 64
        + b"\r\n40\r\n"
        + b"a" * 40,
        b"HTTP/1.0 200 OK\r\n\r\n" + b"a" * 101,  # until close, beyond 100
        # a trailer section beyond the head limit
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: "
        + b"a" * 2000
        + b"\r\n\r\n",
    ],
)
async def test_oversized_heads_and_bodies_are_refused(response: bytes) -> None:
    limits = Limits(max_head_bytes=1024, max_headers=20, max_body_bytes=100)
    async with scripted(answer_with(response, keep_open=True)) as (origin, _):
        client = HTTPClient(limits=limits)
        with anyio.fail_after(5), pytest.raises(MessageTooLarge):
            await client.request("GET", origin, "/")
        await client.aclose()


async def test_a_trailer_that_never_ends_is_refused_once_beyond_the_head_limit() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n")
        await writer.drain()
        for _ in range(10):  # a trailer field, never ended
            await asyncio.sleep(0.01)
            writer.write(b"X-Trailer: " if _ == 0 else b"a" * 500)
            await writer.drain()
        await reader.read()

    async with scripted(script) as (origin, _):
        client = HTTPClient(limits=Limits(max_head_bytes=1024))
        with anyio.fail_after(5), pytest.raises(MessageTooLarge):
            await client.request("GET", origin, "/")
        await client.aclose()


async def test_a_request_body_over_the_limit_is_refused_before_sending() -> None:
    client = HTTPClient(limits=Limits(max_body_bytes=10))
    with pytest.raises(MessageTooLarge):
        await client.request("POST", Origin(host="127.0.0.1", port=9), "/", body=b"x" * 11)
    assert client.statistics().connections_opened == 0


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GE T", "/", {}),
        ("", "/", {}),
        ("GET", "no-slash", {}),
        ("GET", "/a b", {}),
        ("GET", "/a\r\nX-Injected: 1", {}),
        ("GET", "/", {"X-A": "b\r\nX-Injected: 1"}),
        ("GET", "/", {"Bad Name": "v"}),
    ],
)
async def test_requests_that_would_break_framing_are_refused(
    method: str, target: str, headers: dict[str, str]
) -> None:
    client = HTTPClient()
    with pytest.raises(ValueError, match=r"bad|control|token"):
        await client.request(method, Origin(host="127.0.0.1", port=9), target, headers=headers)


def test_default_headers_are_validated_once_at_construction() -> None:
    with pytest.raises(ValueError, match="control"):
        HTTPClient(headers={"X-A": "b\nc"})
    with pytest.raises(ConfigError):
        HTTPClient(max_connections=0)
    with pytest.raises(ConfigError):
        Limits(max_body_bytes=0)


# ----------------------------------------------------------------------------- client: faults


async def test_connection_closed_mid_body_is_connection_lost() -> None:
    async with scripted(answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")) as (
        origin,
        _,
    ):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(ConnectionLost, match="middle"):
            await client.request("GET", origin, "/")
        assert client.statistics().open == 0
        await client.aclose()


async def test_connection_closed_before_the_answer_is_connection_lost_for_a_post() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with scripted(hang_up) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(ConnectionLost, match="before the response"):
            await client.request("POST", origin, "/", body=b"{}")
        await client.aclose()


async def test_a_stale_keep_alive_connection_is_replayed_once_for_idempotent_requests() -> None:
    # First connection: answers once, then drops the next request unanswered (a server that
    # closed the idle connection as the request went out). Later connections answer normally.
    async def answer_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)

    async with scripted(answer_then_drop, answer_with(OK, OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            await client.request("GET", origin, "/")
            response = await client.request("GET", origin, "/")
        assert response.body == b"ok"
        assert client.statistics().replays == 1
        await client.aclose()


async def test_a_stale_connection_is_not_replayed_for_a_post() -> None:
    async def answer_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)

    async with scripted(answer_then_drop, answer_with(OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            await client.request("POST", origin, "/", body=b"1")
            with pytest.raises(ConnectionLost):
                await client.request("POST", origin, "/", body=b"2")
        assert client.statistics().replays == 0
        await client.aclose()


async def test_connection_refused_and_a_missing_socket_are_connect_failed(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = HTTPClient()
    with anyio.fail_after(5):
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await client.request("GET", Origin(host="127.0.0.1", port=port), "/")
        missing = Origin(host="x", unix_path=str(tmp_path / "missing.sock"))
        with pytest.raises(ConnectFailed):
            await client.request("GET", missing, "/")
    assert client.statistics().open == 0
    await client.aclose()


async def test_the_deadline_bounds_the_exchange_and_discards_the_connection() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with scripted(never_answer) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5), pytest.raises(RequestTimedOut, match="within"):
            await client.request("GET", origin, "/", timeout_s=0.1)
        assert client.statistics().open == 0
        await client.aclose()


async def test_a_cancelled_request_never_returns_its_connection() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(0.2)
        writer.write(OK)
        await writer.drain()
        await reader.read()

    async with scripted(slow, answer_with(OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            with anyio.move_on_after(0.05):
                await client.request("GET", origin, "/")
            assert client.statistics().open == 0
            # The late answer of the first connection can never be read as the next response.
            assert (await client.request("GET", origin, "/")).body == b"ok"
        await client.aclose()


async def test_unsolicited_bytes_on_an_idle_connection_retire_it() -> None:
    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK + b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with scripted(chatty, answer_with(OK, keep_open=True)) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            with pytest.raises(MalformedMessage, match="after the end"):
                await client.request("GET", origin, "/")
            assert (await client.request("GET", origin, "/")).body == b"ok"
        await client.aclose()


async def test_concurrent_requests_share_a_capped_pool() -> None:
    peak = 0
    live = 0

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal peak, live
        live += 1
        peak = max(peak, live)
        try:
            while True:
                request = await read_request(reader)
                body = request.split(b"\r\n\r\n", 1)[1]
                await asyncio.sleep(0.001)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        finally:
            live -= 1

    async with scripted(echo) as (origin, _):
        client = HTTPClient(max_connections=3)

        async def one(i: int) -> bytes:
            response = await client.request("POST", origin, "/", body=str(i).encode())
            return response.body

        with anyio.fail_after(10):
            bodies = await asyncio.gather(*(one(i) for i in range(60)))
        stats = client.statistics()
        await client.aclose()
    assert bodies == [str(i).encode() for i in range(60)]
    assert peak <= 3
    assert stats.connections_opened <= 3
    assert stats.waiting == 0


async def test_close_fails_requests_in_flight_and_later_ones() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with scripted(never_answer) as (origin, _):
        client = HTTPClient()
        with anyio.fail_after(5):
            pending = asyncio.ensure_future(client.request("GET", origin, "/"))
            await asyncio.sleep(0.05)
            await client.aclose()
            with pytest.raises(ClientClosed):
                await pending
            with pytest.raises(ClientClosed):
                await client.request("GET", origin, "/")
            await client.aclose()  # idempotent
    assert client.closed


async def test_every_client_failure_is_an_infrastructure_error() -> None:
    for error in (ConnectFailed, ConnectionLost, MalformedMessage, MessageTooLarge):
        assert issubclass(error, InfrastructureError)
    assert issubclass(RequestTimedOut, InfrastructureError)
    assert issubclass(ClientClosed, InfrastructureError)


# ----------------------------------------------------------------------------- parser property


class _Sink(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, start = bytearray(), 0
    for size in sizes:
        piece = body[start : start + size]
        if not piece:
            break
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
        start += len(piece)
    if start < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - start, body[start:])
    return bytes(out + b"0\r\n\r\n")


@given(
    body=st.binary(max_size=300),
    sizes=st.lists(st.integers(1, 50), max_size=10),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    chunked=st.booleans(),
)
def test_responses_parse_the_same_however_the_bytes_are_split(
    body: bytes, sizes: list[int], cuts: list[int], chunked: bool
) -> None:
    if chunked:
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body, sizes)
    else:
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def feed() -> Response:
        conn = _ClientConnection(Limits())
        conn.connection_made(_Sink())
        waiter = conn.start(b"GET / HTTP/1.1\r\n\r\n", head_request=False)
        position, i = 0, 0
        while position < len(wire):
            step = cuts[i % len(cuts)]
            conn.data_received(wire[position : position + step])
            position += step
            i += 1
        assert waiter.done()
        assert conn.reusable
        return waiter.result()

    response = asyncio.run(feed())
    assert (response.status, response.body) == (200, body)


# ----------------------------------------------------------------------------- values


def test_parse_url_splits_origin_and_prefix() -> None:
    assert parse_url("http://h:8000/v1/") == (Origin(host="h", port=8000), "/v1")
    assert parse_url("http://h") == (Origin(host="h", port=80), "")
    assert parse_url("https://h/a") == (Origin(host="h", port=443, tls=True), "/a")
    assert parse_url("http://[::1]:9/") == (Origin(host="::1", port=9), "")
    assert Origin(host="::1", port=9).authority == "[::1]:9"
    assert Origin(host="h", port=80).authority == "h"
    for bad in (
        "ftp://h",
        "h:80",
        "http://",
        "http://h:0",
        "http://h:x",
        "http://u@h",
        "http://h/?q",
    ):
        with pytest.raises(ConfigError):
            parse_url(bad)


def test_headers_are_case_insensitive_and_join_repeats() -> None:
    headers = Headers([("Set-Thing", "a"), ("set-thing", "b"), ("Content-Type", "x")])
    assert headers["SET-THING"] == "a, b"
    assert headers.get("content-type") == "x"
    assert headers.get("missing") is None
    assert sorted(headers) == ["content-type", "set-thing"]
    assert len(headers) == 2


# ----------------------------------------------------------------------------- server


@asynccontextmanager
async def serving(
    handler: Callable[[Request], Awaitable[Reply]], **options: object
) -> AsyncIterator[tuple[int, HTTPServer]]:
    server = HTTPServer(handler, **options)  # type: ignore[arg-type]
    _, port = await server.listen_tcp("127.0.0.1", 0)
    try:
        yield port, server
    finally:
        await server.aclose(grace_s=1)


async def echo_handler(request: Request) -> Reply:
    text = f"{request.method} {request.path} {request.target} {request.body.decode()}"
    return Reply(status=200, body=text.encode(), content_type="text/plain")


async def exchange(port: int, data: bytes, *, until_close: bool = False) -> bytes:
    """Send ``data`` on one connection and read what comes back (until the connection closes,
    or until a short quiet pause)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = bytearray()
    try:
        while True:
            if until_close:
                chunk = await reader.read(65536)
            else:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), 0.3)
                except TimeoutError:
                    break
            if not chunk:
                break
            out += chunk
    finally:
        writer.close()
    return bytes(out)


async def test_server_keeps_the_connection_alive_and_answers_pipelined_requests_in_order() -> None:
    async with serving(echo_handler) as (port, _):
        with anyio.fail_after(5):
            data = await exchange(
                port,
                b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\none"
                b"\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n",
            )
    first, second = data.split(b"HTTP/1.1 200 OK")[1:]
    assert first.endswith(b"\r\n\r\nPOST /a /a?x=1 one")
    assert second.endswith(b"\r\n\r\nGET /b /b ")
    assert b"Connection: close" not in data


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1 extra\r\nHost: h\r\n\r\n", b"400"),
        (b"GET nowhere HTTP/1.1\r\nHost: h\r\n\r\n", b"400"),
        (b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", b"400"),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", b"505"),
        (b"GET / HTTP/1.1\r\n\r\n", b"400"),  # no Host
        (b"GET / HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n", b"400"),  # two
        (b"GET / HTTP/1.1\nHost: h\n\n", b"400"),  # bare LF
        (b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n\r\n", b"400"),  # bare CR
        (b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n", b"400"),  # NUL
        (b"GET / HTTP/1.1\r\nHost: h\r\nX-A : v\r\n\r\n", b"400"),  # space before colon
        (b"FROB / HTTP/1.1\r\nHost: h\r\n\r\n", b"400"),  # a method llhttp does not know
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", b"400"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 1\r\n\r\nx", b"400"),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            b"400",
        ),
        (b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nBad Header: v\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: x\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"501"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1001\r\n\r\n", b"413"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n", b"431"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 2000, b"431"),  # head never ends
    ],
)
async def test_server_refuses_malformed_requests_and_closes(
    request_bytes: bytes, status: bytes
) -> None:
    limits = Limits(max_head_bytes=1024, max_body_bytes=1000)
    async with serving(echo_handler, limits=limits) as (port, _):
        with anyio.fail_after(5):
            data = await exchange(port, request_bytes, until_close=True)
    assert data.startswith(b"HTTP/1.1 " + status)
    assert b"Connection: close" in data
    assert data.count(b"\r\n\r\n") == 1  # one answer, then the connection closed


async def test_a_handler_error_is_a_500_and_the_server_carries_on() -> None:
    async def failing(request: Request) -> Reply:
        if request.path == "/boom":
            raise RuntimeError("boom")
        return Reply(body=b"fine")

    async with serving(failing) as (port, _):
        with anyio.fail_after(5):
            data = await exchange(
                port,
                b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\nGET /ok HTTP/1.1\r\nHost: h\r\n\r\n",
            )
    assert data.startswith(b"HTTP/1.1 500 ")
    assert b"RuntimeError" in data
    assert data.endswith(b"fine")


async def test_expect_continue_is_answered_before_the_body() -> None:
    async with serving(echo_handler) as (port, _):
        with anyio.fail_after(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"PUT /u HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"
            )
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"data")
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.read(100)
            writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert body == b"PUT /u /u data"


async def test_http_1_0_without_keep_alive_is_closed_after_the_answer() -> None:
    async with serving(echo_handler) as (port, _):
        with anyio.fail_after(5):
            data = await exchange(port, b"GET /old HTTP/1.0\r\n\r\n", until_close=True)
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert b"Connection: close" in data


async def test_head_gets_the_length_but_no_body() -> None:
    async with serving(echo_handler) as (port, _):
        with anyio.fail_after(5):
            data = await exchange(port, b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Content-Length: 11" in head  # len("HEAD /h /h ")
    assert body == b""


async def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    async with serving(echo_handler, idle_timeout_s=0.05) as (port, _):
        with anyio.fail_after(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h")  # never finished
            assert await reader.read() == b""
            writer.close()


async def test_client_and_server_round_trip_over_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = HTTPServer(echo_handler, limits=Limits(max_body_bytes=1 << 20))
    await server.listen_unix(path)
    client = HTTPClient()
    origin = Origin(host="local", unix_path=path)
    big = b"x" * (300 << 10)
    try:
        with anyio.fail_after(5):
            replies = await asyncio.gather(
                *(client.request("POST", origin, f"/n{i}", body=b"%d" % i) for i in range(20))
            )
            large = await client.request("POST", origin, "/big", body=big)
    finally:
        await client.aclose()
        await server.aclose(grace_s=1)
    assert [r.body for r in replies] == [b"POST /n%d /n%d %d" % (i, i, i) for i in range(20)]
    assert large.body == b"POST /big /big " + big
    assert replies[0].headers["content-type"] == "text/plain"


async def test_server_close_waits_for_running_handlers() -> None:
    started = asyncio.Event()

    async def slow(request: Request) -> Reply:
        started.set()
        await asyncio.sleep(0.1)
        return Reply(body=b"finished")

    server = HTTPServer(slow)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    client = HTTPClient()
    with anyio.fail_after(5):
        pending = asyncio.ensure_future(
            client.request("GET", Origin(host="127.0.0.1", port=port), "/")
        )
        await started.wait()
        await server.aclose(grace_s=2)
        response = await pending
    await client.aclose()
    assert response.body == b"finished"
    assert response.headers.get("connection") == "close"


async def test_idle_connections_past_the_idle_timeout_are_closed_under_a_steady_load() -> None:
    """A burst opens several connections; a steady load after it reuses the newest only: the
    older ones, idle past the timeout, are closed at the next request, not kept until the
    client closes."""
    async with serving(echo_handler) as (port, _):
        client = HTTPClient(idle_timeout_s=0.3)
        origin = Origin(host="127.0.0.1", port=port)
        try:
            with anyio.fail_after(10):
                await asyncio.gather(*(client.request("GET", origin, f"/b{i}") for i in range(5)))
                assert client.statistics().open == 5
                for i in range(8):  # 0.8 s of one request at a time: the newest reused
                    await client.request("GET", origin, f"/s{i}")
                    await asyncio.sleep(0.1)
                assert client.statistics().open == 1
        finally:
            await client.aclose()
