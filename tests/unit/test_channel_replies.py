"""The agent's channel after its greeting (``channel._Replies``): one request at a time, and
nothing from the sandbox's side becomes a reply unless a request waits for it and it is one
well-formed frame under the cap.

The test plays the agent on the other end of a socket pair, as a hostile lease could (a process
that reached the agent's channel): what it writes unasked, too large, twice, or never, must end
the lease (``AgentLost``), never come back as a result. Each case has a control that writes the
same reply the way the agent does and gets it back.
"""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from tests.agent_peer import CAP, frame, greeted, read_request
from trajcore.adapters.slot_server.channel import AgentLost, encode_request
from trajcore.domain.json_values import JSON

REPLY: dict[str, JSON] = {
    "exit": 0, "signal": None, "stdout": "REAL\n", "stderr": "", "stdout_dropped": 0,
    "stderr_dropped": 0, "timed_out": False, "duration": 0.001,
}  # fmt: skip
FORGED = {**REPLY, "stdout": "FORGED\n"}


def ask() -> bytes:
    return encode_request(["exec", "5.0", "1000", "/bin/sh", "-c", "echo REAL"])


async def settle() -> None:
    for _ in range(20):  # let the loop read what the peer wrote
        await asyncio.sleep(0.005)


def test_control_a_reply_to_a_request_comes_back() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            assert read_request(peer) == ask()
            peer.sendall(frame(REPLY))
            assert await asking == REPLY
            assert agent.alive()
            assert agent.idle()
            # and the next one too: the channel carries one reply per request
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            read_request(peer)
            peer.sendall(frame(REPLY))
            assert await asking == REPLY

    asyncio.run(main())


def test_a_frame_nobody_asked_for_ends_the_lease_instead_of_answering_the_next_call() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            peer.sendall(frame(FORGED))  # before the call: it would wait there as its reply
            await settle()
            assert not agent.alive()
            with pytest.raises(AgentLost, match="no request asked for"):
                await agent.request(ask(), 5)

    asyncio.run(main())


def test_a_second_reply_to_one_request_ends_the_lease() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            read_request(peer)
            peer.sendall(frame(REPLY) + frame(FORGED))
            with pytest.raises(AgentLost, match="more than one reply"):
                await asking
            assert not agent.alive()

    asyncio.run(main())


def test_a_length_over_the_cap_ends_the_lease_before_its_body_is_read() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            read_request(peer)
            peer.sendall(struct.pack(">I", CAP + 1) + b"x" * 1000)
            with pytest.raises(AgentLost, match="over the cap"):
                await asking
            peer.settimeout(5)
            assert peer.recv(1) == b""  # the server closed its end: it reads nothing more

    asyncio.run(main())


def test_an_agent_that_does_not_answer_is_lost_at_its_deadline() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            started = time.monotonic()
            with pytest.raises(AgentLost, match=r"did not answer within 0\.2 s"):
                await agent.request(ask(), 0.2)
            assert time.monotonic() - started < 3
            assert not agent.alive()
            assert read_request(peer) == ask()

    asyncio.run(main())


def test_a_reply_that_is_not_a_reply_ends_the_lease() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            read_request(peer)
            peer.sendall(frame({**REPLY, "exit": True}))
            with pytest.raises(AgentLost, match="malformed reply"):
                await asking

    asyncio.run(main())


def test_a_reply_nested_past_the_parsers_depth_ends_the_lease_as_not_json() -> None:
    """JSON nested deeper than the parser recurses is refused as any bad reply is (the lease
    lost, "not JSON"), not a parser crash inside the protocol's callback; the control, the
    same reply nested ten deep, parses and is then refused for its field."""

    async def main(depth: int) -> dict[str, JSON]:
        body = b'{"exit": 0, "x": ' + b"[" * depth + b"]" * depth + b"}"
        async with greeted() as (agent, peer):
            asking = asyncio.ensure_future(agent.request(ask(), 5))
            await settle()
            read_request(peer)
            peer.sendall(struct.pack(">I", len(body)) + body)
            return await asking

    with pytest.raises(AgentLost, match="not JSON"):
        asyncio.run(main(10_000))
    with pytest.raises(AgentLost, match="malformed reply \\(field 'x'\\)"):
        asyncio.run(main(10))


def test_send_answers_once_from_the_loop_and_refuses_a_second_request_meanwhile() -> None:
    async def main() -> None:
        async with greeted() as (agent, peer):
            answers: list[object] = []
            agent.send(ask(), 5, answers.append)
            assert not agent.idle()
            with pytest.raises(RuntimeError, match="one request at a time"):
                agent.send(ask(), 5, answers.append)
            await settle()
            read_request(peer)
            peer.sendall(frame(REPLY))
            await settle()
            assert answers == [REPLY]
            agent.close_channel()
            await settle()
            assert answers == [REPLY]  # the end of the channel answers no request twice

    asyncio.run(main())
