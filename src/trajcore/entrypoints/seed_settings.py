"""The two seeds' setting names, and what each becomes in ``AgentEnvConfig``.

trajcore replaces two envs: the Nous "atropos-agent" ``AgentEnv`` and hermes-agent's
``HermesAgentBaseEnv``. A config written for either (YAML, ``--env.*`` flags or code) must port
without losing a setting. So ``AgentEnvConfig`` takes every setting name of both seeds:

- A name trajcore kept (``allow_network``, ``enabled_toolsets``, ...) is simply its field.
- A name trajcore renamed (the table below) is accepted, turned into its trajcore field with the
  seed's meaning (``tool_pool_mode="nomad"`` becomes ``sandbox="nomad"``), and one
  ``SeedSettingWarning`` names the new name.
- A seed value trajcore cannot honour (``terminal_backend="singularity"``) is a ``ConfigError``
  naming the seed's field, when the config is built.
- Any other unknown name is a ``ConfigError`` naming it and the closest known name, because
  pydantic would otherwise drop it without a word.
- A renamed name also reads and writes as its field (``config.agent_max_steps`` is
  ``config.max_turns``; ``seed_alias``), and is accepted as a command-line flag
  (``--env.agent_max_steps 3`` becomes ``--env.max_turns 3`` with the same warning;
  ``translate_seed_flags``).
- A config subclass's own field named as a seed setting sets the default of the field it names
  (``SeedFieldsAsTargets``, the config's metaclass), so the seed name keeps meaning that field.

``docs/porting.md`` sets both seeds beside trajcore field by field; this table is its source of
truth for the renamed ones.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_origin

import attrs
from pydantic._internal._decorators import (
    FieldSerializerDecoratorInfo,
    FieldValidatorDecoratorInfo,
    PydanticDescriptorProxy,
    ValidatorDecoratorInfo,
)
from pydantic._internal._model_construction import ModelMetaclass
from pydantic.fields import FieldInfo

from trajcore.domain.errors import ConfigError

PydanticUndefined: Any = FieldInfo().default  # pydantic's marker of a field without a default

__all__ = [
    "SEED_FIELDS",
    "SeedField",
    "SeedFieldsAsTargets",
    "SeedNames",
    "SeedSettingWarning",
    "closest_name",
    "seed_alias",
    "translate_seed_fields",
    "translate_seed_flags",
]


class SeedSettingWarning(UserWarning):
    """A seed's setting name was used; the message names trajcore's name for it."""


def _same(_: str, value: object) -> object:
    return value


def _same_back(value: object) -> object:
    return value


def _local_or_nomad(field: str, value: object) -> object:
    """atropos-agent's pool name as ``sandbox``: only ``local`` and ``nomad`` have a pool."""
    if value in ("local", "nomad"):
        return value
    raise ConfigError(
        field,
        f"{value!r} is not available: trajcore runs slots on the local pool ('local') or on "
        f"Nomad ('nomad'); set sandbox to one of them",
    )


# hermes-agent's terminal backends -> ``sandbox``: its docker backend runs each task's terminal
# in a container on this machine, which is the container pool's slot-server containers.
_BACKENDS: dict[str, str] = {
    "local": "local", "docker": "container", "nomad": "nomad", "ssh": "ssh", "modal": "modal",
    "daytona": "daytona",
}  # fmt: skip


def _terminal_backend_back(value: object) -> object:
    """``sandbox`` in hermes's words: the container pool is its ``docker`` backend."""
    return "docker" if value == "container" else value


def _terminal_backend(field: str, value: object) -> object:
    """hermes-agent's ``terminal_backend`` as ``sandbox``: local, docker, nomad, ssh, modal or
    daytona."""
    if isinstance(value, str) and value in _BACKENDS:
        return _BACKENDS[value]
    raise ConfigError(
        field,
        f"{value!r} is not available: trajcore runs terminals on the local pool ('local'), in "
        f"slot-server containers ('docker'), on Nomad ('nomad'), on SSH hosts ('ssh'), or in "
        f"Modal or Daytona sandboxes ('modal', 'daytona')",
    )


