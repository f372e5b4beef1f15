"""The Daytona pool over the provider double at the SDK boundary (``FakeCloud``), which runs the
real slot server on loopback: the SandboxPool contract and the cloud pool's promises as the
Modal pool's tests check them, and the creation request the pool builds checked against the
API client's own model of Daytona's ``CreateSandbox`` request (generated from Daytona's OpenAPI
document; the document itself does not ship with the SDK).

The double's URL is plain HTTP on loopback: it stands for Daytona's TLS preview proxy. What it
does not check is said in docs/deploy.md; tests/live/ runs the suite against Daytona when
credentials are present."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from daytona_api_client.models.create_sandbox import CreateSandbox

from tests.integration.cloud_testbed import (
    FAST,
    agree_with_the_fake,
    cloud_pool_config,
    pool_on,
    shape_settings,
    stop_sandbox,
)
from trajcore.adapters.pools.cloud_pool import OWNER_LABEL, RUN_LABEL
from trajcore.adapters.pools.daytona_pool import (
    DaytonaPoolConfig,
    DaytonaSandboxPool,
    DaytonaSandboxSettings,
    check_daytona,
)
from trajcore.adapters.pools.daytona_sdk import create_params
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_cloud import FakeCloud
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


def _config(**overrides: object) -> DaytonaPoolConfig:
    settings = {**FAST, "owner": "test-daytona", **overrides}
    return DaytonaPoolConfig(pool=cloud_pool_config(**settings))


@asynccontextmanager
async def daytona_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeCloud(name="Daytona") as fake:
        config = _config(**shape_settings(shape))
        async with pool_on(fake, lambda f: DaytonaSandboxPool(config, provider=f)) as pool:
            yield pool
        for spec in fake.created:  # every request the pool made fits Daytona's API
            _check_create_request(spec.labels, dict(spec.env))


def _check_create_request(labels: object, env: dict[str, str]) -> None:
    from trajcore.adapters.pools.cloud_pool import SandboxSpec

    assert isinstance(labels, dict)
    settings = DaytonaSandboxSettings(
        image="slot-server:1",
        target="eu",
        cpu=2,
        memory_gib=4,
        disk_gib=8,
        auto_stop_min=0,
        create_timeout_s=60.0,
    )
    spec = SandboxSpec(argv=("python3",), port=8765, labels=labels, env=env)
    params = create_params(settings, spec)
    assert params.resources is not None
    request = CreateSandbox.from_dict(
        {
            "labels": params.labels,
            "env": params.env_vars,
            "public": params.public,
            "cpu": params.resources.cpu,
            "memory": params.resources.memory,
            "disk": params.resources.disk,
            "autoStopInterval": params.auto_stop_interval,
        }
    )
    assert request is not None
    assert request.labels == labels
    assert request.public is True


@pytest.mark.slow
class TestDaytonaSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return daytona_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return stop_sandbox


@pytest.mark.slow
def test_the_fake_and_the_daytona_pool_agree() -> None:
    """The lockstep machine: the fake pool and Daytona sandboxes of the provider double (real
    slot servers behind it); a crash is Daytona stopping the sandbox."""
    agree_with_the_fake(daytona_pool)


def test_a_request_that_breaks_daytonas_create_model_is_refused() -> None:
    with pytest.raises(ValueError, match="labels"):
        CreateSandbox.from_dict({"labels": "not-a-mapping"})
    _check_create_request({OWNER_LABEL: "o", RUN_LABEL: "r"}, {"TRAJCORE_SLOT_TOKEN": "t"})


def test_missing_credentials_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SandboxUnavailable, match="DAYTONA_API_KEY"):
        check_daytona()
    with pytest.raises(SandboxUnavailable, match="DAYTONA_API_KEY"):
        DaytonaSandboxPool(_config())


def test_bad_settings_name_their_field() -> None:
    with pytest.raises(ConfigError, match="memory_gib"):
        DaytonaSandboxSettings(memory_gib=0)
    with pytest.raises(ConfigError, match="port"):
        _config(port=70000)
