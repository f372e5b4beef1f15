"""The env's sandbox settings: where slot servers run and what they are told, as ``--env.*`` flags.

``SandboxSettings`` is the sandbox section of ``AgentEnvConfig`` (a mixin, so each setting stays
one flat ``--env.<name>`` flag: atroposlib's command line turns every field of the env's config
into one flag and rebuilds the config from a flat mapping, so nested sections would not reach
it). The settings are not a second copy of the pools' own: each pool's settings are the attrs
values its adapter defines (``LocalPoolConfig``, ``ContainerPoolConfig``, ``NomadPoolConfig``,
``NomadJobSettings``, ``SlurmPoolConfig``, ``SlurmJobSettings``, ``SshHost``, ``SlotIsolation``;
``ModalPoolConfig`` and ``DaytonaPoolConfig`` in ``cloud``), and this module only names them
for the command line. The flags come two ways:

- Derived: every field of a job's settings (``JOB_SECTIONS``: ``NomadJobSettings`` as
  ``nomad_<field>``, ``SlurmJobSettings`` as ``slurm_<field>``) is a flag with the field's
  default (words and JSON lists as text) and its ``Attributes:`` entry as help, generated when
  this module is imported (``derived_flags``). Adding a Nomad job setting is one field, with
  its default, validator and docstring entry, in ``NomadJobSettings``: its flag, its default,
  its help and its error's name follow. A type no flag reads (a mapping, a tuple whose
  converter splits no text) is refused at import, naming the field.
- Written out (``DeclaredSettings``): the choice of pool, the settings several pools share
  (``slots_per_container``, ``image_cache_dir``, the isolation's), and the pools' own that no
  job settings value holds (``nomad_address``, ``ssh_*``, ...; the ``container_*`` flags in
  ``container_settings``). Each default
  is the pool's own, read from its default value, never restated; where the env chooses
  differently it says so (``slots_per_container``: 8 slots, the Nomad and Slurm pools'
  default, for every pool).

A pool's settings are built from the flags by one rule (``_section``): the pool's field ``name``
is read from the flag ``<prefix><name>`` of its section (``nomad_job_id``), else from the flag
``name`` that several pools share (``slots_per_container``, ``privileged``,
``acquire_timeout_s``), else it keeps the pool's default. The few flags named otherwise
(hermes's ``ssh_key``) are listed beside their section. A pool's error is renamed by the same
rule, so a bad value is a ``ConfigError`` naming the flag. ``slot_isolation`` is the one place
the sandbox isolation every slot server gets is derived.

Typing: the derived flags are fields at run time (command line, YAML, ``model_validate``,
``model_fields``) but not to mypy, which sees only ``DeclaredSettings``. Typed code reads them
built and checked, ``nomad_job()`` and ``slurm_job()``, and gives them by name
(``AgentEnvConfig.model_validate({"nomad_cpu_mhz": 2000, ...})``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import re
from collections.abc import Iterator, Mapping
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import attrs
from attrs import AttrsInstance
from pydantic import BaseModel, Field, create_model

from trajcore.adapters.pools.cloud_pool import CloudPoolConfig
from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.adapters.pools.daytona_pool import DaytonaPoolConfig, DaytonaSandboxSettings
from trajcore.adapters.pools.local_pool import LocalPoolConfig
from trajcore.adapters.pools.modal_pool import ModalPoolConfig, ModalSandboxSettings
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig
from trajcore.adapters.pools.reconciled import ReconciledSettings
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.adapters.pools.ssh_pool import SshPoolConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import NomadJobSettings
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slurm_jobs import SlurmJobSettings
from trajcore.domain.ssh_hosts import SshHost
from trajcore.entrypoints.atropos.container_settings import ContainerSettings
from trajcore.entrypoints.atropos.json_list_flags import json_items, json_values
from trajcore.entrypoints.atropos.nomad_agent import NOMAD_VARIABLES, NomadAgent, nomad_agent

__all__ = [
    "JOB_SECTIONS",
    "CloudSettings",
    "DeclaredSettings",
    "SandboxSettings",
    "attribute_docs",
    "derived_flags",
]

T = TypeVar("T", bound=AttrsInstance)

# The pools' own defaults, which the flags below take.
_POLICY = SlotIsolation()
_LOCAL = LocalPoolConfig()
_CONTAINER = ContainerPoolConfig()
_NOMAD = NomadPoolConfig()
_SLURM = SlurmPoolConfig()
_CLOUD = CloudPoolConfig()
_SSH = SshHost(address="host")
_SSH_POOL = SshPoolConfig(hosts=[_SSH])
_MODAL = ModalPoolConfig()
_DAYTONA = DaytonaPoolConfig()


def _cap(default: int | None, description: str) -> Any:
    """The flag of one of the slots' optional caps (``SlotIsolation``): at least 1, ``None`` for
    no cap, by default the policy's (``default``)."""
    return Field(default=default, ge=1, description=description)


