"""Toolsets: which tools a trajectory may call, chosen by name, once per group.

A *toolset* is a named bundle of tool names that may include other toolsets ("terminal" includes
"file" and adds "bash"). A ``ToolsetCatalog`` holds the toolsets an env knows and answers one
question: given the toolsets enabled (``None`` means all of them) and the toolsets disabled, which
tools does the model get? A ``ToolsetDistribution`` answers the question before that one, for
envs that vary the tools across groups: each toolset is included independently with its own
probability, drawn once per group from an injected ``random.Random``. ``ToolsetSelection`` is an
env's whole toolset setting (an explicit list or a distribution, and what is disabled on top),
and ``ToolsetSelection.draw`` is the one call the rollout makes per group.

Rules this module keeps:

- A catalog that exists is sound: toolset names are unique, every include names a toolset of the
  catalog, and no toolset includes itself through any chain. A cycle or an unknown name is a
  ``ConfigError`` whose field names the toolset at fault (``toolsets.web.includes[1]``).
- Resolution is enabled first, disabled removed on top: a tool reached from a disabled toolset is
  never offered, whichever enabled toolset also reaches it.
- The result is an ordered tuple without duplicates, in the catalog's own order (the order in which
  tools first appear when the toolsets are walked as declared, own tools before includes). It does
  not depend on the order in which the caller lists enabled or disabled toolsets, and resolving the
  same setting twice gives the same tuple, so the tools a model sees are reproducible.
- Sampling consumes exactly one ``rng.random()`` per toolset of the distribution, in declared
  order, so a seed fixes the whole run. It never returns an empty choice: when no toolset is drawn
  the most probable one is taken (the first declared among equals). Frequencies follow the
  probabilities, except that this fallback adds ``prod(1 - p)`` to the most probable toolset.
- Probabilities are finite numbers in [0, 1], at least one above 0; each error names the field.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.tools import ToolSpec

__all__ = [
    "DistributionRegistry",
    "GroupTools",
    "Toolset",
    "ToolsetCatalog",
    "ToolsetDistribution",
    "ToolsetSelection",
    "select_specs",
]


def _names(values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        # A bare string would otherwise become a tuple of characters.
        return (values,)
    return tuple(values)


def _optional_names(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else _names(values)


def _is_name(value: object) -> bool:
    """Config arrives untyped: a name must really be a non-empty string."""
    return isinstance(value, str) and bool(value)


def _nonempty_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _is_name(value):
        raise ConfigError(attribute.name, "must be a non-empty string")


@attrs.frozen(kw_only=True)
class Toolset:
    """A named bundle of tools.

    Attributes:
        name: The toolset's name, unique in its catalog.
        tools: Names of the tools it offers directly, in order.
        includes: Names of other toolsets whose tools it offers as well, in order.
        description: What the bundle is for, for people reading the config.
    """

    name: str = attrs.field(validator=_nonempty_name)
    tools: tuple[str, ...] = attrs.field(default=(), converter=_names)
    includes: tuple[str, ...] = attrs.field(default=(), converter=_names)
    description: str = ""

    def __attrs_post_init__(self) -> None:
        for i, tool in enumerate(self.tools):
            if not _is_name(tool):
                raise ConfigError(f"toolsets.{self.name}.tools[{i}]", "must be a non-empty string")
        for i, included in enumerate(self.includes):
            if not _is_name(included):
                raise ConfigError(
                    f"toolsets.{self.name}.includes[{i}]", "must be a non-empty string"
                )


def _toolsets(values: Iterable[Toolset]) -> tuple[Toolset, ...]:
    return tuple(values)


def _ordered_union(parts: Iterable[Iterable[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for part in parts:
        for name in part:
            seen.setdefault(name, None)
    return tuple(seen)


@attrs.frozen(kw_only=True)
class ToolsetCatalog:
    """Every toolset an env knows, checked for soundness when built.

    Attributes:
        toolsets: The toolsets, in declared order (this order fixes the order of resolved tools).

    Raises (when built):
        ConfigError: a duplicate toolset name, an include of an unknown toolset, or a cycle of
            includes; the field names the toolset at fault.
    """

    toolsets: tuple[Toolset, ...] = attrs.field(converter=_toolsets)
    _expanded: Mapping[str, tuple[str, ...]] = attrs.field(init=False, repr=False, eq=False)
    _order: Mapping[str, int] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name: dict[str, Toolset] = {}
        for i, toolset in enumerate(self.toolsets):
            if toolset.name in by_name:
                raise ConfigError(f"toolsets[{i}].name", f"duplicate toolset {toolset.name!r}")
            by_name[toolset.name] = toolset
        for toolset in self.toolsets:
            for i, included in enumerate(toolset.includes):
                if included not in by_name:
                    raise ConfigError(
                        f"toolsets.{toolset.name}.includes[{i}]",
                        f"unknown toolset {included!r}",
                    )

        expanded: dict[str, tuple[str, ...]] = {}

        def expand(name: str, path: tuple[str, ...]) -> tuple[str, ...]:
            if name in path:
                cycle = " -> ".join((*path[path.index(name) :], name))
                raise ConfigError(f"toolsets.{name}.includes", f"includes itself: {cycle}")
            done = expanded.get(name)
            if done is not None:
                return done
            toolset = by_name[name]
            inner = (expand(included, (*path, name)) for included in toolset.includes)
            result = _ordered_union((toolset.tools, *inner))
            expanded[name] = result
            return result

        for toolset in self.toolsets:
            expand(toolset.name, ())
        order = _ordered_union(expanded[t.name] for t in self.toolsets)
        object.__setattr__(self, "_expanded", expanded)
        object.__setattr__(self, "_order", {tool: i for i, tool in enumerate(order)})

    def names(self) -> tuple[str, ...]:
        """The toolset names, in declared order."""
        return tuple(toolset.name for toolset in self.toolsets)

    def all_tools(self) -> tuple[str, ...]:
        """Every tool any toolset offers, in catalog order."""
        return tuple(self._order)

    def tools_of(self, name: str, *, field: str = "toolset") -> tuple[str, ...]:
        """The tools toolset ``name`` offers, includes expanded, in the toolset's own order.

        Raises:
            ConfigError: ``name`` is not a toolset of this catalog (reported at ``field``).
        """
        tools = self._expanded.get(name)
        if tools is None:
            raise ConfigError(field, f"unknown toolset {name!r}; known: {list(self.names())}")
        return tools

    def check_names(self, names: Iterable[str], *, field: str) -> None:
        """Raise ``ConfigError`` at ``field[i]`` for the first name that is not a toolset here."""
        for i, name in enumerate(_names(names)):
            self.tools_of(name, field=f"{field}[{i}]")

    def resolve(
        self, *, enabled: Iterable[str] | None = None, disabled: Iterable[str] = ()
    ) -> tuple[str, ...]:
        """The tools offered when ``enabled`` toolsets (``None``: all) are on and ``disabled`` off.

        Returns the tool names without duplicates, in catalog order; a tool that any disabled
        toolset reaches is left out even when an enabled toolset reaches it too.

        Raises:
            ConfigError: an unknown toolset name, at ``enabled_toolsets[i]`` or
                ``disabled_toolsets[i]``.
        """
        on_names = self.names() if enabled is None else _names(enabled)
        off_names = _names(disabled)
        on: set[str] = set()
        for i, name in enumerate(on_names):
            on.update(self.tools_of(name, field=f"enabled_toolsets[{i}]"))
        for i, name in enumerate(off_names):
            on.difference_update(self.tools_of(name, field=f"disabled_toolsets[{i}]"))
        return tuple(sorted(on, key=self._order.__getitem__))


def _probabilities(
    values: Mapping[str, float] | Iterable[tuple[str, float]],
) -> tuple[tuple[str, float], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple((name, probability) for name, probability in items)


@attrs.frozen(kw_only=True)
class ToolsetDistribution:
    """Per-group random choice of toolsets: each is included independently with its probability.

    Attributes:
        name: The distribution's name; also the prefix of the fields its errors name
            (``toolset_distribution.web``), so an inline setting keeps the default.
        probabilities: ``(toolset, probability)`` pairs in declared order; a mapping is accepted.
        description: What the distribution is for.

    Raises (when built):
        ConfigError: no toolsets, a duplicate toolset, a probability that is not a finite number
            in [0, 1], or no probability above 0; the field is ``<name>.<toolset>``.
    """

    name: str = attrs.field(default="toolset_distribution", validator=_nonempty_name)
    probabilities: tuple[tuple[str, float], ...] = attrs.field(converter=_probabilities)
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.probabilities:
            raise ConfigError(self.name, "a distribution needs at least one toolset")
        seen: set[str] = set()
        for toolset, probability in self.probabilities:
            field = f"{self.name}.{toolset}"
            if not _is_name(toolset):
                raise ConfigError(field, "a toolset name must be a non-empty string")
            if toolset in seen:
                raise ConfigError(field, "toolset listed twice")
            seen.add(toolset)
            if isinstance(probability, bool) or not isinstance(probability, int | float):
                raise ConfigError(field, f"expected a number, got {type(probability).__name__}")
            if not (math.isfinite(probability) and 0.0 <= probability <= 1.0):
                raise ConfigError(field, f"probability must be in [0, 1], got {probability!r}")
        if all(probability == 0 for _, probability in self.probabilities):
            raise ConfigError(self.name, "at least one toolset needs a probability above 0")

    def toolsets(self) -> tuple[str, ...]:
        """The toolsets this distribution may choose, in declared order."""
        return tuple(toolset for toolset, _ in self.probabilities)

    def most_probable(self) -> str:
        """The fallback choice: the highest probability, the first declared among equals."""
        best, best_p = self.probabilities[0]
        for toolset, probability in self.probabilities[1:]:
            if probability > best_p:
                best, best_p = toolset, probability
        return best

    def sample(self, rng: random.Random) -> tuple[str, ...]:
        """Draw the toolsets for one group.

        Returns the chosen toolset names in declared order, never empty. Exactly one
        ``rng.random()`` is drawn per toolset, whatever the outcome.
        """
        chosen = tuple(
            toolset for toolset, probability in self.probabilities if rng.random() < probability
        )
        return chosen or (self.most_probable(),)

    def check_against(self, catalog: ToolsetCatalog) -> None:
        """Raise ``ConfigError`` at ``<name>.<toolset>`` for a toolset the catalog lacks."""
        for toolset, _ in self.probabilities:
            catalog.tools_of(toolset, field=f"{self.name}.{toolset}")


def _distributions(values: Iterable[ToolsetDistribution]) -> tuple[ToolsetDistribution, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class DistributionRegistry:
    """Named toolset distributions an env can pick from by name.

    Attributes:
        distributions: The distributions, names unique.

    Raises (when built):
        ConfigError: two distributions share a name (``toolset_distributions[i].name``).
    """

    distributions: tuple[ToolsetDistribution, ...] = attrs.field(converter=_distributions)

    def __attrs_post_init__(self) -> None:
        seen: set[str] = set()
        for i, distribution in enumerate(self.distributions):
            if distribution.name in seen:
                raise ConfigError(
                    f"toolset_distributions[{i}].name",
                    f"duplicate distribution {distribution.name!r}",
                )
            seen.add(distribution.name)

    def names(self) -> tuple[str, ...]:
        """The distribution names, in declared order."""
        return tuple(distribution.name for distribution in self.distributions)

    def get(self, name: str, *, field: str = "toolset_distribution") -> ToolsetDistribution:
        """The distribution called ``name``.

        Raises:
            ConfigError: no distribution has that name (reported at ``field``).
        """
        for distribution in self.distributions:
            if distribution.name == name:
                return distribution
        raise ConfigError(field, f"unknown distribution {name!r}; known: {list(self.names())}")

    def check_against(self, catalog: ToolsetCatalog) -> None:
        """Raise ``ConfigError`` for the first distribution naming a toolset the catalog lacks."""
        for distribution in self.distributions:
            distribution.check_against(catalog)


@attrs.frozen(kw_only=True)
class GroupTools:
    """The tools one group runs with.

    Attributes:
        toolsets: The toolsets that were on for this group (drawn, listed, or all), before
            ``disabled`` was applied.
        tools: The tool names offered to the model, in catalog order.
    """

    toolsets: tuple[str, ...]
    tools: tuple[str, ...]


@attrs.frozen(kw_only=True)
class ToolsetSelection:
    """An env's toolset setting: which toolsets are on, and which are switched off on top.

    Attributes:
        enabled: Toolsets on for every group; ``None`` means all of the catalog's.
        disabled: Toolsets whose tools are never offered.
        distribution: Draw the enabled toolsets per group from this instead; excludes ``enabled``.

    Raises (when built):
        ConfigError: both ``enabled`` and ``distribution`` are set (``toolset_distribution``).
    """

    enabled: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_names)
    disabled: tuple[str, ...] = attrs.field(default=(), converter=_names)
    distribution: ToolsetDistribution | None = None

    def __attrs_post_init__(self) -> None:
        if self.enabled is not None and self.distribution is not None:
            raise ConfigError(
                "toolset_distribution",
                "set either enabled_toolsets or a toolset distribution, not both",
            )

    def check_against(self, catalog: ToolsetCatalog) -> None:
        """Raise ``ConfigError`` for the first toolset name the catalog lacks, at its field, and
        for a toolset turned on (enabled, or drawn with a probability above 0) whose every tool
        ``disabled`` switches off: the groups that get it would get none of its tools."""
        if self.enabled is not None:
            catalog.check_names(self.enabled, field="enabled_toolsets")
        catalog.check_names(self.disabled, field="disabled_toolsets")
        if self.distribution is not None:
            self.distribution.check_against(catalog)
        kept = set(catalog.resolve(disabled=self.disabled))
        if self.distribution is not None:
            name = self.distribution.name
            on = [(f"{name}.{t}", t) for t, p in self.distribution.probabilities if p > 0]
        else:
            on = [(f"enabled_toolsets[{i}]", t) for i, t in enumerate(self.enabled or ())]
        for field, toolset in on:
            tools = catalog.tools_of(toolset)
            if tools and kept.isdisjoint(tools):
                raise ConfigError(
                    field,
                    f"every tool of toolset {toolset!r} is switched off by disabled_toolsets "
                    f"{list(self.disabled)}, so a group given it would get none of its tools",
                )

    def draw(self, catalog: ToolsetCatalog, rng: random.Random) -> GroupTools:
        """The tools for one group; call once per group.

        ``rng`` is used only when a distribution is set (see ``ToolsetDistribution.sample``).

        Raises:
            ConfigError: a toolset name the catalog lacks.
        """
        if self.distribution is not None:
            on = self.distribution.sample(rng)
        elif self.enabled is not None:
            on = self.enabled
        else:
            on = catalog.names()
        return GroupTools(toolsets=on, tools=catalog.resolve(enabled=on, disabled=self.disabled))


def select_specs(tools: Sequence[str], specs: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    """The specs of ``tools``, in the order of ``tools``.

    Raises:
        ConfigError: a tool has no spec among ``specs`` (field ``tools[i]``).
    """
    by_name = {spec.name: spec for spec in specs}
    out: list[ToolSpec] = []
    for i, name in enumerate(tools):
        spec = by_name.get(name)
        if spec is None:
            raise ConfigError(f"tools[{i}]", f"no tool spec named {name!r}")
        out.append(spec)
    return tuple(out)
