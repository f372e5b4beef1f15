"""The fake Nomad honours a task's artifacts as Nomad does: each is fetched into the task
directory before the task starts (a file placed, a folder copied, its checksum checked); one
that cannot be fetched is the ``Failed Artifact Download`` event and the task never starts;
an artifact Nomad would refuse at registration is a 400."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.nomad_testbed import OPENAPI, group_and_task, wait_until
from trajcore.adapters.pools.nomad_client import (
    NomadClient,
    NomadUnavailable,
    parse_allocation_stubs,
)
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import (
    EnvironmentArtifact,
    NomadJobSettings,
    NomadJobSpec,
    job_json,
    register_request,
)
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

pytestmark = pytest.mark.anyio

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def fake() -> AsyncIterator[FakeNomadAPI]:
    async with FakeNomadAPI(openapi=OPENAPI, kill_timeout_cap_s=0.5) as api:
        yield api


def spec(*artifacts: EnvironmentArtifact) -> NomadJobSpec:
    job = NomadJobSettings(
        job_id="fetchers", driver="raw_exec", command=SLEEPER, image_cache_dir="/c",
        artifacts=artifacts,
    )  # fmt: skip
    return NomadJobSpec(
        job=job, count=1, token="token-token-token",
        server=SlotServerSettings(slots_per_container=1),
    )  # fmt: skip


async def test_artifacts_are_in_the_task_directory_when_the_task_starts(
    fake: FakeNomadAPI, tmp_path: Path
) -> None:
    archive = tmp_path / "task.tar"
    archive.write_bytes(b"an archive kept as it is")
    layout = tmp_path / "layout"
    (layout / "blobs").mkdir(parents=True)
    (layout / "index.json").write_text("{}")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    job = spec(
        EnvironmentArtifact(
            source=str(archive), destination="task.tar", checksum=f"sha256:{digest}"
        ),
        EnvironmentArtifact(source=f"file://{layout}", destination="sets/layout", unpack=True),
    )
    await NomadClient(address=fake.address, timeout_s=5.0).register(
        "fetchers", register_request(job)
    )
    await wait_until(lambda: len(fake.running("fetchers")) == 1, "the task runs")
    (alloc,) = fake.running("fetchers")
    local = fake.alloc_dir / alloc.id / job.job.task / "local" / "environments"
    assert (local / "task.tar").read_bytes() == b"an archive kept as it is"
    assert (local / "sets" / "layout" / "index.json").read_text() == "{}"
    assert (local / "sets" / "layout" / "blobs").is_dir()
    assert fake.violations == []


@pytest.mark.parametrize(
    ("checksum", "missing", "reason"),
    [
        (None, True, "no such file or directory"),
        ("sha256:00", False, "checksums did not match"),
    ],
)
async def test_an_artifact_that_cannot_be_fetched_never_starts_the_task(
    fake: FakeNomadAPI, tmp_path: Path, checksum: str | None, missing: bool, reason: str
) -> None:
    source = tmp_path / "task.tar"
    if not missing:
        source.write_bytes(b"x")
    job = spec(EnvironmentArtifact(source=str(source), destination="t.tar", checksum=checksum))
    client = NomadClient(address=fake.address, timeout_s=5.0)
    await client.register("fetchers", register_request(job))
    await wait_until(
        lambda: any(a.client_status == "failed" for a in fake.allocations("fetchers")),
        "the allocation fails",
    )
    assert fake.running("fetchers") == []
    failed = next(a for a in fake.allocations("fetchers") if a.client_status == "failed")
    events = await client.read_allocation(failed.id)
    assert isinstance(events, dict)
    states = events["TaskStates"]
    assert isinstance(states, dict)
    task = states[job.job.task]
    assert isinstance(task, dict)
    messages = [e for e in task["Events"] if isinstance(e, dict)]  # type: ignore[union-attr]
    downloads = [e for e in messages if e["Type"] == "Failed Artifact Download"]
    assert downloads, messages
    assert reason in str(downloads[0]["Message"])
    assert str(source) in str(downloads[0]["Message"])
    # what the pool reads of it: the stub's failure, which its start error then names
    (stub,) = [s for s in parse_allocation_stubs(await client.job_allocations("fetchers"))
               if s.id == failed.id]  # fmt: skip
    assert stub.failure.startswith("Failed Artifact Download: failed to download artifact")
    assert reason in stub.failure


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"RelativeDest": "../../escape"}, "escapes allocation directory"),
        ({"GetterMode": "sideways"}, "invalid artifact mode"),
        ({"GetterSource": ""}, "source must be specified"),
    ],
)
async def test_an_artifact_nomad_refuses_is_a_400(
    fake: FakeNomadAPI, change: JSONObject, reason: str
) -> None:
    body = job_json(spec(EnvironmentArtifact(source="/s", destination="d")))
    _, task = group_and_task(body)
    artifacts = task["Artifacts"]
    assert isinstance(artifacts, list)
    artifact = artifacts[0]
    assert isinstance(artifact, dict)
    artifact.update(change)
    with pytest.raises(NomadUnavailable, match=reason) as caught:
        await NomadClient(address=fake.address, timeout_s=5.0).register("fetchers", {"Job": body})
    assert caught.value.status == 400
