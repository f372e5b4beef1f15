"""The channels to a slot's keeper and to a lease's agent (both the slot helper,
``slot_helper.c``), and what may come back on them.

Frames to and from an agent are a 4-byte big-endian length and that many bytes; a keeper speaks
one datagram per message on a ``SOCK_SEQPACKET`` socket (docs/sandbox.md, "The slot helper and
its protocol", is the reference for both). Bytes
from inside a sandbox are not trusted: a frame longer than ``reply_cap``, a reply that is not
JSON or not shaped as a reply, and a channel that ends or stays silent past its deadline all
raise ``AgentLost``, which ends the lease; none of them ever becomes a call's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import cast

import attrs

from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON

__all__ = [
    "MAX_REQUEST_BYTES",
    "Agent",
    "AgentEnded",
    "AgentLost",
    "AgentSilent",
    "Answer",
    "Keeper",
    "check_reply",
    "encode_request",
    "parse_json",
    "reply_cap",
]

_HEADER = struct.Struct(">I")
_JSON = json.JSONDecoder()
_decode_json = _JSON.decode  # an agent writes UTF-8: no encoding to detect
# The C scanner ``decode`` runs between its two whitespace matches (an instance attribute)
_scan_json = cast("Callable[[str, int], tuple[object, int]]", vars(_JSON)["scan_once"])
_RESOLUTION = time.get_clock_info("monotonic").resolution  # the event loop's clock's


class AgentLost(Exception):
    """The slot's agent ended or stopped answering."""


class AgentEnded(AgentLost):
    """The agent's channel ended before its greeting: its process died while it started (or,
    readied, while it waited for its lease), and nothing of the lease ran yet."""


class AgentSilent(AgentLost):
    """The agent did not greet within its limit (its process hung, or never got a core)."""


# The largest request a server sends an agent (the agent refuses larger ones: slot_helper.c's
# MAX_REQUEST).
MAX_REQUEST_BYTES = 16 << 20


def encode_request(fields: list[str]) -> bytes:
    """A request as the agent reads it: each field (the op first) as a 4-byte big-endian length
    and its UTF-8 bytes. Raises ``UnicodeEncodeError`` for text that is not valid Unicode (a
    lone surrogate)."""
    parts = []
    for field in fields:
        data = field.encode("utf-8")
        parts += [_HEADER.pack(len(data)), data]
    return b"".join(parts)


def reply_cap(isolation: SlotIsolation) -> int:
    """The largest reply an agent may send: two streams of at most ``output_cap_bytes`` each (a
    tmux capture: at most 1 MiB), every byte escaped to at most six in JSON, and room for the
    rest. A length above it is refused before anything is allocated for it."""
    return 12 * max(isolation.output_cap_bytes, 1 << 20) + (1 << 16)


# Each field of a reply and the exact types (as ``json.loads`` makes them) it may have: a
# ``bool`` is no number here, whatever Python's subclassing says.
_REPLY_TYPES: dict[str, frozenset[type]] = {
    "exit": frozenset({int, type(None)}),
    "signal": frozenset({int, type(None)}),
    "stdout": frozenset({str}),
    "stderr": frozenset({str}),
    "stdout_dropped": frozenset({int}),
    "stderr_dropped": frozenset({int}),
    "timed_out": frozenset({bool}),
    "duration": frozenset({int, float}),
    "error": frozenset({str}),
    "code": frozenset({str}),  # an error's reason as a code (docs/sandbox.md): no_tmux
}
_NO_TYPES: frozenset[type] = frozenset()
# A command's reply as the helper writes it (``write_result``): every field, in this order. Its
# allowed types, field by field, are every combination of ``_REPLY_TYPES``, so a reply of this
# shape is checked by two comparisons (anything else by ``_REPLY_TYPES``, field by field).
_HELPER_KEYS = (
    "exit", "signal", "stdout", "stderr", "stdout_dropped", "stderr_dropped", "timed_out",
    "duration",
)  # fmt: skip
_HELPER_SHAPES = frozenset(itertools.product(*(_REPLY_TYPES[key] for key in _HELPER_KEYS)))


