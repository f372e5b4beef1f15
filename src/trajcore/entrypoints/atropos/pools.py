"""The env's sandbox pool: the slot-server policy, the Nomad settings and the pool, from the config.

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
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypedDict

from trajcore.adapters.sandbox.container_pool import ContainerPoolConfig, ContainerSandboxPool
from trajcore.adapters.sandbox.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.sandbox.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.adapters.sandbox.slurm_pool import SlurmPoolConfig, SlurmSandboxPool
from trajcore.adapters.sandbox.ssh_pool import SshPoolConfig, SshSandboxPool
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.domain.sandbox_policy import SlotPolicy
from trajcore.domain.ssh_hosts import SshHost
from trajcore.ports.sandbox_pool import SandboxPool

if TYPE_CHECKING:
    from trajcore.entrypoints.atropos.config import AgentEnvConfig

__all__ = ["make_pool", "nomad_pool_config", "slot_policy"]

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
    """The sandbox pool of a run, unopened (see ``AgentEnv.make_pool``).

    Raises:
        ConfigError: a Nomad setting that cannot work, named by its env field.
        SandboxUnavailable: ``require_stateful_sandbox`` with the local pool and no tmux on
            this host.
    """
    if config.sandbox == "nomad":
        return NomadSandboxPool(nomad_pool_config(config))
    if (
        config.sandbox == "local"
        and config.require_stateful_sandbox
        and shutil.which("tmux") is None
    ):
        raise SandboxUnavailable(
            "require_stateful_sandbox: the local pool keeps a persistent shell with tmux, "
            "which is not installed on this host"
        )
    servers = _ServerSettings(
        containers=config.local_containers,
        slots_per_container=config.slots_per_container,
        acquire_timeout_s=config.acquire_timeout_s,
        policy=slot_policy(config),
        require_tmux=config.require_stateful_sandbox,
    )
    if config.sandbox == "ssh":
        return SshSandboxPool(ssh_pool_config(config, servers))
    if config.sandbox == "slurm":
        return SlurmSandboxPool(slurm_pool_config(config))
    if config.sandbox == "container":
        return ContainerSandboxPool(
            ContainerPoolConfig(
                image=config.container_image, engine=config.container_engine, **servers
            )
        )
    return LocalSandboxPool(LocalPoolConfig(**servers))
