"""OpenAI mode trains a turn the server cut at ``max_tokens`` (finish ``length``) without an end
of turn: the model never sampled one there, so the re-render's ``<|im_end|>`` is environment.
A turn that stopped keeps its end of turn trained. Qwen3's real tokenizer.
"""

from __future__ import annotations

import pytest

from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.rollout.policy import ChatPolicy

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
CALL = ToolCall(id="call_0", name="bash", arguments={"command": "ls"})

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _spans(masks: tuple[int, ...]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = None
    for k, mask in enumerate((*masks, -100)):
        if mask != -100 and start is None:
            start = k
        elif mask == -100 and start is not None:
            spans.append((start, k))
            start = None
    return spans


@pytest.mark.parametrize("cut_first", [False, True])
async def test_a_cut_turn_is_trained_without_an_end_of_turn(cut_first: bool) -> None:
    qwen3 = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    first = ChatTurn(
        message=Message.assistant("Looking", tool_calls=[CALL]),
        finish_reason=FinishReason.LENGTH if cut_first else FinishReason.TOOL_CALLS,
    )
    second = ChatTurn(
        message=Message.assistant("It holds a.txt and b.t"), finish_reason=FinishReason.LENGTH
    )
    chat = FakeChatServer(script=[first, second])
    prompt = [Message.system("Be brief."), Message.user("What is here?")]
    session = ChatPolicy(chat, ChatTemplate.learn(qwen3)).start(prompt, tools=TOOLS)
    sampling = SamplingParams(max_tokens=16)
    await session.sample(prompt, sampling=sampling)
    result = ToolResult(call_id=CALL.id, name="bash", outcome=ToolOutcome.OK, content="a.txt b.txt")
    messages = [*prompt, first.message, Message.tool(result)]
    await session.sample(messages, sampling=sampling)
    messages.append(second.message)
    exported = session.training_tokens(messages, max_token_length=None)
    assert exported is not None
    end_of_turn = qwen3.encode("<|im_end|>")
    spans = _spans(exported.masks)
    assert len(spans) == 2
    trained = [list(exported.tokens[a:b]) for a, b in spans]
    assert qwen3.decode(trained[1]).endswith("a.txt and b.t")
    assert trained[1][-1:] != end_of_turn
    assert (trained[0][-1:] == end_of_turn) is not cut_first
