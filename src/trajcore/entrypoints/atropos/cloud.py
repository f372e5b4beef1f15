"""The Modal and Daytona pools from an env's settings (``--env.sandbox modal|daytona``, or
hermes-agent's ``terminal_backend: modal|daytona``).

The settings both providers take are ``sandbox_settings.CloudSettings``, part of the env's
sandbox section (each one ``--env.*`` flag): the image by hermes's names (``modal_image``,
``daytona_image``: hermes's ``TERMINAL_MODAL_IMAGE`` and ``TERMINAL_DAYTONA_IMAGE``), Modal's app,
environment and region, Daytona's target, CPU and memory per sandbox, and the sandbox's
lifetime. The scale range, slots per server, lease
deadline and sandbox isolation are the env's own settings, as for every pool. Credentials are the
providers' own variables or files, found when the pool is built and handed to the SDK's client
(``sdk``: ``ModalSdk``, ``DaytonaSdk``, the seam a test fills with ``FakeCloud``), never logged;
a missing SDK or credential fails the env's start naming it (``check_modal``,
``check_daytona``). docs/deploy.md, "Cloud sandboxes", says what was checked.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from trajcore.adapters.pools.daytona_pool import (
    DaytonaSandboxPool,
    DaytonaSdk,
    check_daytona,
    official_daytona_sdk,
)
from trajcore.adapters.pools.modal_pool import (
    ModalSandboxPool,
    ModalSdk,
    check_modal,
    official_modal_sdk,
)
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = [
    "check_daytona_settings",
    "check_modal_settings",
    "daytona_pool",
    "modal_pool",
]


def check_modal_settings(config: SandboxSettings) -> None:
    """At the env's start: the settings work, and the SDK and credentials are there."""
    config.modal_pool_config()
    check_modal()


def check_daytona_settings(config: SandboxSettings) -> None:
    """At the env's start: the settings work, and the SDK and credentials are there."""
    config.daytona_pool_config()
    check_daytona()


def modal_pool(
    config: SandboxSettings, *, sdk: ModalSdk = official_modal_sdk
) -> AbstractAsyncContextManager[SandboxPool]:
    """The env's Modal pool, unopened: its provider built by ``sdk`` (Modal's SDK) with the
    credentials found now. Raises ``ConfigError`` naming the env field, ``SandboxUnavailable``
    naming a missing credential or package."""
    return ModalSandboxPool(config.modal_pool_config(), sdk=sdk)


def daytona_pool(
    config: SandboxSettings, *, sdk: DaytonaSdk = official_daytona_sdk
) -> AbstractAsyncContextManager[SandboxPool]:
    """The env's Daytona pool, unopened: its provider built by ``sdk`` (Daytona's SDK) with
    the credentials found now. Raises ``ConfigError`` naming the env field,
    ``SandboxUnavailable`` naming a missing credential or package."""
    return DaytonaSandboxPool(config.daytona_pool_config(), sdk=sdk)
