"""``SlotServerPool``'s resets: a slot its server cannot prove clean is quarantined, and a
warning (and the pool's ``problems``) names the slot and the server's reason. One scripted
server, no processes."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import attrs
import pytest

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.pool_core import Member, SlotServerPool
from trajcore.domain.slot_protocol import ResetResult
from trajcore.domain.slot_server_settings import SlotServerSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@attrs.define(eq=False)
class ScriptedResets(SlotServerClient):
    """A client whose server answers each reset with the next of ``answers``."""

    answers: list[ResetResult] = attrs.field(factory=list)

    async def reset(self, slot: int, epoch: int) -> ResetResult:
        return self.answers.pop(0)


@attrs.define
class OneServer:
    """A source of one server, ``c-0``, over ``client``."""

    client: SlotServerClient
    lost_reasons: list[str] = attrs.field(factory=list)

    async def open(self, pool: SlotServerPool[None], stack: AsyncExitStack) -> None:
        pass

    async def start(self, pool: SlotServerPool[None]) -> None:
        pool.join("c-0", self.client, None)

    def lost(self, member: Member[None], reason: str) -> None:
        self.lost_reasons.append(reason)

    async def shutdown(self) -> None:
        pass


async def test_a_reset_the_server_cannot_prove_clean_quarantines_the_slot_saying_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reason = "cannot unmount the forked workspace: [Errno 2] No such file or directory"
    client = ScriptedResets(
        base_url="http://slot-server",
        answers=[ResetResult(slot=0, ok=False, error=reason), ResetResult(slot=0, ok=True)],
    )
    source = OneServer(client)
    pool = SlotServerPool(source, SlotServerSettings(slots_per_container=2), label="scripted")
    async with pool:
        async with pool.lease("a") as first:
            assert str(first.slot) == "c-0/0"
        async with pool.lease("b") as second:
            assert str(second.slot) == "c-0/1"  # the quarantined slot is not leased again
        stats = pool.statistics()
        problems = pool.problems
    assert (stats.leased, stats.quarantined, stats.free) == (0, 1, 1)
    assert source.lost_reasons == []  # the server answered: it stays in service
    expected = f"slot c-0/0 quarantined: {reason}"
    assert problems == [expected]
    warnings = [
        record.getMessage()
        for record in caplog.records
        if record.name == "trajcore.adapters.pools.pool_core" and record.levelno == logging.WARNING
    ]
    assert warnings == [f"scripted pool: {expected}"]
