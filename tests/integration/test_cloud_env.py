"""``--env.sandbox modal|daytona`` and hermes's ``terminal_backend: modal|daytona`` from the env's
settings to a working pool.

With the provider's credentials in the environment (made up here, never real ones), the env's
start passes, the registered source builds the pool from the provider's SDK with exactly those
credentials, and a call runs through a slot. The provider's endpoint cannot be reached from
here, so the SDK is replaced at its seam (``ModalSdk``, ``DaytonaSdk``: what builds the provider
from the settings and the credentials found) by ``FakeCloud``, which runs the real slot server.
Every log record and everything printed is captured: the secret never appears. Without the
credentials, or without the SDK's package, the start fails naming what is missing.
"""

from __future__ import annotations

import logging
import secrets
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from trajcore.adapters.pools.cloud_pool import CloudProvider, CloudSandboxPool
from trajcore.adapters.pools.daytona_pool import (
    DaytonaCredentials,
    DaytonaPoolConfig,
    DaytonaSandboxPool,
    DaytonaSandboxSettings,
)
from trajcore.adapters.pools.modal_pool import (
    ModalCredentials,
    ModalPoolConfig,
    ModalSandboxPool,
    ModalSandboxSettings,
)
from trajcore.domain.errors import SandboxUnavailable
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.entrypoints.atropos import cloud, pools
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.seed_envs import HermesAgentEnvConfig
from trajcore.entrypoints.seed_settings import SeedSettingWarning
from trajcore.testing.fake_cloud import FakeCloud

_CREDENTIAL_VARIABLES = (
    "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN",
    "DAYTONA_ORGANIZATION_ID", "DAYTONA_API_URL",
)  # fmt: skip


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No provider credential in the environment, and no Modal profile file."""
    for name in _CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "absent.modal.toml"))


def _env_config(kind: str, backend: str) -> AgentEnvConfig:
    """The env's settings choosing ``backend``: ``--env.sandbox`` or hermes's name; one server
    with one slot."""
    if kind == "sandbox":
        return AgentEnvConfig(
            sandbox=backend, min_containers=1, max_containers=1, slots_per_container=1
        )
    with warnings.catch_warnings():  # the one-time rename warning of a seed name
        warnings.simplefilter("ignore", SeedSettingWarning)
        return HermesAgentEnvConfig(
            terminal_backend=backend,  # type: ignore[call-arg]  # a seed name, renamed at validation
            min_containers=1,
            max_containers=1,
            slots_per_container=1,
        )


@pytest.fixture
def registered_source() -> Iterator[Callable[[str, pools.PoolFactory], None]]:
    """Replace a registered pool source's factory for the test (its check kept); restored after."""
    saved: dict[str, pools.PoolSource] = {}

    def replace(name: str, factory: pools.PoolFactory) -> None:
        source = saved.setdefault(name, pools.POOLS.get(name))
        pools.register_pool(name, factory, check=source.check, replace=True)

    yield replace
    for name, source in saved.items():
        pools.POOLS.register(name, source, replace=True)


async def _one_call_through_a_slot(config: AgentEnvConfig) -> str:
    """Open the env's pool, run ``echo`` in a slot, close; the call's text."""
    async with pools.make_pool(config) as pool:
        assert isinstance(pool, CloudSandboxPool)
        async with pool.lease("trajectory-1") as lease:
            call = ToolCall(id="c1", name="bash", arguments={"command": "echo through-a-slot"})
            slot_call = SlotCall(lease=lease, call=call, timeout_s=30.0)
            (result,) = await pool.execute(lease.slot.container, [slot_call])
    assert result.outcome is ToolOutcome.OK, result
    return result.content


def _sandbox_logs(fake: FakeCloud) -> str:
    return "".join(
        (box.directory / "log").read_text(errors="replace")
        for box in fake.live()
        if (box.directory / "log").is_file()
    )


