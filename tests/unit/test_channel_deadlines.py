"""A lease channel's deadlines with one timer per channel (``channel._Replies``): a request's
answer leaves the timer armed for the next request, which moves it on or, when it must fire
sooner, replaces it. Each request is still lost at its own deadline, never at one an earlier
request set, and never late.

The test plays the agent on the other end of a socket pair (as ``test_channel_replies``).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tests.agent_peer import frame, greeted, read_request
from trajcore.adapters.slot_server.channel import Agent, AgentLost, encode_request
from trajcore.domain.json_values import JSON

REPLY: dict[str, JSON] = {
    "exit": 0, "signal": None, "stdout": "", "stderr": "", "stdout_dropped": 0,
    "stderr_dropped": 0, "timed_out": False, "duration": 0.001,
}  # fmt: skip


ASK = encode_request(["exec", "5.0", "1000", "/bin/sh", "-c", "true"])


async def answered(agent: Agent, peer: socket.socket, timeout_s: float) -> None:
    """One request answered at once (the agent's side played in a thread)."""

    def play() -> None:
        read_request(peer)
        peer.sendall(frame(REPLY))

    played = asyncio.ensure_future(asyncio.to_thread(play))
    assert await agent.request(ASK, timeout_s) == REPLY
    await played


def test_a_later_request_is_not_lost_at_an_earlier_requests_deadline() -> None:
    async def main() -> float:
        async with greeted() as (agent, peer):
            for _ in range(20):
                await answered(agent, peer, 0.5)
            await asyncio.sleep(0.3)  # the first timer, left armed, fires meanwhile or soon
            started = time.monotonic()
            with pytest.raises(AgentLost, match=r"did not answer within 0\.5 s"):
                await agent.request(ASK, 0.5)
            assert read_request(peer) == ASK
            return time.monotonic() - started

    took = asyncio.run(main())
    assert 0.5 <= took < 3  # its own deadline: not the 0.2 s left of the first request's


def test_a_shorter_timeout_after_a_longer_one_fires_at_its_own_deadline() -> None:
    async def main() -> float:
        async with greeted() as (agent, peer):
            await answered(agent, peer, 60.0)  # leaves a timer a minute away
            started = time.monotonic()
            with pytest.raises(AgentLost, match=r"did not answer within 0\.2 s"):
                await agent.request(ASK, 0.2)
            return time.monotonic() - started

    took = asyncio.run(main())
    assert 0.2 <= took < 3


def test_control_requests_answered_in_time_keep_the_lease() -> None:
    async def main() -> bool:
        async with greeted() as (agent, peer):
            for _ in range(5):
                await answered(agent, peer, 0.2)
                await asyncio.sleep(0.1)  # past earlier deadlines, answered each time
            await asyncio.sleep(0.3)  # the timer fires with nothing under way: the lease stays
            await answered(agent, peer, 0.2)
            return agent.alive()

    assert asyncio.run(main())
