"""The lifecycle both fake LLM servers share: script or policy, fault injection, close."""

from __future__ import annotations

import pytest

from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer, FaultKind, LLMFault
from trajcore.domain.errors import ConfigError, ModelServerError, PoolClosed
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, TokenCompletion

COMPLETION = TokenCompletion(
    token_ids=[1, 2], logprobs=[-0.1, -0.2], finish_reason=FinishReason.STOP
)
TURN = ChatTurn(message=Message.assistant("hi"), finish_reason=FinishReason.STOP)


def test_a_script_and_a_policy_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="policy"):
        FakeChatServer(script=[Message.assistant("hi")], policy=lambda _: TURN)
    with pytest.raises(ConfigError, match="policy"):
        FakeTokenServer(script=[COMPLETION], policy=lambda _: COMPLETION)


@pytest.mark.parametrize("attempts", [0, -1, True])
def test_max_attempts_must_be_a_positive_integer(attempts: int) -> None:
    with pytest.raises(ConfigError, match="max_attempts"):
        FakeChatServer(max_attempts=attempts)
    with pytest.raises(ConfigError, match="max_attempts"):
        FakeTokenServer(max_attempts=attempts)


@pytest.mark.anyio
async def test_injected_faults_come_first_and_close_refuses_later_requests() -> None:
    server = FakeTokenServer(script=[COMPLETION], max_attempts=1)
    server.inject(LLMFault(kind=FaultKind.SERVER_ERROR))
    with pytest.raises(ModelServerError):
        await server.generate([5], sampling=SamplingParams())
    assert (await server.generate([5], sampling=SamplingParams())).token_ids == (1, 2)
    await server.aclose()
    await server.aclose()
    with pytest.raises(PoolClosed):
        await server.generate([5], sampling=SamplingParams())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
