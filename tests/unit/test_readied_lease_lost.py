"""A lease whose process dies before its greeting (``channel.Agent.greeting``,
``sandboxes.Sandboxes.lease_agent``).

The greeting tells a channel that ended (the agent's process died: ``AgentEnded``) from one
that stayed silent past its deadline. A lease the keeper gave its readied process that ends so
is asked for once more at once, logged and counted; a lease that was cloned afresh is not asked
for again, and a second failure names both. The keeper is not started here: each attempt
(``Sandboxes._lease_once``) is scripted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from pathlib import Path
from typing import cast

import pytest

from tests.agent_peer import CAP
from trajcore.adapters.slot_server import sandboxes as sandboxes_module
from trajcore.adapters.slot_server.channel import Agent, AgentEnded, AgentLost
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.workspace import Workspace


async def unread_agent() -> tuple[Agent, socket.socket]:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    agent = Agent(
        reader=reader, writer=writer, sandboxed=True, started_s=time.monotonic(), pid=7, cap=CAP
    )
    return agent, peer


def test_a_channel_that_ends_before_the_greeting_is_an_ended_agent() -> None:
    async def main() -> None:
        agent, peer = await unread_agent()
        peer.close()  # the agent's process died
        started = time.monotonic()
        with pytest.raises(AgentEnded, match=r"ended before it was ready \(end of its channel\)"):
            await agent.greeting(5)
        assert time.monotonic() - started < 1  # at once, not at the deadline
        agent.close_channel()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("greeting", "why"),
    [
        (None, r"^the agent did not greet within 0\.1 s$"),  # silent: lost at its deadline
        (b"[" * 30_000 + b"]" * 30_000, r"^the agent's greeting is not JSON$"),
        (b'{"ready": true, "x": "\xff"}', r"^the agent's greeting is not JSON$"),
        (b"{not json", r"^the agent's greeting is not JSON$"),
    ],
    ids=["silent", "nested-past-the-parser", "not-utf-8", "malformed"],
)
def test_an_agent_that_gives_no_json_greeting_is_lost_naming_why_and_not_ended(
    greeting: bytes | None, why: str
) -> None:
    async def main() -> None:
        agent, peer = await unread_agent()
        try:
            if greeting is not None:
                peer.sendall(struct.pack(">I", len(greeting)) + greeting)
            with pytest.raises(AgentLost, match=why) as caught:
                await agent.greeting(0.1 if greeting is None else 5)
            assert not isinstance(caught.value, AgentEnded)
        finally:
            agent.close_channel()
            peer.close()

    asyncio.run(main())


def scripted(tmp_path: Path, outcomes: list[AgentLost | str]) -> tuple[Sandboxes, Slot, list[str]]:
    """Sandboxes whose lease attempts end as ``outcomes`` say, in order (a string: a greeted
    agent, returned as that string stands for it), and the slot they run for."""
    asked: list[str] = []

    class Scripted(Sandboxes):
        async def _lease_once(self, slot: Slot, *, started: float) -> Agent:
            outcome = outcomes[len(asked)]
            asked.append(type(outcome).__name__)
            if isinstance(outcome, AgentLost):
                raise outcome
            return cast("Agent", outcome)  # stands for the agent

    sandboxes = Scripted(config=RuntimeConfig(slots=1, root=tmp_path))
    slot = Slot(
        index=3, workspace=Workspace(root=tmp_path / "w"), state_dir=tmp_path / "s", cgroup=None
    )
    return sandboxes, slot, asked


def readied_died(pid: int) -> AgentLost:
    return sandboxes_module._ReadiedEnded(
        "the agent ended before it was ready (end of its channel)", pid=pid
    )


def test_a_dead_readied_process_gets_a_fresh_lease_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sandboxes, slot, asked = scripted(tmp_path, [readied_died(5), "fresh"])
    with caplog.at_level(logging.WARNING, logger=sandboxes_module.__name__):
        got = asyncio.run(sandboxes.lease_agent(slot, started=time.monotonic()))
    assert cast("object", got) == "fresh"
    assert asked == ["_ReadiedEnded", "str"]
    assert slot.readied_lost == 1
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "slot 3: its readied lease process (pid 5 in its sandbox) died or hung before the "
        "lease's greeting (the agent ended before it was ready (end of its channel)); starting "
        "the lease in a fresh process"
    )


def test_a_fresh_lease_that_fails_too_names_both_failures(tmp_path: Path) -> None:
    fresh_failed = AgentLost("keeper failed: cannot start a lease: Cannot allocate memory")
    sandboxes, slot, asked = scripted(tmp_path, [readied_died(5), fresh_failed])
    with pytest.raises(AgentLost) as caught:
        asyncio.run(sandboxes.lease_agent(slot, started=time.monotonic()))
    assert str(caught.value) == (
        "the slot's readied lease process (pid 5) died or hung before its greeting (the agent "
        "ended before it was ready (end of its channel)), and a fresh lease failed too: keeper "
        "failed: cannot start a lease: Cannot allocate memory"
    )
    assert asked == ["_ReadiedEnded", "AgentLost"]  # asked for once more, not again
    assert slot.readied_lost == 1


def test_a_freshly_cloned_lease_that_ends_is_not_asked_for_again(tmp_path: Path) -> None:
    ended = AgentEnded("the agent ended before it was ready (end of its channel)")
    sandboxes, slot, asked = scripted(tmp_path, [ended, "never"])
    with pytest.raises(AgentEnded):
        asyncio.run(sandboxes.lease_agent(slot, started=time.monotonic()))
    assert asked == ["AgentEnded"]
    assert slot.readied_lost == 0
