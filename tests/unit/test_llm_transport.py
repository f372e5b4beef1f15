"""The shared HTTP layer: retries on 429/5xx/connection errors, deadlines, close.

The stub answers in memory (``LoopbackLLMServer.memory_transport``) where a socket is not the
point; the loopback tests at the end run the same adapters over real connections.
"""

from __future__ import annotations

import random
import socket

import anyio
import pytest

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.adapters.http1.client import MemoryTransport
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.domain.errors import ConfigError, ModelServerError, RateLimited
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tools import ToolCall
from trajcore.testing.llm_stubs import LoopbackLLMServer, messages_from_request

pytestmark = pytest.mark.anyio
SAMPLING = SamplingParams(max_tokens=8)
HELLO = [Message.user("hello")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _chat(
    url: str, retry: RetryRules, transport: MemoryTransport | None = None
) -> OpenAIChatServer:
    return OpenAIChatServer(
        base_url=f"{url}/v1", model="m", retry=retry, rng=random.Random(1), transport=transport
    )


def _in_memory(stub: LoopbackLLMServer, retry: RetryRules) -> OpenAIChatServer:
    return _chat("http://stub.invalid", retry, stub.memory_transport())


async def test_429_then_success_is_retried_and_counted() -> None:
    async with LoopbackLLMServer() as stub:
        stub.inject(LLMFault.rate_limited(retry_after_s=0.01))
        server = _chat(stub.url, RetryRules(base_delay_s=0.001))
        turn = await server.chat(HELLO, tools=(), sampling=SAMPLING)
        await server.aclose()
    assert turn.message.content == "echo: hello"
    stats = server.statistics()
    assert (stats.attempts, stats.retries, stats.failures) == (2, 1, 0)
    assert [r.path for r in stub.requests] == ["/v1/chat/completions"] * 2


async def test_5xx_until_the_deadline_raises_model_server_error_before_it() -> None:
    stub = LoopbackLLMServer()
    stub.inject(*[LLMFault.server_error(503)] * 1000)
    server = _in_memory(stub, RetryRules(max_attempts=1000, base_delay_s=0.05, max_delay_s=0.1))
    with anyio.fail_after(0.5), pytest.raises(ModelServerError) as caught:
        await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert caught.value.status == 503
    assert "before the deadline" in str(caught.value)
    assert not isinstance(caught.value, RateLimited)


async def test_429_until_attempts_run_out_raises_rate_limited() -> None:
    stub = LoopbackLLMServer()
    stub.inject(*[LLMFault.rate_limited()] * 10)
    server = _in_memory(stub, RetryRules(max_attempts=3, base_delay_s=0.001))
    with pytest.raises(RateLimited) as caught:
        await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert "after 3 attempts" in str(caught.value)
    assert len(stub.requests) == 3


async def test_a_retry_after_beyond_the_deadline_gives_up_at_once() -> None:
    stub = LoopbackLLMServer()
    stub.inject(LLMFault.rate_limited(retry_after_s=60))
    server = _in_memory(stub, RetryRules(base_delay_s=0.001))
    with anyio.fail_after(5), pytest.raises(RateLimited):
        await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert len(stub.requests) == 1


async def test_connection_refused_is_a_model_server_error_without_status() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = _chat(f"http://127.0.0.1:{port}", RetryRules(max_attempts=2, base_delay_s=0.001))
    with pytest.raises(ModelServerError) as caught:
        await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert caught.value.status is None
    assert "after 2 attempts" in str(caught.value)


async def test_attempt_timeout_turns_a_hung_answer_into_a_retry() -> None:
    stub = LoopbackLLMServer()
    stub.inject(LLMFault.delay(30))
    server = _in_memory(stub, RetryRules(base_delay_s=0.001, attempt_timeout_s=0.2))
    with anyio.fail_after(10):
        turn = await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert turn.message.content == "echo: hello"
    assert server.statistics().retries == 1


def test_retry_policy_is_validated() -> None:
    with pytest.raises(ConfigError) as caught:
        RetryRules(max_attempts=0)
    assert caught.value.field == "retry.max_attempts"
    with pytest.raises(ConfigError):
        OpenAIChatServer(base_url="localhost:8000", model="m")


def test_backoff_grows_with_jitter_and_honours_retry_after() -> None:
    rules = RetryRules(base_delay_s=1.0, max_delay_s=4.0)
    rng = random.Random(0)
    delays = [rules.backoff_s(n, rng, None) for n in (1, 2, 3, 4, 5)]
    assert 0.5 <= delays[0] <= 1.0
    assert 1.0 <= delays[1] <= 2.0
    assert all(2.0 <= d <= 4.0 for d in delays[2:])
    assert rules.backoff_s(1, rng, 9.0) == 9.0


async def test_a_dropped_connection_is_retried_in_memory_too() -> None:
    stub = LoopbackLLMServer()
    stub.inject(LLMFault.dropped())
    server = _in_memory(stub, RetryRules(base_delay_s=0.001))
    with anyio.fail_after(5):
        turn = await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert turn.message.content == "echo: hello"
    assert server.statistics().retries == 1


async def test_the_in_memory_request_is_what_the_wire_carries() -> None:
    stub = LoopbackLLMServer()
    server = OpenAIChatServer(
        base_url="http://stub.invalid/v1",
        model="m",
        api_key="k-1",
        transport=stub.memory_transport(),
    )
    await server.chat(HELLO, tools=(), sampling=SAMPLING)
    await server.aclose()
    (request,) = stub.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer k-1"
    assert request.headers["host"] == "stub.invalid"
    assert isinstance(request.body, dict)
    assert request.body["max_tokens"] == 8


async def test_a_lone_surrogate_in_the_conversation_is_sent_as_its_json_escape() -> None:
    """A model's tool call that named a file by an undecodable byte (``\\udcff``, as the slot
    protocol writes one) comes back in the next request: it goes out as the JSON escape it
    came in as, not as a request that cannot be encoded (which ended the trajectory)."""
    path = "bad\udcffname"
    call = ToolCall(id="c1", name="read_file", arguments={"path": path})
    conversation = [
        *HELLO,
        Message.assistant("", tool_calls=[call]),
        Message(role="tool", content="Error: no such file", tool_call_id="c1", name="read_file"),
    ]
    stub = LoopbackLLMServer()
    server = _in_memory(stub, RetryRules())
    turn = await server.chat(conversation, tools=(), sampling=SAMPLING)
    await server.aclose()
    assert turn.message.content
    (request,) = stub.requests
    assert isinstance(request.body, dict)
    assert messages_from_request(request.body)[1].tool_calls[0].arguments == {"path": path}
