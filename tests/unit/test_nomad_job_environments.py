"""The Nomad job's task-environment settings: the image cache's flags, the host volume and the
artifacts as Nomad's job API spells them (checked against its OpenAPI description), how a
reference under ``/local/`` reaches an allocation, and each bad setting named."""

from __future__ import annotations

import pytest

from tests.nomad_testbed import OPENAPI, needs_openapi
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import (
    EnvironmentArtifact,
    NomadJobSettings,
    NomadJobSpec,
    job_json,
    register_request,
)
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings

SHELL = EnvironmentArtifact(source="https://images.internal/shell.tar", destination="shell.tar")
LAYOUT = EnvironmentArtifact(
    source="/srv/layouts/task-17", destination="task-17", unpack=True, checksum="sha256:ab12"
)


def spec(**job: object) -> NomadJobSpec:
    return NomadJobSpec(
        job=NomadJobSettings(**job),  # type: ignore[arg-type]
        server=SlotServerSettings(slots_per_container=2),
        count=1,
        token="t" * 32,
    )


def group_of(built: NomadJobSpec) -> JSONObject:
    groups = job_json(built)["TaskGroups"]
    assert isinstance(groups, list)
    assert isinstance(groups[0], dict)
    return groups[0]


def task_of(built: NomadJobSpec) -> JSONObject:
    tasks = group_of(built)["Tasks"]
    assert isinstance(tasks, list)
    assert isinstance(tasks[0], dict)
    return tasks[0]


def test_the_cache_reaches_the_servers_flags_and_the_artifacts_the_task() -> None:
    built = spec(image_cache_dir="/var/cache/trajcore/images", image_cache_bytes=1 << 30,
                 image_cache_volume="trajcore-images", artifacts=[SHELL, LAYOUT])  # fmt: skip
    args = built.server_args()
    assert args[-4:] == ["--image-cache", "/var/cache/trajcore/images", "--image-cache-bytes",
                         str(1 << 30)]  # fmt: skip
    task = task_of(built)
    assert task["Artifacts"] == [
        {"GetterSource": "https://images.internal/shell.tar",
         "RelativeDest": "local/environments/shell.tar", "GetterMode": "file",
         "GetterOptions": {"archive": "false"}},
        {"GetterSource": "/srv/layouts/task-17", "RelativeDest": "local/environments/task-17",
         "GetterMode": "dir", "GetterOptions": {"checksum": "sha256:ab12"}},
    ]  # fmt: skip
    assert task["VolumeMounts"] == [
        {"Volume": "trajcore-image-cache", "Destination": "/var/cache/trajcore/images",
         "ReadOnly": False}
    ]  # fmt: skip
    assert group_of(built)["Volumes"] == {
        "trajcore-image-cache": {"Name": "trajcore-image-cache", "Type": "host",
                                 "Source": "trajcore-images", "ReadOnly": False}
    }  # fmt: skip
    assert (SHELL.path, LAYOUT.path) == (
        "/local/environments/shell.tar",
        "/local/environments/task-17",
    )


def test_without_a_cache_nothing_changes() -> None:
    task = task_of(spec())
    assert "--image-cache" not in spec().server_args()
    assert "Artifacts" not in task
    assert "VolumeMounts" not in task


@needs_openapi
def test_the_environment_settings_validate_against_nomads_job_schema() -> None:
    assert OPENAPI is not None
    built = spec(image_cache_dir="/c", image_cache_volume="v", artifacts=[SHELL, LAYOUT])
    assert OPENAPI.check_schema("Job", job_json(built)) == []
    assert OPENAPI.check_request("POST", "/job/{jobName}", {}, register_request(built)) == []


@pytest.mark.parametrize(
    ("field", "settings"),
    [
        ("image_cache_dir", {"artifacts": [SHELL]}),
        ("image_cache_dir", {"image_cache_volume": "v"}),
        ("image_cache_dir", {"image_cache_dir": "relative/cache"}),
        ("image_cache_dir", {"image_cache_dir": "/with space"}),
        (
            "image_cache_volume",
            {
                "image_cache_dir": "/c",
                "image_cache_volume": "v",
                "driver": "raw_exec",
                "command": "slot-server",
            },
        ),
        ("client_alloc_dir", {"client_alloc_dir": "/opt/nomad/data/alloc"}),
        ("client_alloc_dir", {"driver": "raw_exec", "command": "s", "client_alloc_dir": "alloc"}),
        ("artifacts", {"image_cache_dir": "/c", "artifacts": [SHELL, SHELL]}),
        ("artifacts", {"image_cache_dir": "/c", "artifacts": "shell.tar"}),
    ],
)
def test_a_bad_environment_setting_names_its_field(field: str, settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        NomadJobSettings(**settings)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("field", "artifact"),
    [
        ("destination", {"source": "/s", "destination": "../escape"}),
        ("destination", {"source": "/s", "destination": "/abs"}),
        ("source", {"source": " ", "destination": "d"}),
        ("checksum", {"source": "/s", "destination": "d", "checksum": "nocolon"}),
    ],
)
def test_a_bad_artifact_names_its_field(field: str, artifact: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        EnvironmentArtifact(**artifact)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_raw_exec_task_reads_local_references_in_its_own_directory() -> None:
    raw = NomadJobSettings(
        driver="raw_exec",
        command="slot-server",
        image_cache_dir="/c",
        artifacts=[LAYOUT],
        client_alloc_dir="/opt/nomad/data/alloc/",
    )
    assert raw.task_reference("oci:/local/environments/task-17:v1", "a1") == (
        "oci:/opt/nomad/data/alloc/a1/slot-server/local/environments/task-17:v1"
    )
    assert raw.task_reference("oci:/srv/images/x", "a1") == "oci:/srv/images/x"
    assert raw.task_reference("containers-storage:x", "a1") == "containers-storage:x"
    docker = NomadJobSettings(image_cache_dir="/c", artifacts=[LAYOUT])
    assert docker.task_reference("oci:/local/environments/task-17", "a1") == (
        "oci:/local/environments/task-17"
    )


def test_a_local_reference_no_allocation_can_find_is_refused_naming_why() -> None:
    job = NomadJobSettings(image_cache_dir="/c", artifacts=[LAYOUT])
    assert job.reference_refusal("oci:/local/environments/task-17") is None
    assert job.reference_refusal("oci:/local/environments/task-17/sub") is None
    assert job.reference_refusal("oci:/srv/images/x") is None
    refused = job.reference_refusal("oci-archive:/local/environments/task-18.tar")
    assert refused is not None
    assert refused[0] == "artifacts"
    assert "/local/environments/task-18.tar" in refused[1]
    assert "/local/environments/task-17" in refused[1]  # what the job places
    raw = NomadJobSettings(driver="raw_exec", command="s", image_cache_dir="/c", artifacts=[LAYOUT])
    refused = raw.reference_refusal("oci:/local/environments/task-17")
    assert refused is not None
    assert refused[0] == "client_alloc_dir"


def test_the_envs_image_cache_reaches_the_nomad_job() -> None:
    settings = SandboxSettings(image_cache_dir="/var/cache/images", image_cache_bytes=1 << 30)
    job = settings.nomad_pool_config().job
    assert (job.image_cache_dir, job.image_cache_bytes) == ("/var/cache/images", 1 << 30)
    with pytest.raises(ConfigError) as caught:
        SandboxSettings(image_cache_dir="relative").nomad_pool_config()
    assert caught.value.field == "image_cache_dir"
