"""``DaytonaSandboxPool``: slot servers as Daytona sandboxes (hermes-agent's ``terminal_backend:
daytona``), over Daytona's official SDK (the ``daytona`` extra, imported only when a pool
starts).

The pool is the cloud pool (``cloud_pool``) with Daytona as its provider (``daytona_sdk``):
each sandbox runs one slot server from its ``image`` (trajcore's slot-server image, or any image
with Python, trajcore's core and bubblewrap), reached through its preview URL with the pool's
bearer token. Daytona isolates each sandbox in its own container (or microVM, by target);
trajcore's slots add their own bubblewrap sandbox, uid and seccomp filter inside it
(docs/deploy.md, "Cloud sandboxes"). Its settings (``DaytonaPoolConfig``) hold the cloud
pool's (``pool``, a ``CloudPoolConfig``) and what each sandbox is created with (``sandbox``, a
``DaytonaSandboxSettings``).

Credentials are Daytona's own (``DAYTONA_API_KEY``, or ``DAYTONA_JWT_TOKEN`` with
``DAYTONA_ORGANIZATION_ID``; ``DAYTONA_API_URL`` and ``DAYTONA_TARGET`` optional);
``check_daytona`` names what is missing before anything is created. ``daytona_credentials``
finds them once, when the pool is built, and hands them to the SDK's client (``DaytonaSdk``,
the seam a test fills with ``FakeCloud``); they are kept out of every repr and never logged.
"""

from __future__ import annotations

import os
from typing import TypeAlias

import attrs

from trajcore.adapters.pools.cloud_pool import (
    DEFAULT_IMAGE,
    CloudProvider,
    CloudSandboxPool,
    ProviderPoolConfig,
    ProviderSdk,
    check_provider,
    require_sdk,
)
from trajcore.adapters.pools.reconciled import composed_settings, part
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.domain.validators import nonempty_text, positive_seconds, whole_number

__all__ = [
    "DaytonaCredentials",
    "DaytonaPoolConfig",
    "DaytonaSandboxPool",
    "DaytonaSandboxSettings",
    "DaytonaSdk",
    "check_daytona",
    "daytona_credentials",
    "official_daytona_sdk",
]


@attrs.frozen(kw_only=True)
class DaytonaSandboxSettings:
    """What every Daytona sandbox of the pool is created with.

    Attributes:
        image: The registry image each sandbox runs.
        target: Daytona's target (region), e.g. ``us`` or ``eu`` (``None``: the account's).
        cpu: CPU cores per sandbox (``None``: Daytona's default).
        memory_gib: Memory per sandbox in GiB (``None``: Daytona's default).
        disk_gib: Disk per sandbox in GiB (``None``: Daytona's default).
        auto_stop_min: Daytona stops a sandbox idle this many minutes (0: never); a stopped
            one is replaced.
        create_timeout_s: Longest Daytona may take to create and start one sandbox.
    """

    image: str = attrs.field(default=DEFAULT_IMAGE, validator=nonempty_text)
    target: str | None = None
    cpu: int | None = None
    memory_gib: int | None = None
    disk_gib: int | None = None
    auto_stop_min: int = attrs.field(default=0, validator=whole_number(0))
    create_timeout_s: float = attrs.field(default=300.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        for field in ("cpu", "memory_gib", "disk_gib"):
            value = getattr(self, field)
            if value is not None and value < 1:
                raise ConfigError(field, f"must be >= 1, got {value}")


@composed_settings
@attrs.frozen(kw_only=True)
class DaytonaPoolConfig(ProviderPoolConfig[DaytonaSandboxSettings]):
    """The Daytona pool's settings (``ProviderPoolConfig``): the cloud pool's, and as
    ``sandbox`` what each Daytona sandbox is created with (``DaytonaSandboxSettings``)."""

    sandbox: DaytonaSandboxSettings = part(DaytonaSandboxSettings)


@attrs.frozen(kw_only=True)
class DaytonaCredentials:
    """Daytona's credentials as this process finds them when a pool is built.

    Attributes:
        api_key: ``DAYTONA_API_KEY`` (kept out of every repr and log), or ``None``.
        jwt_token, organization_id: ``DAYTONA_JWT_TOKEN`` and ``DAYTONA_ORGANIZATION_ID``
            (the token kept out of every repr and log), used when there is no API key.
        api_url: ``DAYTONA_API_URL`` (``None``: the SDK's default).
    """

    api_key: str | None = attrs.field(default=None, repr=False)
    jwt_token: str | None = attrs.field(default=None, repr=False)
    organization_id: str | None = None
    api_url: str | None = None


def daytona_credentials() -> DaytonaCredentials:
    """Daytona's credentials from the environment: ``DAYTONA_API_KEY``, or
    ``DAYTONA_JWT_TOKEN`` with ``DAYTONA_ORGANIZATION_ID``; ``DAYTONA_API_URL`` when set.
    Raises ``SandboxUnavailable`` naming them when neither is there."""
    key = os.environ.get("DAYTONA_API_KEY") or None
    jwt = os.environ.get("DAYTONA_JWT_TOKEN") or None
    organization = os.environ.get("DAYTONA_ORGANIZATION_ID") or None
    if not key and not (jwt and organization):
        half = " (DAYTONA_JWT_TOKEN is set, DAYTONA_ORGANIZATION_ID is not)" if jwt else ""
        raise SandboxUnavailable(
            "terminal_backend daytona needs Daytona credentials: DAYTONA_API_KEY, or "
            f"DAYTONA_JWT_TOKEN with DAYTONA_ORGANIZATION_ID{half}"
        )
    return DaytonaCredentials(
        api_key=key,
        jwt_token=None if key else jwt,
        organization_id=organization,
        api_url=os.environ.get("DAYTONA_API_URL") or None,
    )


def check_daytona() -> None:
    """Raise ``SandboxUnavailable`` naming what is missing for a Daytona pool: the ``daytona``
    package (``pip install 'trajcore[daytona]'``) or Daytona's credentials."""
    check_provider("daytona", daytona_credentials)


DaytonaSdk: TypeAlias = ProviderSdk[DaytonaSandboxSettings, DaytonaCredentials]
"""Builds the pool's provider over Daytona's SDK (``official_daytona_sdk``; a test gives one that
returns ``FakeCloud``)."""


def official_daytona_sdk(
    settings: DaytonaSandboxSettings, credentials: DaytonaCredentials
) -> CloudProvider:
    """The provider over the ``daytona`` SDK, its client configured with ``credentials``."""
    require_sdk("daytona")
    from trajcore.adapters.pools.daytona_sdk import DaytonaProvider

    return DaytonaProvider(settings, credentials)


class DaytonaSandboxPool(CloudSandboxPool):
    """The SandboxPool port over Daytona sandboxes. ``async with DaytonaSandboxPool(config)``.

    ``provider`` replaces the SDK (tests give ``trajcore.testing.fake_cloud.FakeCloud``); left
    out, the credentials are found (``daytona_credentials``) and ``sdk`` builds the provider
    with them (``official_daytona_sdk``: the ``daytona`` package); ``SandboxUnavailable`` names
    the credentials or the package when either is missing. See ``CloudSandboxPool``.
    """

    def __init__(
        self,
        config: DaytonaPoolConfig | None = None,
        *,
        provider: CloudProvider | None = None,
        sdk: DaytonaSdk = official_daytona_sdk,
    ) -> None:
        config = config or DaytonaPoolConfig()
        super().__init__(provider or sdk(config.sandbox, daytona_credentials()), config.pool)
