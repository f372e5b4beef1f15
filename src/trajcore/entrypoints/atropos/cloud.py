"""The Modal and Daytona pools from an env's settings (``--env.sandbox modal|daytona``, or
hermes-agent's ``terminal_backend: modal|daytona``).

The settings both providers take are ``sandbox_settings.CloudSettings``, part of the env's
sandbox section (each one ``--env.*`` flag): the image by hermes's names (``modal_image``,
``daytona_image``: hermes's ``TERMINAL_MODAL_IMAGE`` and ``TERMINAL_DAYTONA_IMAGE``), Modal's app,
environment and region, Daytona's target, CPU and memory per sandbox, and the sandbox's
lifetime. The scale range, slots per server, lease
deadline and sandbox policy are the env's own settings, as for every pool. Credentials are the
providers' own variables or files, found when the pool is built and handed to the SDK's client
(``sdk``: ``ModalSdk``, ``DaytonaSdk``, the seam a test fills with ``FakeCloud``), never logged;
a missing SDK or credential fails the env's start naming it (``check_modal``,
``check_daytona``). docs/deploy.md, "Cloud sandboxes", says what was checked.
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager
from typing import Any

from trajcore.adapters.sandbox.daytona_pool import (
    DaytonaPoolConfig,
    DaytonaSandboxPool,
    DaytonaSdk,
    check_daytona,
    official_daytona_sdk,
)
from trajcore.adapters.sandbox.modal_pool import (
    ModalPoolConfig,
    ModalSandboxPool,
    ModalSdk,
    check_modal,
    official_modal_sdk,
)
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = [
    "check_daytona_settings",
    "check_modal_settings",
    "daytona_pool",
    "daytona_pool_config",
    "modal_pool",
    "modal_pool_config",
]


def _shared(config: SandboxSettings) -> dict[str, Any]:
    return {
        "owner": config.cloud_owner,
        "slots_per_container": config.slots_per_container,
        "policy": config.slot_policy(),
        "min_containers": config.min_containers,
        "max_containers": config.max_containers,
        "acquire_timeout_s": config.acquire_timeout_s,
        "require_tmux": config.require_stateful_sandbox,
    }


def _named(prefix: str, error: ConfigError) -> ConfigError:
    fields = {"image": "image", "region": "region", "target": "target", "app_name": "app"}
    if error.field in ("cpu", "memory_mib", "memory_gib"):
        return ConfigError(f"cloud_{'cpu' if error.field == 'cpu' else 'memory_mb'}", error.reason)
    if error.field in ("sandbox_timeout_s", "auto_stop_min"):
        return ConfigError("cloud_lifetime_s", error.reason)
    if error.field in fields:
        return ConfigError(f"{prefix}_{fields[error.field]}", error.reason)
    return error


def modal_pool_config(config: SandboxSettings) -> ModalPoolConfig:
    """The Modal pool's settings. Raises ``ConfigError`` naming the env field."""
    settings = _shared(config)
    if config.cloud_lifetime_s is not None:
        settings["sandbox_timeout_s"] = config.cloud_lifetime_s
    try:
        return ModalPoolConfig(
            **settings, app_name=config.modal_app, environment=config.modal_environment,
            image=config.modal_image, region=config.modal_region, cpu=config.cloud_cpu,
            memory_mib=config.cloud_memory_mb,
        )  # fmt: skip
    except ConfigError as error:
        raise _named("modal", error) from None


def daytona_pool_config(config: SandboxSettings) -> DaytonaPoolConfig:
    """The Daytona pool's settings: CPUs rounded up to whole cores, memory up to whole GiB,
    the lifetime as the idle stop in whole minutes. Raises ``ConfigError`` naming the env
    field."""
    memory = config.cloud_memory_mb
    lifetime = config.cloud_lifetime_s
    try:
        return DaytonaPoolConfig(
            **_shared(config), image=config.daytona_image, target=config.daytona_target,
            cpu=None if config.cloud_cpu is None else math.ceil(config.cloud_cpu),
            memory_gib=None if memory is None else math.ceil(memory / 1024),
            auto_stop_min=0 if lifetime is None else math.ceil(lifetime / 60),
        )  # fmt: skip
    except ConfigError as error:
        raise _named("daytona", error) from None


def check_modal_settings(config: SandboxSettings) -> None:
    """At the env's start: the settings work, and the SDK and credentials are there."""
    modal_pool_config(config)
    check_modal()


def check_daytona_settings(config: SandboxSettings) -> None:
    """At the env's start: the settings work, and the SDK and credentials are there."""
    daytona_pool_config(config)
    check_daytona()


def modal_pool(
    config: SandboxSettings, *, sdk: ModalSdk = official_modal_sdk
) -> AbstractAsyncContextManager[SandboxPool]:
    """The env's Modal pool, unopened: its provider built by ``sdk`` (Modal's SDK) with the
    credentials found now. Raises ``ConfigError`` naming the env field, ``SandboxUnavailable``
    naming a missing credential or package."""
    return ModalSandboxPool(modal_pool_config(config), sdk=sdk)


def daytona_pool(
    config: SandboxSettings, *, sdk: DaytonaSdk = official_daytona_sdk
) -> AbstractAsyncContextManager[SandboxPool]:
    """The env's Daytona pool, unopened: its provider built by ``sdk`` (Daytona's SDK) with
    the credentials found now. Raises ``ConfigError`` naming the env field,
    ``SandboxUnavailable`` naming a missing credential or package."""
    return DaytonaSandboxPool(daytona_pool_config(config), sdk=sdk)
