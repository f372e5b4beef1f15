"""A snapshot request whose caller is cancelled leaves no snapshot behind.

``environment_leasing.freeze`` asks a slot server to freeze a lease. A caller cancelled while
the request is out (the trajectory's deadline in ``SlotTools.fork``, ``prepare_once``'s
deadline) would never learn the snapshot's id, and a snapshot nobody can drop stays on its
server until it closes, holding its image and counting against the server's snapshot bytes.
The request is shielded and a snapshot made for a cancelled caller is dropped at once. The
cancellation is made certain here: a client that cancels its caller's scope once the server has
answered, before the caller has the answer (on the code before, the snapshot stayed held).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
import attrs
import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.integration.test_slot_server import (
    TOKEN,
    Server,
    searchable_dir,
    start_server,
    stop_server,
)
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.environment_leasing import EnvironmentCounters, freeze
from trajcore.domain.slot_protocol import ExecuteCall, SnapshotAnswer
from trajcore.domain.slots import Lease, SlotId
from trajcore.domain.tools import ToolOutcome

pytestmark = pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))


@attrs.define(eq=False)
class CancelledOnAnswer(SlotServerClient):
    """A client whose snapshot request cancels ``scope`` once the server has answered, and then
    reaches a checkpoint: the cancellation arrives between the answer and its caller."""

    scope: anyio.CancelScope | None = None

    async def snapshot(self, slot: int, epoch: int) -> SnapshotAnswer:
        answer = await super().snapshot(slot, epoch)
        assert self.scope is not None
        self.scope.cancel()
        await anyio.lowlevel.checkpoint()
        return answer


@pytest.fixture
def image_server() -> Iterator[tuple[Server, str]]:
    with searchable_dir("snapshot-cancelled") as folder:
        write_shell_image(folder / "layout", salt="snapshot-cancelled")
        server = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        try:
            yield server, f"oci:{folder / 'layout'}"
        finally:
            assert stop_server(server) == 0


async def prepared_lease(client: SlotServerClient, ref: str, epoch: int) -> Lease:
    assert (await client.lease(0, epoch, ref)).ok
    asked = ExecuteCall(
        slot=0, epoch=epoch, call_id=f"prepare-{epoch}", tool="bash",
        arguments={"command": "echo prepared > /workspace/notes"}, timeout_s=10.0,
    )  # fmt: skip
    (result,) = await client.execute([asked])
    assert result.outcome is ToolOutcome.OK, result
    return Lease(slot=SlotId(container="c", index=0), epoch=epoch, holder="t")


def test_a_snapshot_made_for_a_cancelled_caller_is_dropped(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        address = server.ready["address"]
        async with (
            server.client() as plain,
            CancelledOnAnswer.tcp(address, TOKEN) as cancelling,
        ):
            assert isinstance(cancelling, CancelledOnAnswer)
            # the control: a caller that is not cancelled holds the snapshot until it drops it
            lease = await prepared_lease(plain, ref, 1)
            kept = await freeze(plain, lease, ref, EnvironmentCounters())
            assert (await plain.reset(0, 1)).ok
            assert (await plain.health()).snapshots == 1
            assert (await plain.drop_snapshot(kept.snapshot)).ok
            assert (await plain.health()).snapshots == 0
            # a caller cancelled once the server has answered
            lease = await prepared_lease(plain, ref, 2)
            got = None
            with anyio.CancelScope() as scope:
                cancelling.scope = scope
                got = await freeze(cancelling, lease, ref, EnvironmentCounters())
            assert scope.cancelled_caught
            assert got is None
            assert (await plain.reset(0, 2)).ok  # the lease's release, as the pool does
            health = await plain.health()
            assert (health.snapshots, health.snapshot_bytes) == (0, 0)

    asyncio.run(main())
