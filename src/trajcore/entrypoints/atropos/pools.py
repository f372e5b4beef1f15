"""The env's sandbox pool: the open registry of pool sources and the pool of a run.

``sandbox`` names a pool source in an open registry: ``register_pool(name, factory, check=...)``
(or an entry point in group ``trajcore.sandboxes``) makes a source selectable as
``--env.sandbox name``; trajcore's own (``local``, ``container``, ``nomad``, ``ssh``,
``slurm``, ``modal``, ``daytona``) are registered at the bottom of this module the same way. A
factory takes the env's config (its ``AgentEnvConfig``, whose sandbox section is
``SandboxSettings``) and returns the unopened pool; a ``check`` runs when the settings are
checked (``AgentEnvConfig.settings``), before anything starts. Each pool's settings are built
from the env's fields by ``SandboxSettings`` (``sandbox_settings``; Modal and Daytona: ``cloud``).

Rules it keeps:

- A setting that cannot work is a ``ConfigError`` named by its env field (``terminal_timeout_s``,
  ``nomad_driver``, ...), not by the pool's own field name.
- Nothing here starts anything: ``make_pool`` returns an unopened pool, which the run enters.
- A sandbox setting the chosen source never reads is not dropped in silence: when the source
  names the builder of its own settings (``register_pool(..., settings=)``, as every built-in
  does), ``check_pool`` finds the env fields that builder reads, and refuses each one set away
  from its default that it does not (``nomad_address`` with ``sandbox local``): a
  ``ConfigError`` naming the setting, the chosen source and the sources that read it. The
  builders are the one table of which source reads which setting (``settings_readers``).
  "Set" means away from the config class's default: Atropos rebuilds a config from
  ``model_dump()``, so a value given equal to the default cannot be told from none.
- The Nomad pool's agent comes from the settings, else ``$NOMAD_ADDR`` and the other Nomad
  variables (``nomad_agent``); its start-up log line says which, never showing the token.
- It never imports the env's config module (``config`` imports it, to check ``sandbox``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import shutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar, cast

import attrs

from trajcore.adapters.pools.container_pool import ContainerSandboxPool
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.adapters.pools.slurm_pool import SlurmSandboxPool
from trajcore.adapters.pools.ssh_pool import SshSandboxPool
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.entrypoints.atropos.cloud import (
    check_daytona_settings,
    check_modal_settings,
    daytona_pool,
    modal_pool,
)
from trajcore.entrypoints.atropos.registries import Registry, track
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = [
    "POOLS",
    "PoolFactory",
    "PoolSource",
    "check_pool",
    "make_pool",
    "register_pool",
    "settings_read",
    "settings_readers",
    "unread_settings",
]

PoolFactory = Callable[[SandboxSettings], AbstractAsyncContextManager[SandboxPool]]
"""Builds the unopened pool of a source from the env's settings (its ``AgentEnvConfig``)."""

S = TypeVar("S", bound=SandboxSettings)
_log = logging.getLogger(__name__)


@attrs.frozen
class PoolSource:
    """A place slot servers run, as ``sandbox`` selects it.

    Attributes:
        factory: Builds the unopened pool from the env's settings (its ``AgentEnvConfig``).
        check: Raises ``ConfigError`` (naming the env field) for settings the source cannot
            work with, at ``AgentEnvConfig.settings``; ``None`` checks nothing early.
        settings: Builds the source's own settings from the env's (``local_pool_config``),
            raising ``ConfigError`` (naming the env field) for one that cannot work: it runs
            when the settings are checked, after ``check``, and the env fields it reads are the
            ones the source reads (module doc); ``None``: nothing is built early, nor any
            setting refused as unread.
    """

    factory: PoolFactory
    check: Callable[[SandboxSettings], object] | None = None
    settings: Callable[[SandboxSettings], object] | None = None


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
    factory: Callable[[S], AbstractAsyncContextManager[SandboxPool]],
    *,
    check: Callable[[S], object] | None = None,
    settings: Callable[[S], object] | None = None,
    replace: bool = False,
) -> None:
    """Make ``factory`` selectable as ``--env.sandbox name`` (``check`` runs at settings time;
    ``settings``, when given, builds the source's own settings, telling which env fields it
    reads).

    Both are called with the env's config: a factory may take the ``AgentEnvConfig`` (or the
    env's own config class) rather than ``SandboxSettings``, to read the env's other fields.

    Raises:
        ConfigError: ``name`` is already registered and ``replace`` is false (field
            ``sandbox``).
    """
    # S is the env's config class, of which SandboxSettings is the sandbox section.
    source = PoolSource(
        factory=cast("PoolFactory", factory),
        check=cast("Callable[[SandboxSettings], object] | None", check),
        settings=cast("Callable[[SandboxSettings], object] | None", settings),
    )
    POOLS.register(name, source, replace=replace)


