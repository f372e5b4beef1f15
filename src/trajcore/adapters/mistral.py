"""The Tokenizer port over ``mistral_common``: Mistral's own tokenizers and chat-request encoder.

Mistral's models are not templated with jinja: Mistral publishes ``mistral_common``, whose
``MistralTokenizer.encode_chat_completion`` turns a chat request (messages, tools, tool calls and
tool results) into the exact ids a model was trained on. vLLM's ``--tokenizer-mode mistral`` uses
it; so does this adapter. ``render`` builds a ``ChatCompletionRequest`` from trajcore's messages
and returns that encoder's ids, so the ledger's prompt and bridges are Mistral's own tokens.

What this adapter promises, and the rules it keeps:

- **Offline.** ``from_file`` reads a ``tekken.json`` or ``tokenizer.model.v*`` file from disk;
  ``bundled`` loads the tokenizer files shipped inside the ``mistral_common`` wheel (SentencePiece
  v3 and v7, Tekken v3), and a Tekken v7 tokenizer built from the shipped Tekken vocabulary with
  the v7 request encoder, exactly as ``mistral_common`` builds a v7 Tekken file that lists no
  special tokens of its own. Nothing touches the Hugging Face Hub.
- **Mistral's encoder, unmodified, in ``agnostic`` validation mode.** Every message and tool goes
  through ``mistral_common``'s validator, normaliser (JSON arguments and JSON tool results are
  re-serialised) and version-specific encoder. ``agnostic`` mode lets a conversation end with an
  assistant turn (the ledger renders such stand-ins) or with a tool result; every other check
  (roles in order, calls answered, names ``^[a-zA-Z0-9_-]{1,64}$``) still applies.
- **No generation prompt.** Mistral's format has none: the model writes straight after
  ``[/INST]`` or ``[/TOOL_RESULTS]``. ``add_generation_prompt`` changes nothing.
- **Tool-call ids.** Tokenizers v3 and v7 accept only ids of nine ASCII letters and digits (models
  write such ids in their calls). An id of that form is kept as it is; any other id (trajcore's
  parsers write ``call_1_0``) is replaced by the first nine hex digits of its SHA-256 in both the
  call and its result, so calls and results still pair (``mistral_call_id``). vLLM truncates to the
  last nine characters instead, which can still be invalid and can collide.
- **What the format cannot hold is documented, not guessed.** v3 (and earlier) encode an
  assistant turn as either text or tool calls, never both (``mistral_common`` raises): a message
  with both is rendered with its calls only. No version here has a place for reasoning: a
  message's ``reasoning`` is not rendered. In both cases only a re-render loses the text (it shows
  up as drift); the ledger keeps the ids the model sampled.
- **Errors name the input.** A message ``mistral_common`` refuses becomes
  ``ConfigError("messages[i]", reason)`` when one message is at fault, ``ConfigError("messages",
  reason)`` for the conversation's structure, ``ConfigError("tools[i]", reason)`` for a tool; a
  file that cannot be loaded becomes ``ConfigError("tokenizer_path", reason)``.
- **No ``Any`` past this module.** ``mistral_common`` is typed; its JSON-typed corners (the Tekken
  file, tool parameters) are checked and converted here.
- **Safe from several threads at once.** The trajectory runner renders finished trajectories in
  worker threads while the event loop renders and decodes others' turns. ``mistral_common``'s
  request encoders build new objects per call and keep no settings that a call changes (unlike
  transformers' truncation and padding), and the Tekken (tiktoken) and SentencePiece encoders
  under them only read; ``tests/unit/test_tokenizer_threads.py`` checks eight threads' renders
  against single-threaded ones.

``decode`` keeps special tokens as their text (``[TOOL_CALLS]``, ``</s>``) and decodes the runs
between them as text (SentencePiece's ``▁`` becomes a space, its leading dummy space dropped),
so the ``mistral`` tool-call parser reads what the model wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeAlias, cast

import attrs
from pydantic import ValidationError

try:
    from mistral_common.exceptions import MistralCommonException
    from mistral_common.protocol.instruct.messages import (
        AssistantMessage,
        SystemMessage,
        ToolMessage,
        UserMessage,
    )
    from mistral_common.protocol.instruct.normalize import get_normalizer
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import (
        Function,
        FunctionCall,
        Tool,
    )
    from mistral_common.protocol.instruct.tool_calls import (
        ToolCall as MistralToolCall,
    )
    from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
    from mistral_common.tokens.tokenizers.base import (
        SpecialTokenPolicy,
        Tokenized,
        TokenizerVersion,
    )
    from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV7
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer, TokenInfo
except ModuleNotFoundError as exc:  # pragma: no cover - only without the optional extra
    raise ModuleNotFoundError(
        "trajcore.adapters.mistral needs mistral-common: pip install 'trajcore[mistral]'"
    ) from exc

from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import LONE_SURROGATE, Message, escape_lone_surrogates
from trajcore.domain.tools import ToolCall, ToolSpec

__all__ = ["BundledMistral", "MistralCommonTokenizer", "mistral_call_id"]

BundledMistral = Literal["v3", "v7", "tekken-v3", "tekken-v7"]
"""The tokenizers ``MistralCommonTokenizer.bundled`` loads from ``mistral_common``'s own files."""

