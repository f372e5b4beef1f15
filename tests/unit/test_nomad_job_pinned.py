"""Nomad job spec: the decisions ``test_nomad_job`` checks only in part (found by mutation
testing): every field of the job Nomad is sent, the reason of each refused setting, how
a spec holds the job's settings."""

from __future__ import annotations

import re

import attrs
import pytest

from tests.nomad_testbed import group_and_task
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import (
    NomadJobSettings,
    NomadJobSpec,
    _matches,
    job_json,
    scale_request,
)
from trajcore.domain.slot_server_settings import SlotServerSettings

TOKEN = "t0ken-t0ken-t0ken"


def test_the_whole_job_nomad_is_sent() -> None:
    spec = NomadJobSpec(
        job=NomadJobSettings(
            job_id="slots", namespace="ns", region="eu", restart_attempts=2, restart_delay_s=3.0
        ),
        count=2,
        token=TOKEN,
        server=SlotServerSettings(slots_per_container=8),
    )
    job = job_json(spec)
    _, task = group_and_task(job)
    config = task["Config"]
    assert isinstance(config, dict)
    args = config.pop("args")
    assert isinstance(args, list)
    assert args[:12] == [
        "--slots", "8",
        "--root", "${NOMAD_TASK_DIR}/slots",
        "--listen", "0.0.0.0:${NOMAD_PORT_slot}",
        "--token-env", "TRAJCORE_SLOT_TOKEN",
        # the server's own forced end, half a second before Nomad's SIGKILL (KillTimeout 10 s)
        "--stop-deadline", "9.5",
        "--slot-uid-block", "${NOMAD_ALLOC_INDEX}",
    ]  # fmt: skip
    seconds = 1_000_000_000
    assert job == {
        "ID": "slots",
        "Name": "slots",
        "Type": "service",
        "Datacenters": ["dc1"],
        "Meta": {"trajcore-role": "slot-servers", "trajcore-slots-per-container": "8"},
        "TaskGroups": [
            {
                "Name": "slots",
                "Count": 2,
                "Networks": [{"Mode": "host", "DynamicPorts": [{"Label": "slot"}]}],
                "RestartPolicy": {
                    "Attempts": 2,
                    "Delay": 3 * seconds,
                    "Interval": 1800 * seconds,
                    "Mode": "fail",
                },
                # unlimited replacements, the delay growing exponentially up to its ceiling
                "ReschedulePolicy": {
                    "Unlimited": True,
                    "Attempts": 0,
                    "Interval": 0,
                    "Delay": 5 * seconds,
                    "DelayFunction": "exponential",
                    "MaxDelay": 60 * seconds,
                },
                "EphemeralDisk": {"SizeMB": 1024},
                "Services": [
                    {
                        "Name": "trajcore-slot-server",
                        "PortLabel": "slot",
                        "Provider": "nomad",
                        "Checks": [
                            {
                                "Name": "slot-server-port",
                                "Type": "tcp",
                                "PortLabel": "slot",
                                "Interval": 10 * seconds,
                                "Timeout": 2 * seconds,
                            }
                        ],
                    }
                ],
                # no rolling update: a new version replaces every allocation at once
                "Update": {"MaxParallel": 0},
                "Tasks": [
                    {
                        "Name": "slot-server",
                        "Driver": "docker",
                        "Config": {
                            "image": "trajcore/slot-server:latest",
                            "entrypoint": ["trajcore", "slot-server"],
                            "ports": ["slot"],
                            "privileged": False,
                            "ulimit": {"nofile": "16384:16384", "nproc": "16384:16384"},
                            "security_opt": ["seccomp=unconfined", "systempaths=unconfined"],
                        },
                        "Env": {"TRAJCORE_SLOT_TOKEN": TOKEN},
                        "Resources": {"CPU": 1000, "MemoryMB": 2560},
                        "KillSignal": "SIGTERM",
                        "KillTimeout": 10 * seconds,
                        "LogConfig": {"MaxFiles": 2, "MaxFileSizeMB": 10},
                        "Meta": {"trajcore-role": "slot-server"},
                    }
                ],
            }
        ],
        "Namespace": "ns",
        "Region": "eu",
    }


def test_a_spec_holds_the_job_settings_beside_the_slots_the_count_and_the_token() -> None:
    settings = NomadJobSettings(
        job_id="j",
        driver="exec",
        image="other:1",
        command="python -m trajcore.entrypoints.slot_server",
        token_env="TOKEN_VAR",
        nofile_limit=100,
        nproc_limit=200,
        datacenters="dc1, dc2,,",
        namespace="ns",
        region="r",
        group="g",
        task="t",
        cpu_mhz=5,
        memory_mb=50,
        disk_mb=100,
        restart_attempts=1,
        restart_delay_s=2.0,
        reschedule_delay_s=6.0,
        reschedule_max_delay_s=7.0,
        kill_timeout_s=3.0,
    )
    isolation = SlotIsolation(max_processes=7)
    server = SlotServerSettings(slots_per_container=3, isolation=isolation)
    spec = NomadJobSpec(job=settings, server=server, count=4, token=TOKEN)
    assert (spec.job, spec.server) == (settings, server)
    assert (spec.count, spec.token) == (4, TOKEN)
    job = job_json(spec)
    group, task = group_and_task(job)
    config = task["Config"]
    assert isinstance(config, dict)
    assert (job["ID"], job["Datacenters"], job["Namespace"], job["Region"]) == (
        "j", ["dc1", "dc2"], "ns", "r"
    )  # fmt: skip
    assert (group["Name"], group["Count"], task["Name"], task["Driver"]) == ("g", 4, "t", "exec")
    assert config["command"] == "python"
    assert task["Env"] == {"TOKEN_VAR": TOKEN}
    assert task["Resources"] == {"CPU": 5, "MemoryMB": 50}


