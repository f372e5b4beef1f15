"""The ``ChatServer`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``ChatServerContract`` and provide ``chat_server_factory``: a function of a policy (what
the model answers) and a list of ``LLMFault`` (what goes wrong first, one per request) that returns
an async context manager yielding a ``ChatServer`` wired to a backend following both. The suite
then checks what ``trajcore.ports.chat_server`` promises:

- the answer is the backend's assistant turn: content, reasoning, tool calls in order with their
  arguments decoded, finish reason; the backend sees the conversation as sent;
- concurrent calls each get their own answer;
- 429, 5xx and dropped connections are retried; when they persist, ``RateLimited`` /
  ``ModelServerError``; a 4xx is ``ModelServerRejected`` with status and body; a malformed body is
  a ``WireError``; a tool call with broken arguments comes back in ``ChatTurn.problems`` as a
  ``ParseProblem`` with the raw text (never dropped, never raised);
- cancellation is prompt and leaves the server usable; ``aclose`` is idempotent and later calls
  raise ``PoolClosed``.

With faults, ``test_generated_conversations_through_generated_faults`` also sends generated
conversations (tools, tool calls and results; ``trajcore.testing.tokenizer_contract.conversations``)
with generated sampling settings through generated faults: up to three transient ones (429 with and
without ``Retry-After``, 5xx, drops) must be retried away, and a 4xx or a malformed body after them
must be its typed error. Factories must allow at least 4 attempts per call with millisecond
backoff, so the retry tests stay fast. The fault tests live in ``ChatServerFaultContract``; an
implementation that cannot stage faults subclasses ``ChatServerContract`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajcore.adapters.fakes.llm import ChatResponder, LLMFault
from trajcore.domain.errors import (
    ModelServerError,
    ModelServerRejected,
    PoolClosed,
    RateLimited,
    WireError,
)
from trajcore.domain.messages import Message, ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.ports.chat_server import ChatServer
from trajcore.testing.tokenizer_contract import Conversation, conversations

__all__ = [
    "TERMINAL_FAULTS",
    "TRANSIENT_FAULTS",
    "ChatServerContract",
    "ChatServerFactory",
    "ChatServerFaultContract",
]

ChatServerFactory = Callable[
    [ChatResponder, Sequence[LLMFault]], AbstractAsyncContextManager[ChatServer]
]

SAMPLING = SamplingParams(max_tokens=64, temperature=0.0)
TOOLS = (
    ToolSpec(
        name="bash",
        description="run a command",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)


TRANSIENT_FAULTS = st.one_of(
    st.builds(LLMFault.rate_limited, retry_after_s=st.none() | st.sampled_from([0.0, 0.01])),
    st.builds(LLMFault.server_error, status=st.sampled_from([500, 502, 503, 504])),
    st.just(LLMFault.dropped()),
)
TERMINAL_FAULTS = st.one_of(
    st.builds(
        LLMFault.rejected,
        status=st.sampled_from([400, 404, 413, 422]),
        message=st.text(alphabet="abc xyz", min_size=1, max_size=20),
    ),
    st.builds(LLMFault.malformed, body=st.sampled_from([b'{"choices": [', b"[]", b"not json"])),
)
_SAMPLINGS = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0.0, 2.0),
    top_p=st.floats(0.01, 1.0),
    seed=st.none() | st.integers(0, 2**31 - 1),
)
_base = settings.default
assert _base is not None, "hypothesis has no settings profile loaded"
# a server per example: a fifth of the profile's examples; the factory is reused by every one
_fault_settings = settings(
    max_examples=max(5, _base.max_examples // 5),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.differing_executors,
        HealthCheck.too_slow,
    ],
)


def _echo(messages: Sequence[Message]) -> ChatTurn:
    last = next((m.content for m in reversed(messages) if m.role == "user"), "")
    return ChatTurn(message=Message.assistant(f"echo: {last}"), finish_reason=FinishReason.STOP)


def _tool_turn(_: Sequence[Message]) -> ChatTurn:
    calls = [
        ToolCall(id="call_1", name="bash", arguments={"command": "ls -la", "env": {"A": [1, 2.5]}}),
        ToolCall(id="call_2", name="read_file", arguments={}),
    ]
    return ChatTurn(
        message=Message.assistant("Let me look.", tool_calls=calls, reasoning="I should list."),
        finish_reason=FinishReason.TOOL_CALLS,
    )


def _conversation() -> list[Message]:
    call = ToolCall(id="call_0", name="bash", arguments={"command": "pwd"})
    result = ToolResult(call_id="call_0", name="bash", outcome=ToolOutcome.OK, content="/work")
    return [
        Message.system("You are terse."),
        Message.user("where am I?"),
        Message.assistant("", tool_calls=[call]),
        Message.tool(result),
        Message.user("and now? ünïcode ✓"),
    ]


class ChatServerContract:
    """Abstract suite: subclass and override ``chat_server_factory``."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def chat_server_factory(self) -> ChatServerFactory:
        raise NotImplementedError

    @pytest.mark.anyio
    async def test_answer_keeps_content_reasoning_and_tool_calls_in_order(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_tool_turn, []) as server:
            turn = await server.chat(_conversation(), tools=TOOLS, sampling=SAMPLING)
        expected = _tool_turn([])
        assert turn.message == expected.message
        assert turn.finish_reason is FinishReason.TOOL_CALLS

    @pytest.mark.anyio
    async def test_backend_sees_the_conversation_as_sent(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        seen: list[list[Message]] = []

        def policy(messages: Sequence[Message]) -> ChatTurn:
            seen.append(list(messages))
            return _echo(messages)

        async with chat_server_factory(policy, []) as server:
            turn = await server.chat(_conversation(), tools=TOOLS, sampling=SAMPLING)
        assert turn.message.content == "echo: and now? ünïcode ✓"
        assert seen == [_conversation()]

    @pytest.mark.anyio
    async def test_concurrent_calls_get_their_own_answers(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        answers: dict[int, str] = {}
        async with chat_server_factory(_echo, []) as server:

            async def one(i: int) -> None:
                turn = await server.chat([Message.user(f"q{i}")], tools=(), sampling=SAMPLING)
                answers[i] = turn.message.content

            async with anyio.create_task_group() as group:
                for i in range(24):
                    group.start_soon(one, i)
        assert answers == {i: f"echo: q{i}" for i in range(24)}

    @pytest.mark.anyio
    async def test_aclose_is_idempotent_and_later_calls_raise_pool_closed(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_echo, []) as server:
            await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
            await server.aclose()
            await server.aclose()
            with pytest.raises(PoolClosed):
                await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)


class ChatServerFaultContract(ChatServerContract):
    """The fault half of the contract, for implementations that can inject ``LLMFault``s.

    Subclass this instead of ``ChatServerContract`` when the implementation takes faults
    (fakes, loopback stubs). An implementation that cannot stage them (atroposlib's
    ``ServerManager``, which retries on its own schedule) subclasses ``ChatServerContract``
    alone and is held to the rest.
    """

    @_fault_settings
    @given(
        chat=conversations(ends_with="user"),
        transient=st.lists(TRANSIENT_FAULTS, max_size=3),
        last=st.none() | TERMINAL_FAULTS,
        sampling=_SAMPLINGS,
    )
    def test_generated_conversations_through_generated_faults(
        self,
        chat_server_factory: ChatServerFactory,
        chat: Conversation,
        transient: list[LLMFault],
        last: LLMFault | None,
        sampling: SamplingParams,
    ) -> None:
        """Up to three transient faults (429 with or without ``Retry-After``, 5xx, a dropped
        connection) are retried away; a 4xx or a malformed body after them is its typed error."""
        faults = [*transient, *([] if last is None else [last])]
        want = f"echo: {chat.messages[-1].content}"

        async def go() -> None:
            async with chat_server_factory(_echo, faults) as server:
                with anyio.fail_after(20):
                    if last is None:
                        turn = await server.chat(chat.messages, tools=chat.tools, sampling=sampling)
                        assert turn.message.content == want
                        assert turn.finish_reason is FinishReason.STOP
                    elif last.status == 200:
                        with pytest.raises(WireError):
                            await server.chat(chat.messages, tools=chat.tools, sampling=sampling)
                    else:
                        with pytest.raises(ModelServerRejected) as caught:
                            await server.chat(chat.messages, tools=chat.tools, sampling=sampling)
                        assert caught.value.status == last.status

        anyio.run(go)

    @pytest.mark.anyio
    async def test_transient_failures_are_retried(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        faults = [
            LLMFault.rate_limited(retry_after_s=0.01),
            LLMFault.server_error(503),
            LLMFault.dropped(),
        ]
        async with chat_server_factory(_echo, faults) as server:
            with anyio.fail_after(20):
                turn = await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        assert turn.message.content == "echo: hi"

    @pytest.mark.anyio
    async def test_persistent_server_errors_raise_model_server_error(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_echo, [LLMFault.server_error(502)] * 50) as server:
            with anyio.fail_after(20), pytest.raises(ModelServerError) as caught:
                await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        assert not isinstance(caught.value, RateLimited)
        assert caught.value.status == 502

    @pytest.mark.anyio
    async def test_persistent_rate_limits_raise_rate_limited(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_echo, [LLMFault.rate_limited()] * 50) as server:
            with anyio.fail_after(20), pytest.raises(RateLimited) as caught:
                await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        assert caught.value.status == 429

    @pytest.mark.anyio
    async def test_rejection_carries_status_and_body(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        fault = LLMFault.rejected(422, "tools[0] schema is invalid")
        async with chat_server_factory(_echo, [fault]) as server:
            with pytest.raises(ModelServerRejected) as caught:
                await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        assert caught.value.status == 422
        assert "tools[0] schema is invalid" in caught.value.body

    @pytest.mark.anyio
    async def test_malformed_body_is_a_wire_error(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_echo, [LLMFault.malformed(b'{"choices": [')]) as server:
            with pytest.raises(WireError) as caught:
                await server.chat([Message.user("hi")], tools=(), sampling=SAMPLING)
        assert caught.value.field.startswith("$")

    @pytest.mark.anyio
    async def test_garbled_tool_call_is_kept_as_a_parse_problem(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        fault = LLMFault.garbled_tool_call('{"command": "ls -', finish_reason=FinishReason.LENGTH)
        async with chat_server_factory(_echo, [fault]) as server:
            turn = await server.chat([Message.user("hi")], tools=TOOLS, sampling=SAMPLING)
        assert turn.finish_reason is FinishReason.LENGTH
        assert turn.message.tool_calls == ()
        (problem,) = turn.parsed().errors
        assert problem.reason.endswith("@ arguments")
        assert problem.raw == '{"command": "ls -'
        assert problem.name == "bash"
        assert problem.message_for_model().startswith("Error: tool call")

    @pytest.mark.anyio
    async def test_cancellation_is_prompt_and_server_stays_usable(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        async with chat_server_factory(_echo, [LLMFault.delay(30.0)]) as server:
            with anyio.move_on_after(0.2) as scope:
                await server.chat([Message.user("slow")], tools=(), sampling=SAMPLING)
            assert scope.cancelled_caught
            with anyio.fail_after(10):
                turn = await server.chat([Message.user("fast")], tools=(), sampling=SAMPLING)
        assert turn.message.content == "echo: fast"