class CloudSettings(BaseModel):
    """The Modal and Daytona settings (``SandboxSettings.modal_pool_config``,
    ``daytona_pool_config``; the pools themselves: ``cloud``)."""

    modal_image: str = Field(default=_MODAL.sandbox.image, description="Modal: the sandbox image.")
    modal_app: str = Field(default=_MODAL.sandbox.app_name, description="Modal: the app's name.")
    modal_environment: str | None = Field(
        default=_MODAL.sandbox.environment, description="Modal: the environment."
    )
    modal_region: str | None = Field(
        default=_MODAL.sandbox.region, description="Modal: where sandboxes run."
    )
    daytona_image: str = Field(
        default=_DAYTONA.sandbox.image, description="Daytona: the sandbox image."
    )
    daytona_target: str | None = Field(
        default=_DAYTONA.sandbox.target, description="Daytona: the target (region)."
    )
    cloud_cpu: float | None = Field(default=None, description="Modal, Daytona: CPUs per sandbox.")
    cloud_memory_mb: int | None = Field(
        default=None, description="Modal, Daytona: memory per sandbox in MB."
    )
    cloud_lifetime_s: float | None = Field(
        default=None,
        description="Modal: a sandbox's lifetime; Daytona: its idle stop.",
    )
    cloud_owner: str = Field(
        default=_MODAL.pool.owner,
        description="Modal, Daytona: the label of this pool's sandboxes; at start every sandbox "
        "with it is deleted (a crashed run's), so give each concurrent pool its own.",
    )


