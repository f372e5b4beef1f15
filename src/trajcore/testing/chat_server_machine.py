"""The ``ChatServer`` contract as a hypothesis state machine, for one server or several in lockstep.

``ChatServerMachine`` adds to the shared rules of ``trajcore.testing.llm_server_machine`` what a
chat request is. Each request is a generated conversation -- an optional system prompt, user
turns, assistant turns with text (and sometimes reasoning) or with tool calls whose arguments fit
generated JSON-Schema tools (``trajcore.testing.tool_schemas``), one tool result per call,
unicode anywhere -- ending with a user turn or a tool result, offered generated tools, with
generated sampling settings. The model answers each with a generated turn: content, reasoning
or none, tool calls of the offered tools with arguments that fit their schemas, a finish reason.
Its faults add a garbled tool call (arguments that are cut JSON text or not a JSON object) to
the shared ones.

What every answer must be: the model's turn as it wrote it -- content, reasoning, every tool
call in order with its arguments decoded, the finish reason, no problems; and the backend saw
the conversation exactly as sent. A garbled call comes back as one ``ParseProblem`` in
``ChatTurn.problems`` with its raw text, name and id (never dropped, never raised); the staged
turn around it is empty, so fakes that replace the turn and servers that add to it agree.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Hashable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.ports.chat_server import ChatServer
from trajcore.testing.conversations import openings
from trajcore.testing.llm_server_machine import (
    Expected,
    LLMServerMachine,
    run_llm_machine,
)
from trajcore.testing.tool_schemas import arguments_for, tool_lists, tool_texts

__all__ = [
    "GARBLED_TOOL_CALLS",
    "ChatRequest",
    "ChatServerMachine",
    "chat_samplings",
    "run_chat_server_machine",
]


@attrs.frozen
class ChatRequest:
    """One generated request: the conversation (its last message tagged), tools, sampling."""

    tag: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    sampling: SamplingParams


chat_samplings = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0.0, 2.0),
    top_p=st.floats(0.01, 1.0),
    seed=st.none() | st.integers(0, 2**31 - 1),
)
"""Sampling settings a chat request may carry."""


@st.composite
def _garbled_text(draw: st.DrawFn) -> str:
    if draw(st.booleans()):  # a call cut in the middle: a strict prefix of an object's JSON
        keys = st.text("abc", min_size=1)
        whole = json.dumps(draw(st.dictionaries(keys, tool_texts, min_size=1)))
        return whole[: draw(st.integers(1, len(whole) - 1))]
    return json.dumps(draw(st.sampled_from([[1, 2], "text", 42, None, [{"a": 1}]])))


GARBLED_TOOL_CALLS = st.builds(
    LLMFault.garbled_tool_call,
    _garbled_text(),
    finish_reason=st.sampled_from([FinishReason.LENGTH, FinishReason.TOOL_CALLS]),
)
"""Tool calls whose arguments are not a JSON object, as a model may write them."""


_SAMPLING = SamplingParams(max_tokens=64, temperature=0.0)


def _tag_of(messages: Sequence[Message]) -> str:
    return messages[-1].content.rpartition(" #")[2] if messages else ""


class ChatServerMachine(LLMServerMachine[ChatServer, ChatRequest, ChatTurn]):
    """The shared LLM rules over chat requests (see the module doc)."""

    extra_terminal_faults = GARBLED_TOOL_CALLS

    def __init__(self) -> None:
        self.answers: dict[str, ChatTurn] = {}
        self.seen: dict[str, list[tuple[Message, ...]]] = {}
        super().__init__()

    def respond(self, request: Any) -> ChatTurn:
        messages: Sequence[Message] = request
        tag = _tag_of(messages)
        self.seen.setdefault(tag, []).append(tuple(messages))
        return self.answers[tag]

    def ask(
        self,
        messages: Sequence[Message],
        answer: ChatTurn,
        *,
        tools: Sequence[ToolSpec] = (),
        sampling: SamplingParams = _SAMPLING,
    ) -> ChatRequest:
        """A request for ``messages`` (the last one tagged) that the model answers with
        ``answer``."""
        tag = str(self.next_tag())
        last = messages[-1]
        tagged = [*messages[:-1], attrs.evolve(last, content=f"{last.content} #{tag}")]
        self.answers[tag] = answer
        return ChatRequest(tag=tag, messages=tuple(tagged), tools=tuple(tools), sampling=sampling)

    def draw_request(self, data: st.DataObject, *, garbled: bool = False) -> ChatRequest:
        tools: list[ToolSpec] = data.draw(st.just([]) | tool_lists(), label="tools")
        messages = data.draw(_conversations(tools), label="conversation")
        if garbled:
            answer = ChatTurn(message=Message.assistant(""), finish_reason=FinishReason.STOP)
        else:
            answer = data.draw(_turns(tools, self.serial + 1), label="answer")
        return self.ask(
            messages, answer, tools=tools, sampling=data.draw(chat_samplings, label="sampling")
        )

    async def send(self, server: ChatServer, request: ChatRequest) -> ChatTurn:
        return await server.chat(request.messages, tools=request.tools, sampling=request.sampling)

    def check_answer(self, request: ChatRequest, answer: ChatTurn, expected: Expected) -> Hashable:
        seen = self.seen.pop(request.tag, [])
        for messages in seen:
            assert messages == request.messages, "the backend saw another conversation"
        want = self.answers[request.tag]
        assert answer.message == want.message, (answer.message, want.message)
        if expected.garbled is None:
            assert seen, "the backend never saw the conversation"
            assert answer.finish_reason is want.finish_reason, answer
            assert answer.problems == (), answer.problems
        else:
            assert answer.finish_reason is expected.garbled.finish_reason, answer
            (problem,) = answer.problems
            assert problem.raw == expected.garbled.raw_arguments, problem
            assert (problem.index, problem.name, problem.call_id) == (0, "bash", "call_garbled_0")
            assert problem.reason.endswith("@ arguments"), problem.reason
            assert problem.message_for_model().startswith("Error: tool call"), problem
        problems = tuple((p.index, p.raw, p.name, p.call_id) for p in answer.problems)
        return (answer.message, answer.finish_reason, problems)


_TEXT = tool_texts


@st.composite
def _calls(draw: st.DrawFn, tools: Sequence[ToolSpec], prefix: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for k in range(draw(st.integers(1, 3))):
        tool = draw(st.sampled_from(tools))
        arguments = draw(arguments_for(tool.parameters))
        calls.append(ToolCall(id=f"{prefix}_{k}", name=tool.name, arguments=arguments))
    return calls


@st.composite
def _conversations(draw: st.DrawFn, tools: Sequence[ToolSpec]) -> list[Message]:
    ids = itertools.count(1)
    messages: list[Message] = draw(openings(_TEXT))
    for _ in range(draw(st.integers(0, 2))):
        calling: bool = draw(st.booleans())
        if tools and calling:
            calls = draw(_calls(tools, f"call{next(ids)}"))
            messages.append(Message.assistant(draw(_TEXT), tool_calls=calls))
            messages.extend(
                Message(role="tool", content=draw(_TEXT), tool_call_id=c.id, name=c.name)
                for c in calls
            )
            if draw(st.booleans()):
                continue  # the model answers the tool results next
        else:
            reasoning: str | None = draw(st.none() | _TEXT)
            messages.append(Message.assistant(draw(_TEXT), reasoning=reasoning))
        messages.append(Message.user(draw(_TEXT)))
    return messages


@st.composite
def _turns(draw: st.DrawFn, tools: Sequence[ToolSpec], tag: int) -> ChatTurn:
    calls: list[ToolCall] = []
    calling: bool = draw(st.booleans())
    if tools and calling:
        calls = draw(_calls(tools, f"answer{tag}"))
    reasoning: str | None = draw(st.none() | _TEXT)
    message = Message.assistant(draw(_TEXT), tool_calls=calls, reasoning=reasoning)
    finish = FinishReason.TOOL_CALLS if calls else draw(st.sampled_from(FinishReason))
    return ChatTurn(message=message, finish_reason=finish)


run_chat_server_machine = functools.partial(run_llm_machine, ChatServerMachine)
"""Drive the chat servers from ``factories`` (in lockstep when several) with generated
sequences; the settings are those of ``trajcore.testing.llm_server_machine.run_llm_machine``."""
