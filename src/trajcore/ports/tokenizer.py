"""Tokenizer: text and chats to token ids and back, with the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trajcore.domain.token_ledger.template import ChatRenderer

__all__ = ["Tokenizer"]


class Tokenizer(ChatRenderer, Protocol):
    """A tokenizer with a chat template. Synchronous: it is CPU work, not I/O.

    ``render``, the chat template as ids, is ``ChatRenderer.render``.
    """

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id, if the tokenizer has one."""
        ...

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept (invalid UTF-8 becomes U+FFFD)."""
        ...
