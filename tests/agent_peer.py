"""A lease agent's channel with the test playing the agent on the other end of a socket pair:
the frames it writes, the requests it reads, and an ``Agent`` whose greeting was read."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from trajcore.adapters.slot_server.channel import Agent

CAP = 1 << 16


def frame(message: object) -> bytes:
    """``message`` as the agent frames it: a 4-byte big-endian length, then its JSON."""
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def read_request(peer: socket.socket) -> bytes:
    """The next request the server wrote to the agent's end (5 s at most)."""
    peer.settimeout(5)
    (size,) = struct.unpack(">I", peer.recv(4, socket.MSG_WAITALL))
    return peer.recv(size, socket.MSG_WAITALL)


@asynccontextmanager
async def greeted() -> AsyncIterator[tuple[Agent, socket.socket]]:
    """An agent whose greeting was read, and the socket the test plays the agent on."""
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.sendall(frame({"ready": True, "pid": 1, "tmux": False}))
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    agent = Agent(
        reader=reader, writer=writer, sandboxed=True, started_s=time.monotonic(), pid=1, cap=CAP
    )
    try:
        await agent.greeting(5)
        yield agent, peer
    finally:
        agent.close_channel()
        peer.close()
