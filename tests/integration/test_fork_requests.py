"""Several forks of one snapshot in one request (``POST /v1/lease/fork``), in a real slot server.

The forks of one snapshot that a client is asked for in the same turns of the event loop (a
group's members, ``SlotTools.fork``) travel as one request, counted by the server's health; each
lease of it is answered on its own, so a lease the server refuses fails alone and the others
start, each in its own slot and epoch, with its own copy of the snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.environment_roots import image_problem
from tests.integration.test_environment_leases import reset, shell
from tests.integration.test_slot_server import Server
from tests.integration.test_snapshots import prepared_snapshot, snapshot_server

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    with snapshot_server("fork-requests") as running:
        yield running


def test_forks_asked_together_travel_in_one_request_and_stay_apart(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            snapshot = await prepared_snapshot(client, server, ref, 1)
            before = await client.health()
            slots = (1, 2, 3)
            answers = await asyncio.gather(
                *(client.lease(slot, 1, ref, snapshot=snapshot) for slot in slots)
            )
            after = await client.health()
            assert [(a.slot, a.epoch, a.ok, a.snapshot) for a in answers] == [
                (slot, 1, True, snapshot) for slot in slots
            ], answers
            assert after.fork_requests - before.fork_requests == 1, (before, after)
            assert after.forks - before.forks == len(slots), (before, after)
            for slot in slots:  # each writes over its own copy
                code, text = await shell(
                    server, slot, 1, f"echo {slot} >> /workspace/prep.txt; cat /workspace/prep.txt"
                )
                assert (code, text.split()) == (0, ["prepared", str(slot)]), text
            for slot in (0, *slots):
                await reset(server, slot, 1)
            assert (await client.drop_snapshot(snapshot)).ok

    asyncio.run(main())


def test_a_refused_lease_of_a_fork_request_fails_alone(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            snapshot = await prepared_snapshot(client, server, ref, 2)
            await reset(server, 2, 2)  # slot 2's epoch 2 is retired: a stale lease
            before = await client.health()
            answers = await client.fork(ref, snapshot, [(1, 2), (2, 2), (99, 1), (3, 2)])
            after = await client.health()
            assert after.fork_requests - before.fork_requests == 1, (before, after)
            assert [(a.slot, a.ok, a.field) for a in answers] == [
                (1, True, None),
                (2, False, "epoch"),
                (99, False, "slot"),
                (3, True, None),
            ], answers
            assert after.forks - before.forks == 2, (before, after)
            for slot in (1, 3):  # the others started from the snapshot
                code, text = await shell(server, slot, 2, "cat /workspace/prep.txt")
                assert (code, text.split()) == (0, ["prepared"]), text
            # the refused slot was never started from it: its next lease runs as any
            code, text = await shell(server, 2, 3, "ls /workspace | wc -l")
            assert (code, text.split()) == (0, ["0"]), text
            for slot, epoch in ((0, 2), (1, 2), (3, 2), (2, 3)):
                await reset(server, slot, epoch)
            assert (await client.drop_snapshot(snapshot)).ok

    asyncio.run(main())