_BUNDLED_FILES: dict[BundledMistral, str] = {
    "v3": "mistral_instruct_tokenizer_240323.model.v3",  # SentencePiece, Mistral 7B v0.3
    "v7": "mistral_instruct_tokenizer_241114.model.v7",  # SentencePiece, Mistral Large 2411
    "tekken-v3": "tekken_240718.json",  # Tekken, Mistral NeMo
    "tekken-v7": "tekken_240718.json",  # the same vocabulary with the v7 request encoder
}

_Encoder: TypeAlias = MistralTokenizer[
    UserMessage, AssistantMessage, ToolMessage, SystemMessage, Tokenized
]

_MISTRAL_ID = re.compile(r"[a-zA-Z0-9]{9}")

_ChatMessage: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage


def mistral_call_id(call_id: str) -> str:
    """The tool-call id Mistral's encoder writes for trajcore's ``call_id``.

    An id of nine ASCII letters and digits is kept; any other becomes the first nine hex digits
    of its SHA-256 (deterministic, so a call and its result still pair).
    """
    if _MISTRAL_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:9]


def _data_dir() -> Path:
    return Path(MistralTokenizer._data_path())  # the package's own data folder


def _tekken_v7(path: Path) -> _Encoder:
    """A v7 Tekken tokenizer over the vocabulary in ``path``, built as ``from_file`` builds a
    v7 Tekken file without a ``special_tokens`` list (the twenty control tokens of v7)."""
    data: object = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError("tokenizer_path", f"{str(path)!r} is not a Tekken file")
    config = cast("dict[str, object]", data["config"])
    vocab = data.get("vocab")
    pattern = config.get("pattern")
    vocab_size = config.get("default_vocab_size")
    specials = config.get("default_num_special_tokens")
    if not (
        isinstance(vocab, list)
        and isinstance(pattern, str)
        and isinstance(vocab_size, int)
        and isinstance(specials, int)
    ):
        raise ConfigError("tokenizer_path", f"{str(path)!r} lacks a Tekken vocabulary or config")
    tekken = Tekkenizer(
        vocab=cast("list[TokenInfo]", vocab),
        special_tokens=list(Tekkenizer.DEPRECATED_SPECIAL_TOKENS),
        pattern=pattern,
        vocab_size=vocab_size,
        num_special_tokens=specials,
        version=TokenizerVersion.v7,
        name=path.stem + "-v7",
    )
    return MistralTokenizer(
        InstructTokenizerV7(tekken),
        validator=get_validator(TokenizerVersion.v7, mode=ValidationMode.agnostic),
        request_normalizer=get_normalizer(TokenizerVersion.v7),
    )