@attrs.frozen(kw_only=True)
class SeedField:
    """One seed setting that trajcore names differently.

    Attributes:
        name: The seed's field name.
        seeds: Which seeds had it (``atropos-agent``, ``hermes-agent``).
        target: The ``AgentEnvConfig`` field it sets.
        note: What changes besides the name (empty when nothing does).
        convert: ``(seed field, value) -> trajcore value``; raises ``ConfigError`` naming the
            seed field for a value trajcore cannot honour.
        convert_back: trajcore's value in the seed's words, for reading the seed name.
    """

    name: str
    seeds: tuple[str, ...]
    target: str
    note: str = ""
    convert: Callable[[str, object], object] = _same
    convert_back: Callable[[object], object] = _same_back

    def warning(self, replaced: str = "") -> SeedSettingWarning:
        """The one warning a use of this name gets."""
        note = f"; {self.note}" if self.note else ""
        return SeedSettingWarning(
            f"{self.name} is the {'/'.join(self.seeds)} name of trajcore's {self.target}"
            f"{note}{replaced}"
        )


_ATROPOS = ("atropos-agent",)
_HERMES = ("hermes-agent",)

# Seed name -> the seeds that had it and the trajcore field it sets.
_RENAMED: dict[str, tuple[tuple[str, ...], str]] = {
    "tool_pool_mode": (_ATROPOS, "sandbox"),
    "tool_batch_window_ms": (_ATROPOS, "batch_window_ms"),
    "tool_max_batch_size": (_ATROPOS, "max_batch_size"),
    "sandbox_job_id": (_ATROPOS, "nomad_job_id"),
    "sandbox_image": (_ATROPOS, "nomad_image"),
    "purge_job_on_start": (_ATROPOS, "purge_on_start"),
    "purge_job_on_shutdown": (_ATROPOS, "purge_on_shutdown"),
    "agent_max_steps": (_ATROPOS, "max_turns"),
    "agent_max_tokens": (_ATROPOS, "max_tokens"),
    "agent_tool_delay_s": (_ATROPOS, "tool_delay_s"),
    "max_agent_turns": (_HERMES, "max_turns"),
    "distribution": (_HERMES, "toolset_distribution"),
    "terminal_backend": (_HERMES, "sandbox"),
    "terminal_timeout": (_HERMES, "terminal_timeout_s"),
    "terminal_lifetime": (_HERMES, "slot_idle_timeout_s"),
    "dataset_name": (_HERMES, "dataset"),
    "tool_pool_size": (_HERMES, "tool_threads"),
}

# What changes besides the name, where something does.
_NOTES: dict[str, str] = {
    "tool_pool_mode": "'nomad' and 'local' pools; the seed's 'modal' stub has no pool here",
    "agent_max_tokens": "None lets each turn use what is left of max_token_length",
    "agent_tool_delay_s": "the pause comes before each batch of one turn's calls",
    "distribution": "a name picks one of the env's toolset_distributions()",
    "terminal_backend": (
        "'local', 'docker' (the container pool: slot-server containers on this machine) and "
        "'nomad', 'ssh' (slot servers on the ssh_host hosts), 'modal' and 'daytona' (one slot "
        "server per provider sandbox: the modal_*, daytona_* and cloud_* settings); singularity "
        "has no pool here"
    ),
    "terminal_lifetime": (
        "a trajectory whose slot waits longer than this for the model ends, unscored"
    ),
    "tool_pool_size": "threads for synchronous tool_registry() tools",
}

# Seed values that are checked or translated on the way (the rest pass as they are).
_CONVERTERS: dict[str, Callable[[str, object], object]] = {
    "tool_pool_mode": _local_or_nomad,
    "terminal_backend": _terminal_backend,
}