class DeclaredSettings(ContainerSettings, CloudSettings):
    """The sandbox flags written out here: the choice of pool, the settings several pools
    share, and the pools' own that no job settings value holds (the job flags are derived,
    ``JOB_SECTIONS``)."""

    sandbox: str = Field(
        default="local",
        description="Where slots run: local slot servers (processes), slot-server containers "
        "on this machine (podman or docker), a Nomad cluster, hosts reached over SSH, Slurm "
        "batch jobs, or a registered pool source (register_pool).",
    )

    slurm_shared_dir: str | None = Field(
        default=None, description="Slurm pool: a directory this host and every node share."
    )
    ssh_host: str | None = Field(
        default=None, description="SSH pool: the host, or hosts comma-separated (hermes's name)."
    )
    ssh_user: str | None = Field(default=_SSH.user, description="SSH pool: the login (hermes's).")
    ssh_port: int | None = Field(default=_SSH.port, description="SSH pool: sshd's port (hermes's).")
    ssh_key: str | None = Field(
        default=_SSH.identity_file,
        description="SSH pool: a private key file (default: the agent's keys).",
    )
    ssh_known_hosts: str | None = Field(
        default=_SSH.known_hosts,
        description="SSH pool: the known_hosts file (default: ssh's own).",
    )
    ssh_accept_new_host_key: bool = Field(
        default=_SSH.accept_new_host_key,
        description="SSH pool: trust an unknown host key on first contact.",
    )
    ssh_python: str = Field(
        default=_SSH.python, description="SSH pool: the hosts' python that has trajcore."
    )
    local_containers: int = Field(
        default=_LOCAL.containers, ge=1, description="Local and container pools: slot servers (K)."
    )
    image_cache_dir: str | None = Field(
        default=None,
        description="Local, container and Nomad pools: the slot servers' image cache (absolute; "
        "a Nomad task's as it sees it): tasks may run over their own images; off by default.",
    )
    image_cache_bytes: int = Field(
        default=_LOCAL.image_cache_bytes, ge=1, description="The image cache's size limit."
    )
    environment_dirs: str | None = Field(
        default=None,
        description="Local pool: the only folders directory: trees may come from (the container "
        "pool: container_environment_dirs; refused with the Nomad pool).",
    )
    fork_wait_s: float = Field(
        default=_LOCAL.fork_wait_s,
        ge=0,
        description="Local, container and Nomad pools: how long a member waits for a slot of "
        "the server its group was prepared on before it prepares elsewhere (prepare_once).",
    )
    slots_per_container: int = Field(
        default=_NOMAD.server.slots_per_container, ge=1, description="Slots per container (N)."
    )
    nomad_address: str | None = Field(
        default=None,
        description=f"Nomad API URL (default: $NOMAD_ADDR, else {_NOMAD.address}).",
    )
    nomad_token: str | None = Field(
        default=_NOMAD.token, description="Nomad ACL token (default: $NOMAD_TOKEN)."
    )
    min_containers: int = Field(
        default=_NOMAD.scaling.min_containers, ge=1, description="Nomad: fewest containers."
    )
    max_containers: int = Field(
        default=_NOMAD.scaling.max_containers, ge=1, description="Nomad: most containers."
    )
    privileged: bool = Field(
        default=_NOMAD.job.privileged, description="Nomad: run containers privileged."
    )
    purge_on_start: bool = Field(
        default=_NOMAD.purge_on_start, description="Nomad: purge the job on start."
    )
    purge_on_shutdown: bool = Field(
        default=_NOMAD.purge_on_shutdown, description="Nomad: purge it on shutdown."
    )
    acquire_timeout_s: float = Field(
        default=cast("float", _NOMAD.server.acquire_timeout_s),
        gt=0,
        description="Longest wait for a slot.",
    )
    allow_network: bool = Field(
        default=_POLICY.allow_network, description="Slots may reach the network."
    )
    require_sandbox: bool = Field(
        default=_POLICY.require_sandbox,
        description="Refuse to start when commands cannot run isolated.",
    )
    require_stateful_sandbox: bool = Field(
        default=_LOCAL.server.require_tmux,
        description="Refuse to start when slots cannot keep a persistent shell "
        "(bash_stateful, tmux; the local pool needs tmux on the host).",
    )
    max_file_bytes: int | None = _cap(
        _POLICY.max_file_bytes,
        "Largest file a sandboxed process may write (an rlimit; 1 GiB by default, so "
        "a runaway 'yes > out' stops there). None: no cap.",
    )
    disk_bytes: int | None = _cap(
        _POLICY.disk_bytes,
        "Disk space one lease may fill in its workspace and writable layers (10 GiB "
        "by default); a lease past it is ended, naming the budget. None: no budget.",
    )
    disk_files: int | None = _cap(
        _POLICY.disk_files,
        "Files (inodes) one lease may keep in its workspace and writable layers "
        "(1,000,000 by default); a lease past it is ended, naming the budget. None: no budget.",
    )
    terminal_timeout_s: float = Field(
        default=_POLICY.default_timeout_s,
        gt=0,
        description="Limit of one slot tool call (the env's, not the model's).",
    )
    slot_uid_base: int = Field(
        default=_POLICY.slot_uid_base,
        description="Slot servers run as root run slot i as host uid slot_uid_base + i (each "
        "server its own block). Pools on one host reserve theirs apart; give env processes on "
        "Nomad's docker or exec driver ranges apart by hand (docs/deploy.md).",
    )


