"""The env's sandbox section: each pool's settings built from its flags by one rule, each
default the pool's own, and no import of the env's config by the pool modules."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest
from pydantic import Field, ValidationError

from trajcore.adapters.pools.cloud_pool import CloudPoolConfig
from trajcore.adapters.pools.container_pool import ContainerPoolConfig, ContainerSandboxPool
from trajcore.adapters.pools.daytona_pool import DaytonaPoolConfig, DaytonaSandboxSettings
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.pools.modal_pool import ModalPoolConfig, ModalSandboxSettings
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.adapters.pools.ssh_pool import SshPoolConfig
from trajcore.domain.converters import command_words
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import NomadJobSettings
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slurm_jobs import SlurmJobSettings
from trajcore.domain.ssh_hosts import SshHost
from trajcore.entrypoints.atropos import sandbox_settings
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings


def test_each_pool_reads_exactly_its_section_and_the_shared_fields() -> None:
    section = sandbox_settings._section
    # Every field of the Nomad job is its own nomad_* flag, but the three that are shared.
    shared_job_fields = {
        "privileged": "privileged",
        "image_cache_dir": "image_cache_dir",  # the servers' cache, for the Nomad pool too
        "image_cache_bytes": "image_cache_bytes",
    }
    assert section(NomadJobSettings, ("nomad_",), {}) == {
        **{field.name: f"nomad_{field.name}" for field in attrs.fields(NomadJobSettings)},
        **shared_job_fields,
    }
    assert section(NomadPoolConfig, ("nomad_",), {}) == {
        "address": "nomad_address", "token": "nomad_token",
        "purge_on_start": "purge_on_start", "purge_on_shutdown": "purge_on_shutdown",
        "fork_wait_s": "fork_wait_s",
    }  # fmt: skip
    # The scaling settings of every scheduled pool: the shared scale range (the damping is
    # the pool's own).
    assert section(ScaleSettings, (), {}) == {
        "min_containers": "min_containers", "max_containers": "max_containers",
    }  # fmt: skip
    # The slot servers' settings of every pool: the shared flags (the isolation and the tmux
    # requirement come from slot_isolation and require_stateful_sandbox).
    assert section(SlotServerSettings, (), {}) == {
        "slots_per_container": "slots_per_container", "acquire_timeout_s": "acquire_timeout_s",
    }  # fmt: skip
    assert section(SlurmJobSettings, ("slurm_",), {}) == {
        field.name: f"slurm_{field.name}" for field in attrs.fields(SlurmJobSettings)
    }
    assert section(SlurmPoolConfig, ("slurm_",), {}) == {
        "shared_dir": "slurm_shared_dir",
    }
    shared_servers = {
        "image_cache_dir": "image_cache_dir",
        "image_cache_bytes": "image_cache_bytes",
        "fork_wait_s": "fork_wait_s",
    }
    assert section(LocalPoolConfig, ("local_",), {}) == {
        "containers": "local_containers", "environment_dirs": "environment_dirs",
        **shared_servers,
    }  # fmt: skip
    assert section(ContainerPoolConfig, ("container_", "local_"), {}) == {
        "containers": "local_containers", "image": "container_image",
        "engine": "container_engine", "environment_dirs": "container_environment_dirs",
        "engine_options": "container_engine_options", "name_prefix": "container_name_prefix",
        "engine_timeout_s": "container_engine_timeout_s", **shared_servers,
    }  # fmt: skip
    assert section(SshPoolConfig, ("ssh_",), {}) == {}
    assert section(SshHost, ("ssh_",), sandbox_settings._SSH_NAMES) == {
        "user": "ssh_user", "port": "ssh_port", "servers": "local_containers",
        "slots": "slots_per_container", "python": "ssh_python", "identity_file": "ssh_key",
        "known_hosts": "ssh_known_hosts", "accept_new_host_key": "ssh_accept_new_host_key",
    }  # fmt: skip


def test_the_cloud_pools_read_their_sections_with_the_renamed_fields() -> None:
    section = sandbox_settings._section
    assert section(CloudPoolConfig, ("cloud_",), {}) == {
        "owner": "cloud_owner",
    }
    assert section(ModalSandboxSettings, ("modal_", "cloud_"), sandbox_settings._MODAL_NAMES) == {
        "app_name": "modal_app", "environment": "modal_environment", "image": "modal_image",
        "region": "modal_region", "cpu": "cloud_cpu", "memory_mib": "cloud_memory_mb",
        "sandbox_timeout_s": "cloud_lifetime_s",
    }  # fmt: skip
    assert section(
        DaytonaSandboxSettings, ("daytona_", "cloud_"), sandbox_settings._DAYTONA_NAMES
    ) == {
        "image": "daytona_image", "target": "daytona_target", "cpu": "cloud_cpu",
        "memory_gib": "cloud_memory_mb", "auto_stop_min": "cloud_lifetime_s",
    }  # fmt: skip
    settings = SandboxSettings()
    # The env's scale range and slots, every other setting the pool's own default.
    server = attrs.evolve(CloudPoolConfig().server, slots_per_container=8)
    pool = CloudPoolConfig(server=server, scaling=ScaleSettings(max_containers=10))
    assert settings.modal_pool_config() == ModalPoolConfig(pool=pool)
    assert settings.daytona_pool_config() == DaytonaPoolConfig(pool=pool)
    with pytest.raises(ConfigError) as caught:
        SandboxSettings(cloud_memory_mb=0).daytona_pool_config()
    assert caught.value.field == "cloud_memory_mb"


def test_the_file_size_limit_reaches_the_slot_servers_and_none_lifts_it() -> None:
    assert SandboxSettings().slot_isolation().max_file_bytes == 1 << 30
    assert SandboxSettings(max_file_bytes=None).slot_isolation().max_file_bytes is None
    assert SandboxSettings(max_file_bytes=4096).slot_isolation().max_file_bytes == 4096
    local = SandboxSettings(max_file_bytes=None).local_pool_config()
    assert local.server.isolation.max_file_bytes is None


def test_the_disk_budget_reaches_the_slot_servers_and_none_lifts_it() -> None:
    assert SandboxSettings().slot_isolation().disk_bytes == 10 << 30
    assert SandboxSettings().slot_isolation().disk_files == 1_000_000
    budget = SandboxSettings(disk_bytes=8 << 20, disk_files=None).local_pool_config()
    assert budget.server.isolation.disk_bytes == 8 << 20
    assert budget.server.isolation.disk_files is None


@pytest.mark.parametrize("field", ["disk_bytes", "disk_files"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "many"])
def test_a_bad_disk_budget_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        SandboxSettings.model_validate({field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


def test_the_slot_uid_base_reaches_every_pools_servers_and_a_bad_one_is_named() -> None:
    settings = SandboxSettings(slot_uid_base=1_950_000_000)
    for config in (settings.local_pool_config(), settings.container_pool_config()):
        assert config.server.isolation.slot_uid_base == 1_950_000_000
        assert config.server_isolation(1).slot_uid_base == 1_950_000_008  # 8 slots a server
    assert settings.nomad_pool_config().server.isolation.slot_uid_base == 1_950_000_000
    assert settings.slurm_pool_config().server.isolation.slot_uid_base == 1_950_000_000
    for bad in (5, 2**31):
        with pytest.raises(ConfigError) as caught:
            SandboxSettings(slot_uid_base=bad).local_pool_config()
        assert caught.value.field == "slot_uid_base"


def test_the_defaults_are_the_pools_own() -> None:
    settings = SandboxSettings()
    assert settings.slot_isolation() == SlotIsolation()
    assert settings.nomad_pool_config() == NomadPoolConfig()
    assert settings.slurm_pool_config() == SlurmPoolConfig()
    # The env serves 8 slots per server everywhere (the Nomad and Slurm pools' default).
    local, container = LocalPoolConfig(), ContainerPoolConfig()
    eight = attrs.evolve(local.server, slots_per_container=8)
    assert settings.local_pool_config() == attrs.evolve(local, server=eight)
    container_server = attrs.evolve(container.server, slots_per_container=8)
    assert container.server.start_timeout_s == 60.0  # the container pool's own
    assert settings.container_pool_config() == attrs.evolve(container, server=container_server)
    ssh = SandboxSettings(ssh_host="a, b").ssh_pool_config()
    hosts = [SshHost(address=a, servers=2, slots=8) for a in ("a", "b")]
    assert ssh == SshPoolConfig(hosts=hosts, server=eight)


def test_the_fork_wait_reaches_every_pool_that_forks() -> None:
    """The local, container and Nomad pools run task environments and forks; the Nomad pool
    read no fork wait before (its leases from a snapshot waited the default 2 s)."""
    settings = SandboxSettings(fork_wait_s=0.25)
    assert LocalSandboxPool(settings.local_pool_config()).fork_wait_s == 0.25
    assert ContainerSandboxPool(settings.container_pool_config()).fork_wait_s == 0.25
    assert NomadSandboxPool(settings.nomad_pool_config()).fork_wait_s == 0.25
    for config in (LocalPoolConfig, NomadPoolConfig):
        with pytest.raises(ConfigError, match="fork_wait_s"):
            config(fork_wait_s=-1)


def test_a_pools_error_names_the_env_field() -> None:
    with pytest.raises(ConfigError) as caught:
        SandboxSettings(ssh_host="h", ssh_key="two words").ssh_pool_config()
    assert caught.value.field == "ssh_key"
    with pytest.raises(ConfigError) as caught:
        SandboxSettings(container_image="").container_pool_config()
    assert caught.value.field == "container_image"
    with pytest.raises(ConfigError) as caught:
        SandboxSettings(min_containers=3, max_containers=2).slurm_pool_config()
    assert caught.value.field == "max_containers"


class _EnvSettings(SandboxSettings):
    image: str = Field(default="the env's own image, not a pool's")
    python: str = Field(default="/the/env's/own/python")


def test_an_env_field_named_like_a_pool_field_stays_the_envs() -> None:
    settings = _EnvSettings()
    assert settings.container_pool_config().image == ContainerPoolConfig().image
    assert settings.local_pool_config().python == LocalPoolConfig().python


@pytest.mark.parametrize("module", ["pools", "cloud", "sandbox_settings"])
def test_the_pool_modules_never_import_the_env_config(module: str) -> None:
    source = Path(sandbox_settings.__file__).with_name(f"{module}.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    imported |= {
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert not any(name.startswith("trajcore.entrypoints.atropos.config") for name in imported)


def test_every_job_setting_is_a_flag_with_the_settings_default_and_doc() -> None:
    flags = SandboxSettings.model_fields
    for settings, prefix, label in sandbox_settings.JOB_SECTIONS:
        docs = sandbox_settings.attribute_docs(settings)
        for field in attrs.fields(settings):
            if field.name in sandbox_settings.DeclaredSettings.model_fields:
                continue  # a shared flag (privileged, image_cache_dir, ...)
            flag = flags[prefix + field.name]
            assert docs.get(field.name), f"{settings.__name__}.{field.name} has no doc entry"
            assert flag.description == f"{label}: {docs[field.name]}"
    defaults = SandboxSettings()
    assert defaults.nomad_job() == NomadJobSettings()
    assert defaults.slurm_job() == SlurmJobSettings()


def test_the_newer_job_flags_reach_the_job_and_a_bad_one_is_named() -> None:
    values = {
        "nomad_cpu_mhz": 2500, "nomad_restart_attempts": 2, "nomad_token_env": "SLOT_TOKEN",
        "slurm_extra_options": "--gres=gpu:1 --exclusive", "slurm_job_name": "rl-slots",
    }  # fmt: skip
    settings = SandboxSettings.model_validate(values)
    nomad = settings.nomad_job()
    assert (nomad.cpu_mhz, nomad.restart_attempts, nomad.token_env) == (2500, 2, "SLOT_TOKEN")
    slurm = settings.slurm_job()
    assert slurm.extra_options == ("--gres=gpu:1", "--exclusive")
    assert slurm.job_name == "rl-slots"
    for field, value in [
        ("nomad_cpu_mhz", 0), ("nomad_reschedule_delay_s", 1.0), ("nomad_group", "a b"),
        ("slurm_extra_options", "gres"), ("slurm_job_name", "two words"),
    ]:  # fmt: skip
        built = SandboxSettings.model_validate({field: value})
        check = built.nomad_pool_config if field.startswith("nomad_") else built.slurm_pool_config
        with pytest.raises(ConfigError) as caught:
            check()
        assert caught.value.field == field


def _comma_words(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(value.split(",")) if isinstance(value, str) else value


@attrs.frozen(kw_only=True)
class _DemoJob:
    """A job as a newcomer writes it.

    Attributes:
        cores: Cores each server takes.
        labels, zones: Where it may run
            (comma-separated).
        note: Free text.
    """

    cores: int = attrs.field(default=2, validator=attrs.validators.gt(0))
    labels: tuple[str, ...] = attrs.field(default=("a", "b"), converter=_comma_words)
    zones: tuple[str, ...] = attrs.field(default=(), converter=command_words)
    note: str | None = None


def test_a_field_written_once_in_a_settings_class_is_a_documented_flag() -> None:
    flags = sandbox_settings.derived_flags(
        sandbox_settings.DeclaredSettings, ((_DemoJob, "demo_", "Demo job"),)
    )
    assert set(flags) == {"demo_cores", "demo_labels", "demo_zones", "demo_note"}
    kind, field = flags["demo_cores"]
    assert (kind, field.default, field.description) == (
        int,
        2,
        "Demo job: Cores each server takes.",
    )
    kind, field = flags["demo_labels"]  # its converter splits on commas: the default joins so
    assert (kind, field.default) == (str, "a,b")
    assert field.description == "Demo job: Where it may run (comma-separated)."
    assert flags["demo_zones"][1].default == ""
    assert flags["demo_note"][0] == str | None


@attrs.frozen
class _Unflaggable:
    where: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class _Unsplit:
    words: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen
class _Required:
    name: str


@pytest.mark.parametrize("settings", [_Unflaggable, _Unsplit, _Required])
def test_a_settings_field_no_flag_can_read_is_refused_naming_it(settings: type) -> None:
    with pytest.raises(TypeError, match=rf"{settings.__name__}\."):
        sandbox_settings.derived_flags(
            sandbox_settings.DeclaredSettings, ((settings, "bad_", "Bad"),)
        )