SEED_FIELDS: dict[str, SeedField] = {
    name: SeedField(
        name=name,
        seeds=seeds,
        target=target,
        note=_NOTES.get(name, ""),
        convert=_CONVERTERS.get(name, _same),
        convert_back=_terminal_backend_back if name == "terminal_backend" else _same_back,
    )
    for name, (seeds, target) in _RENAMED.items()
}
"""Every seed setting whose trajcore name differs, by seed name."""


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name most like ``name`` (difflib), or ``None`` when none is close."""
    matches = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def translate_seed_fields(data: Mapping[str, object], known: Iterable[str]) -> dict[str, object]:
    """``data`` with every seed name replaced by its trajcore field, one warning each.

    ``known`` are the config's own field names (its subclass's included): those pass as they
    are, even when a seed used the same name for something renamed here. A seed name wins over
    its trajcore field when both are present, because Atropos builds the config from the
    defaults' full dump with the YAML and flags merged on top (the warning says what it
    replaced).

    Raises:
        ConfigError: an unknown name (naming it and the closest known one), two seed names for
            one field with different values (naming both), or a seed value trajcore cannot
            honour (naming the seed field).
    """
    own = set(known)
    out: dict[str, object] = {}
    seeded: dict[str, tuple[str, object]] = {}
    for key, value in data.items():
        if key in own:
            out[key] = value
        elif key not in SEED_FIELDS:
            close = closest_name(key, own | SEED_FIELDS.keys())
            hint = f"; did you mean {close!r}?" if close else ""
            raise ConfigError(key, f"unknown setting{hint}")
    for key, value in data.items():
        if key in own or key not in SEED_FIELDS:
            continue
        seed = SEED_FIELDS[key]
        converted = seed.convert(key, value)
        if seed.target in seeded and seeded[seed.target][1] != converted:
            other = seeded[seed.target][0]
            raise ConfigError(key, f"sets {seed.target}, which {other} sets differently: give one")
        replaced = ""
        if seed.target in out and out[seed.target] != converted:
            replaced = f" (it replaces {seed.target}={out[seed.target]!r})"
        warnings.warn(seed.warning(replaced), stacklevel=5)
        seeded[seed.target] = (key, converted)
        out[seed.target] = converted
    return out


def seed_alias(seed: SeedField) -> property:
    """A property that reads ``seed.target`` in the seed's words and writes it through
    ``seed.convert`` (with the usual warning), so a seed env's ``self.config.<seed name>`` and
    ``config.<seed name> = value`` keep working on trajcore's field."""

    def read(config: object) -> object:
        return seed.convert_back(getattr(config, seed.target))

    def write(config: object, value: object) -> None:
        converted = seed.convert(seed.name, value)
        warnings.warn(seed.warning(), stacklevel=5)  # the caller's assignment
        setattr(config, seed.target, converted)

    return property(read, write, doc=f"The seed's name of {seed.target} ({seed.name}).")


def translate_seed_flags(
    argv: Sequence[str], known: Iterable[str], *, prefix: str = "--env."
) -> list[str]:
    """``argv`` with every seed name flag (``--env.agent_max_steps 3`` or
    ``--env.agent_max_steps=3``) turned into its trajcore flag, with one warning per name.

    Atropos builds its command line from the config's fields, so a seed name would be refused
    there as an unrecognised argument. ``known`` are the config's own field names: those pass as
    they are.

    Raises:
        ConfigError: a seed value trajcore cannot honour (naming the seed field), or a name
            that is neither the config's nor a seed's (naming it and the closest known one).
    """
    own = set(known)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        name, sep, inline = (
            arg[len(prefix) :].partition("=") if arg.startswith(prefix) else ("", "", "")
        )
        seed = SEED_FIELDS.get(name)
        if name and name not in own and seed is None:  # argparse would say only "unrecognized"
            close = closest_name(name, own | SEED_FIELDS.keys())
            hint = f"; did you mean {prefix}{close}?" if close else ""
            raise ConfigError(f"{prefix[2:]}{name}", f"unknown setting{hint}")
        if seed is None or name in own:
            out.append(arg)
            continue
        warnings.warn(seed.warning(), stacklevel=2)
        value: str | None = inline if sep else None
        if value is None and i < len(argv) and not argv[i].startswith("--"):
            value = argv[i]
            i += 1
        flag = f"{prefix}{seed.target}"
        if value is None:
            out.append(flag)
            continue
        converted = seed.convert(name, value)
        out.extend([flag, str(converted)])
    return out


