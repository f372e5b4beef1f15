"""``--env.sandbox modal|daytona`` and hermes's ``terminal_backend: modal|daytona``: the
settings reach each provider's pool config, named as env fields when they cannot work, and the
env's start fails naming what is missing when the SDK's credentials are not there."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.entrypoints.atropos import pools
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.seed_settings import SeedSettingWarning


def test_hermes_terminal_backends_select_the_cloud_pools() -> None:
    for backend in ("modal", "daytona"):
        with warnings.catch_warnings():  # the one-time rename warning of a seed name
            warnings.simplefilter("ignore", SeedSettingWarning)
            config = AgentEnvConfig(terminal_backend=backend)
        assert config.sandbox == backend
        assert backend in pools.POOLS.names()


def test_every_modal_setting_reaches_the_pool() -> None:
    config = AgentEnvConfig(
        sandbox="modal", modal_image="registry.example/slots:1", modal_app="rl",
        modal_environment="dev", modal_region="us-east", cloud_cpu=2.5, cloud_memory_mb=3000,
        cloud_lifetime_s=7200.0, cloud_owner="run-7", min_containers=2, max_containers=6,
        slots_per_container=5, acquire_timeout_s=30.0, allow_network=True,
    )  # fmt: skip
    got = config.modal_pool_config()
    sandbox, pool = got.sandbox, got.pool
    assert (sandbox.image, sandbox.app_name, sandbox.environment, sandbox.region) == (
        "registry.example/slots:1", "rl", "dev", "us-east"
    )  # fmt: skip
    assert (sandbox.cpu, sandbox.memory_mib, sandbox.sandbox_timeout_s) == (2.5, 3000, 7200.0)
    assert (pool.owner, pool.scaling.min_containers, pool.scaling.max_containers) == ("run-7", 2, 6)
    assert (pool.server.slots_per_container, pool.server.acquire_timeout_s) == (5, 30.0)
    assert pool.server.isolation.allow_network


def test_daytona_settings_are_rounded_up_to_its_units() -> None:
    config = AgentEnvConfig(
        sandbox="daytona", daytona_image="img:2", daytona_target="eu", cloud_cpu=1.5,
        cloud_memory_mb=1500, cloud_lifetime_s=61.0,
    )  # fmt: skip
    got = config.daytona_pool_config().sandbox
    assert (got.image, got.target) == ("img:2", "eu")
    assert (got.cpu, got.memory_gib, got.auto_stop_min) == (2, 2, 2)


def test_a_cloud_setting_that_cannot_work_names_its_env_field() -> None:
    with pytest.raises(ConfigError) as raised:
        AgentEnvConfig(sandbox="modal", cloud_memory_mb=0).modal_pool_config()
    assert raised.value.field == "cloud_memory_mb"


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"sandbox": "modal", "modal_app": ""}, "modal_app"),
        ({"sandbox": "modal", "modal_image": "  "}, "modal_image"),
        ({"sandbox": "daytona", "daytona_image": ""}, "daytona_image"),
        ({"sandbox": "modal", "cloud_owner": ""}, "cloud_owner"),
    ],
)
def test_an_empty_cloud_name_is_refused_naming_its_env_field(
    settings: dict[str, str], field: str
) -> None:
    config = AgentEnvConfig(**settings)
    build = (
        config.modal_pool_config if settings["sandbox"] == "modal" else config.daytona_pool_config
    )
    with pytest.raises(ConfigError) as raised:
        build()
    assert raised.value.field == field
    assert "non-empty text" in raised.value.reason


def test_without_credentials_the_start_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "absent.toml"))
    with pytest.raises(SandboxUnavailable, match="MODAL_TOKEN_ID"):
        AgentEnvConfig(sandbox="modal").settings()
    with pytest.raises(SandboxUnavailable, match="DAYTONA_API_KEY"):
        AgentEnvConfig(sandbox="daytona").settings()
