"""OpenAI mode trains a tool call whose arguments were no JSON object (unterminated JSON, an
array, ``null``) as the model wrote them, never as the ``{}`` the conversation replays to the
server with. Qwen3's real template writes text arguments as they are; a template that cannot
(``tojson`` of the text, ``mistral_common`` rewriting what it can read) leaves that turn out of
training (masked) and says why in the tokens' ``untrained_turns``. Real tokenizers, from local
files. Managed mode keeps the sampled ids as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer
from trajcore.adapters.llm.chat_wire import chat_request, parse_chat_body
from trajcore.adapters.mistral import MistralCommonTokenizer
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.token_ledger.ledger import MASKED_LABEL, TrainingTokens, UntrainedTurn
from trajcore.domain.token_ledger.template import ChatTemplate, RenderOnly
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.ports.tokenizer import Tokenizer
from trajcore.rollout.policy import ChatPolicy, TokenPolicy
from trajcore.testing.tokenizers import write_llama3_shaped_tokenizer

TOOLS = (
    ToolSpec(
        name="write_file",
        description="Write a file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    ),
)
UNTERMINATED = '{"path": "a.txt", "content": "unterminated'
ARRAY = '["a.txt", "x"]'
NULL = "null"
PROMPT = (Message.system("Be brief."), Message.user("Create a.txt."))

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def qwen3() -> TransformersTokenizer:
    return TransformersTokenizer.from_path(qwen3_tokenizer_path())


def _garbled(raw: str, finish: str = "tool_calls") -> ChatTurn:
    """The turn a chat-completions server answers with one call whose arguments are ``raw``."""
    call = {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": raw}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    return parse_chat_body({"choices": [{"message": message, "finish_reason": finish}]})


def _spans(masks: tuple[int, ...]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = None
    for k, mask in enumerate((*masks, MASKED_LABEL)):
        if mask != MASKED_LABEL and start is None:
            start = k
        elif mask == MASKED_LABEL and start is not None:
            spans.append((start, k))
            start = None
    return spans


async def _run(
    tokenizer: Tokenizer, raw: str, finish: str = "tool_calls"
) -> tuple[TrainingTokens, FakeChatServer]:
    """Two turns: the garbled call, answered as the agent loop answers it, then ``Done.``."""
    first, last = (
        _garbled(raw, finish),
        ChatTurn(message=Message.assistant("Done."), finish_reason=FinishReason.STOP),
    )
    chat = FakeChatServer(script=[first, last])
    session = ChatPolicy(chat, ChatTemplate.learn(tokenizer)).start(PROMPT, tools=TOOLS)
    sampling = SamplingParams(max_tokens=64)
    turn = await session.sample(PROMPT, sampling=sampling)
    assert len(turn.parsed.errors) == 1
    rejection = turn.parsed.errors[0].rejection(1)
    messages = [*PROMPT, turn.parsed.to_message(), Message.tool(rejection)]
    await session.sample(messages, sampling=sampling)
    messages.append(last.message)
    exported = session.training_tokens(messages, max_token_length=None)
    assert exported is not None
    return exported, chat


@pytest.mark.parametrize("raw", [UNTERMINATED, ARRAY, NULL], ids=["unterminated", "array", "null"])
async def test_qwen3_trains_the_arguments_as_the_model_wrote_them(
    qwen3: TransformersTokenizer, raw: str
) -> None:
    exported, chat = await _run(qwen3, raw)
    trained = [qwen3.decode(exported.tokens[a:b]) for a, b in _spans(exported.masks)]
    assert len(trained) == 2
    assert f'{{"name": "write_file", "arguments": {raw}}}\n</tool_call>' in trained[0]
    assert '"arguments": {}' not in qwen3.decode(exported.tokens)
    assert exported.untrained_turns == ()
    # the replay to the server still carries {} for the call, so that its answer pairs with it
    (replayed,) = [m for m in chat.requests[1].messages if m.tool_calls]
    assert replayed.tool_calls[0].raw_arguments is None
    body = chat_request(model="m", messages=[replayed], tools=TOOLS, sampling=SamplingParams())
    assert '"arguments": "{}"' in json.dumps(body)


async def test_a_turn_cut_inside_such_a_call_is_not_trained(qwen3: TransformersTokenizer) -> None:
    # the model wrote no end of the call: Qwen3's template would add '}\n</tool_call>'
    exported, _ = await _run(qwen3, UNTERMINATED, finish="length")
    spans = _spans(exported.masks)
    assert len(spans) == 1
    assert qwen3.decode(exported.tokens[spans[0][0] : spans[0][1]]).endswith("Done.<|im_end|>")
    (untrained,) = exported.untrained_turns
    assert untrained.turn == 1
    assert "cut the turn inside a call" in untrained.reason


@pytest.fixture(scope="module")
def llama3_shaped(tmp_path_factory: pytest.TempPathFactory) -> TransformersTokenizer:
    folder: Path = write_llama3_shaped_tokenizer(tmp_path_factory.mktemp("llama3"))
    return TransformersTokenizer.from_path(folder)


@pytest.mark.parametrize("raw", [UNTERMINATED, ARRAY, NULL], ids=["unterminated", "array", "null"])
async def test_a_template_that_quotes_text_arguments_leaves_the_turn_untrained(
    llama3_shaped: TransformersTokenizer, raw: str
) -> None:
    exported, _ = await _run(llama3_shaped, raw)
    spans = _spans(exported.masks)
    assert len(spans) == 1  # the last turn only
    assert llama3_shaped.decode(exported.tokens[spans[0][0] : spans[0][1]]).startswith("Done.")
    (untrained,) = exported.untrained_turns
    assert untrained.turn == 1
    assert "call c1 (write_file)" in untrained.reason
    assert "does not write them as the model wrote them" in untrained.reason


@pytest.mark.parametrize(
    ("raw", "trained"),
    [(UNTERMINATED, False), (ARRAY, True), (NULL, True)],
    ids=["unterminated", "array", "null"],
)
async def test_mistral_trains_only_what_its_encoder_writes_as_written(
    raw: str, trained: bool
) -> None:
    # mistral_common writes arguments it can read as JSON again (the array and null come out
    # as written) and anything else as a JSON string (not what the model wrote)
    tekken = MistralCommonTokenizer.bundled("tekken-v7")
    exported, _ = await _run(tekken, raw)
    spans = _spans(exported.masks)
    assert len(spans) == (2 if trained else 1)
    if trained:
        assert raw in tekken.decode(exported.tokens[spans[0][0] : spans[0][1]])
        assert exported.untrained_turns == ()
    else:
        assert [u.turn for u in exported.untrained_turns] == [1]


@pytest.mark.parametrize("raw", [UNTERMINATED, ARRAY, NULL], ids=["unterminated", "array", "null"])
async def test_managed_mode_trains_the_sampled_ids_as_they_are(
    qwen3: TransformersTokenizer, raw: str
) -> None:
    text = f'<tool_call>\n{{"name": "write_file", "arguments": {raw}}}\n</tool_call>'
    sampled = [*qwen3.encode(text), *qwen3.encode("<|im_end|>")]
    completion = TokenCompletion.of(sampled, [-0.5] * len(sampled), FinishReason.TOOL_CALLS)
    policy = TokenPolicy(
        server=FakeTokenServer(script=[completion]),
        tokenizer=qwen3,
        template=ChatTemplate.learn(qwen3),
        parser=get_parser("hermes"),
    )
    session = policy.start(PROMPT, tools=TOOLS)
    turn = await session.sample(PROMPT, sampling=SamplingParams(max_tokens=64))
    assert len(turn.parsed.errors) == 1
    assert turn.parsed.to_message().tool_calls == ()  # managed mode keeps no call for it
    exported = session.training_tokens([*PROMPT, turn.parsed.to_message()], max_token_length=None)
    assert exported is not None
    trained = [t for t, m in zip(exported.tokens, exported.masks, strict=True) if m != MASKED_LABEL]
    assert trained == sampled
    assert exported.untrained_turns == ()


class _RefusesRawArguments:
    """Qwen3, except that it refuses any call given as raw text (as a strict template may)."""

    def __init__(self, inner: TransformersTokenizer) -> None:
        self.inner = inner

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        if any(c.raw_arguments is not None for m in messages for c in m.tool_calls):
            raise ConfigError("messages", "arguments must be a mapping")
        return self.inner.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)


def test_what_the_template_check_says(qwen3: TransformersTokenizer) -> None:
    call = ToolCall(id="c1", name="write_file", raw_arguments=ARRAY)
    assert ChatTemplate.learn(qwen3).writes_raw_arguments(call) is None
    assert ChatTemplate.learn(qwen3).writes_raw_arguments(ToolCall(id="c2", name="x")) is None
    blind = ChatTemplate.learn(RenderOnly(qwen3)).writes_raw_arguments(call)
    assert blind == "the tokenizer cannot decode a render to check its text"
    strict = ChatTemplate.learn(_RefusesRawArguments(qwen3)).writes_raw_arguments(call)
    assert strict is not None
    assert strict.startswith("the chat template refuses them (")
    assert "arguments must be a mapping" in strict


def test_raw_arguments_go_to_templates_and_never_to_the_wire() -> None:
    call = ToolCall(id="c1", name="write_file", raw_arguments=NULL)
    message = Message.assistant(tool_calls=[call])
    assert message.to_chat_dict()["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": "null"}}
    ]
    assert message.to_chat_dict(arguments_as_json=True)["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": "{}"}}
    ]
    with pytest.raises(ValueError, match="turn"):
        UntrainedTurn(turn=0, reason="x")


@pytest.fixture(scope="module")
def items_template(tmp_path_factory: pytest.TempPathFactory) -> TransformersTokenizer:
    """Llama-3-shaped, writing a call's arguments as Qwen3-Coder's template does: one line per
    ``arguments|items`` pair, which jinja refuses for text with a ``TypeError``."""
    folder: Path = write_llama3_shaped_tokenizer(tmp_path_factory.mktemp("items"))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    quoted = "{{- call.function.arguments | tojson }}"
    assert quoted in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        quoted, "{%- for k, v in call.function.arguments|items %}{{ k }}={{ v }};{%- endfor %}"
    )
    config_file.write_text(json.dumps(config))
    return TransformersTokenizer.from_path(folder)


@pytest.mark.parametrize("raw", [UNTERMINATED, ARRAY, NULL], ids=["unterminated", "array", "null"])
async def test_a_template_that_iterates_the_arguments_leaves_the_turn_untrained(
    items_template: TransformersTokenizer, raw: str
) -> None:
    exported, _ = await _run(items_template, raw)
    assert len(_spans(exported.masks)) == 1  # the last turn only
    (untrained,) = exported.untrained_turns
    assert untrained.turn == 1
    assert "the chat template refuses them" in untrained.reason
