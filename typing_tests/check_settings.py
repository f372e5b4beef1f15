"""The pools' settings, as typed code sees them (mypy checks this file; pytest never runs it).

- Every pool's slot servers' settings are one ``SlotServerSettings`` value (``server``), which
  is what the pool core reads (``join_rules``) and the Nomad job spec holds.
- Every scheduled pool's scaling settings are one ``ScaleSettings`` value (``scaling``), which
  the reconciler reads; every pool that starts its own servers holds one ``RestartSettings``
  value (``restart``), which its supervision reads.
- The env's flags derived from a job's settings (``nomad_cpu_mhz``, ``slurm_job_name``, ...)
  are not fields mypy sees: typed code reads them built and checked, ``nomad_job()`` and
  ``slurm_job()``, whose fields keep their types.
"""

from __future__ import annotations

from typing import assert_type

from trajcore.adapters.pools.cloud_pool import CloudPoolConfig
from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.adapters.pools.local_pool import LocalPoolConfig
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig
from trajcore.adapters.pools.pool_core import JoinRules, join_rules
from trajcore.adapters.pools.reconciled import ReconciledSettings
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.adapters.pools.ssh_pool import SshPoolConfig
from trajcore.adapters.pools.supervision import RestartSettings
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import NomadJobSettings, NomadJobSpec
from trajcore.domain.nomad_reconcile import ReconcileConfig
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slurm_jobs import SlurmJobSettings
from trajcore.env import AgentEnvConfig


def check_the_pool_core_reads_the_servers_settings(server: SlotServerSettings) -> JoinRules:
    return join_rules(server)


def check_started_pools_hold_one_server_value(
    local: LocalPoolConfig, container: ContainerPoolConfig, ssh: SshPoolConfig
) -> list[JoinRules]:
    for config in (local, container, ssh):
        assert_type(config.server, SlotServerSettings)
        assert_type(config.restart, RestartSettings)
    return [join_rules(local.server), join_rules(container.server), join_rules(ssh.server)]


def check_scheduled_pools_hold_one_server_value(
    nomad: NomadPoolConfig, slurm: SlurmPoolConfig, cloud: CloudPoolConfig
) -> list[ReconciledSettings]:
    for config in (nomad, slurm, cloud):
        assert_type(config.server, SlotServerSettings)
        assert_type(config.server.isolation, SlotIsolation)
        assert_type(config.scaling, ScaleSettings)
        assert_type(ReconcileConfig(scale=config.scaling), ReconcileConfig)
    assert_type(nomad.job_spec(count=1, token="t" * 16), NomadJobSpec)
    return [nomad, slurm, cloud]


def check_the_derived_flags_read_typed(config: AgentEnvConfig) -> tuple[int, str]:
    assert_type(config.nomad_job(), NomadJobSettings)
    assert_type(config.slurm_job(), SlurmJobSettings)
    return config.nomad_job().cpu_mhz, config.slurm_job().job_name
