"""The ``ChatServer`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``ChatServerFaultContract`` (or ``ChatServerContract`` when the implementation cannot
stage faults) and provide ``chat_server_factory``: a function of the model's policy (a
``ChatResponder``: the conversation in, the assistant turn out) returning an async context
manager that yields a ``ServerUnderTest``: your ``ChatServer`` wired to a backend that answers
with that policy, and ``inject`` to stage ``LLMFault`` values on that backend (``None`` when it
cannot). ``trajcore.testing.llm_stubs.LoopbackLLMServer`` is such a backend for any server that
speaks the OpenAI wire format.

The suite checks what ``trajcore.ports.chat_server`` promises. ``test_generated_sequences`` runs
the state machine of ``trajcore.testing.chat_server_machine``: generated conversations with
generated JSON-Schema tools, sampling settings and model turns, through generated faults (429
with and without ``Retry-After``, 5xx, dropped connections, 4xx, malformed bodies, late answers,
garbled tool calls), concurrent calls, cancellations and closing, checked after every step. The
named scenarios are single steps of that machine: a turn with nested tool-call arguments, many
calls at once, closing, and with faults the scenarios of ``LLMServerFaultContract`` and a garbled
tool call kept as a ``ParseProblem``. Settings (``attempts``, ``honours_retry_after``,
``machine_scale``) are described in ``trajcore.testing.llm_server_contract``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from trajcore.adapters.fakes.llm import ChatResponder, LLMFault
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.ports.chat_server import ChatServer
from trajcore.testing.chat_server_machine import ChatRequest, ChatServerMachine
from trajcore.testing.llm_server_contract import LLMServerContract, LLMServerFaultContract
from trajcore.testing.llm_server_machine import ServerFactory, ServerUnderTest

__all__ = ["ChatServerContract", "ChatServerFactory", "ChatServerFaultContract"]

ChatServerFactory = Callable[
    [ChatResponder], AbstractAsyncContextManager[ServerUnderTest[ChatServer]]
]

TOOLS = (
    ToolSpec(
        name="bash",
        description="run a command",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
_TOOL_TURN = ChatTurn(
    message=Message.assistant(
        "Let me look.",
        tool_calls=[
            ToolCall(
                id="call_1", name="bash", arguments={"command": "ls -la", "env": {"A": [1, 2.5]}}
            ),
            ToolCall(id="call_2", name="read_file", arguments={}),
        ],
        reasoning="I should list.",
    ),
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


class ChatServerContract(LLMServerContract):
    """Abstract suite: subclass and override ``chat_server_factory``."""

    machine = ChatServerMachine

    @pytest.fixture
    def chat_server_factory(self) -> ChatServerFactory:
        raise NotImplementedError

    @pytest.fixture
    def llm_server_factory(
        self, chat_server_factory: ChatServerFactory
    ) -> ServerFactory[ChatServer]:
        return chat_server_factory

    def example_request(self, state: ChatServerMachine) -> ChatRequest:
        answer = ChatTurn(message=Message.assistant("done"), finish_reason=FinishReason.STOP)
        return state.ask(_conversation(), answer, tools=TOOLS)

    def test_answer_keeps_content_reasoning_and_tool_calls_in_order(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        with self.opened(chat_server_factory) as state:
            message, finish, problems = state.exchange(
                state.ask(_conversation(), _TOOL_TURN, tools=TOOLS), []
            )
        assert (message, finish, problems) == (_TOOL_TURN.message, FinishReason.TOOL_CALLS, ())


class ChatServerFaultContract(ChatServerContract, LLMServerFaultContract):
    """The fault half of the contract, for implementations that can stage ``LLMFault`` values.

    An implementation that cannot stage them (atroposlib's ``ServerManager``, which retries on
    its own schedule) subclasses ``ChatServerContract`` alone and is held to the rest.
    """

    def test_garbled_tool_call_is_kept_as_a_parse_problem(
        self, chat_server_factory: ChatServerFactory
    ) -> None:
        fault = LLMFault.garbled_tool_call('{"command": "ls -', finish_reason=FinishReason.LENGTH)
        empty = ChatTurn(message=Message.assistant(""), finish_reason=FinishReason.STOP)
        with self.opened(chat_server_factory) as state:
            message, finish, problems = state.exchange(
                state.ask([Message.user("hi")], empty, tools=TOOLS), [fault]
            )
        assert message.tool_calls == ()
        assert finish is FinishReason.LENGTH
        assert problems == ((0, '{"command": "ls -', "bash", "call_garbled_0"),)