# ============================================================================ derived flags

JOB_SECTIONS: tuple[tuple[type[AttrsInstance], str, str], ...] = (
    (NomadJobSettings, "nomad_", "Nomad job"),
    (SlurmJobSettings, "slurm_", "Slurm job"),
)
"""The settings values whose every field is a flag ``<prefix><field>`` (``nomad_cpu_mhz``), with
the settings' default and its ``Attributes:`` entry as the flag's help: a field added to one
of them is a flag with nothing else written. A field whose bare name is a flag written out
above (``privileged``, ``image_cache_dir``) is read from that shared flag instead."""

_ENTRY = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's text in ``cls``'s docstring ``Attributes:`` block, on one line (an entry
    ``a, b: text`` gives both ``a`` and ``b`` its text)."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    docs: dict[str, list[str]] = {}
    current: list[str] = []
    inside = False
    for line in lines:
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line.strip() and not line.startswith("    "):
            break
        entry = _ENTRY.match(line[4:]) if not line.startswith("     ") else None
        if entry is not None:
            current = [entry.group(2)]
            for name in entry.group(1).split(", "):
                docs[name] = current
        elif line.strip():
            current.append(line.strip())
    return {name: " ".join(words) for name, words in docs.items()}


def _flag_type(hint: object, where: str) -> object:
    """The flag's type for a settings field of type ``hint``: the type itself for ``bool``,
    ``int``, ``float`` and ``str``; text for a ``Literal``, words and a JSON list of values;
    ``X | None`` for an optional one. Raises ``TypeError`` naming ``where`` for any other."""
    if hint in (bool, int, float, str):
        return hint
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal or origin is tuple:
        return str
    if origin in (Union, UnionType) and type(None) in args:
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _flag_type(inner, where) | None  # type: ignore[operator]
    raise TypeError(f"{where}: a settings field of type {hint!r} has no flag form; give it one")


def _flag_default(field: attrs.Attribute[Any], hint: object, where: str) -> object:
    """The flag's default: the settings' own, as text where the flag is text. Words are joined
    by the separator the field's converter splits text on (spaces, else commas).

    Raises:
        TypeError: a tuple field whose converter reads no text (naming ``where``).
    """
    default: Any = field.default
    factory = getattr(default, "factory", None)
    if factory is not None:  # attrs.Factory
        default = factory()
    if json_items(hint) is not None:
        return json.dumps([attrs.asdict(item) for item in default]) if default else ""
    if isinstance(default, tuple):
        converter: Any = field.converter
        probe = ("x", "y")
        for separator in (" ", ","):
            if callable(converter) and converter(separator.join(probe)) == probe:
                return separator.join(default)
        raise TypeError(f"{where}: a tuple field needs a converter that splits text into words")
    return default


def derived_flags(
    declared: type[BaseModel],
    sections: tuple[tuple[type[AttrsInstance], str, str], ...] = JOB_SECTIONS,
) -> dict[str, Any]:
    """The flags of ``sections`` (settings, prefix, label) that ``declared`` does not write
    out, for ``pydantic.create_model``: each ``(type, Field(default, description))``.

    Raises:
        TypeError: a settings field of a type no flag reads (naming it).
    """
    flags: dict[str, Any] = {}
    for settings, prefix, label in sections:
        hints = get_type_hints(settings)
        docs = attribute_docs(settings)
        for field in attrs.fields(settings):
            name = prefix + field.name
            if not field.init or field.name in declared.model_fields:
                continue
            hint, where = hints[field.name], f"{settings.__name__}.{field.name}"
            if field.default is attrs.NOTHING:
                raise TypeError(f"{where}: a flag needs a default")
            flags[name] = (
                _flag_type(hint, where),
                Field(
                    default=_flag_default(field, hint, where),
                    description=f"{label}: {docs.get(field.name, '')}",
                ),
            )
    return flags


if TYPE_CHECKING:
    _Flags = DeclaredSettings
