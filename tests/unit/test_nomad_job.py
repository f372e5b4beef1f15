"""The Nomad job spec (``trajcore.domain.nomad_job``); Nomad's answers: ``test_nomad_answers``.

Schema checks read Nomad's own OpenAPI description (``nomad-openapi-v1.yaml``, found through
``TRAJCORE_NOMAD_OPENAPI``, by default ``../shared/reference/`` beside the repository) with
unknown fields refused; they skip, naming the variable, when it names no file. Everything else
runs anyway.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.flat_settings import split_off
from tests.nomad_testbed import OPENAPI, group_and_task, needs_openapi
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import (
    DRIVERS,
    PORT_LABEL,
    NomadJobSettings,
    NomadJobSpec,
    job_json,
    register_request,
    scale_request,
)
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.entrypoints.slot_server import parse_args

TOKEN = "t0ken-t0ken-t0ken"

# ----------------------------------------------------------------------------- strategies

names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=20).filter(
    lambda s: s[0].isalnum()
)
words = st.text(string.ascii_letters + string.digits + "/._-", min_size=1, max_size=20)
seconds = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)


@st.composite
def flags(draw: st.DrawFn) -> SlotIsolation:
    low = draw(seconds)
    default = draw(st.floats(min_value=low, max_value=low * 10))
    high = draw(st.floats(min_value=default, max_value=default * 10))
    return SlotIsolation(
        allow_network=draw(st.booleans()),
        require_sandbox=draw(st.booleans()),
        max_processes=draw(st.integers(1, 4096)),
        memory_bytes=draw(st.integers(1, 1 << 16)) << 20,
        cpu_seconds=draw(st.none() | st.integers(1, 10_000)),
        output_cap_bytes=draw(st.integers(1, 1 << 24)),
        file_cap_bytes=draw(st.integers(1, 1 << 30)),
        min_timeout_s=low,
        default_timeout_s=default,
        max_timeout_s=high,
        use_cgroups=draw(st.booleans()),
        bwrap=draw(words),
    )


@st.composite
def specs(draw: st.DrawFn) -> NomadJobSpec:
    driver = draw(st.sampled_from(DRIVERS))
    delay = draw(st.floats(min_value=5.0, max_value=600.0))
    job = NomadJobSettings(
        job_id=draw(names),
        driver=driver,
        image=draw(words) if driver == "docker" else draw(st.sampled_from(["", "unused"])),
        command=tuple(draw(st.lists(words, min_size=1, max_size=4))),
        privileged=draw(st.booleans()) if driver == "docker" else False,
        datacenters=tuple(draw(st.lists(names, min_size=1, max_size=3))),
        namespace=draw(st.none() | names),
        region=draw(st.none() | names),
        cpu_mhz=draw(st.integers(1, 100_000)),
        memory_mb=draw(st.integers(10, 1 << 20)),
        disk_mb=draw(st.integers(21, 1 << 20)),
        restart_attempts=draw(st.integers(0, 10)),
        restart_delay_s=draw(st.floats(min_value=0.0, max_value=60.0)),
        reschedule_delay_s=delay,
        reschedule_max_delay_s=draw(st.floats(min_value=delay, max_value=delay * 100)),
        kill_timeout_s=draw(st.floats(min_value=1.0, max_value=600.0)),
    )
    return NomadJobSpec(
        job=job,
        count=draw(st.integers(0, 1000)),
        server=SlotServerSettings(
            slots_per_container=draw(st.integers(1, 256)), isolation=draw(flags())
        ),
        token="tok:" + draw(st.text(string.ascii_letters + string.digits + "-_.~", min_size=12)),
    )


def _spec(**settings: object) -> NomadJobSpec:
    """A spec from flat settings: the job's settings go to its ``NomadJobSettings``, the slot
    servers' to its ``SlotServerSettings``."""
    rest = dict(settings)
    server = split_off(SlotServerSettings(), rest)
    job = split_off(NomadJobSettings(), rest)
    return NomadJobSpec(job=job, server=server, **rest)  # type: ignore[arg-type]


def _argv(task: JSONObject) -> list[str]:
    config = task["Config"]
    assert isinstance(config, dict)
    args = config["args"]
    assert isinstance(args, list)
    head = config["entrypoint"] if task["Driver"] == "docker" else [config["command"]]
    assert isinstance(head, list)
    return [str(word) for word in [*head, *args]]


