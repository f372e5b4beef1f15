"""The fake Nomad API is strict and behaves like the agent where the pool depends on it.

Known differences between Nomad's published OpenAPI description and a real agent, and what the
fake and the pool do about each (the real agent wins):

- The agent writes Go's nil slices, maps and pointers as ``null`` (``TaskStates``, ``Events``,
  ``RescheduleTracker``, ``Ports`` ...), which the description never marks nullable. The fake
  leaves such fields out, so its answers validate; the pool's parsers accept ``null`` too
  (``tests/unit/test_nomad_job.py``).
- Write answers of the agent carry ``Index`` where the description says ``LastIndex``; the fake
  sends ``LastIndex`` and the pool reads neither.
- The agent's job allocation list leaves ``AllocatedResources`` out of its stubs unless asked;
  the fake leaves it out as well, and the pool reads addresses from ``GET /allocation/{id}``.
- The description declares blocking queries' ``index`` as a header; the agent reads it from the
  query string. The pool does not make blocking queries.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.nomad_testbed import OPENAPI, needs_openapi, wait_until
from trajcore.adapters.pools.nomad_client import (
    NomadClient,
    NomadUnavailable,
    allocation_address,
    parse_allocation_stubs,
)
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import (
    NomadJobSettings,
    NomadJobSpec,
    job_json,
    register_request,
    scale_request,
)
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.fake_nomad.openapi import OPENAPI_ENV, NomadOpenAPI

pytestmark = pytest.mark.anyio

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")  # ignores the slot flags
TOKEN = "token-token-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def fake() -> AsyncIterator[FakeNomadAPI]:
    async with FakeNomadAPI(openapi=OPENAPI, kill_timeout_cap_s=0.5) as api:
        yield api


def sleeper_spec(count: int = 1, **change: object) -> NomadJobSpec:
    settings: dict[str, object] = {"job_id": "sleepers", "driver": "raw_exec", "command": SLEEPER}
    settings.update(change)
    return NomadJobSpec(
        job=NomadJobSettings(**settings),  # type: ignore[arg-type]
        count=count,
        token=TOKEN,
        server=SlotServerSettings(slots_per_container=8),
    )


@needs_openapi
async def test_every_call_the_pool_makes_and_every_answer_fit_the_schema(
    fake: FakeNomadAPI,
) -> None:
    assert OPENAPI is not None
    client = NomadClient(address=fake.address, timeout_s=5.0)
    spec = sleeper_spec()
    assert await client.leader()
    registered = await client.register(spec.job.job_id, register_request(spec))
    assert OPENAPI.check_response("POST", "/job/{jobName}", 200, registered) == []
    job = await client.read_job(spec.job.job_id)
    assert job is not None
    assert OPENAPI.check_response("GET", "/job/{jobName}", 200, job) == []
    await wait_until(lambda: len(fake.running("sleepers")) == 1, "the task runs")
    listing = await client.job_allocations(spec.job.job_id)
    assert OPENAPI.check_response("GET", "/job/{jobName}/allocations", 200, listing) == []
    (stub,) = parse_allocation_stubs(listing)
    allocation = await client.read_allocation(stub.id)
    assert OPENAPI.check_response("GET", "/allocation/{allocID}", 200, allocation) == []
    assert allocation_address(allocation) == fake.running("sleepers")[0].address
    await client.scale(spec.job.job_id, scale_request(spec.job.group, 2, "two"))
    await client.stop_allocation(stub.id)
    await wait_until(lambda: len(fake.running("sleepers")) == 2, "two tasks run")
    assert stub.id not in {a.id for a in fake.running("sleepers")}
    assert await client.deregister(spec.job.job_id, purge=True)
    assert not await client.deregister(spec.job.job_id, purge=True)  # 404: gone
    assert await client.read_job(spec.job.job_id) is None
    assert fake.violations == []
    paths = {(r.method, r.path.replace(stub.id, "{allocID}")) for r in fake.requests}
    assert paths >= {
        ("GET", "/v1/status/leader"),
        ("POST", "/v1/job/sleepers"),
        ("GET", "/v1/job/sleepers"),
        ("GET", "/v1/job/sleepers/allocations"),
        ("GET", "/v1/allocation/{allocID}"),
        ("POST", "/v1/job/sleepers/scale"),
        ("POST", "/v1/allocation/{allocID}/stop"),
        ("DELETE", "/v1/job/sleepers"),
    }


@needs_openapi
async def test_requests_outside_the_schema_are_refused(fake: FakeNomadAPI) -> None:
    client = NomadClient(address=fake.address, timeout_s=5.0)
    request = register_request(sleeper_spec())
    job = request["Job"]
    assert isinstance(job, dict)
    job["TaskGroup"] = "a misspelt field"
    with pytest.raises(NomadUnavailable) as caught:
        await client.register("sleepers", request)
    assert caught.value.status == 400
    assert "'TaskGroup' was unexpected" in str(caught.value)
    async with httpx.AsyncClient(base_url=fake.address) as http:
        bogus = await http.get("/v1/job/sleepers/allocations", params={"bogus": "1"})
        purge = await http.delete("/v1/job/sleepers", params={"purge": "maybe"})
        unknown = await http.get("/v1/nodes/whatever")
    assert (bogus.status_code, purge.status_code, unknown.status_code) == (400, 400, 404)
    assert len(fake.violations) == 3
    assert fake.job("sleepers") is None


def _tweak(body: JSONObject, path: tuple[str | int, ...], value: object) -> JSONObject:
    target: object = body
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    return body


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (("ID",), "two words", "contains a space"),
        (("TaskGroups", 0, "ReschedulePolicy", "Delay"), 1_000_000_000, "less than 5s"),
        (("TaskGroups", 0, "RestartPolicy", "Mode"), "delay", "ambiguous"),
        (("TaskGroups", 0, "Tasks", 0, "Resources", "MemoryMB"), 4, "MemoryMB"),
        (
            ("TaskGroups", 0, "Tasks", 0, "Templates"),
            [{"EmbeddedTmpl": '{{ env "X" }}', "DestPath": "../x"}],
            "escapes",
        ),
        (
            ("TaskGroups", 0, "Tasks", 0, "Templates"),
            [{"EmbeddedTmpl": '{{ key "k" }}', "DestPath": "secrets/x"}],
            "env",
        ),
        (("Datacenters",), [], "datacenters"),
        (("TaskGroups", 0, "EphemeralDisk", "SizeMB"), 20, "log storage"),
    ],
)
async def test_jobs_the_agent_refuses_are_refused(
    fake: FakeNomadAPI, path: tuple[str | int, ...], value: object, reason: str
) -> None:
    body = _tweak(job_json(sleeper_spec()), path, value)
    client = NomadClient(address=fake.address, timeout_s=5.0)
    with pytest.raises(NomadUnavailable, match=reason) as caught:
        await client.register("sleepers", {"Job": body})
    assert caught.value.status == 400
    assert fake.job("sleepers") is None


async def test_a_dead_task_restarts_in_place_then_its_allocation_is_replaced(
    fake: FakeNomadAPI,
) -> None:
    spec = sleeper_spec(restart_attempts=1)
    client = NomadClient(address=fake.address, timeout_s=5.0)
    await client.register(spec.job.job_id, register_request(spec))
    await wait_until(lambda: len(fake.running("sleepers")) == 1, "the task runs")
    (first,) = fake.running("sleepers")
    fake.kill_allocation(first.id)
    await wait_until(
        lambda: [a.restarts for a in fake.running("sleepers")] == [1], "it restarts in place"
    )
    assert fake.running("sleepers")[0].id == first.id
    fake.kill_allocation(first.id)
    await wait_until(
        lambda: [a.id for a in fake.running("sleepers")] not in ([], [first.id]),
        "a replacement allocation runs",
    )
    (old,) = [a for a in fake.allocations("sleepers") if a.id == first.id]
    assert old.client_status == "failed"
    (new,) = fake.running("sleepers")
    assert (new.name, new.index) == (first.name, first.index)
    assert fake.violations == []


async def test_scaling_down_stops_the_highest_indices(fake: FakeNomadAPI) -> None:
    spec = sleeper_spec(count=3)
    client = NomadClient(address=fake.address, timeout_s=5.0)
    await client.register(spec.job.job_id, register_request(spec))
    await wait_until(lambda: len(fake.running("sleepers")) == 3, "three tasks run")
    await client.scale(spec.job.job_id, scale_request(spec.job.group, 1, "one"))
    await wait_until(lambda: len(fake.running("sleepers")) == 1, "one task runs")
    assert [a.index for a in fake.running("sleepers")] == [0]
    assert fake.job("sleepers") is not None
    with anyio.fail_after(5):
        await client.scale(spec.job.job_id, scale_request(spec.job.group, 2, "two"))
    await wait_until(lambda: len(fake.running("sleepers")) == 2, "two tasks run")
    assert sorted(a.index for a in fake.running("sleepers")) == [0, 1]
    assert fake.violations == []


def test_the_openapi_description_is_found_only_through_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(OPENAPI_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"is not set.*@ {OPENAPI_ENV}"):
        NomadOpenAPI.from_env()
    monkeypatch.setenv(OPENAPI_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=f"missing.yaml', which is not a file @ {OPENAPI_ENV}"):
        NomadOpenAPI.from_env()
    not_openapi = tmp_path / "other.yaml"
    not_openapi.write_text("just: text\n", encoding="utf-8")
    monkeypatch.setenv(OPENAPI_ENV, str(not_openapi))
    with pytest.raises(ConfigError, match=f"is not an OpenAPI description @ {OPENAPI_ENV}"):
        NomadOpenAPI.from_env()
