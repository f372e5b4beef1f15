"""The rows behind ``AgentEnv``'s built-in ``get_next_item``: a dataset named in the config.

hermes-agent's config named a dataset (``dataset_name``, ``dataset_split``, ``prompt_field``); an
env that sets ``dataset`` (and leaves ``get_next_item`` and ``build_task`` alone) gets its items
from here, one row at a time, cycling, and sends ``row[prompt_field]`` as the task.

The rows are loaded only for the built-in ``get_next_item``: an env that writes its own (as
hermes's envs did, loading their data in ``setup``) keeps ``dataset`` for itself and nothing is
loaded for it; the built-in ``build_task`` needs no rows, only ``prompt_field``.

Rules this module keeps:

- **Offline.** A local ``.jsonl`` or ``.parquet`` file is read directly; a folder saved with
  ``datasets``' ``save_to_disk`` is loaded from disk; any other name goes to
  ``datasets.load_dataset`` with offline mode forced for the call (the ``HF_HUB_OFFLINE``
  variables and the constants ``huggingface_hub`` and ``datasets`` read them into at import), so
  it is served from the local cache or fails, and never reaches the network (the error says
  how to fetch it once).
- **Files as they are.** A ``.jsonl`` file is UTF-8, one JSON value per ``\\n``-ended line
  (blank lines skipped; a string may hold U+2028 and the like); a file that is not, or a
  ``.parquet`` file pyarrow cannot read, is a ``ConfigError`` naming the file (and line).
- **Checked when loaded.** Every row must be a JSON object holding ``prompt_field`` with text; a
  row that does not is a ``ConfigError`` naming the row (``path:line`` in a ``.jsonl`` file)
  and the field, when the env is built.
- **Order.** Rows come in file order, then again from the first (the env's ``group_size``
  trajectories of one row are one group).
- **Shards.** With ``dataset_shard`` ``I/K`` the rows are the file's ``I``-th, ``I+K``-th, ...
  (from 0): K env processes of one env, each given its own ``I``, cycle through disjoint rows.
  A shard with no row, or ``I`` not below ``K``, is a ``ConfigError`` at ``dataset_shard``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, cast

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject, check_json

__all__ = ["DatasetRows", "DatasetSettings", "builtin_dataset", "load_rows", "shard_of"]


_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@contextmanager
def _offline(hub_constants: object, datasets_config: object) -> Iterator[None]:
    """Offline mode for the call: the environment variables, and the module constants
    ``huggingface_hub`` and ``datasets`` read them into when imported (setting the variables
    alone does nothing once they are imported). One call at a time: two interleaved ones
    would each restore what the other set."""
    with _OFFLINE_LOCK:
        saved_env = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
        targets = [(hub_constants, "HF_HUB_OFFLINE")]
        targets += [(datasets_config, name) for name in _OFFLINE_VARIABLES]
        saved = [(module, name, getattr(module, name)) for module, name in targets]
        os.environ.update(dict.fromkeys(saved_env, "1"))
        for module, name, _ in saved:
            setattr(module, name, True)
        try:
            yield
        finally:
            for module, name, value in saved:
                setattr(module, name, value)
            for name, env_value in saved_env.items():
                if env_value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = env_value


_OFFLINE_LOCK = threading.Lock()


def _jsonl(path: Path) -> list[tuple[str, object]]:
    """Each row of ``path`` with where it is (``path:line``, lines counted from 1, blank ones
    too). Lines end at ``\\n`` only: a JSON string may hold U+2028, U+2029 or U+0085."""
    rows: list[tuple[str, object]] = []
    try:
        with path.open("rb") as file:
            for number, raw in enumerate(file, start=1):
                where = f"{path}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError("dataset", f"{where} is not UTF-8: {exc}") from None
                if line.strip():
                    try:
                        rows.append((where, json.loads(line)))
                    except ValueError as exc:
                        raise ConfigError("dataset", f"{where} is not JSON: {exc}") from None
    except OSError as exc:
        raise ConfigError("dataset", f"{path}: cannot be read: {exc}") from None
    return rows


def _parquet(path: Path) -> list[object]:
    import pyarrow  # type: ignore[import-untyped]  # pyarrow ships no types
    import pyarrow.parquet  # type: ignore[import-untyped]

    try:
        rows: list[object] = pyarrow.parquet.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        raise ConfigError("dataset", f"{path}: not a readable Parquet file: {exc}") from None
    return rows


def _hugging_face(source: str, split: str) -> list[object]:
    import datasets  # type: ignore[import-untyped]  # datasets ships no types

    # huggingface_hub (datasets' own dependency, loaded with it) holds the offline switch too
    hub_constants = sys.modules["huggingface_hub.constants"]
    with _offline(hub_constants, datasets.config):
        try:
            if Path(source).is_dir():
                loaded = datasets.load_from_disk(source)
                table = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
            else:
                table = datasets.load_dataset(source, split=split)
        except KeyError:
            raise ConfigError("dataset_split", f"{source!r} has no split {split!r}") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(
                "dataset",
                f"cannot load {source!r} offline (HF_HUB_OFFLINE=1): {exc}. Fetch it once "
                f"(huggingface-cli download --repo-type dataset {source}), name a local "
                ".jsonl/.parquet file, or write get_next_item and load it in setup",
            ) from None
    return [dict(row) for row in table]


def load_rows(source: str, *, split: str, prompt_field: str) -> tuple[JSONObject, ...]:
    """The rows of ``source``, each checked to hold ``prompt_field`` as text.

    Raises:
        ConfigError: no such file or dataset, an empty one, a row that is not a JSON object or
            lacks ``prompt_field`` (``dataset``, ``dataset_split`` or ``prompt_field``).
    """
    path = Path(source)
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise ConfigError("dataset", f"no such file: {source}")
        located = _jsonl(path)
    elif path.suffix == ".parquet":
        if not path.is_file():
            raise ConfigError("dataset", f"no such file: {source}")
        located = [(f"row {i} of {source!r}", row) for i, row in enumerate(_parquet(path))]
    else:
        raw = _hugging_face(source, split)
        located = [(f"row {i} of {source!r}", row) for i, row in enumerate(raw)]
    if not located:
        raise ConfigError("dataset", f"{source!r} has no rows")
    rows: list[JSONObject] = []
    for where, row in located:
        if not isinstance(row, dict):
            raise ConfigError("dataset", f"{where} is not an object")
        problem = check_json(row)
        if problem is not None:
            raise ConfigError("dataset", f"{where}: {problem}")
        if not isinstance(row.get(prompt_field), str):
            raise ConfigError(
                "prompt_field",
                f"{where} has no text field {prompt_field!r} (it has {sorted(row)})",
            )
        rows.append(cast("JSONObject", row))  # check_json proved it
    return tuple(rows)


@attrs.define
class DatasetRows:
    """A loaded dataset, handed out one row at a time, cycling.

    Attributes:
        rows: The checked rows, in order.
        prompt_field: The field holding each row's task text.
    """

    rows: Sequence[JSONObject]
    prompt_field: str
    _next: int = attrs.field(default=0, init=False)

    def next_row(self) -> JSONObject:
        """The next row (after the last, the first again)."""
        row = self.rows[self._next % len(self.rows)]
        self._next += 1
        return row

    def prompt(self, row: JSONObject) -> str:
        """The task text of ``row``.

        Raises:
            ConfigError: ``row`` has no text at ``prompt_field``.
        """
        return self.prompt_of(row, self.prompt_field)

    @staticmethod
    def prompt_of(row: Mapping[str, object], prompt_field: str) -> str:
        """The task text of ``row`` at ``prompt_field``.

        Raises:
            ConfigError: ``row`` has no text at ``prompt_field``.
        """
        value = row.get(prompt_field)
        if not isinstance(value, str):
            raise ConfigError("prompt_field", f"the item has no text field {prompt_field!r}")
        return value


class DatasetSettings(Protocol):
    """The config fields the built-in dataset reads."""

    @property
    def dataset(self) -> str | None: ...
    @property
    def dataset_split(self) -> str: ...
    @property
    def prompt_field(self) -> str: ...
    @property
    def dataset_shard(self) -> str | None: ...


def builtin_dataset(
    config: DatasetSettings, *, env_name: str, builtin: Sequence[str]
) -> DatasetRows | None:
    """The rows behind the built-in ``get_next_item``, loaded and checked now, or ``None``
    when the env writes its own ``get_next_item`` (``builtin`` names the item hooks the env
    left to the base: ``get_next_item``, ``build_task``).

    Raises:
        ConfigError: no ``dataset`` while a built-in hook needs one, or what ``load_rows``
            raises.
    """
    if config.dataset is None:
        if builtin:
            raise ConfigError(
                "dataset",
                f"{env_name} does not define {' or '.join(builtin)}: set dataset (a "
                ".jsonl/.parquet file or a Hugging Face dataset) or write them",
            )
        return None
    if "get_next_item" not in builtin:
        return None
    rows = load_rows(config.dataset, split=config.dataset_split, prompt_field=config.prompt_field)
    if config.dataset_shard is not None:
        rows = shard_of(rows, config.dataset_shard)
    return DatasetRows(rows=rows, prompt_field=config.prompt_field)


def shard_of(rows: tuple[JSONObject, ...], shard: str) -> tuple[JSONObject, ...]:
    """The rows of ``shard`` (``I/K``): the ``I``-th, ``I+K``-th, ... of ``rows``.

    Raises:
        ConfigError: at ``dataset_shard``: not ``I/K`` with ``0 <= I < K``, or no row in it.
    """
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise ConfigError("dataset_shard", f"expected I/K with 0 <= I < K, got {shard!r}")
    picked = rows[int(index) :: int(count)]
    if not picked:
        raise ConfigError(
            "dataset_shard", f"shard {shard} of the dataset's {len(rows)} rows holds no row"
        )
    return picked
