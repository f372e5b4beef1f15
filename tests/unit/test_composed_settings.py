"""Every pool's settings are composed of settings values
(``reconciled.composed_settings``): a keyword that belongs to one of the parts is refused with
one ``ConfigError`` naming it and the part to give it in; the class's own keywords, unknown
keywords and ``attrs.evolve`` behave as without the decorator. Each pool states its own
default of each part once."""

from __future__ import annotations

import attrs
import pytest

from trajcore.adapters.pools.cloud_pool import CloudPoolConfig
from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.adapters.pools.daytona_pool import DaytonaPoolConfig, DaytonaSandboxSettings
from trajcore.adapters.pools.local_pool import LocalPoolConfig
from trajcore.adapters.pools.modal_pool import ModalPoolConfig, ModalSandboxSettings
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.adapters.pools.ssh_pool import SshPoolConfig
from trajcore.adapters.pools.supervision import RestartSettings, SupervisedPoolConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import NomadJobSettings
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.ssh_hosts import SshHost


@pytest.mark.parametrize(
    ("config", "given", "part"),
    [
        (NomadPoolConfig, {"image": "img:1"}, "job=NomadJobSettings(image=...)"),
        (
            NomadPoolConfig,
            {"slots_per_container": 3},
            "server=SlotServerSettings(slots_per_container=...)",
        ),
        (
            NomadPoolConfig,
            {"allow_network": True},
            "server=SlotServerSettings(isolation=SlotIsolation(allow_network=...))",
        ),
        (SlurmPoolConfig, {"require_tmux": True}, "server=SlotServerSettings(require_tmux=...)"),
        (
            CloudPoolConfig,
            {"start_timeout_s": 1.0},
            "server=SlotServerSettings(start_timeout_s=...)",
        ),
        (
            ModalPoolConfig,
            {"reset_timeout_s": 1.0},
            "pool=CloudPoolConfig(server=SlotServerSettings(reset_timeout_s=...))",
        ),
        (SlurmPoolConfig, {"partition": "gpu"}, "job=SlurmJobSettings(partition=...)"),
        (ModalPoolConfig, {"owner": "run-7"}, "pool=CloudPoolConfig(owner=...)"),
        (ModalPoolConfig, {"image": "img:1"}, "sandbox=ModalSandboxSettings(image=...)"),
        (
            DaytonaPoolConfig,
            {"max_containers": 3},
            "pool=CloudPoolConfig(scaling=ScaleSettings(max_containers=...))",
        ),
        (NomadPoolConfig, {"min_containers": 2}, "scaling=ScaleSettings(min_containers=...)"),
        (NomadPoolConfig, {"max_containers": 2}, "scaling=ScaleSettings(max_containers=...)"),
        (SlurmPoolConfig, {"cooldown_s": 0.0}, "scaling=ScaleSettings(cooldown_s=...)"),
        (
            CloudPoolConfig,
            {"scale_down_margin": 1},
            "scaling=ScaleSettings(scale_down_margin=...)",
        ),
        (
            LocalPoolConfig,
            {"restart_attempts": 5},
            "restart=RestartSettings(restart_attempts=...)",
        ),
        (
            ContainerPoolConfig,
            {"restart_crashed": False},
            "restart=RestartSettings(restart_crashed=...)",
        ),
        (SshPoolConfig, {"backoff_s": 1.0}, "restart=RestartSettings(backoff_s=...)"),
        (DaytonaPoolConfig, {"target": "eu"}, "sandbox=DaytonaSandboxSettings(target=...)"),
        (
            LocalPoolConfig,
            {"slots_per_container": 3},
            "server=SlotServerSettings(slots_per_container=...)",
        ),
        (
            ContainerPoolConfig,
            {"start_timeout_s": 1.0},
            "server=SlotServerSettings(start_timeout_s=...)",
        ),
        (
            SshPoolConfig,
            {"require_sandbox": True},
            "server=SlotServerSettings(isolation=SlotIsolation(require_sandbox=...))",
        ),
    ],
)
def test_a_setting_of_a_part_is_named_with_the_part_to_give_it_in(
    config: type[object], given: dict[str, object], part: str
) -> None:
    (name,) = given
    with pytest.raises(ConfigError) as caught:
        config(**given)
    assert caught.value.field == name
    assert caught.value.reason == (
        f"is not a setting of {config.__name__} itself; give it as {part}"
    )


