"""The decisions of the Nomad job's task-environment settings that its other tests leave open:
which artifacts are refused and what each refusal says, how a raw_exec task's directory is
joined onto a reference, and what a refused reference says the job places.

Every artifact here is built inside its test, not at import, so that what the test checks runs
when the test does."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import EnvironmentArtifact, NomadJobSettings, NomadJobSpec, job_json
from trajcore.domain.slot_server_settings import SlotServerSettings


def _refusal(**artifact: object) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        EnvironmentArtifact(**artifact)  # type: ignore[arg-type]
    return caught.value.field, caught.value.reason


def test_an_artifact_must_name_what_nomad_fetches() -> None:
    assert _refusal(source="  ", destination="a.tar") == (
        "source",
        "must name what Nomad fetches (a URL or a path on the client), got '  '",
    )


@pytest.mark.parametrize("destination", ["a..b", "x/y..", "v1.0/img.tar", "a/b.c"])
def test_dots_inside_a_name_are_taken(destination: str) -> None:
    """A name's parts start with a letter or digit; dots after that are the name's own."""
    artifact = EnvironmentArtifact(source="https://h/x.tar", destination=destination)
    assert artifact.path == f"/local/environments/{destination}"


@pytest.mark.parametrize("checksum", ["sha256:ab12", "md5:0f", "sha256:ab:cd"])
def test_a_checksum_of_type_and_value_is_passed_to_nomad(checksum: str) -> None:
    """Whatever follows the first colon is the value, colons included."""
    artifact = EnvironmentArtifact(source="/srv/a.tar", destination="a.tar", checksum=checksum)
    assert artifact.artifact_json()["GetterOptions"] == {"archive": "false", "checksum": checksum}


@pytest.mark.parametrize(
    "checksum", ["sha256", "sha256:", ":ab12", ":sha256:ab12", "sha256:ab 12", " sha256:ab12"]
)
def test_a_checksum_without_a_type_a_value_or_with_a_space_is_refused(checksum: str) -> None:
    """The type is what stands before the first colon and must not be empty, nor the value."""
    assert _refusal(source="/srv/a.tar", destination="a.tar", checksum=checksum) == (
        "checksum",
        f"must be type:value (sha256:<hex>), got {checksum!r}",
    )


def _raw_exec(client_alloc_dir: str | None) -> NomadJobSettings:
    layout = EnvironmentArtifact(source="/srv/layouts/t", destination="t", unpack=True)
    return NomadJobSettings(
        driver="raw_exec",
        command="slot-server",
        image_cache_dir="/c",
        artifacts=[layout],
        client_alloc_dir=client_alloc_dir,
    )


def test_a_raw_exec_task_without_the_clients_alloc_dir_reads_references_as_they_are() -> None:
    assert _raw_exec(None).task_reference("oci:/local/environments/t", "a1") == (
        "oci:/local/environments/t"
    )


def test_the_alloc_dir_loses_only_its_trailing_slashes_before_the_allocation_is_joined() -> None:
    assert _raw_exec("/mnt/ALLOCX//").task_reference("oci:/local/environments/t", "a1") == (
        "oci:/mnt/ALLOCX/a1/slot-server/local/environments/t"
    )


def test_a_reference_no_artifact_places_is_refused_listing_what_the_job_places() -> None:
    artifacts = [
        EnvironmentArtifact(source="/srv/a", destination="a", unpack=True),
        EnvironmentArtifact(source="/srv/b.tar", destination="b.tar"),
    ]
    job = NomadJobSettings(job_id="slots", image_cache_dir="/c", artifacts=artifacts)
    assert job.reference_refusal("oci:/local/environments/c") == (
        "artifacts",
        "no artifact of the Nomad job slots places /local/environments/c (its artifacts place "
        "/local/environments/a, /local/environments/b.tar; NomadJobSettings.artifacts)",
    )
    bare = NomadJobSettings(job_id="slots", image_cache_dir="/c")
    assert bare.reference_refusal("oci:/local/environments/c") == (
        "artifacts",
        "no artifact of the Nomad job slots places /local/environments/c (its artifacts place "
        "nothing; NomadJobSettings.artifacts)",
    )


def test_a_raw_exec_task_without_the_alloc_dir_refuses_local_references_saying_what_to_set() -> (
    None
):
    assert _raw_exec(None).reference_refusal("oci:/local/environments/t") == (
        "client_alloc_dir",
        "a raw_exec task reads /local/environments/t in its own task directory on the client: "
        "set NomadJobSettings.client_alloc_dir to the clients' <data_dir>/alloc",
    )


def _task(job: NomadJobSettings) -> JSONObject:
    spec = NomadJobSpec(job=job, server=SlotServerSettings(), count=1, token="t" * 32)
    groups = job_json(spec)["TaskGroups"]
    assert isinstance(groups, list)
    assert isinstance(groups[0], dict)
    tasks = groups[0]["Tasks"]
    assert isinstance(tasks, list)
    assert isinstance(tasks[0], dict)
    return tasks[0]


def test_a_cache_directory_without_a_host_volume_mounts_nothing_into_the_task() -> None:
    """The task mounts the cache's volume only when the job names one; a cache directory
    alone is a path the task reads as it is."""
    docker = NomadJobSettings(image_cache_dir="/cache")
    raw = NomadJobSettings(driver="raw_exec", command="slot-server", image_cache_dir="/cache")
    assert "VolumeMounts" not in _task(docker)
    assert "VolumeMounts" not in _task(raw)
    mounted = NomadJobSettings(image_cache_dir="/cache", image_cache_volume="images")
    assert "VolumeMounts" in _task(mounted)


def _job_refusal(**settings: object) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        NomadJobSettings(**settings)  # type: ignore[arg-type]
    return caught.value.field, caught.value.reason


def test_the_job_refuses_environment_settings_that_cannot_work_saying_what_to_set() -> None:
    """Each refusal names the setting at fault and, in full, why and what to set instead."""
    layout = EnvironmentArtifact(source="/srv/t", destination="t", unpack=True)
    assert _job_refusal(image_cache_dir="/c", artifacts=["t.tar"]) == (
        "artifacts",
        "expected EnvironmentArtifact values, got 't.tar'",
    )
    assert _job_refusal(artifacts=[layout]) == (
        "image_cache_dir",
        "artifacts and image_cache_volume are task environments: set image_cache_dir",
    )
    assert _job_refusal(
        driver="raw_exec", command="s", image_cache_dir="/c", image_cache_volume="images"
    ) == (
        "image_cache_volume",
        "raw_exec tasks run on the client's own file system and mount no volume: name the "
        "client's path in image_cache_dir",
    )
    assert _job_refusal(driver="exec", command="s", client_alloc_dir="/alloc") == (
        "client_alloc_dir",
        "only raw_exec tasks read the client's paths; exec tasks see /local",
    )


@pytest.mark.parametrize(("first", "second"), [("t", "t"), ("t", "t/sub"), ("t/sub", "t")])
def test_two_artifacts_may_not_land_at_one_place_or_one_inside_the_other(
    first: str, second: str
) -> None:
    artifacts = [
        EnvironmentArtifact(source="/srv/a", destination=first, unpack=True),
        EnvironmentArtifact(source="/srv/b", destination=second, unpack=True),
    ]
    field, reason = _job_refusal(image_cache_dir="/c", artifacts=artifacts)
    assert field == "artifacts"
    assert reason == "two artifacts land at local/environments/t (or one inside the other)"


def test_artifacts_whose_names_only_share_a_prefix_land_apart() -> None:
    artifacts = [
        EnvironmentArtifact(source="/srv/a", destination="t", unpack=True),
        EnvironmentArtifact(source="/srv/b", destination="t2/sub", unpack=True),
        EnvironmentArtifact(source="/srv/c", destination="t2/sub2", unpack=True),
    ]
    assert NomadJobSettings(image_cache_dir="/c", artifacts=artifacts).artifacts == tuple(artifacts)


def test_directories_on_the_clients_are_refused_saying_what_a_directory_must_be() -> None:
    assert _job_refusal(driver="raw_exec", command="s", client_alloc_dir="/alloc\0x") == (
        "client_alloc_dir",
        "must be None or an absolute path on the clients, got '/alloc\\x00x'",
    )
    assert _job_refusal(image_cache_dir="cache") == (
        "image_cache_dir",
        "must be None or an absolute path as the task sees it (or one under "
        "${NOMAD_ALLOC_DIR}), without spaces, ',' or ':', got 'cache'",
    )


def test_artifacts_are_a_list_of_artifacts_and_a_cache_path_may_hold_any_other_letter() -> None:
    assert _job_refusal(image_cache_dir="/c", artifacts="t.tar") == (
        "artifacts",
        "expected EnvironmentArtifact values, got 't.tar'",
    )
    assert NomadJobSettings(image_cache_dir="/X/cache-X").image_cache_dir == "/X/cache-X"


def test_a_cache_directory_may_start_at_a_nomad_variable_spelt_as_nomad_spells_it() -> None:
    """Pins the other root a task-side cache path may have: a Nomad variable
    (``${NOMAD_ALLOC_DIR}/images``, which the task sees as a path), in Nomad's upper case; a
    variable in other letters is no Nomad variable, so a relative path, and refused."""
    under_alloc = "${NOMAD_ALLOC_DIR}/images"
    assert NomadJobSettings(image_cache_dir=under_alloc).image_cache_dir == under_alloc
    field, reason = _job_refusal(image_cache_dir="${nomad_alloc_dir}/images")
    assert field == "image_cache_dir"
    assert reason.endswith("got '${nomad_alloc_dir}/images'")