def _run_with_fake_sdk(
    provider: str, config: AgentEnvConfig, install: Callable[[FakeCloud], None]
) -> tuple[str, str]:
    """Run one call through the env's pool, its SDK ``FakeCloud`` (``install`` puts it behind
    the registered source); the call's text and what the sandboxes logged."""

    async def main() -> tuple[str, str]:
        async with FakeCloud(name=provider) as fake:
            install(fake)
            text = await _one_call_through_a_slot(config)
            return text, _sandbox_logs(fake)

    return anyio.run(main)


def _no_secret_anywhere(
    secret: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], *more: str
) -> None:
    out, err = capfd.readouterr()
    assert caplog.records, "the pool logged nothing: the capture is not working"
    for where, text in (("logs", caplog.text), ("stdout", out), ("stderr", err)):
        assert secret not in text, f"the secret appears in the {where}"
    for text in more:
        assert secret not in text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sandbox", "terminal_backend"])
@pytest.mark.usefixtures("no_credentials")
def test_modal_with_credentials_builds_a_working_pool_from_them(
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    registered_source: Callable[[str, pools.PoolFactory], None],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    secret = f"as-test-{secrets.token_hex(12)}"
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test-id")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", secret)
    caplog.set_level(logging.DEBUG)
    config = _env_config(kind, "modal")
    config.settings()  # the env's start: the settings, the SDK and the credentials are there

    seen: list[ModalCredentials] = []

    def install(fake: FakeCloud) -> None:
        def sdk(_: ModalSandboxSettings, credentials: ModalCredentials) -> CloudProvider:
            seen.append(credentials)
            return fake

        registered_source("modal", lambda c: cloud.modal_pool(c, sdk=sdk))

    text, logs = _run_with_fake_sdk("Modal", config, install)
    assert seen == [ModalCredentials(token_id="ak-test-id", token_secret=secret)]
    assert "through-a-slot" in text
    built = config.modal_pool_config()
    assert isinstance(built, ModalPoolConfig)
    _no_secret_anywhere(secret, caplog, capfd, logs, repr(seen), repr(built))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sandbox", "terminal_backend"])
