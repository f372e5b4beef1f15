"""The env's sandbox pool: the slot-server policy, the Nomad settings and the pool, from the config.

``sandbox`` names a pool source in an open registry: ``register_pool(name, factory, check=...)``
(or an entry point in group ``trajcore.sandboxes``) makes a source selectable as
``--env.sandbox name``; trajcore's own (``local``, ``container``, ``nomad``, ``ssh``,
``slurm``) are registered at the bottom of this module the same way. A factory takes the
``AgentEnvConfig`` and returns the unopened pool; a ``check`` runs when the settings are checked
(``AgentEnvConfig.settings``), before anything starts.

Every place that turns ``AgentEnvConfig`` fields into a pool's settings lives here, so the slot
policy is derived once: ``slot_policy`` builds the policy every slot server gets, and
the Nomad, container and local pools' settings take it whole rather than restating its range.

Rules it keeps:

- A setting that cannot work is a ``ConfigError`` named by its env field (``terminal_timeout_s``,
  ``nomad_driver``, ...), not by the pool's own field name.
- Nothing here starts anything: ``make_pool`` returns an unopened pool, which the run enters.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypedDict

import attrs

from trajcore.adapters.sandbox.container_pool import ContainerPoolConfig, ContainerSandboxPool
from trajcore.adapters.sandbox.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.sandbox.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.adapters.sandbox.slurm_pool import SlurmPoolConfig, SlurmSandboxPool
from trajcore.adapters.sandbox.ssh_pool import SshPoolConfig, SshSandboxPool
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.domain.sandbox_policy import SlotPolicy
from trajcore.domain.ssh_hosts import SshHost
from trajcore.entrypoints.atropos.registries import Registry, track
from trajcore.ports.sandbox_pool import SandboxPool

if TYPE_CHECKING:
    from trajcore.entrypoints.atropos.config import AgentEnvConfig

__all__ = [
    "POOLS",
    "PoolFactory",
    "PoolSource",
    "check_pool",
    "make_pool",
    "nomad_pool_config",
    "register_pool",
    "slot_policy",
]

PoolFactory = Callable[["AgentEnvConfig"], AbstractAsyncContextManager[SandboxPool]]
"""Builds the unopened pool of a source from the env's settings."""


@attrs.frozen
class PoolSource:
    """A place slot servers run, as ``sandbox`` selects it.

    Attributes:
        factory: Builds the unopened pool from the ``AgentEnvConfig``.
        check: Raises ``ConfigError`` (naming the env field) for settings the source cannot
            work with, at ``AgentEnvConfig.settings``; ``None`` checks nothing early.
    """

    factory: PoolFactory
    check: Callable[[AgentEnvConfig], object] | None = None


def _as_source(loaded: object) -> PoolSource:
    if isinstance(loaded, PoolSource):
        return loaded
    if callable(loaded):
        return PoolSource(factory=loaded)
    raise TypeError(f"expected a PoolSource or a pool factory, got {type(loaded).__name__}")


POOLS: Registry[PoolSource] = track(
    Registry(field="sandbox", what="sandbox", group="trajcore.sandboxes", adapt=_as_source)
)
"""The pool sources ``sandbox`` selects from."""


def register_pool(
    name: str,
    factory: PoolFactory,
    *,
    check: Callable[[AgentEnvConfig], object] | None = None,
    replace: bool = False,
) -> None:
    """Make ``factory`` selectable as ``--env.sandbox name`` (``check`` runs at settings time).

    Raises:
        ConfigError: ``name`` is already registered and ``replace`` is false (field
            ``sandbox``).
    """
    POOLS.register(name, PoolSource(factory=factory, check=check), replace=replace)


def check_pool(config: AgentEnvConfig) -> None:
    """Run the chosen source's settings check.

    Raises:
        ConfigError: an unknown ``sandbox``, or a setting the source cannot work with, named by
            its env field.
    """
    check = POOLS.get(config.sandbox).check
    if check is not None:
        check(config)


# NomadPoolConfig's fields -> the env fields they are read from (and named by in errors).
_NOMAD_FIELDS: dict[str, str] = {
    **{
        name: f"nomad_{name}"
        for name in (
            "address", "job_id", "driver", "image", "command", "token", "namespace", "region",
            "datacenters",
        )
    },
    **{
        name: name
        for name in (
            "slots_per_container", "min_containers", "max_containers", "privileged",
            "acquire_timeout_s", "purge_on_start", "purge_on_shutdown",
        )
    },
}  # fmt: skip


def slot_policy(config: AgentEnvConfig) -> SlotPolicy:
    """The sandbox policy every slot server gets: network, sandbox requirement, timeouts.

    ``require_stateful_sandbox`` requires the sandbox too: the persistent shell lives in it.

    Raises:
        ConfigError: a timeout range that cannot work (``terminal_timeout_s``).
    """
    timeout = config.terminal_timeout_s
    try:
        return SlotPolicy(
            allow_network=config.allow_network,
            require_sandbox=config.require_sandbox or config.require_stateful_sandbox,
            min_timeout_s=min(1.0, timeout),
            default_timeout_s=timeout,
            max_timeout_s=max(3600.0, timeout),
        )
    except ConfigError as error:
        raise ConfigError("terminal_timeout_s", error.reason) from None