def parse_json(text: str) -> object:
    """``json.loads(text)``: the agent's compact JSON read once, by the C scanner alone; white
    space after it skipped and anything else after it refused, as ``JSONDecoder.decode`` does
    (read once more by no one); text the scanner does not start on (leading white space, no
    JSON at all) by ``decode`` itself. Raises ``ValueError`` (``RecursionError`` for JSON
    nested past the interpreter's depth)."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return _decode_json(text)
    stop = len(text) - len(text[end:].lstrip(" \t\n\r"))  # JSON's white space
    if stop == len(text):
        return value
    raise json.JSONDecodeError("Extra data", text, stop)  # as ``decode`` refuses it


def check_reply(reply: object) -> dict[str, JSON]:
    """``reply`` when it is what an agent answers a request with, else ``AgentLost``: a reply
    that does not parse as one never becomes a result."""
    if type(reply) is not dict or "exit" not in reply:
        raise AgentLost(f"the slot's agent sent a malformed reply ({type(reply).__name__})")
    if tuple(reply) == _HELPER_KEYS and tuple(map(type, reply.values())) in _HELPER_SHAPES:
        return cast("dict[str, JSON]", reply)
    for key, value in reply.items():
        if type(value) not in _REPLY_TYPES.get(key, _NO_TYPES):
            raise AgentLost(f"the slot's agent sent a malformed reply (field {key!r})")
    return cast("dict[str, JSON]", reply)


Answer = Callable[["dict[str, JSON] | AgentLost"], None]
"""Called once with a request's reply (checked by ``check_reply``) or with why the lease is lost."""


