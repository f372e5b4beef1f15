"""What an LLM is asked to do and what it gives back, independent of any server.

``SamplingParams`` is validated when built. ``ChatTurn`` is OpenAI mode's answer (a message; the
tokens are the server's business and not exact). ``TokenCompletion`` is managed mode's answer: the
sampled token ids and their logprobs, verbatim, which the token ledger keeps for training.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from trajcore.domain import converters, validators
from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.turns import ParsedTurn, ParseProblem

__all__ = ["ChatTurn", "FinishReason", "SamplingParams", "TokenCompletion", "Usage"]


class FinishReason(enum.Enum):
    """Why a generation stopped."""

    STOP = "stop"  # end of turn or a stop sequence
    LENGTH = "length"  # max_tokens reached: the turn may be cut mid-sentence or mid-call
    TOOL_CALLS = "tool_calls"  # OpenAI mode: the server parsed tool calls
    ABORT = "abort"  # the server aborted the request
    CONTENT_FILTER = "content_filter"  # the server's filter stopped what the model wrote

    @classmethod
    def parse(cls, value: object, *, field: str = "finish_reason") -> FinishReason:
        """Map a server's finish reason (``"eos"``, ``"stop"``, ``None``...) onto this enum."""
        if value is None or value in ("stop", "eos", "end_turn", "stop_sequence"):
            return cls.STOP
        if value in ("length", "max_tokens"):
            return cls.LENGTH
        if value in ("tool_calls", "function_call"):
            return cls.TOOL_CALLS
        if value in ("abort", "cancelled"):
            return cls.ABORT
        if value == "content_filter":
            return cls.CONTENT_FILTER
        raise WireError(field, f"unknown finish reason {value!r}")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to sample one turn.

    Attributes:
        max_tokens: Most tokens to generate in this turn.
        temperature: Sampling temperature, 0 for greedy.
        top_p: Nucleus mass.
        stop: Extra stop strings.
        seed: Server-side seed, when the server honours one.
        extra_body: Passed through verbatim to the server's request body.
    """

    max_tokens: int = attrs.field(default=1024, validator=validators.positive_int)
    temperature: float = attrs.field(
        default=1.0, validator=validators.finite_number(None, at_least=0.0, at_most=10.0)
    )
    top_p: float = attrs.field(
        default=1.0, validator=validators.finite_number(None, at_least=0.0, at_most=1.0)
    )
    stop: tuple[str, ...] = attrs.field(default=(), converter=converters.strs)
    seed: int | None = None
    extra_body: JSONObject = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts a server reported for one call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@attrs.frozen(kw_only=True)
class ChatTurn:
    """OpenAI mode's answer: one assistant message, with native tool calls when the server parsed
    them. Its tokens are not exact: data built from it is fit for SFT and evaluation only.

    Attributes:
        message: The assistant message, with its well-formed tool calls.
        finish_reason: Why sampling stopped.
        usage: Token counts the server reported.
        problems: One ``ParseProblem`` per tool call whose arguments the model garbled (broken
            JSON, cut at ``max_tokens``): the model's mistake, kept as data for the agent loop to
            answer and count, never an exception and never dropped.
    """

    message: Message
    finish_reason: FinishReason
    usage: Usage = attrs.field(factory=Usage)
    problems: tuple[ParseProblem, ...] = attrs.field(
        default=(), converter=converters.parse_problems
    )

    def __attrs_post_init__(self) -> None:
        if self.message.role != "assistant":
            raise WireError("message.role", f"expected assistant, got {self.message.role}")

    def parsed(self) -> ParsedTurn:
        """The turn as the agent loop takes it: content, reasoning, calls and problems."""
        m = self.message
        return ParsedTurn(
            content=m.content, reasoning=m.reasoning, calls=m.tool_calls, errors=self.problems
        )


def _same_length(instance: TokenCompletion, _: attrs.Attribute[object], value: object) -> None:
    if len(instance.logprobs) != len(instance.token_ids):
        raise WireError(
            "logprobs",
            f"{len(instance.logprobs)} logprobs for {len(instance.token_ids)} token ids",
        )


@attrs.frozen(kw_only=True)
class TokenCompletion:
    """Managed mode's answer: the sampled ids and their logprobs, exactly as the server sampled.

    Attributes:
        token_ids: Sampled token ids, in order.
        logprobs: The sampler's logprob of each sampled id (same length).
        finish_reason: Why sampling stopped.
        text: The server's detokenisation, when it sent one (informational only).
    """

    token_ids: tuple[int, ...] = attrs.field(converter=converters.ints)
    logprobs: tuple[float, ...] = attrs.field(converter=converters.floats, validator=_same_length)
    finish_reason: FinishReason
    text: str | None = None

    @classmethod
    def of(
        cls, token_ids: Sequence[int], logprobs: Sequence[float], finish_reason: FinishReason
    ) -> TokenCompletion:
        return cls(
            token_ids=tuple(token_ids), logprobs=tuple(logprobs), finish_reason=finish_reason
        )