else:
    _Flags = create_model(
        "SandboxFlags",
        __base__=DeclaredSettings,
        __module__=__name__,
        **derived_flags(DeclaredSettings),
    )


class SandboxSettings(_Flags):
    """Where slot servers run and what they are told (see the module docstring). The flags
    derived from ``JOB_SECTIONS`` (``nomad_*``, ``slurm_*`` but ``slurm_shared_dir``) are
    fields at run time, not to mypy: in typed code read them built (``nomad_job()``,
    ``slurm_job()``) and give them by name (``AgentEnvConfig.model_validate({...})``)."""

    def slot_isolation(self) -> SlotIsolation:
        """The sandbox isolation every slot server gets: network, sandbox requirement, timeouts.

        ``require_stateful_sandbox`` requires the sandbox too: the persistent shell lives in it.

        Raises:
            ConfigError: a timeout range that cannot work (``terminal_timeout_s``).
        """
        timeout = self.terminal_timeout_s
        try:
            return SlotIsolation(
                slot_uid_base=self.slot_uid_base,
                allow_network=self.allow_network,
                max_file_bytes=self.max_file_bytes,
                disk_bytes=self.disk_bytes,
                disk_files=self.disk_files,
                require_sandbox=self.require_sandbox or self.require_stateful_sandbox,
                min_timeout_s=min(_POLICY.min_timeout_s, timeout),
                default_timeout_s=timeout,
                max_timeout_s=max(_POLICY.max_timeout_s, timeout),
            )
        except ConfigError as error:
            field = "slot_uid_base" if error.field == "slot_uid_base" else "terminal_timeout_s"
            raise ConfigError(field, error.reason) from None

    def slot_servers(self, default: SlotServerSettings) -> SlotServerSettings:
        """A pool's slot servers' settings: ``default`` (the pool's own) with the env's slots,
        lease deadline, isolation and tmux requirement.

        Raises:
            ConfigError: a setting that cannot work, named by its env field.
        """
        given = {"isolation": self.slot_isolation(), "require_tmux": self.require_stateful_sandbox}
        return _build(self, SlotServerSettings, (), given, base=default)

    def scaling(self, default: ScaleSettings) -> ScaleSettings:
        """A scheduled pool's scaling settings: ``default`` (the pool's own) with the env's
        ``min_containers`` and ``max_containers``.

        Raises:
            ConfigError: a setting that cannot work, named by its env field.
        """
        return _build(self, ScaleSettings, (), {}, base=default)

    def local_pool_config(self) -> LocalPoolConfig:
        """The local pool's settings (``local_*`` and the shared fields).

        Raises:
            ConfigError: a setting that cannot work, named by its env field.
        """
        server = self.slot_servers(_LOCAL.server)
        return _build(self, LocalPoolConfig, ("local_",), {"server": server})

    def container_pool_config(self) -> ContainerPoolConfig:
        """The container pool's settings (``container_*``, ``local_containers``, shared).

        Raises:
            ConfigError: a setting that cannot work, named by its env field.
        """
        if self.environment_dirs and not self.container_environment_dirs:
            raise ConfigError(
                "environment_dirs", "the container pool takes directory: trees only from the "
                "folders it mounts: set container_environment_dirs instead",
            )  # fmt: skip
        server = self.slot_servers(_CONTAINER.server)
        return _build(self, ContainerPoolConfig, ("container_", "local_"), {"server": server})

    def nomad_pool_config(self) -> NomadPoolConfig:
        """The Nomad pool's settings (``nomad_*`` and the shared fields; the agent's address,
        token, namespace and region from ``$NOMAD_*`` where not given, ``nomad_agent``).

        Raises:
            ConfigError: a Nomad setting that cannot work, named by its env field.
        """
        if self.environment_dirs:
            raise ConfigError(
                "environment_dirs", "the Nomad pool takes no directory: trees (its job lists "
                "no folder for them, docs/deploy.md); name images instead",
            )  # fmt: skip
        job, agent = self.nomad_job(), self.nomad_agent()
        address, token = agent.values["nomad_address"], agent.values["nomad_token"]
        with _read_from_variables(agent):
            return self._scheduled(
                NomadPoolConfig, "nomad_", _NOMAD, job=job, token=token,
                address=_NOMAD.address if address is None else address,
            )  # fmt: skip

    def nomad_agent(self, environ: Mapping[str, str] | None = None) -> NomadAgent:
        """The Nomad agent the pool talks to: ``nomad_address``, ``nomad_token``,
        ``nomad_namespace`` and ``nomad_region``, each not given read from its Nomad variable
        in ``environ`` (default: this process's environment; ``nomad_agent.NOMAD_VARIABLES``)."""
        return nomad_agent({name: getattr(self, name) for name in NOMAD_VARIABLES}, environ)

    def nomad_job(self) -> NomadJobSettings:
        """The Nomad job's settings, from the ``nomad_*`` flags (and the shared ones; the
        namespace and region from ``$NOMAD_NAMESPACE`` and ``$NOMAD_REGION`` where not given).

        Raises:
            ConfigError: a job setting that cannot work, named by its env field.
        """
        agent = self.nomad_agent()
        given = {
            "namespace": agent.values["nomad_namespace"],
            "region": agent.values["nomad_region"],
        }
        with _read_from_variables(agent):
            return _build(self, NomadJobSettings, ("nomad_",), given)

    def slurm_job(self) -> SlurmJobSettings:
        """Each Slurm batch job's settings, from the ``slurm_*`` flags.

        Raises:
            ConfigError: a job setting that cannot work, named by its env field.
        """
        return _build(self, SlurmJobSettings, ("slurm_",), {})

    def slurm_pool_config(self) -> SlurmPoolConfig:
        """The Slurm pool's settings (``slurm_*`` and the shared fields).

        Raises:
            ConfigError: a Slurm setting that cannot work, named by its env field.
        """
        return self._scheduled(SlurmPoolConfig, "slurm_", _SLURM, job=self.slurm_job())

    def ssh_pool_config(self) -> SshPoolConfig:
        """The SSH pool's settings: each ``ssh_host`` runs ``local_containers`` servers of
        ``slots_per_container`` slots (docs/deploy.md).

        Raises:
            ConfigError: no host, or a host setting that cannot work, named by its env field.
        """
        server = self.slot_servers(_SSH_POOL.server)
        addresses = [word.strip() for word in (self.ssh_host or "").split(",") if word.strip()]
        hosts = [
            _build(self, SshHost, ("ssh_",), {"address": address}, _SSH_NAMES)
            for address in addresses or [_SSH.address]  # the host settings are read all the same
        ]
        if not addresses:
            raise ConfigError("ssh_host", "sandbox 'ssh' needs at least one host")
        return _build(self, SshPoolConfig, ("ssh_",), {"server": server, "hosts": hosts})

    def modal_pool_config(self) -> ModalPoolConfig:
        """The Modal pool's settings (``modal_*``, ``cloud_*`` and the shared fields;
        ``cloud_lifetime_s`` unset keeps the pool's sandbox lifetime).

        Raises:
            ConfigError: a Modal setting that cannot work, named by its env field.
        """
        given: dict[str, object] = {}
        if self.cloud_lifetime_s is None:
            given["sandbox_timeout_s"] = _MODAL.sandbox.sandbox_timeout_s
        sandbox = _build(self, ModalSandboxSettings, ("modal_", "cloud_"), given, _MODAL_NAMES)
        return ModalPoolConfig(pool=self._cloud_pool_config(), sandbox=sandbox)

    def daytona_pool_config(self) -> DaytonaPoolConfig:
        """The Daytona pool's settings (``daytona_*``, ``cloud_*`` and the shared fields): CPUs
        rounded up to whole cores, memory up to whole GiB, the lifetime as the idle stop in
        whole minutes (unset: the pool's).

        Raises:
            ConfigError: a Daytona setting that cannot work, named by its env field.
        """
        cpu, memory, lifetime = self.cloud_cpu, self.cloud_memory_mb, self.cloud_lifetime_s
        stop = _DAYTONA.sandbox.auto_stop_min if lifetime is None else math.ceil(lifetime / 60)
        given = {
            "cpu": None if cpu is None else math.ceil(cpu),
            "memory_gib": None if memory is None else math.ceil(memory / 1024),
            "auto_stop_min": stop,
        }
        sandbox = _build(
            self, DaytonaSandboxSettings, ("daytona_", "cloud_"), given, _DAYTONA_NAMES
        )
        return DaytonaPoolConfig(pool=self._cloud_pool_config(), sandbox=sandbox)

    def _cloud_pool_config(self) -> CloudPoolConfig:
        """The cloud pool's settings of the Modal and Daytona pools (``cloud_*``, shared)."""
        return self._scheduled(CloudPoolConfig, "cloud_", _CLOUD)

    def _scheduled(
        self, target: type[T], prefix: str, default: ReconciledSettings, **parts: object
    ) -> T:
        """A scheduled pool's settings (``<prefix>*`` and the shared fields): its slot servers'
        and its scaling settings, ``default``'s (the pool's own) with the env's, and ``parts``
        (its ``job``)."""
        given = {
            **parts,
            "server": self.slot_servers(default.server),
            "scaling": self.scaling(default.scaling),
        }
        return _build(self, target, (prefix,), given)