class _Replies(asyncio.Protocol):
    """The agent's channel once it is ready: one request at a time, its reply framed as it
    arrives and handed to the request's ``Answer`` from the event loop's read callback, with no
    task, stream or timeout object of its own.

    Whatever the agent's side sends is checked before it is kept: a length over ``cap`` loses
    the lease before anything is buffered for it; bytes that no request waits for (before a
    request, or after its reply) lose it too, so a frame written into the channel by anything
    but the agent's answer never waits there to become the next call's result; so does the
    end of the channel and a deadline passed. Once lost, the channel reads nothing more."""

    def __init__(self, transport: asyncio.WriteTransport, cap: int) -> None:
        self.transport = transport
        self.cap = cap
        self.buffer = bytearray()
        self.answer: Answer | None = None
        self.deadline: asyncio.TimerHandle | None = None  # fires at or before ``due``
        self.fires = 0.0  # when ``deadline`` fires (its ``when()``)
        self.due = 0.0  # the request under way's deadline (loop time)
        self.limit_s = 0.0  # and its timeout
        self.lost: AgentLost | None = None
        self.loop = asyncio.get_running_loop()

    def send(self, payload: bytes, timeout_s: float, answer: Answer) -> None:
        if self.lost is not None:
            answer(self.lost)
            return
        if self.answer is not None:
            raise RuntimeError("an agent serves one request at a time")
        self.answer = answer
        loop = self.loop
        self.due, self.limit_s = loop.time() + timeout_s, timeout_s
        # One timer per channel, moved on lazily: a request's answer leaves it armed, and the
        # next request reuses it unless it must fire sooner (no timer made or cancelled per
        # request, as the calls of a lease mostly share one timeout).
        deadline = self.deadline
        if deadline is None or self.fires > self.due:
            if deadline is not None:
                deadline.cancel()
            self.deadline = loop.call_at(self.due, self._check)
            self.fires = self.due
        self.transport.write(_HEADER.pack(len(payload)) + payload)

    def _check(self) -> None:
        """The timer fired: lose the lease if the request under way is past its deadline,
        else wait on for it (none under way: the timer lapses until the next request)."""
        self.deadline = None
        if self.answer is None or self.lost is not None:
            return
        loop = self.loop
        if loop.time() + _RESOLUTION < self.due:  # a timer may fire this early
            self.deadline = loop.call_at(self.due, self._check)
            self.fires = self.due
            return
        self.lose(AgentLost(f"the slot's agent did not answer within {self.limit_s:.1f} s"))

    def lose(self, why: AgentLost) -> None:
        if self.lost is not None:
            return
        self.lost = why
        self.buffer = bytearray()
        with contextlib.suppress(OSError, RuntimeError):
            self.transport.close()
        self._give(why)

    def _give(self, outcome: dict[str, JSON] | AgentLost) -> None:
        answer, self.answer = self.answer, None
        if self.lost is not None and self.deadline is not None:  # no more requests: no timer
            self.deadline.cancel()
            self.deadline = None
        if answer is not None:
            answer(outcome)

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        if self.answer is None:
            self.lose(AgentLost("the slot's agent sent bytes no request asked for"))
            return
        # A reply mostly comes in one read: framed from ``data`` itself, never copied into the
        # buffer, which holds only the start of a frame that a later read completes.
        buffer = self.buffer
        held = bool(buffer)
        if held:
            buffer += data
        frame = buffer if held else data
        if len(frame) >= _HEADER.size:
            size = _HEADER.unpack_from(frame)[0]
            if size > self.cap:
                self.lose(
                    AgentLost(
                        f"the slot's agent sent a frame of {size} bytes, over the cap of {self.cap}"
                    )
                )
                return
            end = _HEADER.size + size
            if len(frame) > end:
                self.lose(AgentLost("the slot's agent sent more than one reply to a request"))
                return
            if len(frame) == end:
                try:
                    text = frame[_HEADER.size :].decode()
                    buffer.clear()
                    reply: dict[str, JSON] | AgentLost = check_reply(parse_json(text))
                except (ValueError, RecursionError):  # UnicodeDecodeError; nested too deep
                    reply = AgentLost("the slot's agent sent a reply that is not JSON")
                except AgentLost as malformed:
                    reply = malformed
                if isinstance(reply, AgentLost):
                    self.lose(reply)
                else:
                    self._give(reply)
                return
        if not held:
            buffer += data

    def eof_received(self) -> bool:
        self.lose(AgentLost("the slot's sandbox ended (end of its channel)"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lose(AgentLost(f"the slot's sandbox ended ({type(exc).__name__})"))


@attrs.define(eq=False)
class Agent:
    """One lease's exec agent: the channel to it, and (for a bare agent) its own process.

    ``cap``: the largest reply it may send (``reply_cap``); a length above it, or a reply that
    does not parse as one, ends the lease (``AgentLost``), never becomes a result. Its greeting
    is read from ``reader``; after it the channel is served by ``_Replies``, and ``send`` (or
    ``request``) asks one request at a time."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    sandboxed: bool
    started_s: float
    pid: int | None
    cap: int
    process: asyncio.subprocess.Process | None = None
    _replies: _Replies | None = attrs.field(init=False, default=None)

    async def _frame(self) -> bytes:
        size = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))[0]
        if size > self.cap:
            raise AgentLost(
                f"the slot's agent sent a frame of {size} bytes, over the cap of {self.cap}"
            )
        return await self.reader.readexactly(size)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.returncode is None
        if self._replies is not None:
            return self._replies.lost is None
        return not self.reader.at_eof()

    def idle(self) -> bool:
        """Ready for a request now: greeted, its channel not lost, no request under way."""
        replies = self._replies
        return replies is not None and replies.lost is None and replies.answer is None

    def close_channel(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.close()

    async def greeting(self, timeout_s: float) -> dict[str, JSON]:
        """The agent's first message (``{"ready": true, ...}``). Raises ``AgentEnded`` when the
        channel ends first (the agent's process died), ``AgentSilent`` when ``timeout_s``
        passes first, else ``AgentLost``."""
        try:
            async with asyncio.timeout(timeout_s):
                hello = json.loads(await self._frame())
        except (asyncio.IncompleteReadError, ConnectionError) as ended:
            why = "end of its channel" if isinstance(ended, EOFError) else type(ended).__name__
            raise AgentEnded(f"the agent ended before it was ready ({why})") from None
        except TimeoutError:
            raise AgentSilent(f"the agent did not greet within {timeout_s:.1f} s") from None
        except OSError:
            raise AgentLost("the agent ended before it was ready") from None
        except (ValueError, RecursionError):  # UnicodeDecodeError; nested too deep
            raise AgentLost("the agent's greeting is not JSON") from None
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            detail = hello.get("error") if isinstance(hello, dict) else None
            raise AgentLost(str(detail) if detail else f"unexpected greeting {hello!r}")
        # From here on the channel carries replies only. Anything the stream reader still
        # holds came unasked and is dropped with it, never read as a reply.
        transport = self.writer.transport
        self._replies = _Replies(transport, self.cap)
        transport.set_protocol(self._replies)
        if transport.is_closing():
            self._replies.lost = AgentLost("the slot's sandbox ended (its channel closed)")
        elif isinstance(transport, asyncio.ReadTransport):
            transport.resume_reading()  # in case the stream reader had paused it
        return cast("dict[str, JSON]", hello)

    def send(self, payload: bytes, timeout_s: float, answer: Answer) -> None:
        """Send one request (made by ``encode_request``); ``answer`` is called once, from the
        event loop, with its checked reply or with the ``AgentLost`` that ended the lease (also
        at once, when it is lost already). Raises ``RuntimeError`` before the greeting or while
        another request is under way."""
        if self._replies is None:
            raise RuntimeError("the agent has not greeted yet")
        self._replies.send(payload, timeout_s, answer)

    async def request(self, payload: bytes, timeout_s: float) -> dict[str, JSON]:
        """One request (made by ``encode_request``) and its reply. The reply is
        JSON: bytes from inside the sandbox are not trusted. Raises ``AgentLost``."""
        done: asyncio.Future[dict[str, JSON] | AgentLost] = (
            asyncio.get_running_loop().create_future()
        )

        def answer(outcome: dict[str, JSON] | AgentLost) -> None:
            if not done.done():
                done.set_result(outcome)

        self.send(payload, timeout_s, answer)
        try:
            outcome = await done
        except asyncio.CancelledError:
            # a request cut short leaves its reply on the way: the channel is of no more use
            if self._replies is not None:
                self._replies.lose(AgentLost("the request to the slot's agent was cancelled"))
            raise
        if isinstance(outcome, AgentLost):
            raise outcome
        return outcome


@attrs.define(eq=False)
class Keeper:
    """A slot's long-lived sandbox and the keeper in it, which starts and ends its leases.

    ``pids`` are the processes of the slot's cgroup once the keeper was ready (bubblewrap and
    the keeper): a slot whose cgroup holds anything else after a lease ended is not clean.
    """

    process: asyncio.subprocess.Process
    control: socket.socket
    pids: frozenset[int] = frozenset()
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)

    def alive(self) -> bool:
        return self.process.returncode is None

    async def receive(self, timeout_s: float) -> dict[str, JSON]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                packet = await loop.sock_recv(self.control, 1 << 16)
        except OSError as error:
            raise AgentLost(f"the slot's keeper is gone ({type(error).__name__})") from None
        except TimeoutError:
            raise AgentLost(f"the slot's keeper did not answer within {timeout_s:.1f} s") from None
        if not packet:
            raise AgentLost("the slot's keeper ended")
        try:
            reply = json.loads(packet)
        except (ValueError, RecursionError):  # UnicodeDecodeError; nested too deep
            raise AgentLost("the slot's keeper sent malformed JSON") from None
        if not isinstance(reply, dict):
            raise AgentLost(f"the slot's keeper sent {reply!r}")
        failure = reply.get("error")
        if isinstance(failure, str):
            raise AgentLost(failure)
        return cast("dict[str, JSON]", reply)

    async def ask(
        self, op: str, timeout_s: float, channel: socket.socket | None = None,
        more: Sequence[int] = (),
    ) -> dict[str, JSON]:  # fmt: skip
        """Send one request (``lease`` or ``end``; with ``channel`` passed along, and ``more``
        descriptors after it) and return the answer. Raises ``AgentLost`` when the keeper is
        gone, answers an error, or is late."""
        payload = op.encode()
        async with self.lock:
            try:
                if channel is None:
                    self.control.send(payload)
                else:
                    socket.send_fds(self.control, [payload], [channel.fileno(), *more])
            except OSError as error:
                raise AgentLost(f"the slot's keeper is gone ({type(error).__name__})") from None
            return await self.receive(timeout_s)