def _seed_field_as_its_target(
    cls_name: str, name: str, value: object, inherited: Mapping[str, FieldInfo]
) -> FieldInfo:
    """A subclass's ``name: T = default`` for a seed name, as the field its seed name sets:
    trajcore's field (its type, checks and description) with the default converted as a seed
    value is (``terminal_backend = "docker"`` is ``sandbox = "container"``)."""
    seed = SEED_FIELDS[name]
    where = f"{cls_name}.{name}"
    fix = f"declare {seed.target} with its default instead"
    default = value
    description: str | None = None
    if isinstance(value, FieldInfo):
        plain = FieldInfo(default=value.default, description=value.description)
        if value.default_factory is not None or repr(plain) != repr(value):
            raise ConfigError(
                where,
                f"is the {'/'.join(seed.seeds)} name of trajcore's {seed.target}, and "
                f"only a plain default (Field(default=..., description=...)) maps onto it; {fix}",
            )
        default, description = value.default, value.description
    if default is PydanticUndefined:
        raise ConfigError(
            where,
            f"is the {'/'.join(seed.seeds)} name of trajcore's {seed.target} and needs a "
            f"default to set it; {fix}",
        )
    info = copy.copy(inherited[seed.target])
    converted = seed.convert(where, default)
    if isinstance(converted, list | dict):
        kept = converted
        info.default = PydanticUndefined
        info.default_factory = lambda: copy.deepcopy(kept)
    else:
        info.default = converted
        info.default_factory = None
    if description:
        info.description = description
    warnings.warn(seed.warning(f" (in {cls_name}, its default)"), stacklevel=3)
    return info


_CLASS_VAR = re.compile(r"^[\s'\"]*(?:[A-Za-z_][A-Za-z_0-9]*\.)*ClassVar\b")


def _is_class_var(annotation: object) -> bool:
    """``ClassVar[...]`` (an object, or a string under ``from __future__ import annotations``):
    a class attribute, not a setting."""
    if isinstance(annotation, str):
        return _CLASS_VAR.match(annotation) is not None
    return annotation is ClassVar or get_origin(annotation) is ClassVar


def _decorators_on_targets(namespace: dict[str, Any], known: set[str]) -> None:
    """Point each field validator and serializer (``@field_validator("dataset_name")``) that
    names a seed setting at the trajcore field it sets (``dataset``), in place: the seed name is
    no field of the class, so pydantic would refuse the decorator."""
    for attr, value in list(namespace.items()):
        if not isinstance(value, PydanticDescriptorProxy):
            continue
        info = value.decorator_info
        if not isinstance(
            info,
            FieldValidatorDecoratorInfo | FieldSerializerDecoratorInfo | ValidatorDecoratorInfo,
        ):
            continue
        moved = tuple(
            SEED_FIELDS[f].target if f in SEED_FIELDS and f not in known else f for f in info.fields
        )
        if moved != info.fields:
            # past the namespace's own __setitem__, which warns of an overridden decorator
            dict.__setitem__(
                namespace,
                attr,
                dataclasses.replace(value, decorator_info=dataclasses.replace(info, fields=moved)),
            )