_SSH_NAMES: Mapping[str, str] = {
    "identity_file": "ssh_key",  # hermes's name
    "servers": "local_containers",
    "slots": "slots_per_container",
}
_MODAL_NAMES: Mapping[str, str] = {
    "app_name": "modal_app",
    "memory_mib": "cloud_memory_mb",
    "sandbox_timeout_s": "cloud_lifetime_s",
}
_DAYTONA_NAMES: Mapping[str, str] = {
    "memory_gib": "cloud_memory_mb",
    "auto_stop_min": "cloud_lifetime_s",
}


@contextlib.contextmanager
def _read_from_variables(agent: NomadAgent) -> Iterator[None]:
    """A ``ConfigError`` of a setting read from its Nomad variable says so."""
    try:
        yield
    except ConfigError as error:
        variable = agent.from_variable(error.field)
        if variable is None:
            raise
        reason = f"{error.reason} (read from ${variable}, as {error.field} is not set)"
        raise ConfigError(error.field, reason) from None


def _section(
    target: type[AttrsInstance],
    prefixes: tuple[str, ...],
    names: Mapping[str, str],
) -> dict[str, str]:
    """``target``'s fields that ``settings`` set, each to the env field it is read from."""
    flags = SandboxSettings.model_fields  # never an env subclass's own fields
    section: dict[str, str] = {}
    for field in attrs.fields(target):
        candidates = (names.get(field.name), *(p + field.name for p in prefixes), field.name)
        flag = next((c for c in candidates if c is not None and c in flags), None)
        if field.init and flag is not None:
            section[field.name] = flag
    return section


def _build(
    settings: SandboxSettings,
    target: type[T],
    prefixes: tuple[str, ...],
    given: Mapping[str, object],
    names: Mapping[str, str] | None = None,
    *,
    base: T | None = None,
) -> T:
    """``target`` built from its section of ``settings`` and ``given`` (over ``base``'s values
    when given, else its defaults); a ``ConfigError`` is renamed to the env field its value
    came from."""
    section = _section(target, prefixes, names or {})
    try:
        hints = get_type_hints(target)
    except NameError:  # annotations only a type checker resolves: no JSON-list field
        hints = {}
    values: dict[str, object] = {}
    for name, flag in section.items():
        if name not in given:
            value, items = getattr(settings, flag), json_items(hints.get(name))
            values[name] = json_values(flag, items, value) if items is not None else value
    try:
        if base is None:
            return target(**values, **given)
        return target(**{**attrs.asdict(base, recurse=False), **values, **given})
    except ConfigError as error:
        raise ConfigError(section.get(error.field, error.field), error.reason) from None
