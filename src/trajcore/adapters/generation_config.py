"""A model's stop ids from its ``generation_config.json``, read from a local folder.

Hugging Face models list the ids that end generation in ``generation_config.json`` as
``eos_token_id``: one id or a list (Qwen3: ``[151645, 151643]``, ``<|im_end|>`` and
``<|endoftext|>``). A tokenizer's own ``eos_token_id`` names only one of them, so a turn that ends
with the other would carry its text into the message. ``generation_stop_ids`` reads the list, so
the ledger's template (``ChatTemplate.learn(turn_stops=...)``) and the managed-mode policy know
every id that can end a sampled turn.

Rules: local files only; a folder without the file has no extra stop ids (an empty set); a file
that is not JSON, or an ``eos_token_id`` that is not a non-negative integer or a list of them, is a
``ConfigError`` naming ``generation_config.eos_token_id`` and the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from trajcore.domain.errors import ConfigError

__all__ = ["generation_stop_ids"]

_FIELD = "generation_config.eos_token_id"


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def generation_stop_ids(folder: str | Path) -> frozenset[int]:
    """The ``eos_token_id`` ids of ``folder/generation_config.json``; empty when there is none.

    Raises:
        ConfigError: the file exists but is not a JSON object, or its ``eos_token_id`` is neither
            an id nor a list of ids (``field`` is ``generation_config.eos_token_id``).
    """
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return frozenset()
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("generation_config", f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError("generation_config", f"{str(path)!r} is not a JSON object")
    value = config.get("eos_token_id")
    if value is None:
        return frozenset()
    ids = value if isinstance(value, list) else [value]
    if not all(_is_id(i) for i in ids):
        raise ConfigError(
            _FIELD, f"expected a token id or a list of them in {str(path)!r}, got {value!r}"
        )
    return frozenset(ids)
