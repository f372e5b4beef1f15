"""Every pool's settings are composed of settings values
(``reconciled.composed_settings``): a keyword that belongs to one of the parts is refused with
one ``ConfigError`` naming it and the part to give it in; the class's own keywords, unknown
keywords and ``attrs.evolve`` behave as without the decorator."""

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
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import NomadJobSettings


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
        (DaytonaPoolConfig, {"max_containers": 3}, "pool=CloudPoolConfig(max_containers=...)"),
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
    config = NomadPoolConfig(job=NomadJobSettings(image="img:1"), min_containers=2)
    assert (config.job.image, config.min_containers) == ("img:1", 2)
    assert attrs.evolve(config, max_containers=3).max_containers == 3
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