def nomad_pool_config(config: AgentEnvConfig) -> NomadPoolConfig:
    """The Nomad pool's settings from the ``nomad_*`` fields and the sandbox policy.

    Raises:
        ConfigError: a Nomad setting that cannot work, named by its env field.
    """
    policy = slot_policy(config)
    settings = {name: getattr(config, field) for name, field in _NOMAD_FIELDS.items()}
    try:
        return NomadPoolConfig(
            **settings, policy=policy, require_tmux=config.require_stateful_sandbox
        )
    except ConfigError as error:
        raise ConfigError(_NOMAD_FIELDS.get(error.field, error.field), error.reason) from None


class _ServerSettings(TypedDict):
    """The env's settings of a pool whose servers this machine starts (local or container)."""

    containers: int
    slots_per_container: int
    acquire_timeout_s: float | None
    policy: SlotPolicy
    require_tmux: bool


def ssh_pool_config(config: AgentEnvConfig, servers: _ServerSettings) -> SshPoolConfig:
    """The SSH pool's settings: each ``ssh_host`` runs ``local_containers`` servers of
    ``slots_per_container`` slots (docs/deploy.md)."""
    hosts = [word.strip() for word in (config.ssh_host or "").split(",") if word.strip()]
    if not hosts:
        raise ConfigError("ssh_host", "sandbox 'ssh' needs at least one host")
    return SshPoolConfig(
        hosts=[
            SshHost(
                address=address, user=config.ssh_user, port=config.ssh_port,
                servers=servers["containers"], slots=servers["slots_per_container"],
                python=config.ssh_python, identity_file=config.ssh_key,
                known_hosts=config.ssh_known_hosts,
                accept_new_host_key=config.ssh_accept_new_host_key,
            )
            for address in hosts
        ],
        policy=servers["policy"],
        require_tmux=servers["require_tmux"],
        acquire_timeout_s=servers["acquire_timeout_s"],
    )  # fmt: skip


def slurm_pool_config(config: AgentEnvConfig) -> SlurmPoolConfig:
    """The Slurm pool's settings from the ``slurm_*`` fields, the scale range and the policy
    (docs/deploy.md).

    Raises:
        ConfigError: a Slurm setting that cannot work, named by its env field.
    """
    job = ("command", "partition", "account", "qos", "constraint", "cpus_per_task", "memory_mb")
    settings = {name: getattr(config, f"slurm_{name}") for name in job}
    try:
        return SlurmPoolConfig(
            **settings, slots_per_container=config.slots_per_container,
            policy=slot_policy(config), time_limit_min=config.slurm_time_limit_min,
            min_containers=config.min_containers, max_containers=config.max_containers,
            shared_dir=config.slurm_shared_dir, acquire_timeout_s=config.acquire_timeout_s,
            require_tmux=config.require_stateful_sandbox,
        )  # fmt: skip
    except ConfigError as error:
        name = f"slurm_{error.field}" if error.field in (*job, "shared_dir") else error.field
        raise ConfigError(name, error.reason) from None


def make_pool(config: AgentEnvConfig) -> AbstractAsyncContextManager[SandboxPool]:
    """The sandbox pool of a run, unopened (see ``AgentEnv.make_pool``): the registered source
    ``config.sandbox`` builds it.

    Raises:
        ConfigError: an unknown ``sandbox``, or a setting that cannot work, named by its env
            field.
        SandboxUnavailable: ``require_stateful_sandbox`` with the local pool and no tmux on
            this host.
    """
    return POOLS.get(config.sandbox).factory(config)


def _server_settings(config: AgentEnvConfig) -> _ServerSettings:
    return _ServerSettings(
        containers=config.local_containers,
        slots_per_container=config.slots_per_container,
        acquire_timeout_s=config.acquire_timeout_s,
        policy=slot_policy(config),
        require_tmux=config.require_stateful_sandbox,
    )


def _local_pool(config: AgentEnvConfig) -> AbstractAsyncContextManager[SandboxPool]:
    if config.require_stateful_sandbox and shutil.which("tmux") is None:
        raise SandboxUnavailable(
            "require_stateful_sandbox: the local pool keeps a persistent shell with tmux, "
            "which is not installed on this host"
        )
    return LocalSandboxPool(LocalPoolConfig(**_server_settings(config)))


def _container_pool(config: AgentEnvConfig) -> AbstractAsyncContextManager[SandboxPool]:
    return ContainerSandboxPool(
        ContainerPoolConfig(
            image=config.container_image,
            engine=config.container_engine,
            **_server_settings(config),
        )
    )


def _check_ssh(config: AgentEnvConfig) -> None:
    if not (config.ssh_host or "").strip():
        raise ConfigError("ssh_host", "sandbox 'ssh' needs at least one host")


register_pool("local", _local_pool)
register_pool("container", _container_pool)
register_pool(
    "nomad", lambda config: NomadSandboxPool(nomad_pool_config(config)), check=nomad_pool_config
)
register_pool(
    "ssh",
    lambda config: SshSandboxPool(ssh_pool_config(config, _server_settings(config))),
    check=_check_ssh,
)
register_pool(
    "slurm", lambda config: SlurmSandboxPool(slurm_pool_config(config)), check=slurm_pool_config
)
