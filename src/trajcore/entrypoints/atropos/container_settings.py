"""The container pool's own flags (``container_*``): ``ContainerSettings``, a section of the env's
``SandboxSettings``.

Each flag is read into the ``ContainerPoolConfig`` field of its name without the prefix
(``container_name_prefix`` into ``name_prefix``; ``SandboxSettings.container_pool_config``), and
each default is the pool's own, read from its default value, never restated. The pool checks the
values when its settings are built (``AgentEnvConfig.settings``, at the env's start), and its
error is renamed to the flag (``container_name_prefix``, ``container_engine_timeout_s``).

``container_engine_options`` is read here first, since it arrives as text: atroposlib's command
line and ``trajcore run --set`` give a JSON list of strings or one text of shell words. A value
that starts with ``-`` must follow ``=`` on atroposlib's command line
(``--env.container_engine_options="--memory 8g"``): without it the flag reads as a bare
``true`` and the options as flags of their own, which is refused here, saying so.
"""

from __future__ import annotations

import json
import shlex

from pydantic import BaseModel, Field, field_validator

from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.domain.errors import ConfigError

__all__ = ["ContainerSettings", "engine_options"]

_CONTAINER = ContainerPoolConfig()
_OPTIONS = "container_engine_options"


def engine_options(value: object) -> list[str] | None:
    """The engine's ``run`` options as given on the command line, in YAML or in Python.

    ``None``, an empty text or ``"None"``: none given (the pool's ``default_engine_options``).
    A list (or tuple) of strings as it is; a text starting with ``[`` (or ``{``): JSON, which
    must be a list of strings; any other text: shell words (``"--memory 8g --pids-limit 512"``).

    Raises:
        ConfigError: anything else, an item that is not a non-empty string, malformed JSON or
            unbalanced quotes (field ``container_engine_options``, the item's index named).
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or text == "None":
            return None
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise ConfigError(_OPTIONS, f"not a JSON list of strings: {error}") from None
        else:
            try:
                return shlex.split(text)
            except ValueError as error:
                raise ConfigError(_OPTIONS, f"cannot split {text!r} into words: {error}") from None
    if isinstance(value, bool):
        raise ConfigError(
            _OPTIONS,
            f"expected a list of strings, got {value!r}; on the command line give options that "
            f'start with "-" after "=": --env.{_OPTIONS}="--memory 8g"',
        )
    if not isinstance(value, list | tuple):
        raise ConfigError(_OPTIONS, f"expected a list of strings, got {value!r}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(
                _OPTIONS, f"[{index}]: expected a non-empty string without NUL, got {item!r}"
            )
    return list(value)


class ContainerSettings(BaseModel):
    """The container pool's own flags (the module doc); ``local_containers``, the image cache
    and the shared flags are ``SandboxSettings``'."""

    container_image: str = Field(
        default=_CONTAINER.image,
        description="Container pool: the slot-server image (./dev image builds it).",
    )
    container_engine: str | None = Field(
        default=_CONTAINER.engine,
        description="Container pool: 'podman' or 'docker' (default: whichever works here).",
    )
    container_engine_options: list[str] | str | None = Field(
        default=engine_options(_CONTAINER.engine_options),
        description="Container pool: the engine's run options IN PLACE OF trajcore's (the "
        "/proc unmask, seccomp and ulimit options default_engine_options gives; start from "
        "those to add --memory or --pids-limit): a JSON list of strings or shell words, after "
        "'=' on the command line (--env.container_engine_options=\"--memory 8g ...\"). "
        "Default: trajcore's.",
    )
    container_name_prefix: str | None = Field(
        default=_CONTAINER.name_prefix,
        description="Container pool: the containers' name prefix and trajcore.pool label "
        "([A-Za-z0-9][A-Za-z0-9_.-]*, at most 41 characters); a running pool's prefix is "
        "refused. Default: trajcore-<random>.",
    )
    container_engine_timeout_s: float = Field(
        default=_CONTAINER.engine_timeout_s,
        description="Container pool: longest one engine command (run, port, rm, ...) may take.",
    )
    container_environment_dirs: str | None = Field(
        default=None,
        description="Container pool: host directories of task environments (OCI layouts, "
        "archives), comma-separated, mounted read-only at the same paths.",
    )

    @field_validator("container_engine_options", mode="before")
    @classmethod
    def _engine_options(cls, value: object) -> list[str] | None:
        return engine_options(value)
