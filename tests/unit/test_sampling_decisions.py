"""The decisions of the sampling values: how a server's finish reason is read, which message a
chat answer may hold and how it becomes a turn, and that a completion has a logprob per id."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import WireError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, TokenCompletion
from trajcore.domain.tools import ToolCall
from trajcore.domain.turns import ParsedTurn, ParseProblem


@pytest.mark.parametrize(
    ("said", "reason"),
    [
        (None, FinishReason.STOP),
        ("stop", FinishReason.STOP),
        ("eos", FinishReason.STOP),
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("max_tokens", FinishReason.LENGTH),
        ("tool_calls", FinishReason.TOOL_CALLS),
        ("function_call", FinishReason.TOOL_CALLS),
        ("abort", FinishReason.ABORT),
        ("cancelled", FinishReason.ABORT),
        ("content_filter", FinishReason.CONTENT_FILTER),
    ],
)
def test_each_servers_word_for_why_it_stopped_is_read_as_one_reason(
    said: str | None, reason: FinishReason
) -> None:
    """vLLM, SGLang, OpenAI and Anthropic-style words map onto the five reasons; a server that
    says nothing stopped normally."""
    assert FinishReason.parse(said) is reason


def test_an_unknown_finish_reason_is_a_wire_error_naming_the_field_and_the_word() -> None:
    """A word no server is known to send is refused, not guessed; the field defaults to
    ``finish_reason`` and a caller may name the path it read it from."""
    with pytest.raises(WireError) as caught:
        FinishReason.parse("halted")
    assert (caught.value.field, caught.value.reason) == (
        "finish_reason",
        "unknown finish reason 'halted'",
    )
    with pytest.raises(WireError) as caught:
        FinishReason.parse("", field="choices[0].finish_reason")
    assert (caught.value.field, caught.value.reason) == (
        "choices[0].finish_reason",
        "unknown finish reason ''",
    )


def test_a_chat_answer_holds_an_assistant_message_only() -> None:
    """A server answering with another role is a wire error naming the role it sent."""
    with pytest.raises(WireError) as caught:
        ChatTurn(message=Message.user("hi"), finish_reason=FinishReason.STOP)
    assert (caught.value.field, caught.value.reason) == (
        "message.role",
        "expected assistant, got user",
    )
    ChatTurn(message=Message.assistant("hi"), finish_reason=FinishReason.STOP)


def test_a_chat_answer_becomes_a_turn_with_its_message_and_its_garbled_calls() -> None:
    """The agent loop takes the message's content, reasoning and calls, and the problems the
    answer reported beside it, all of them."""
    call = ToolCall(id="c1", name="bash", arguments={"cmd": "ls"})
    problem = ParseProblem(index=1, raw='{"cmd": ', reason="truncated JSON @ arguments")
    answer = ChatTurn(
        message=Message.assistant("Looking.", tool_calls=(call,), reasoning="Check first."),
        finish_reason=FinishReason.TOOL_CALLS,
        problems=(problem,),
    )
    assert answer.parsed() == ParsedTurn(
        content="Looking.", reasoning="Check first.", calls=(call,), errors=(problem,)
    )


def test_a_completion_has_one_logprob_per_token_id() -> None:
    """A server's logprobs that do not pair with its ids are refused, saying both counts."""
    with pytest.raises(WireError) as caught:
        TokenCompletion(token_ids=(1, 2, 3), logprobs=(-0.5,), finish_reason=FinishReason.STOP)
    assert (caught.value.field, caught.value.reason) == ("logprobs", "1 logprobs for 3 token ids")
    with pytest.raises(WireError):
        TokenCompletion(token_ids=(1,), logprobs=(-0.5, -0.1), finish_reason=FinishReason.STOP)
    TokenCompletion(token_ids=(), logprobs=(), finish_reason=FinishReason.LENGTH)


def test_a_completion_built_from_sequences_keeps_ids_logprobs_and_reason_in_order() -> None:
    """``TokenCompletion.of`` freezes what the sampler gave, in its order, with no text."""
    completion = TokenCompletion.of([5, 3, 9], [-0.1, -2.0, 0.0], FinishReason.LENGTH)
    assert completion == TokenCompletion(
        token_ids=(5, 3, 9), logprobs=(-0.1, -2.0, 0.0), finish_reason=FinishReason.LENGTH
    )
    assert completion.text is None
