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
import json
import socket
import struct
from collections.abc import Sequence
from typing import cast

import attrs

from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON

__all__ = [
    "MAX_REQUEST_BYTES",
    "Agent",
    "AgentLost",
    "Keeper",
    "check_reply",
    "encode_request",
    "reply_cap",
]

_HEADER = struct.Struct(">I")


class AgentLost(Exception):
    """The slot's agent ended or stopped answering."""


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
}
_NO_TYPES: frozenset[type] = frozenset()


def check_reply(reply: object) -> dict[str, JSON]:
    """``reply`` when it is what an agent answers a request with, else ``AgentLost``: a reply
    that does not parse as one never becomes a result."""
    if type(reply) is not dict or "exit" not in reply:
        raise AgentLost(f"the slot's agent sent a malformed reply ({type(reply).__name__})")
    for key, value in reply.items():
        if type(value) not in _REPLY_TYPES.get(key, _NO_TYPES):
            raise AgentLost(f"the slot's agent sent a malformed reply (field {key!r})")
    return cast("dict[str, JSON]", reply)


@attrs.define(eq=False)
class Agent:
    """One lease's exec agent: the channel to it, and (for a bare agent) its own process.

    ``cap``: the largest reply it may send (``reply_cap``); a length above it, or a reply that
    does not parse as one, ends the lease (``AgentLost``), never becomes a result."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    sandboxed: bool
    started_s: float
    pid: int | None
    cap: int
    process: asyncio.subprocess.Process | None = None

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
        return not self.reader.at_eof()

    def close_channel(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.close()

    async def greeting(self, timeout_s: float) -> dict[str, JSON]:
        """The agent's first message (``{"ready": true, ...}``). Raises ``AgentLost``."""
        try:
            async with asyncio.timeout(timeout_s):
                hello = json.loads(await self._frame())
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            raise AgentLost("the agent ended before it was ready") from None
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            detail = hello.get("error") if isinstance(hello, dict) else None
            raise AgentLost(str(detail) if detail else f"unexpected greeting {hello!r}")
        return cast("dict[str, JSON]", hello)

    async def request(self, payload: bytes, timeout_s: float) -> dict[str, JSON]:
        """One request (made by ``encode_request``) and its reply. The reply is
        JSON: bytes from inside the sandbox are not trusted."""
        try:
            self.writer.write(_HEADER.pack(len(payload)) + payload)
            transport = self.writer.transport
            if transport.is_closing() or transport.get_write_buffer_size():
                await self.writer.drain()  # else all was sent, and there is nothing to wait for
            async with asyncio.timeout(timeout_s):
                body = await self._frame()
        except (OSError, asyncio.IncompleteReadError) as error:
            raise AgentLost(f"the slot's sandbox ended ({type(error).__name__})") from None
        except TimeoutError:
            raise AgentLost(f"the slot's agent did not answer within {timeout_s:.1f} s") from None
        try:
            reply = json.loads(body)
        except ValueError:
            raise AgentLost("the slot's agent sent a reply that is not JSON") from None
        return check_reply(reply)


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
        except ValueError:
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