@pytest.mark.usefixtures("no_credentials")
def test_daytona_with_credentials_builds_a_working_pool_from_them(
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    registered_source: Callable[[str, pools.PoolFactory], None],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    secret = f"dtn-test-{secrets.token_hex(12)}"
    monkeypatch.setenv("DAYTONA_API_KEY", secret)
    monkeypatch.setenv("DAYTONA_API_URL", "https://daytona.invalid/api")
    caplog.set_level(logging.DEBUG)
    config = _env_config(kind, "daytona")
    config.settings()

    seen: list[DaytonaCredentials] = []

    def install(fake: FakeCloud) -> None:
        def sdk(_: DaytonaSandboxSettings, credentials: DaytonaCredentials) -> CloudProvider:
            seen.append(credentials)
            return fake

        registered_source("daytona", lambda c: cloud.daytona_pool(c, sdk=sdk))

    text, logs = _run_with_fake_sdk("Daytona", config, install)
    assert seen == [DaytonaCredentials(api_key=secret, api_url="https://daytona.invalid/api")]
    assert "through-a-slot" in text
    _no_secret_anywhere(secret, caplog, capfd, logs, repr(seen))


def test_the_daytona_client_is_configured_with_the_credentials_found(
    no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's own client configuration (built, never connected) carries the credentials
    found, the JWT with its organization when there is no API key."""
    from trajcore.adapters.pools.daytona_pool import official_daytona_sdk
    from trajcore.adapters.pools.daytona_sdk import DaytonaProvider

    monkeypatch.setenv("DAYTONA_JWT_TOKEN", "jwt-test")
    monkeypatch.setenv("DAYTONA_ORGANIZATION_ID", "org-7")
    pool = DaytonaSandboxPool(
        DaytonaPoolConfig(sandbox=DaytonaSandboxSettings(target="eu")), sdk=official_daytona_sdk
    )
    provider = pool.provider
    assert isinstance(provider, DaytonaProvider)
    client = provider.client_config()
    assert (client.api_key, client.jwt_token, client.organization_id, client.target) == (
        None, "jwt-test", "org-7", "eu"
    )  # fmt: skip
    monkeypatch.setenv("DAYTONA_API_KEY", "key-test")
    provider = DaytonaSandboxPool(DaytonaPoolConfig()).provider
    assert isinstance(provider, DaytonaProvider)
    assert (provider.client_config().api_key, provider.client_config().jwt_token) == (
        "key-test", None
    )  # fmt: skip


@pytest.mark.usefixtures("no_credentials")
def test_the_modal_provider_is_given_the_credentials_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's provider (built, never connected) holds the token it makes its client from."""
    from trajcore.adapters.pools.modal_sdk import ModalProvider

    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    provider = ModalSandboxPool(
        ModalPoolConfig(sandbox=ModalSandboxSettings(app_name="rl"))
    ).provider
    assert isinstance(provider, ModalProvider)
    assert provider.credentials == ModalCredentials(token_id="ak-test", token_secret="as-test")
    assert provider.settings.app_name == "rl"
    assert "as-test" not in repr(provider)


@pytest.mark.parametrize("kind", ["sandbox", "terminal_backend"])
def test_a_modal_profile_file_is_credentials_enough(
    kind: str, no_credentials: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    profile = tmp_path / "modal.toml"
    profile.write_text('[default]\ntoken_id = "ak-x"\ntoken_secret = "as-x"\n')
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(profile))
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-only-half")  # one of the two is not enough
    _env_config(kind, "modal").settings()
    seen: list[ModalCredentials] = []

    def sdk(_: ModalSandboxSettings, credentials: ModalCredentials) -> CloudProvider:
        seen.append(credentials)
        return FakeCloud(name="Modal")

    cloud.modal_pool(_env_config(kind, "modal"), sdk=sdk)
    assert seen == [ModalCredentials(profile=profile)]


@pytest.mark.parametrize("kind", ["sandbox", "terminal_backend"])
@pytest.mark.parametrize(
    ("backend", "given", "named"),
    [
        ("modal", {}, "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"),
        ("modal", {"MODAL_TOKEN_ID": "ak-x"}, r"MODAL_TOKEN_SECRET is not\)"),
        ("modal", {"MODAL_TOKEN_SECRET": "as-x"}, r"MODAL_TOKEN_ID is not\)"),
        ("daytona", {}, "DAYTONA_API_KEY, or DAYTONA_JWT_TOKEN with DAYTONA_ORGANIZATION_ID"),
        ("daytona", {"DAYTONA_JWT_TOKEN": "jwt-x"}, r"DAYTONA_ORGANIZATION_ID is not\)"),
    ],
)
@pytest.mark.usefixtures("no_credentials")
def test_without_credentials_the_start_and_the_pool_name_what_is_missing(
    kind: str,
    backend: str,
    given: dict[str, str],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    config = _env_config(kind, backend)
    with pytest.raises(SandboxUnavailable, match=named):
        config.settings()
    with pytest.raises(SandboxUnavailable, match=named):
        pools.make_pool(config)


@pytest.mark.parametrize("kind", ["sandbox", "terminal_backend"])
@pytest.mark.parametrize("backend", ["modal", "daytona"])
def test_without_the_sdk_the_start_and_the_pool_name_the_package(
    kind: str, backend: str, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's package made unimportable (``sys.modules[name] = None``, Python's way to
    block an import), with credentials present."""
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-x")
    monkeypatch.setenv("DAYTONA_API_KEY", "key-x")
    monkeypatch.setitem(sys.modules, backend, None)
    config = _env_config(kind, backend)
    package = f"pip install 'trajcore\\[{backend}\\]'"
    with pytest.raises(SandboxUnavailable, match=package):
        config.settings()
    with pytest.raises(SandboxUnavailable, match=package):
        pools.make_pool(config)