class _SeedFieldsAsTargets(ModelMetaclass):
    """Builds ``AgentEnvConfig`` and its subclasses: a subclass field named as a seed setting
    (hermes's ``dataset_name: str = Field(default=...)``) becomes the default of the trajcore
    field it names, so the seed name keeps reading and writing that field (``SeedNames``), and
    a value given under either name reaches it. A field validator or serializer naming a seed
    name (``@field_validator("dataset_name")``) runs on that trajcore field, and a ``ClassVar``
    with a seed name stays a class attribute. A field that cannot map exactly (a factory, a
    constraint, no default, or the trajcore field declared beside it) is a ``ConfigError``
    naming both, when the class is defined."""

    def __new__(
        mcs,
        cls_name: str,
        bases: tuple[type[Any], ...],
        namespace: dict[str, Any],
        **kwargs: Any,
    ) -> type:
        annotations = namespace.get("__annotations__")
        inherited: dict[str, FieldInfo] = {}
        for base in reversed(bases):
            inherited.update(getattr(base, "__pydantic_fields__", None) or {})
        if isinstance(annotations, dict) and "max_turns" in inherited:
            seed_names = [
                n
                for n, annotation in annotations.items()
                if n in SEED_FIELDS and n not in inherited and not _is_class_var(annotation)
            ]
            for name in seed_names:
                target = SEED_FIELDS[name].target
                if target in annotations:
                    raise ConfigError(
                        f"{cls_name}.{name}",
                        f"is the seeds' name of trajcore's {target}, which {cls_name} declares "
                        "too: keep one",
                    )
                value = namespace.pop(name, PydanticUndefined)
                del annotations[name]
                namespace[target] = _seed_field_as_its_target(cls_name, name, value, inherited)
                annotations[target] = inherited[target].annotation
        if "max_turns" in inherited:
            _decorators_on_targets(namespace, set(inherited) | set(annotations or ()))
        cls = super().__new__(mcs, cls_name, bases, namespace, **kwargs)
        # Annotations this could not rewrite (evaluated lazily): refused rather than shadowed.
        for name in set(getattr(cls, "__pydantic_fields__", {})) & SEED_FIELDS.keys():
            target = SEED_FIELDS[name].target
            raise ConfigError(
                f"{cls_name}.{name}",
                f"is the seeds' name of trajcore's {target}; declare {target} instead",
            )
        return cls


# A type checker learns a pydantic model's __init__ from ModelMetaclass's dataclass_transform,
# which mypy does not look for on a subclass of it: it sees the metaclass as pydantic's own.
if TYPE_CHECKING:
    SeedFieldsAsTargets = ModelMetaclass
else:
    SeedFieldsAsTargets = _SeedFieldsAsTargets


if TYPE_CHECKING:
    T = TypeVar("T")

    class _SeedName(Generic[T]):
        """What the type checker sees of a seed name: an attribute read and written as a ``T``."""

        def __get__(self, config: object, owner: object = None) -> T:
            raise NotImplementedError

        def __set__(self, config: object, value: T) -> None:
            raise NotImplementedError


class SeedNames:
    """The renamed seed settings as attributes of ``AgentEnvConfig`` (a mixin): each reads and
    writes its trajcore field (``seed_alias``), so a seed env's ``self.config.agent_max_steps``
    keeps working, typed."""

    if TYPE_CHECKING:
        tool_pool_mode = _SeedName[str]()
        tool_batch_window_ms = _SeedName[float]()
        tool_max_batch_size = _SeedName[int]()
        sandbox_job_id = _SeedName[str]()
        sandbox_image = _SeedName[str]()
        purge_job_on_start = _SeedName[bool]()
        purge_job_on_shutdown = _SeedName[bool]()
        agent_max_steps = _SeedName[int]()
        agent_max_tokens = _SeedName[int | None]()
        agent_tool_delay_s = _SeedName[float]()
        max_agent_turns = _SeedName[int]()
        distribution = _SeedName[dict[str, float] | str | None]()
        terminal_backend = _SeedName[str]()
        terminal_timeout = _SeedName[float]()
        terminal_lifetime = _SeedName[float | None]()
        dataset_name = _SeedName[str | None]()
        tool_pool_size = _SeedName[int]()


for _name, _seed in SEED_FIELDS.items():
    setattr(SeedNames, _name, seed_alias(_seed))
