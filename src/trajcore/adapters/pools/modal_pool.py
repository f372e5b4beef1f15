"""``ModalSandboxPool``: slot servers as Modal sandboxes (hermes-agent's ``terminal_backend:
modal``), over Modal's official SDK (the ``modal`` extra, imported only when a pool starts).

The pool is the cloud pool (``cloud_pool``) with Modal as its provider (``modal_sdk``): each
sandbox runs one slot server from its ``image`` (trajcore's slot-server image, or any image with
Python, trajcore's core and bubblewrap), reached over its encrypted tunnel with the pool's
bearer token. Modal isolates each sandbox with gVisor; trajcore's slots add their own
bubblewrap sandbox, uid and seccomp filter inside it (docs/deploy.md, "Cloud sandboxes").
Its settings (``ModalPoolConfig``) hold the cloud pool's (``pool``, a ``CloudPoolConfig``) and
what each sandbox is created with (``sandbox``, a ``ModalSandboxSettings``).

Credentials are Modal's own (``MODAL_TOKEN_ID`` and ``MODAL_TOKEN_SECRET``, or a profile in
``~/.modal.toml``, as ``modal token set`` writes it); ``check_modal`` names what is missing
before anything is created. ``modal_credentials`` finds them once, when the pool is built, and
hands them to the SDK's client (``ModalSdk``, the seam a test fills with ``FakeCloud``); they
are kept out of every repr and never logged.
"""

from __future__ import annotations

import os
from pathlib import Path
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
from trajcore.domain.validators import nonempty_text, positive_seconds

__all__ = [
    "ModalCredentials",
    "ModalPoolConfig",
    "ModalSandboxPool",
    "ModalSandboxSettings",
    "ModalSdk",
    "check_modal",
    "modal_credentials",
    "official_modal_sdk",
]


@attrs.frozen(kw_only=True)
class ModalSandboxSettings:
    """What every Modal sandbox of the pool is created with.

    Attributes:
        app_name: The Modal app the sandboxes belong to (created when missing).
        environment: The Modal environment (``None``: the profile's default).
        image: The registry image each sandbox runs.
        add_python: A Python version Modal adds to an image without one (``None``: the image
            has its own, with trajcore installed).
        region: Where the sandboxes run (``None``: anywhere Modal chooses).
        cpu: CPU cores per sandbox (``None``: Modal's default).
        memory_mib: Memory per sandbox in MiB (``None``: Modal's default).
        sandbox_timeout_s: Modal ends a sandbox this long after it starts, in whole seconds
            (the pool replaces it; its calls in flight end as ``INFRA_ERROR``).
    """

    app_name: str = attrs.field(default="trajcore-slots", validator=nonempty_text)
    environment: str | None = None
    image: str = attrs.field(default=DEFAULT_IMAGE, validator=nonempty_text)
    add_python: str | None = None
    region: str | None = None
    cpu: float | None = None
    memory_mib: int | None = None
    sandbox_timeout_s: float = attrs.field(default=24 * 3600.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        if self.cpu is not None and not self.cpu > 0:
            raise ConfigError("cpu", f"must be > 0 cores, got {self.cpu}")
        if self.memory_mib is not None and self.memory_mib < 1:
            raise ConfigError("memory_mib", f"must be >= 1 MiB, got {self.memory_mib}")


@composed_settings
@attrs.frozen(kw_only=True)
class ModalPoolConfig(ProviderPoolConfig[ModalSandboxSettings]):
    """The Modal pool's settings (``ProviderPoolConfig``): the cloud pool's, and as
    ``sandbox`` what each Modal sandbox is created with (``ModalSandboxSettings``)."""

    sandbox: ModalSandboxSettings = part(ModalSandboxSettings)


@attrs.frozen(kw_only=True)
class ModalCredentials:
    """Modal's credentials as this process finds them when a pool is built.

    Attributes:
        token_id, token_secret: ``MODAL_TOKEN_ID`` and ``MODAL_TOKEN_SECRET`` (kept out of every
            repr and log); ``None`` when a profile file is used.
        profile: The profile file the SDK reads when the variables are not both set (``None``
            when they are).
    """

    token_id: str | None = attrs.field(default=None, repr=False)
    token_secret: str | None = attrs.field(default=None, repr=False)
    profile: Path | None = None


def modal_credentials() -> ModalCredentials:
    """Modal's credentials from the environment: ``MODAL_TOKEN_ID`` and ``MODAL_TOKEN_SECRET``
    when both are set, else the profile file (``MODAL_CONFIG_PATH``, default
    ``~/.modal.toml``). Raises ``SandboxUnavailable`` naming both when neither is there."""
    token_id = os.environ.get("MODAL_TOKEN_ID")
    token_secret = os.environ.get("MODAL_TOKEN_SECRET")
    if token_id and token_secret:
        return ModalCredentials(token_id=token_id, token_secret=token_secret)
    config = Path(os.environ.get("MODAL_CONFIG_PATH", Path.home() / ".modal.toml"))
    if not config.is_file():
        half = ""
        if bool(token_id) != bool(token_secret):
            given, missing = (
                ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
                if token_id
                else ("MODAL_TOKEN_SECRET", "MODAL_TOKEN_ID")
            )
            half = f" ({given} is set, {missing} is not)"
        raise SandboxUnavailable(
            "terminal_backend modal needs Modal credentials: MODAL_TOKEN_ID and "
            f"MODAL_TOKEN_SECRET, or a profile in {config} (`modal token set`){half}"
        )
    return ModalCredentials(profile=config)


def check_modal() -> None:
    """Raise ``SandboxUnavailable`` naming what is missing for a Modal pool: the ``modal``
    package (``pip install 'trajcore[modal]'``) or Modal's credentials."""
    check_provider("modal", modal_credentials)


ModalSdk: TypeAlias = ProviderSdk[ModalSandboxSettings, ModalCredentials]
"""Builds the pool's provider over Modal's SDK (``official_modal_sdk``; a test gives one that
returns ``FakeCloud``)."""


def official_modal_sdk(
    settings: ModalSandboxSettings, credentials: ModalCredentials
) -> CloudProvider:
    """The provider over the ``modal`` SDK, authenticated with ``credentials`` (a client from
    the token when the variables gave one, else the SDK's own profile)."""
    require_sdk("modal")
    from trajcore.adapters.pools.modal_sdk import ModalProvider

    return ModalProvider(settings, credentials)


class ModalSandboxPool(CloudSandboxPool):
    """The SandboxPool port over Modal sandboxes. ``async with ModalSandboxPool(config)``.

    ``provider`` replaces the SDK (tests give ``trajcore.testing.fake_cloud.FakeCloud``); left
    out, the credentials are found (``modal_credentials``) and ``sdk`` builds the provider with
    them (``official_modal_sdk``: the ``modal`` package); ``SandboxUnavailable`` names the
    credentials or the package when either is missing. See ``CloudSandboxPool``.
    """

    def __init__(
        self,
        config: ModalPoolConfig | None = None,
        *,
        provider: CloudProvider | None = None,
        sdk: ModalSdk = official_modal_sdk,
    ) -> None:
        config = config or ModalPoolConfig()
        super().__init__(provider or sdk(config.sandbox, modal_credentials()), config.pool)
