"""Open registries: what the names ``tool_call_parser``, ``sandbox`` and ``tokenizer_mode`` select.

Each setting picks a factory by name from a table that trajcore's built-ins fill the same way
code outside trajcore does:

=====================  ======================================  ===============================
setting                register in code                        or an entry point in group
=====================  ======================================  ===============================
``tool_call_parser``   ``trajcore.domain.tool_parsers``        ``trajcore.tool_parsers``
                       ``.register_parser(name, factory)``
``sandbox``            ``pools.register_pool(name, factory)``  ``trajcore.sandboxes``
``tokenizer_mode``     ``tokenizer_modes``                     ``trajcore.tokenizer_modes``
                       ``.register_tokenizer_mode(name, f)``
=====================  ======================================  ===============================

An entry point's name is the registered name and its object the factory (for a pool, a factory
or a ``PoolSource``). Entry points are read once, the first time a name is checked
(``discover``), so a package installed beside trajcore is selectable from the config with no
import. The parser table lives in the domain as a plain dict (the domain reads no package
metadata); this module reads the metadata and registers what it finds there.

Rules they keep:

- A name is registered once; registering it again needs ``replace=True`` (a plugin that means to
  override a built-in says so), otherwise a ``ConfigError`` names the registry.
- An unknown name is a ``ConfigError`` naming the setting, listing every registered name.
- An entry point that cannot be loaded is a ``ConfigError`` naming its group and name; an entry
  point never replaces a name registered in code.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from typing import Generic, TypeVar

from trajcore.domain.errors import ConfigError
from trajcore.domain.tool_parsers import parser_names, register_parser

__all__ = ["Registry", "discover", "load_entry_points"]

F = TypeVar("F")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Registry(Generic[F]):
    """Factories by name, for the setting ``field``.

    ``group`` is the entry-point group read by ``discover``; ``adapt`` turns an entry point's
    object into a factory (or raises ``TypeError`` saying what it expected).
    """

    def __init__(self, *, field: str, what: str, group: str, adapt: Callable[[object], F]) -> None:
        self.field = field
        self.what = what
        self.group = group
        self.adapt = adapt
        self._factories: dict[str, F] = {}

    def register(self, name: str, factory: F, *, replace: bool = False) -> None:
        """Make ``factory`` selectable as ``name``.

        Raises:
            ConfigError: ``name`` is not a plain name (letters, digits, ``_.-``) or is already
                registered and ``replace`` is false (field: the setting).
        """
        given: object = name  # callers outside trajcore may pass anything
        if not isinstance(given, str) or not _NAME.match(name):
            raise ConfigError(self.field, f"cannot register {self.what} {name!r}: not a plain name")
        if name in self._factories and not replace:
            raise ConfigError(
                self.field,
                f"{self.what} {name!r} is already registered (pass replace=True to override it)",
            )
        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        """The registered names, built-ins first, then in the order registered."""
        return tuple(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def get(self, name: str) -> F:
        """The factory registered as ``name`` (entry points read first).

        Raises:
            ConfigError: no such name (field: the setting; the reason lists the known names).
        """
        if name not in self._factories:
            discover()
        factory = self._factories.get(name)
        if factory is None:
            known = ", ".join(self.names())
            raise ConfigError(self.field, f"unknown {self.what} {name!r}; known: {known}")
        return factory


_REGISTRIES: list[Registry[object]] = []
_discovered = False


def track(registry: Registry[F]) -> Registry[F]:
    """Have ``discover`` fill ``registry`` from its entry-point group; returns it."""
    _REGISTRIES.append(registry)  # type: ignore[arg-type]  # only register/adapt are used
    return registry


def load_entry_points(group: str, register: Callable[[str, object], None]) -> None:
    """Load every entry point of ``group`` and ``register(name, object)`` it.

    Raises:
        ConfigError: an entry point failed to load (field: ``<group>.<name>``).
    """
    for entry in importlib.metadata.entry_points(group=group):
        try:
            loaded = entry.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of a plugin is reported
            raise ConfigError(
                f"{group}.{entry.name}", f"cannot load {entry.value}: {exc!r}"
            ) from None
        register(entry.name, loaded)


def discover(*, again: bool = False) -> None:
    """Register the parsers, pools and tokenizer modes installed packages name as entry points
    (once; ``again`` reads them anew). A name already registered in code is kept."""
    global _discovered  # noqa: PLW0603 - one read of the package metadata per process
    if _discovered and not again:
        return
    _discovered = True

    def add_parser(name: str, loaded: object) -> None:
        if name in parser_names():
            return
        if not callable(loaded):
            raise ConfigError(f"trajcore.tool_parsers.{name}", "expected a parser factory")
        register_parser(name, loaded)

    load_entry_points("trajcore.tool_parsers", add_parser)
    for registry in _REGISTRIES:

        def add(name: str, loaded: object, registry: Registry[object] = registry) -> None:
            if name in registry:
                return
            try:
                factory = registry.adapt(loaded)
            except TypeError as exc:
                raise ConfigError(f"{registry.group}.{name}", str(exc)) from None
            registry.register(name, factory)

        load_entry_points(registry.group, add)