def test_own_settings_unknown_keywords_and_evolve_are_untouched() -> None:
    config = NomadPoolConfig(job=NomadJobSettings(image="img:1"), address="http://nomad:4646")
    assert (config.job.image, config.address) == ("img:1", "http://nomad:4646")
    assert attrs.evolve(config, purge_on_start=True).purge_on_start
    with pytest.raises(TypeError, match="no_such_setting"):
        NomadPoolConfig(no_such_setting=1)  # type: ignore[call-arg]
    modal = ModalPoolConfig(
        pool=CloudPoolConfig(owner="run-7"), sandbox=ModalSandboxSettings(image="img:2")
    )
    assert (modal.pool.owner, modal.sandbox.image) == ("run-7", "img:2")
    daytona = DaytonaPoolConfig(sandbox=DaytonaSandboxSettings(target="eu"))
    assert (daytona.pool, daytona.sandbox.target) == (CloudPoolConfig(), "eu")


def test_a_part_of_another_type_is_refused_naming_its_field() -> None:
    with pytest.raises(ConfigError) as caught:
        CloudPoolConfig(server=SlotIsolation())  # type: ignore[arg-type]
    assert caught.value.field == "server"
    with pytest.raises(ConfigError) as caught:
        ModalPoolConfig(sandbox=DaytonaSandboxSettings())  # type: ignore[arg-type]
    assert caught.value.field == "sandbox"


def test_each_scheduled_pool_states_its_own_scaling_defaults() -> None:
    # The range each scheduler's pool is scaled in by default; the damping is the rules' own.
    assert NomadPoolConfig().scaling == ScaleSettings(min_containers=1, max_containers=10)
    assert SlurmPoolConfig().scaling == ScaleSettings(min_containers=1, max_containers=10)
    assert CloudPoolConfig().scaling == ScaleSettings(min_containers=1, max_containers=4)
    assert ModalPoolConfig().pool.scaling == DaytonaPoolConfig().pool.scaling
    assert (ScaleSettings().scale_down_margin, ScaleSettings().cooldown_s) == (0, 30.0)
    # One pool's value given whole is that pool's alone.
    slurm = SlurmPoolConfig(scaling=ScaleSettings(max_containers=3, cooldown_s=0.0))
    assert (slurm.scaling.max_containers, slurm.scaling.cooldown_s) == (3, 0.0)
    assert NomadPoolConfig().scaling.max_containers == 10


def test_each_supervising_pool_states_its_own_restart_defaults() -> None:
    supervised = RestartSettings(
        restart_crashed=True, restart_attempts=3, backoff_s=0.1, backoff_max_s=2.0
    )
    assert SupervisedPoolConfig().restart == supervised
    assert LocalPoolConfig().restart == ContainerPoolConfig().restart == supervised
    # An SSH host may take a while to come back: more tries, further apart.
    ssh = SshPoolConfig(hosts=[SshHost(address="host")])
    assert ssh.restart == RestartSettings(restart_attempts=8, backoff_s=0.5, backoff_max_s=30.0)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"min_containers": -1}, "min_containers"),
        ({"max_containers": 0}, "max_containers"),
        ({"min_containers": 3, "max_containers": 2}, "max_containers"),
        ({"cooldown_s": -1.0}, "cooldown_s"),
    ],
)
def test_a_bad_scaling_value_names_the_field_as_given(given: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        NomadPoolConfig(scaling=ScaleSettings(**given))  # type: ignore[arg-type]
    assert caught.value.field == field
    with pytest.raises(ConfigError) as caught:  # a value, not a mapping, is what it holds
        NomadPoolConfig(scaling=given)  # type: ignore[arg-type]
    assert caught.value.field == "scaling"