def check_pool(config: SandboxSettings) -> None:
    """Run the chosen source's settings check and build its settings, refusing each sandbox
    setting it never reads (module doc).

    Raises:
        ConfigError: an unknown ``sandbox``, a setting the source cannot work with, or one set
            that it never reads, named by its env field (``problems``: every such setting).
    """
    source = POOLS.get(config.sandbox)
    if source.check is not None:
        source.check(config)
    unread = unread_settings(config)
    if not unread:
        return
    problems = []
    for name in unread:
        readers = settings_readers(config, name)
        elsewhere = (
            f"it is a setting of sandbox {' and '.join(map(repr, readers))}"
            if readers
            else "no sandbox reads it with these settings"
        )
        reason = (
            f"set to {_shown(config, name)}, but sandbox {config.sandbox!r} never reads it "
            f"({elsewhere}): unset it, or choose a sandbox that reads it"
        )
        problems.append(f"{reason} @ {name}")
    first = problems[0].rpartition(" @ ")[0]
    raise ConfigError(unread[0], first, problems=tuple(problems))


def _shown(config: SandboxSettings, name: str) -> str:
    """The value of setting ``name`` for an error, a secret's only as set."""
    if name.endswith(("_token", "_secret", "_password")):
        return "a value (not shown)"
    return repr(getattr(config, name))


def unread_settings(config: SandboxSettings) -> list[str]:
    """The sandbox settings set away from their default that the chosen source never reads
    (module doc); none when the source does not name its settings builder.

    Raises:
        ConfigError: as the source's settings builder.
    """
    build = POOLS.get(config.sandbox).settings
    if build is None:
        return []
    reads = _Reads(config)
    build(cast("SandboxSettings", reads))
    fields = type(config).model_fields
    return [
        name
        for name in SandboxSettings.model_fields
        if name != "sandbox"
        and name not in reads.read
        and getattr(config, name) != fields[name].get_default(call_default_factory=True)
    ]


def settings_read(config: SandboxSettings, sandbox: str) -> frozenset[str]:
    """The sandbox settings that source ``sandbox``'s settings builder reads with ``config``'s
    values (those read before it refused one, if it does); empty when it names no builder."""
    build = POOLS.get(sandbox).settings
    if build is None:
        return frozenset()
    values = {name: getattr(config, name) for name in type(config).model_fields}
    reads = _Reads(type(config).model_construct(**{**values, "sandbox": sandbox}))
    with contextlib.suppress(ConfigError):
        build(cast("SandboxSettings", reads))
    return frozenset(reads.read)


def settings_readers(config: SandboxSettings, name: str) -> list[str]:
    """The registered sources whose settings builder reads setting ``name`` (``settings_read``),
    in their order of registration."""
    return [sandbox for sandbox in POOLS.names() if name in settings_read(config, sandbox)]


class _Reads:
    """``config`` as a settings builder sees it, noting each sandbox field it reads: its
    methods and properties run over this view, so what they read is noted too."""

    def __init__(self, config: SandboxSettings) -> None:
        self.config = config
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> object:
        if name in SandboxSettings.model_fields:
            self.read.add(name)
            return getattr(self.config, name)
        found = getattr(type(self.config), name, None)
        if isinstance(found, property) and found.fget is not None:
            return found.fget(self)
        if inspect.isfunction(found):
            return found.__get__(self)
        return getattr(self.config, name)


def make_pool(config: SandboxSettings) -> AbstractAsyncContextManager[SandboxPool]:
    """The sandbox pool of a run, unopened (see ``AgentEnv.make_pool``): the registered source
    ``config.sandbox`` builds it.

    Raises:
        ConfigError: an unknown ``sandbox``, or a setting that cannot work, named by its env
            field.
        SandboxUnavailable: ``require_stateful_sandbox`` with the local pool and no tmux on
            this host.
    """
    return POOLS.get(config.sandbox).factory(config)


def _local_pool(config: SandboxSettings) -> AbstractAsyncContextManager[SandboxPool]:
    if config.require_stateful_sandbox and shutil.which("tmux") is None:
        raise SandboxUnavailable(
            "require_stateful_sandbox: the local pool keeps a persistent shell with tmux, "
            "which is not installed on this host"
        )
    return LocalSandboxPool(config.local_pool_config())


def _nomad_pool(config: SandboxSettings) -> AbstractAsyncContextManager[SandboxPool]:
    """The Nomad pool, its agent and where the address came from said in the log (never the
    token)."""
    pool = config.nomad_pool_config()
    _log.info("%s", config.nomad_agent().line(pool.address))
    return NomadSandboxPool(pool)


_S = SandboxSettings
register_pool("local", _local_pool, settings=_S.local_pool_config)
register_pool(
    "container",
    lambda config: ContainerSandboxPool(config.container_pool_config()),
    settings=_S.container_pool_config,
)

register_pool("nomad", _nomad_pool, settings=_S.nomad_pool_config)
register_pool(
    "ssh", lambda config: SshSandboxPool(config.ssh_pool_config()), settings=_S.ssh_pool_config
)
register_pool(
    "slurm",
    lambda config: SlurmSandboxPool(config.slurm_pool_config()),
    settings=_S.slurm_pool_config,
)
register_pool("modal", modal_pool, check=check_modal_settings, settings=_S.modal_pool_config)
register_pool(
    "daytona", daytona_pool, check=check_daytona_settings, settings=_S.daytona_pool_config
)