# ----------------------------------------------------------------------------- schema


@needs_openapi
@given(specs())
def test_every_job_validates_against_nomads_job_schema(spec: NomadJobSpec) -> None:
    assert OPENAPI is not None
    assert OPENAPI.check_schema("Job", job_json(spec)) == []
    assert OPENAPI.check_request("POST", "/job/{jobName}", {}, register_request(spec)) == []


@needs_openapi
@given(count=st.integers(0, 10_000), group=names, message=st.text(max_size=40))
def test_every_scale_request_validates(count: int, group: str, message: str) -> None:
    assert OPENAPI is not None
    body = scale_request(group, count, message)
    assert OPENAPI.check_request("POST", "/job/{jobName}/scale", {}, body) == []


@needs_openapi
def test_the_schema_check_refuses_unknown_fields_and_wrong_types() -> None:
    assert OPENAPI is not None
    job = job_json(
        _spec(
            job_id="j",
            count=1,
            driver="raw_exec",
            token=TOKEN,
            slots_per_container=8,
            isolation=SlotIsolation(),
        )
    )
    job["Drivr"] = "raw_exec"
    group_and_task(job)[1]["Resources"] = {"CPU": "lots"}
    problems = OPENAPI.check_schema("Job", job)
    assert any("'Drivr' was unexpected" in p for p in problems)
    assert any("Resources.CPU" in p for p in problems)


# ----------------------------------------------------------------------------- job shape


@given(specs())
def test_the_job_runs_the_slot_server_as_specified(spec: NomadJobSpec) -> None:
    job = job_json(spec)
    assert job["ID"] == spec.job.job_id
    assert job["Type"] == "service"
    group = job["TaskGroups"][0]  # type: ignore[index]
    assert isinstance(group, dict)
    assert group["Count"] == spec.count
    assert group["Networks"] == [{"Mode": "host", "DynamicPorts": [{"Label": PORT_LABEL}]}]
    task = group_and_task(job)[1]
    assert task["Driver"] == spec.job.driver
    argv = _argv(task)
    assert argv[: len(spec.job.command)] == list(spec.job.command)
    # Nomad interpolates the allocation's index before the server reads it
    words = [w.replace("${NOMAD_ALLOC_INDEX}", "3") for w in argv[len(spec.job.command) :]]
    assert words != argv[len(spec.job.command) :]
    parsed = parse_args(words)
    assert parsed.slot_uid_block == 3  # each allocation its own block of slot uids
    assert parsed.slots == spec.server.slots_per_container
    assert parsed.listen == spec.listen_address()
    assert parsed.token_env == spec.job.token_env
    assert parsed.token_file is None
    assert parsed.allow_network is spec.server.isolation.allow_network
    assert parsed.require_sandbox is spec.server.isolation.require_sandbox
    # The token reaches the task only through its environment: never an argument, no template.
    assert task["Env"] == {spec.job.token_env: spec.token}
    assert not any(spec.token in word for word in argv)
    assert "Templates" not in task
    config = task["Config"]
    assert isinstance(config, dict)
    if spec.job.driver == "docker":
        assert config["image"] == spec.job.image
        assert config["ports"] == [PORT_LABEL]
        assert config["privileged"] is spec.job.privileged
        assert spec.listen_address().startswith("0.0.0.0:")
        # what ./dev runs the image with: the sandbox's needs, without privileged
        if spec.job.privileged:
            assert "security_opt" not in config
        else:
            assert config["security_opt"] == ["seccomp=unconfined", "systempaths=unconfined"]
        assert config["ulimit"] == {
            "nofile": f"{spec.job.nofile_limit}:{spec.job.nofile_limit}",
            "nproc": f"{spec.job.nproc_limit}:{spec.job.nproc_limit}",
        }
    else:
        assert "image" not in config
        assert "privileged" not in config
        assert "security_opt" not in config
        assert spec.listen_address() == "${NOMAD_IP_slot}:${NOMAD_PORT_slot}"