def test_datacenters_are_named_by_a_string_split_on_commas_or_a_list() -> None:
    assert NomadJobSettings(datacenters="a,b").datacenters == ("a", "b")
    assert _refusal(datacenters=5) == ("datacenters", "must name one or more datacenters, got 5")
    assert NomadJobSettings(datacenters="a b").datacenters == ("a b",)
    assert NomadJobSettings(datacenters=["x", "y"]).datacenters == ("x", "y")


def _refusal(**change: object) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        NomadJobSettings(**change)  # type: ignore[arg-type]
    return caught.value.field, caught.value.reason


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (
            {"job_id": "a b"},
            "job_id",
            "must be letters, digits, '_', '.' or '-' (at most 128), got 'a b'",
        ),
        ({"job_id": 5}, "job_id", "must be letters, digits, '_', '.' or '-' (at most 128), got 5"),
        ({"group": "a b"}, "group", "must be a name, got 'a b'"),
        (
            {"namespace": "a b"},
            "namespace",
            "must be None or a name of letters, digits, '_' and '-', got 'a b'",
        ),
        ({"region": 3}, "region", "must be None or a name of letters, digits, '_' and '-', got 3"),
        ({"command": ("a", "")}, "command", "must be one or more non-empty words, got ('a', '')"),
        (
            {"command": ("a", "b\0c")},
            "command",
            "must be one or more non-empty words, got ('a', 'b\\x00c')",
        ),
        (
            {"datacenters": ("dc1", " dc2")},
            "datacenters",
            "must name one or more datacenters, got ('dc1', ' dc2')",
        ),
        (
            {"datacenters": ("dc1", "")},
            "datacenters",
            "must name one or more datacenters, got ('dc1', '')",
        ),
        ({"driver": "podman"}, "driver", "must be one of docker, exec, raw_exec, got 'podman'"),
        ({"image": "a b"}, "image", "the docker driver needs an image name, got 'a b'"),
        (
            {"driver": "exec", "privileged": True},
            "privileged",
            "only the docker driver runs containers privileged; exec tasks run as the Nomad "
            "client's user",
        ),
        (
            {"reschedule_delay_s": 30.0, "reschedule_max_delay_s": 10.0},
            "reschedule_max_delay_s",
            "must be >= reschedule_delay_s (30.0), got 10.0",
        ),
        ({"kill_timeout_s": -1.0}, "kill_timeout_s", "must be finite seconds >= 0, got -1.0"),
        (
            {"kill_timeout_s": 0.9},
            "kill_timeout_s",
            "must be at least 1.0 s: the slot server ends its sandboxes within it before "
            "Nomad's SIGKILL, got 0.9",
        ),
        (
            {"restart_attempts": 900, "restart_delay_s": 2.0},
            "restart_attempts",
            "900 restarts 2.0 s apart do not fit in Nomad's restart interval of 1800.0 s",
        ),
    ],
)
def test_a_refused_setting_says_why(change: dict[str, object], field: str, reason: str) -> None:
    assert _refusal(**change) == (field, reason)


def test_the_restarts_must_end_before_nomads_restart_interval_does() -> None:
    # 1800 s of restarts reach the end of the interval: refused; just under it is kept
    assert _refusal(restart_attempts=900, restart_delay_s=2.0)[0] == "restart_attempts"
    assert NomadJobSettings(restart_attempts=899, restart_delay_s=2.0).restart_attempts == 899


def test_a_pattern_check_refuses_what_does_not_match_whole_and_names_its_field() -> None:
    # The pattern validators are built when the module is imported; this builds one afresh.
    check = _matches(re.compile("a+"), "some a's")
    field = attrs.fields(NomadJobSettings).group
    check(None, field, "aaa")
    for bad in ("aab", "b", 3):
        with pytest.raises(ConfigError) as caught:
            check(None, field, bad)
        assert (caught.value.field, caught.value.reason) == (
            "group",
            f"must be some a's, got {bad!r}",
        )


def test_a_refused_scale_count_says_why() -> None:
    with pytest.raises(ConfigError) as caught:
        scale_request("slots", -1, "x")
    assert caught.value.reason == "must be an integer >= 0, got -1"
    assert scale_request("g", 0, "m") == {"Count": 0, "Target": {"Group": "g"}, "Message": "m"}


def test_the_server_ends_itself_half_a_second_before_nomads_sigkill() -> None:
    """The shortest kill timeout, 1 s, is taken and leaves the server 0.5 s to end its sandboxes."""
    spec = NomadJobSpec(
        job=NomadJobSettings(kill_timeout_s=1.0),
        server=SlotServerSettings(slots_per_container=1),
        count=1,
        token=TOKEN,
    )
    args = spec.server_args()
    assert args[args.index("--stop-deadline") + 1] == "0.5"
    assert group_and_task(job_json(spec))[1]["KillTimeout"] == 1_000_000_000
