"""``--env.sandbox slurm``: every ``slurm_*`` setting, the scale range and the sandbox isolation
reach the Slurm pool's config; a setting that cannot work is refused naming its env field."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig, SlurmSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos import pools
from trajcore.entrypoints.atropos.config import AgentEnvConfig


def test_every_slurm_setting_reaches_the_pool(tmp_path: Path) -> None:
    config = AgentEnvConfig(
        sandbox="slurm", slurm_command="/opt/venv/bin/trajcore slot-server",
        slurm_partition="gpu", slurm_account="lab", slurm_qos="high", slurm_constraint="avx2",
        slurm_cpus_per_task=4, slurm_memory_mb=4096, slurm_time_limit_min=60,
        slurm_shared_dir=str(tmp_path), min_containers=2, max_containers=5,
        slots_per_container=3, acquire_timeout_s=42.0, allow_network=True,
        require_stateful_sandbox=True,
    )  # fmt: skip
    pool = pools.make_pool(config)
    assert isinstance(pool, SlurmSandboxPool)
    got, job = pool.config, pool.config.job
    assert job.command == ("/opt/venv/bin/trajcore", "slot-server")
    assert (job.partition, job.account, job.qos, job.constraint) == ("gpu", "lab", "high", "avx2")
    assert (job.cpus_per_task, job.memory_mb, job.time_limit_min) == (4, 4096, 60)
    assert got.shared_dir == tmp_path
    server = got.server
    scaling = got.scaling
    assert (scaling.min_containers, scaling.max_containers, server.slots_per_container) == (2, 5, 3)
    assert scaling.cooldown_s == SlurmPoolConfig().scaling.cooldown_s  # the pool's
    assert server.acquire_timeout_s == 42.0
    assert server.isolation.allow_network
    assert server.require_tmux
    assert server.start_timeout_s == SlurmPoolConfig().server.start_timeout_s  # the pool's


@pytest.mark.parametrize(
    ("field", "value"),
    [("slurm_partition", "two words"), ("slurm_command", ""), ("slurm_memory_mb", 0)],
)
def test_a_slurm_setting_that_cannot_work_names_its_field(field: str, value: object) -> None:
    values: dict[str, object] = {"sandbox": "slurm", field: value}
    config = AgentEnvConfig.model_construct(None, **values)
    with pytest.raises(ConfigError) as raised:
        config.slurm_pool_config()
    assert raised.value.field == field


@pytest.mark.parametrize(("minutes", "drain_s"), [(1, 15.0), (5, 75.0), (20, 300.0), (240, 300.0)])
def test_a_short_time_limit_works_and_drains_a_quarter_of_it(minutes: int, drain_s: float) -> None:
    """The drain margin is no env field: it follows the time limit, so no limit the flag takes
    fails with an error about a field the env does not have."""
    config = AgentEnvConfig.model_construct(None, sandbox="slurm", slurm_time_limit_min=minutes)
    assert config.slurm_pool_config().drain_before_s == drain_s