@given(specs())
def test_durations_are_whole_nanoseconds(spec: NomadJobSpec) -> None:
    group = job_json(spec)["TaskGroups"][0]  # type: ignore[index]
    assert isinstance(group, dict)
    reschedule = group["ReschedulePolicy"]
    assert isinstance(reschedule, dict)
    assert reschedule["Delay"] == round(spec.job.reschedule_delay_s * 1e9)
    assert isinstance(reschedule["MaxDelay"], int)
    assert reschedule["MaxDelay"] >= reschedule["Delay"]
    assert reschedule["Unlimited"] is True
    restart = group["RestartPolicy"]
    assert isinstance(restart, dict)
    assert restart["Mode"] == "fail"
    assert restart["Attempts"] == spec.job.restart_attempts
    task = group_and_task(job_json(spec))[1]
    assert task["KillTimeout"] == round(spec.job.kill_timeout_s * 1e9)
    # the server ends itself (and its sandboxes) before Nomad's SIGKILL can
    args = spec.server_args()
    stop_deadline = float(args[args.index("--stop-deadline") + 1])
    assert 0 < stop_deadline < spec.job.kill_timeout_s


# ----------------------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("job_id", {"job_id": "has space"}),
        ("job_id", {"job_id": ""}),
        ("count", {"count": -1}),
        ("count", {"count": True}),
        ("driver", {"driver": "podman"}),
        ("image", {"driver": "docker", "image": ""}),
        ("image", {"driver": "docker", "image": "two words"}),
        ("privileged", {"driver": "raw_exec", "privileged": True}),
        ("token", {"token": "short"}),
        ("token", {"token": "has a space in it ok"}),
        ("token_env", {"token_env": "1BAD"}),
        ("command", {"command": ()}),
        ("command", {"command": ("trajcore", "")}),
        ("slots_per_container", {"slots_per_container": 0}),
        ("datacenters", {"datacenters": ()}),
        ("namespace", {"namespace": "bad namespace"}),
        ("memory_mb", {"memory_mb": 5}),
        ("cpu_mhz", {"cpu_mhz": 0}),
        ("disk_mb", {"disk_mb": 20}),
        ("reschedule_delay_s", {"reschedule_delay_s": 1.0}),
        ("reschedule_delay_s", {"reschedule_delay_s": float("nan")}),
        ("reschedule_max_delay_s", {"reschedule_delay_s": 30.0, "reschedule_max_delay_s": 10.0}),
        ("restart_attempts", {"restart_attempts": 5000}),
    ],
)
def test_a_bad_spec_names_its_field(field: str, change: dict[str, object]) -> None:
    settings: dict[str, object] = {
        "job_id": "slots",
        "count": 1,
        "driver": "docker",
        "image": "img",
        "token": TOKEN,
        "slots_per_container": 8,
        "isolation": SlotIsolation(),
    }
    settings.update(change)
    with pytest.raises(ConfigError) as caught:
        _spec(**settings)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("max_processes", {"max_processes": 0}),
        ("cpu_seconds", {"cpu_seconds": 0}),
        ("min_timeout_s", {"min_timeout_s": -1.0}),
        ("default_timeout_s", {"min_timeout_s": 5.0, "default_timeout_s": 1.0}),
        ("bwrap", {"bwrap": ""}),
        ("allow_network", {"allow_network": "yes"}),
    ],
)
def test_bad_policy_flags_name_their_field(field: str, change: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(**change)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_negative_scale_count_names_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        scale_request("slots", -1, "x")
    assert caught.value.field == "count"


def test_every_slot_server_registers_a_service_with_a_tcp_check_on_its_port() -> None:
    spec = _spec(
        job_id="slots",
        count=1,
        image="trajcore/slot-server",
        token="t" * 16,
        slots_per_container=8,
        isolation=SlotIsolation(),
    )
    group = job_json(spec)["TaskGroups"][0]  # type: ignore[index]
    assert isinstance(group, dict)
    assert group["Services"] == [
        {
            "Name": "trajcore-slot-server",
            "PortLabel": PORT_LABEL,
            "Provider": "nomad",
            "Checks": [
                {
                    "Name": "slot-server-port",
                    "Type": "tcp",
                    "PortLabel": PORT_LABEL,
                    "Interval": 10_000_000_000,
                    "Timeout": 2_000_000_000,
                }
            ],
        }
    ]
    with pytest.raises(ConfigError, match="nofile_limit"):
        _spec(
            job_id="slots",
            count=1,
            image="i",
            token="t" * 16,
            nofile_limit=8,
            slots_per_container=8,
            isolation=SlotIsolation(),
        )
