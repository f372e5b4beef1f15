"""``DaytonaSandboxPool``: slot servers as Daytona sandboxes (hermes-agent's ``terminal_backend:
daytona``), over Daytona's official SDK (the ``daytona`` extra, imported only when a pool
starts).

The pool is the cloud pool (``cloud_pool``) with Daytona as its provider (``daytona_sdk``):
each sandbox runs one slot server from ``image`` (trajcore's slot-server image, or any image
with Python, trajcore's core and bubblewrap), reached through its preview URL with the pool's
bearer token. Daytona isolates each sandbox in its own container (or microVM, by target);
trajcore's slots add their own bubblewrap sandbox, uid and seccomp filter inside it
(docs/deploy.md, "Cloud sandboxes").

Credentials are Daytona's own (``DAYTONA_API_KEY``, or ``DAYTONA_JWT_TOKEN`` with
``DAYTONA_ORGANIZATION_ID``; ``DAYTONA_API_URL`` and ``DAYTONA_TARGET`` optional);
``check_daytona`` names what is missing before anything is created, and nothing here reads
them beyond their presence or logs them.
"""

from __future__ import annotations

import importlib.util
import os

import attrs

from trajcore.adapters.sandbox.cloud_pool import CloudPoolConfig, CloudProvider, CloudSandboxPool
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.domain.validators import positive_seconds, whole_number

__all__ = ["DaytonaPoolConfig", "DaytonaSandboxPool", "check_daytona"]

DEFAULT_IMAGE = "ghcr.io/trajcore/slot-server:latest"


@attrs.frozen(kw_only=True)
class DaytonaPoolConfig(CloudPoolConfig):
    """The cloud pool's settings (``CloudPoolConfig``) and Daytona's.

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

    image: str = attrs.field(default=DEFAULT_IMAGE, validator=attrs.validators.min_len(1))
    target: str | None = None
    cpu: int | None = None
    memory_gib: int | None = None
    disk_gib: int | None = None
    auto_stop_min: int = attrs.field(default=0, validator=whole_number(0))
    create_timeout_s: float = attrs.field(default=300.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for field in ("cpu", "memory_gib", "disk_gib"):
            value = getattr(self, field)
            if value is not None and value < 1:
                raise ConfigError(field, f"must be >= 1, got {value}")


def check_daytona() -> None:
    """Raise ``SandboxUnavailable`` naming what is missing for a Daytona pool: the ``daytona``
    package (``pip install 'trajcore[daytona]'``) or Daytona's credentials."""
    if importlib.util.find_spec("daytona") is None:
        raise SandboxUnavailable(
            "terminal_backend daytona needs the daytona package: pip install 'trajcore[daytona]'"
        )
    key = os.environ.get("DAYTONA_API_KEY")
    jwt = os.environ.get("DAYTONA_JWT_TOKEN") and os.environ.get("DAYTONA_ORGANIZATION_ID")
    if not key and not jwt:
        raise SandboxUnavailable(
            "terminal_backend daytona needs Daytona credentials: DAYTONA_API_KEY, or "
            "DAYTONA_JWT_TOKEN with DAYTONA_ORGANIZATION_ID"
        )


def _daytona_provider(config: DaytonaPoolConfig) -> CloudProvider:
    check_daytona()
    from trajcore.adapters.sandbox.daytona_sdk import DaytonaProvider, DaytonaSandboxSettings

    return DaytonaProvider(
        DaytonaSandboxSettings(
            image=config.image,
            target=config.target,
            cpu=config.cpu,
            memory_gib=config.memory_gib,
            disk_gib=config.disk_gib,
            auto_stop_min=config.auto_stop_min,
            create_timeout_s=config.create_timeout_s,
        )
    )


class DaytonaSandboxPool(CloudSandboxPool):
    """The SandboxPool port over Daytona sandboxes. ``async with DaytonaSandboxPool(config)``.

    ``provider`` replaces the SDK (tests give ``trajcore.testing.fake_cloud.FakeCloud``); left
    out, the pool is built over the ``daytona`` SDK and raises ``SandboxUnavailable`` naming
    the package or the credentials when either is missing. See ``CloudSandboxPool``.
    """

    def __init__(
        self, config: DaytonaPoolConfig | None = None, *, provider: CloudProvider | None = None
    ) -> None:
        config = config or DaytonaPoolConfig()
        super().__init__(provider or _daytona_provider(config), config)
