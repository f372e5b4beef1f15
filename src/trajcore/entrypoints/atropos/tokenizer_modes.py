"""How managed mode tokenizes: the ``tokenizer_mode`` names and the tokenizers they build.

``tokenizer_mode`` names a factory in an open registry: ``register_tokenizer_mode(name,
factory)`` (or an entry point in group ``trajcore.tokenizer_modes``) makes a tokenizer selectable
as ``--env.tokenizer_mode name``; trajcore's own two are registered below the same way:

- ``hf``: Atropos's tokenizer (from ``tokenizer_name``) with its chat template;
- ``mistral``: Mistral's own encoder (``mistral_common``), as vLLM's ``--tokenizer-mode mistral``.

A factory takes the ``AgentEnvConfig`` and Atropos's tokenizer object (``BaseEnv.tokenizer``,
which a mode may ignore) and returns trajcore's ``Tokenizer``; a setting it cannot work with is a
``ConfigError`` naming the env field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.registries import Registry, track
from trajcore.ports.tokenizer import Tokenizer

if TYPE_CHECKING:
    from trajcore.entrypoints.atropos.config import AgentEnvConfig

__all__ = [
    "TOKENIZER_MODES",
    "TokenizerFactory",
    "hf_tokenizer",
    "mistral_tokenizer",
    "register_tokenizer_mode",
    "tokenizer_for",
]

TokenizerFactory = Callable[["AgentEnvConfig", object], Tokenizer]
"""Builds the env's ``Tokenizer`` from its settings and Atropos's tokenizer object."""


def _as_factory(loaded: object) -> TokenizerFactory:
    if not callable(loaded):
        raise TypeError(f"expected a tokenizer factory, got {type(loaded).__name__}")
    return loaded


TOKENIZER_MODES: Registry[TokenizerFactory] = track(
    Registry(
        field="tokenizer_mode",
        what="tokenizer mode",
        group="trajcore.tokenizer_modes",
        adapt=_as_factory,
    )
)
"""The tokenizer modes ``tokenizer_mode`` selects from."""


def register_tokenizer_mode(name: str, factory: TokenizerFactory, *, replace: bool = False) -> None:
    """Make ``factory`` selectable as ``--env.tokenizer_mode name``.

    Raises:
        ConfigError: ``name`` is already registered and ``replace`` is false (field
            ``tokenizer_mode``).
    """
    TOKENIZER_MODES.register(name, factory, replace=replace)


def tokenizer_for(config: AgentEnvConfig, hf_tokenizer: object) -> Tokenizer:
    """The env's tokenizer as trajcore's ``Tokenizer``, built by the mode ``tokenizer_mode``.

    Raises:
        ConfigError: an unknown mode, or a setting the mode cannot work with (the built-in
            ``mistral``: ``mistral_tokenizer_file`` missing or unloadable, or the ``mistral``
            extra not installed).
    """
    return TOKENIZER_MODES.get(config.tokenizer_mode)(config, hf_tokenizer)


def hf_tokenizer(config: AgentEnvConfig, atropos_tokenizer: object) -> Tokenizer:
    """``hf``: Atropos's tokenizer with its chat template (``TransformersTokenizer``)."""
    from trajcore.adapters.tokenizers import TransformersTokenizer

    return TransformersTokenizer(tokenizer=atropos_tokenizer, path=Path(str(config.tokenizer_name)))


def mistral_tokenizer(config: AgentEnvConfig, atropos_tokenizer: object = None) -> Tokenizer:
    """``mistral``: ``MistralCommonTokenizer`` over ``mistral_tokenizer_file``, or the one
    Mistral file in the ``tokenizer_name`` folder (``tekken.json``, else the newest
    ``tokenizer.model.v*``); Atropos's tokenizer is not used."""
    field = "mistral_tokenizer_file"
    try:
        from trajcore.adapters.mistral import MistralCommonTokenizer
    except ImportError as exc:
        raise ConfigError(
            "tokenizer_mode", f"'mistral' needs pip install 'trajcore[mistral]' ({exc})"
        ) from None
    if config.mistral_tokenizer_file is not None:
        file = Path(config.mistral_tokenizer_file)
    else:
        folder = Path(str(config.tokenizer_name))
        found = sorted(folder.glob("tokenizer.model.v*")) if folder.is_dir() else []
        tekken = folder / "tekken.json"
        if tekken.is_file():
            found = [tekken]
        if not found:
            raise ConfigError(
                field, f"no tekken.json or tokenizer.model.v* in {str(folder)!r}: name the file"
            )
        file = found[-1]
    try:
        return MistralCommonTokenizer.from_file(file)
    except ConfigError as exc:
        raise ConfigError(field, exc.reason) from None


register_tokenizer_mode("hf", hf_tokenizer)
register_tokenizer_mode("mistral", mistral_tokenizer)