@attrs.define
class MistralCommonTokenizer:
    """Mistral's tokenizer and chat-request encoder (``mistral_common``), as the ``Tokenizer`` port.

    Build it with ``from_file`` or ``bundled``. Encoding is CPU work and synchronous.

    Attributes:
        source: Where the tokenizer came from (a path, or ``bundled:<name>``).
    """

    _tokenizer: _Encoder = attrs.field(alias="tokenizer", repr=False)
    source: str

    @classmethod
    def from_file(cls, path: str | Path) -> MistralCommonTokenizer:
        """Load a ``tekken.json`` or ``tokenizer.model.v*`` file, never touching the network.

        Raises:
            ConfigError: ``tokenizer_path`` is not a file, or ``mistral_common`` cannot load it.
        """
        file = Path(path)
        if not file.is_file():
            raise ConfigError("tokenizer_path", f"{str(file)!r} is not a local file")
        try:
            tokenizer = MistralTokenizer.from_file(file, mode=ValidationMode.agnostic)
        except (MistralCommonException, OSError, ValueError, KeyError, AssertionError) as exc:
            # mistral_common reports a malformed file with assert as well as with exceptions.
            raise ConfigError("tokenizer_path", f"cannot load a Mistral tokenizer: {exc}") from exc
        return cls(tokenizer=tokenizer, source=str(file))

    @classmethod
    def bundled(cls, name: BundledMistral) -> MistralCommonTokenizer:
        """A tokenizer from the files shipped inside the ``mistral_common`` package.

        ``"v3"`` and ``"v7"`` are SentencePiece (Mistral 7B v0.3; Mistral Large 2411),
        ``"tekken-v3"`` is Tekken (Mistral NeMo), ``"tekken-v7"`` is that Tekken vocabulary with
        the v7 request encoder (system prompts in ``[SYSTEM_PROMPT]``, results with
        ``[TOOL_CONTENT]``).

        Raises:
            ConfigError: ``name`` is not one of these, or its file is missing.
        """
        if name not in _BUNDLED_FILES:
            raise ConfigError("name", f"expected one of {sorted(_BUNDLED_FILES)}, got {name!r}")
        file = _data_dir() / _BUNDLED_FILES[name]
        if not file.is_file():
            raise ConfigError("name", f"mistral_common ships no {file.name}")
        if name == "tekken-v7":
            return cls(tokenizer=_tekken_v7(file), source=f"bundled:{name}")
        loaded = cls.from_file(file)
        return cls(tokenizer=loaded._tokenizer, source=f"bundled:{name}")

    @property
    def version(self) -> str:
        """The tokenizer's version (``"v3"``, ``"v7"``...), which decides the chat format."""
        return self._tokenizer.instruct_tokenizer.tokenizer.version.value

    @property
    def is_tekken(self) -> bool:
        """Whether the tokenizer is Tekken (tiktoken-based) rather than SentencePiece."""
        return isinstance(self._tokenizer.instruct_tokenizer.tokenizer, Tekkenizer)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id (``</s>``), which ends every assistant turn."""
        return self._tokenizer.instruct_tokenizer.tokenizer.eos_id

    def special_id(self, text: str) -> int:
        """The id of the special token ``text`` (``"[TOOL_CALLS]"``).

        Raises:
            ConfigError: the tokenizer has no such special token.
        """
        inner = self._tokenizer.instruct_tokenizer.tokenizer
        try:
            token = inner.get_special_token(text)
        except (MistralCommonException, ValueError, KeyError) as exc:
            raise ConfigError("text", f"{text!r} is not a special token: {exc}") from exc
        if not inner.is_special(token) or inner.id_to_piece(token) != text:
            raise ConfigError("text", f"{text!r} is not a special token")
        return token

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added (special-token text stays text)."""
        inner = self._tokenizer.instruct_tokenizer.tokenizer
        return list(inner.encode(escape_lone_surrogates(text), bos=False, eos=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept as their text (invalid UTF-8 becomes U+FFFD).

        Raises:
            ConfigError: an id is outside the vocabulary (``ids``).
        """
        inner = self._tokenizer.instruct_tokenizer.tokenizer
        size = inner.n_words
        for index, token in enumerate(ids):
            if not 0 <= token < size:
                raise ConfigError(f"ids[{index}]", f"{token} is outside the vocabulary of {size}")
        if isinstance(inner, Tekkenizer):
            return inner.decode(list(ids), special_token_policy=SpecialTokenPolicy.KEEP)
        # SentencePiece keeps special tokens only as raw pieces ("▁" for spaces) when asked to
        # keep them, so runs of ordinary tokens are decoded as text between the special ones.
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            if inner.is_special(token):
                if run:
                    parts.append(inner.decode(run))
                    run = []
                parts.append(inner.id_to_piece(token))
            else:
                run.append(token)
        if run:
            parts.append(inner.decode(run))
        return "".join(parts)

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """See ``ChatRenderer.render``; a tool ``mistral_common`` refuses is named ``tools[i]``.

        ``add_generation_prompt`` changes nothing: Mistral's format has no generation prompt.
        """
        del add_generation_prompt  # Mistral's model writes straight after [/INST] or results.
        both = self._tokenizer.instruct_tokenizer.tokenizer.version >= TokenizerVersion.v7
        chat = [_message(i, m, content_with_calls=both) for i, m in enumerate(messages)]
        specs = [_tool(i, spec) for i, spec in enumerate(tools)]
        try:
            request = ChatCompletionRequest(messages=chat, tools=specs or None)
            tokenized = self._tokenizer.encode_chat_completion(request)
        except (MistralCommonException, ValueError) as exc:
            # pydantic's ValidationError is a ValueError; so is the normaliser's refusal.
            raise ConfigError("messages", f"mistral_common refused them: {exc}") from exc
        return list(tokenized.tokens)


def _message(index: int, message: Message, *, content_with_calls: bool) -> _ChatMessage:
    try:
        if message.role == "system":
            return SystemMessage(content=escape_lone_surrogates(message.content))
        if message.role == "user":
            return UserMessage(content=escape_lone_surrogates(message.content))
        if message.role == "tool":
            if message.tool_call_id is None:
                raise ConfigError(f"messages[{index}].tool_call_id", "a tool result needs its id")
            return ToolMessage(
                content=escape_lone_surrogates(message.content),
                tool_call_id=mistral_call_id(message.tool_call_id),
                name=message.name,
            )
        calls = [_call(call) for call in message.tool_calls] or None
        content = (
            escape_lone_surrogates(message.content)
            if (content_with_calls or calls is None)
            else None
        )
        return AssistantMessage(content=content or None, tool_calls=calls)
    except ValidationError as exc:
        raise ConfigError(f"messages[{index}]", f"mistral_common refused it: {exc}") from exc


def _call(call: ToolCall) -> MistralToolCall:
    # raw arguments (no JSON object) are given as written: mistral_common writes JSON it can
    # read as it reads it, anything else as a JSON string
    text = call.arguments_json() if call.raw_arguments is None else call.raw_arguments
    return MistralToolCall(
        id=mistral_call_id(call.id),
        # mistral_common reads the arguments' JSON and writes it again, so an escape would come
        # back a lone surrogate: the tekkenizer writes one as U+FFFD, SentencePiece cannot take
        # it at all; every version gets U+FFFD
        function=FunctionCall(name=call.name, arguments=LONE_SURROGATE.sub("\ufffd", text)),
    )


def _tool(index: int, spec: ToolSpec) -> Tool:
    try:
        return Tool(
            function=Function(
                name=spec.name,
                description=spec.description,
                parameters=dict(spec.parameters),
            )
        )
    except ValidationError as exc:
        raise ConfigError(f"tools[{index}]", f"mistral_common refused it: {exc}") from exc
