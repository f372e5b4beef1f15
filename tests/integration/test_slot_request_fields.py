"""A slot server refuses a request body with a key its request does not know.

A misspelt field (``snapshott``, ``enviroment``) must not be dropped: the server would then run
another request than the one asked, a plain lease for a lease from a snapshot. Every JSON
endpoint answers it with 400, the unknown key's path as ``field``, and a reason naming the key
and the fields the request takes; nothing of the request runs, so the right request after it
works as if the bad one had never come.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.integration.test_slot_server import (
    TOKEN,
    Server,
    call,
    one,
    searchable_dir,
    start_server,
    stop_server,
)
from trajcore.domain.tools import ToolOutcome

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    """A slot server with an image cache, and the reference of a small image with a shell."""
    with searchable_dir("request-fields") as folder:
        write_shell_image(folder / "layout")
        running = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        yield running, f"oci:{folder / 'layout'}"
        assert stop_server(running) == 0


async def post(server: Server, path: str, body: object) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.ready['address']}{path}",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        answer: dict[str, object] = json.loads(await response.text())
        return response.status, answer


def test_a_misspelt_lease_field_is_refused_and_the_right_lease_then_runs(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        asked = {"slot": 0, "epoch": 1, "environment": ref, "snapshott": "s-1"}
        status, answer = await post(server, "/v1/lease", asked)
        assert status == 400, answer
        assert answer["field"] == "$.snapshott", answer
        reason = str(answer["error"])
        assert "unknown field 'snapshott'" in reason, reason
        assert "slot, epoch, environment, snapshot" in reason, reason
        # a misspelt required field names the unknown key, not only the missing one
        status, answer = await post(server, "/v1/lease", {"slot": 0, "epoch": 1, "enviroment": ref})
        assert (status, answer["field"]) == (400, "$.enviroment"), answer
        # nothing of either ran: the epoch has no lease yet, and takes the right one
        status, answer = await post(
            server, "/v1/lease", {"slot": 0, "epoch": 1, "environment": ref}
        )
        assert (status, answer["ok"]) == (200, True), answer
        async with server.client() as client:
            result = await one(client, call(0, "bash", command="cat /etc/os-release"))
            assert result.outcome is ToolOutcome.OK, result
            assert "trajcore-test-image" in result.content
            assert (await client.reset(0, 1)).ok

    asyncio.run(main())


ENDPOINTS: list[tuple[str, dict[str, object], str, str]] = [
    ("/v1/reset", {"slot": 1, "epoch": 1, "timeout": 5}, "$.timeout", "ResetRequest"),
    (
        "/v1/lease/fork",
        {"environment": "", "snapshot": "s", "leases": [{"slot": 1, "epoch": 1, "epcoh": 2}]},
        "$.leases[0].epcoh",
        "ForkLease",
    ),
    ("/v1/lease/fork", {"environment": "", "snapshot": "s", "leases": [], "x": 1}, "$.x", "Fork"),
    ("/v1/snapshot", {"slot": 1, "epoch": 1, "name": "a"}, "$.name", "SnapshotRequest"),
    ("/v1/snapshot/drop", {"snapshot": "s", "slot": 1}, "$.slot", "DropSnapshotRequest"),
    ("/v1/artifacts/read", {"slot": 1, "path": "a", "max_byte": 1}, "$.max_byte", "ReadArtifact"),
    ("/v1/artifacts/list", {"slot": 1, "path": ".", "depth": 1}, "$.depth", "ListArtifacts"),
    ("/v1/artifacts/archive", {"slot": 1, "path": ".", "gzip": True}, "$.gzip", "ArchiveArtif"),
    (
        "/v1/execute",
        {"calls": [{"slot": 1, "epoch": 1, "call_id": "c", "tool": "bash", "hookk": True}]},
        "$.calls[0].hookk",
        "ExecuteCall",
    ),
    ("/v1/execute", {"calls": [], "batch": 1}, "$.batch", "ExecuteRequest"),
]


@pytest.mark.parametrize(("path", "body", "field", "kind"), ENDPOINTS)
def test_every_json_endpoint_refuses_an_unknown_field_by_name(
    image_server: tuple[Server, str], path: str, body: dict[str, object], field: str, kind: str
) -> None:
    server, _ = image_server
    status, answer = asyncio.run(post(server, path, body))
    assert status == 400, answer
    assert answer["field"] == field, answer
    unknown = field.rpartition(".")[2]
    assert f"unknown field '{unknown}'" in str(answer["error"]), answer
    assert kind in str(answer["error"]), answer


def test_a_refused_batch_runs_none_of_its_calls(image_server: tuple[Server, str]) -> None:
    server, _ = image_server
    good = {"slot": 2, "epoch": 1, "call_id": "w", "tool": "bash", "timeout_s": 5}
    bad = {**good, "call_id": "x", "time_left": 1}
    write = {**good, "arguments": {"command": "echo ran > ran"}}

    async def main() -> None:
        status, answer = await post(server, "/v1/execute", {"calls": [write, bad]})
        assert (status, answer["field"]) == (400, "$.calls[1].time_left"), answer
        async with server.client() as client:
            found = call(2, "bash", command="test -e ran && echo ran || echo none")
            result = await one(client, found)
            assert result.content.strip() == "none", result
            assert (await client.reset(2, 1)).ok

    asyncio.run(main())
