"""The tokenizer adapters from several threads at once: the ids of a single thread, no error.

The trajectory runner renders finished trajectories in worker threads while the event loop
renders and decodes the turns of others with the same tokenizer object. A Rust (``tokenizers``)
tokenizer raises ``RuntimeError: Already borrowed`` when one thread reconfigures it while another
encodes with it, and a setting changed between another thread's setting and its encoding gives
that thread the wrong ids, silently. Each case renders sixteen different conversations (half of
them with text that spells a special token, which takes the adapter's other path) from eight
threads at once, and compares every render with the single-threaded one.
"""

from __future__ import annotations

import copy
import json
import pickle
import threading
from collections.abc import Callable

import pytest

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolResult
from trajcore.ports.tokenizer import Tokenizer
from trajcore.testing.tokenizers import write_llama3_shaped_tokenizer

THREADS = 8
ROUNDS = 3


def _conversation(k: int, special: str) -> list[Message]:
    call = ToolCall(id=f"call{k}", name="read_file", arguments={"path": f"f{k}.txt"})
    spelled = f" {special} " if k % 2 == 0 else " "
    body = "\n".join(f"line {i} of file {k}:{spelled}{'x' * (i % 9)}" for i in range(120))
    return [
        Message.system("You fix things."),
        Message.user(f"Task {k}: read f{k}.txt."),
        Message.assistant(f"Reading {k}.", tool_calls=[call]),
        Message.tool(ToolResult.success(call, body)),
        Message.assistant(f"Done with {k}."),
    ]


def _hammer(tokenizer: Tokenizer, special: str, beside: Callable[[], None] | None = None) -> None:
    """Render the conversations from ``THREADS`` threads at once (``beside`` running on this
    thread meanwhile) and check every render against the single-threaded one."""
    conversations = [_conversation(k, special) for k in range(16)]
    expected = [tokenizer.render(c) for c in conversations]
    assert len({tuple(ids) for ids in expected}) == len(expected)  # sixteen different renders
    wrong: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS + 1)

    def work(offset: int) -> None:
        start.wait()
        for _ in range(ROUNDS):
            for step in range(len(conversations)):
                k = (offset + step * (1 + offset % 3)) % len(conversations)
                try:
                    if tokenizer.render(conversations[k]) != expected[k]:
                        wrong.append(k)
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    start.wait()
    try:
        while beside is not None and any(t.is_alive() for t in threads):
            beside()
    finally:
        for thread in threads:
            thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert [repr(e) for e in errors] == []
    assert wrong == []


@pytest.fixture(scope="module")
def qwen3() -> TransformersTokenizer:
    return TransformersTokenizer.from_path(qwen3_tokenizer_path())


def test_qwen3_renders_the_same_ids_from_eight_threads(qwen3: TransformersTokenizer) -> None:
    _hammer(qwen3, "<|im_end|>")


@pytest.fixture(scope="module")
def without_pre_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TransformersTokenizer:
    """A tokenizer shaped like Llama 2's and Mistral's Hugging Face files: no pre-tokenizer, its
    normalizer does the work (here byte-level)."""
    folder = write_llama3_shaped_tokenizer(tmp_path_factory.mktemp("no-pre-tokenizer"))
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = None
    spec["normalizer"] = {"type": "ByteLevel"}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return TransformersTokenizer.from_path(folder)


def test_a_tokenizer_without_pre_tokenizer_renders_the_same_ids_from_eight_threads(
    without_pre_tokenizer: TransformersTokenizer,
) -> None:
    # Text that spells a special token is encoded without matching added tokens: that must not
    # flip a setting of the shared tokenizer the other threads' renders read.
    _hammer(without_pre_tokenizer, "<|eot_id|>")


@pytest.fixture
def shared_qwen3(qwen3: TransformersTokenizer) -> tuple[TransformersTokenizer, object]:
    """The adapter over a transformers object the env's own code holds too (Atropos's, in the
    ``hf`` tokenizer mode), and that object."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen3.path), local_files_only=True)
    return TransformersTokenizer(tokenizer=hf, path=qwen3.path), hf


def test_renders_stay_exact_while_the_env_calls_the_shared_object_with_truncation(
    shared_qwen3: tuple[TransformersTokenizer, object],
) -> None:
    adapter, hf = shared_qwen3
    lengths: list[int] = []

    def env_code() -> None:  # what an env's hook may do with Atropos's tokenizer meanwhile
        encoded = hf("some text to cut short " * 20, truncation=True, max_length=8)  # type: ignore[operator]
        lengths.append(len(encoded["input_ids"]))

    try:
        _hammer(adapter, "<|im_end|>", beside=env_code)
    finally:  # the env's own calls are cut as they asked, also while renders run
        assert lengths
        assert set(lengths) == {8}


def test_mistral_tokenizers_render_the_same_ids_from_eight_threads() -> None:
    pytest.importorskip("mistral_common")
    from trajcore.adapters.mistral import MistralCommonTokenizer

    for name in ("v3", "tekken-v7"):
        _hammer(MistralCommonTokenizer.bundled(name), "[INST]")


def test_the_thread_safe_encoding_gives_transformers_own_ids(
    qwen3: TransformersTokenizer,
    without_pre_tokenizer: TransformersTokenizer,
    shared_qwen3: tuple[TransformersTokenizer, object],
) -> None:
    # The adapter no longer lets transformers tokenize (that reconfigures the tokenizer per
    # call): a conversation without special-token text must still get exactly its ids.
    adapter, hf = shared_qwen3
    cases = [(qwen3, qwen3._tokenizer), (without_pre_tokenizer, without_pre_tokenizer._tokenizer)]
    for tokenizer, transformers_object in [*cases, (adapter, hf)]:
        for k in (1, 3):
            conversation = _conversation(k, "<unused>")
            chat = [m.to_chat_dict() for m in conversation]
            for prompt in (False, True):
                expected = transformers_object.apply_chat_template(
                    chat, tokenize=True, return_dict=False, add_generation_prompt=prompt
                )
                assert tokenizer.render(conversation, add_generation_prompt=prompt) == expected


def test_the_adapter_still_pickles_and_copies_with_the_same_ids(
    qwen3: TransformersTokenizer, shared_qwen3: tuple[TransformersTokenizer, object]
) -> None:
    # Its thread-safety holds no lock of its own: a value that pickles (into worker processes)
    # and deep-copies as before, and renders the same ids once copied, before or after first use.
    adapter, _ = shared_qwen3
    conversation = _conversation(2, "<|im_end|>")  # both paths: spelled and plain
    for tokenizer in (TransformersTokenizer(tokenizer=adapter._tokenizer, path=qwen3.path), qwen3):
        for copied in (pickle.loads(pickle.dumps(tokenizer)), copy.deepcopy(tokenizer)):
            assert copied.render(conversation) == tokenizer.render(conversation)
            assert copied.render(_conversation(1, "")) == tokenizer.render(_conversation(1, ""))
