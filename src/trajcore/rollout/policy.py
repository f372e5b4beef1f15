"""The model side of a trajectory, in its two modes, behind one small interface.

A *policy* starts a *session* per trajectory. The session samples assistant turns, takes the
environment's messages (tool results) after each, and at the end exports the trajectory's
training tokens. The trajectory runner neither knows nor cares which mode it drives.

- ``ChatPolicy`` (OpenAI mode): the server templates and parses (``ChatServer``). Tokens, when a
  tokenizer is given, come from re-rendering the finished conversation and are marked
  ``token_exact=False``: fit for SFT and evaluation, not for RL.
- ``TokenPolicy`` (managed mode): trajcore renders the template (``ChatTemplate`` over the
  ``Tokenizer`` port), sends token ids to a ``TokenServer``, keeps the sampled ids and logprobs
  verbatim in a ``TokenLedger``, decodes the completion and parses tool calls with the model
  family's domain parser. Training tokens are exact, and the drift against a full re-render is
  reported as a metric.

Tool-call ids are unique within a trajectory: managed mode prefixes them with the turn number,
and both modes rename an id an earlier turn had (``distinct_ids``), so a server that numbers each
turn's calls from 0, or sends none (``chat_wire`` generates them), cannot pair a result with the
wrong call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams
from trajcore.domain.token_ledger.drift import Drift
from trajcore.domain.token_ledger.ledger import TokenLedger, TrainingTokens, UntrainedTurn
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers.base import ToolCallParser, distinct_ids
from trajcore.domain.tools import ToolSpec
from trajcore.domain.turns import ParsedTurn
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.token_server import TokenServer
from trajcore.ports.tokenizer import Tokenizer

__all__ = [
    "ChatPolicy",
    "ModelStallCheck",
    "ModelTurn",
    "Policy",
    "PolicySession",
    "SessionWrapper",
    "TokenPolicy",
    "context_window",
    "turn_cap",
]

ModelStallCheck = Callable[[float], str | None]
"""Whether a model call still in flight when a trajectory's turns run out of time is the model
server's failure: given the seconds it has waited, why it is (a one-line detail), or ``None``
when its time is the policy's (a turn still being generated). The Atropos env's
(``adapters.llm.atropos.stall_check``) reads Atropos's health checks and request timeout."""


@attrs.frozen(kw_only=True)
class ModelTurn:
    """One sampled assistant turn.

    Attributes:
        parsed: Content, reasoning, well-formed calls and parse problems.
        finish_reason: Why sampling stopped.
        completion_tokens: Tokens sampled in this turn.
        context_tokens: Prompt plus completion length of this turn.
    """

    parsed: ParsedTurn
    finish_reason: FinishReason
    completion_tokens: int
    context_tokens: int


class PolicySession(Protocol):
    """One trajectory's conversation with the model.

    ``training_tokens`` and ``drift`` run once the trajectory ends, in a worker thread (the
    rollout's render threads, off the event loop): a session must not share unguarded state
    with other sessions there (the shipped sessions' tokenizers are safe to share)."""

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        """The next assistant turn after ``messages`` (the whole conversation so far).

        Raises:
            ModelServerError, ModelServerRejected, WireError: as the server ports do.
        """
        ...

    def add_environment(self, messages: Sequence[Message]) -> None:
        """Record what followed the last assistant turn (tool results, a user nudge)."""
        ...

    def prompt_tokens(self) -> int | None:
        """The next request's prompt length where the session renders the prompt itself
        (managed mode: its ledger), so that a turn can be capped by the context left; ``None``
        where the server renders it (OpenAI mode)."""
        ...

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        """The trajectory's tokens for the trainer, or ``None`` when there is no tokenizer."""
        ...

    def drift(self, messages: Sequence[Message]) -> Drift | None:
        """Ledger versus a full re-render (managed mode only)."""
        ...


def context_window(session: PolicySession, *limits: int | None) -> int | None:
    """The context the session's next turn must fit in: the least of ``limits`` that are set
    (the loop's ``max_context_tokens``, the trainer's ``max_token_length``) where the session
    knows its prompt's length (managed mode), else ``None``."""
    given = [n for n in limits if n]
    return min(given) if given and session.prompt_tokens() is not None else None


def turn_cap(session: PolicySession, tokens_left: int | None, window: int | None) -> int | None:
    """The most tokens the session's next turn may sample: what is left of the completion
    budget (``tokens_left``) and of the context ``window`` after the prompt; ``None`` for no
    cap."""
    caps = [] if tokens_left is None else [tokens_left]
    prompt = session.prompt_tokens()
    if window is not None and prompt is not None:
        caps.append(window - prompt)
    return min(caps) if caps else None


class SessionWrapper:
    """A session that adds to ``sample`` and hands the rest to ``inner``, the session it wraps
    (subclasses declare ``inner`` and write ``sample``)."""

    __slots__ = ()
    inner: PolicySession

    def add_environment(self, messages: Sequence[Message]) -> None:
        self.inner.add_environment(messages)

    def prompt_tokens(self) -> int | None:
        return self.inner.prompt_tokens()

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        return self.inner.training_tokens(messages, max_token_length=max_token_length)

    def drift(self, messages: Sequence[Message]) -> Drift | None:
        return self.inner.drift(messages)


class Policy(Protocol):
    """Starts a session per trajectory."""

    @property
    def token_exact(self) -> bool:
        """Whether training tokens are the sampled ids (managed mode)."""
        ...

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        """A session whose prompt is ``messages`` with ``tools`` offered."""
        ...


# ------------------------------------------------------------------------------- OpenAI mode

_CUT = frozenset({FinishReason.LENGTH, FinishReason.CONTENT_FILTER})  # turns with no end of turn
_CUT_CALL = (
    "the server cut the turn inside a call whose arguments are no JSON object: a render would "
    "close the call, which the model never did"
)


@attrs.define
class _ChatSession:
    server: ChatServer
    tools: tuple[ToolSpec, ...]
    template: ChatTemplate | None
    finishes: list[FinishReason] = attrs.field(factory=list)  # one per sampled turn, in order
    used_ids: set[str] = attrs.field(factory=set)  # call ids of earlier turns: ids stay unique
    # per sampled turn, the text the model wrote as arguments of each call kept with {}
    raw_arguments: list[dict[str, str]] = attrs.field(factory=list)

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        turn = await self.server.chat(messages, tools=self.tools, sampling=sampling)
        self.finishes.append(turn.finish_reason)
        usage = turn.usage
        # the server reads the conversation again: a malformed call stays in it, answered
        parsed = attrs.evolve(turn.parsed(), pair_problems=True).with_distinct_ids()
        # a server may number each turn's calls from 0, or send none (chat_wire generates)
        parsed = distinct_ids(parsed, self.used_ids, suffix=str(len(self.finishes)))
        kept = {call.id for call in parsed.message_calls()}
        self.raw_arguments.append(
            {p.call_id: p.raw for p in parsed.errors if p.call_id is not None and p.call_id in kept}
        )
        return ModelTurn(
            parsed=parsed,
            finish_reason=turn.finish_reason,
            completion_tokens=usage.completion_tokens,
            context_tokens=usage.prompt_tokens + usage.completion_tokens,
        )

    def add_environment(self, messages: Sequence[Message]) -> None:
        return None  # the server re-reads the whole conversation each turn

    def prompt_tokens(self) -> int | None:
        return None  # the server renders the prompt

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        if self.template is None:
            return None
        # A turn cut at max_tokens (or stopped by the server's content filter) sampled no end of
        # turn: the re-render's is not trained. The sampled turns are the last assistant
        # messages (a prompt may hold earlier ones).
        first = sum(1 for m in messages if m.role == "assistant") - len(self.finishes)
        cut = [first + k for k, f in enumerate(self.finishes) if f in _CUT]
        rendered, untrained = self._as_written(self.template, messages, first)
        ledger = self.template.rerender(
            rendered,
            tools=self.tools,
            cut_turns=cut,
            untrained_turns=[first + u.turn - 1 for u in untrained],
        )
        tokens = ledger.export(max_token_length=max_token_length)
        return attrs.evolve(tokens, untrained_turns=untrained) if untrained else tokens

    def _as_written(
        self, template: ChatTemplate, messages: Sequence[Message], first: int
    ) -> tuple[list[Message], tuple[UntrainedTurn, ...]]:
        """``messages`` with each call kept with ``{}`` for arguments that were no JSON object
        given the text the model wrote, where the template writes that text as it is; a turn
        with a call whose text it does not write, or cut by the server inside such a call, is
        left as it is and not trained."""
        out = list(messages)
        untrained: list[UntrainedTurn] = []
        assistant = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for k, raw in enumerate(self.raw_arguments):
            if not raw or not 0 <= first + k < len(assistant):
                continue
            message = messages[assistant[first + k]]
            if self.finishes[k] in _CUT:  # the template would close a call the model never did
                untrained.append(UntrainedTurn(turn=k + 1, reason=_CUT_CALL))
                continue
            calls = [
                attrs.evolve(c, raw_arguments=raw[c.id]) if c.id in raw else c
                for c in message.tool_calls
            ]
            why = [
                (c, template.writes_raw_arguments(c)) for c in calls if c.raw_arguments is not None
            ]
            faults = [f"call {c.id} ({c.name}): {reason}" for c, reason in why if reason]
            if faults:
                untrained.append(
                    UntrainedTurn(
                        turn=k + 1,
                        reason="arguments that were no JSON object cannot be rendered as the "
                        f"model wrote them: {'; '.join(faults)}",
                    )
                )
            elif why:
                out[assistant[first + k]] = attrs.evolve(message, tool_calls=calls)
        return out, tuple(untrained)

    def drift(self, messages: Sequence[Message]) -> Drift | None:
        return None


@attrs.frozen
class ChatPolicy:
    """OpenAI mode: a ``ChatServer``, and optionally a ``ChatTemplate`` to export (inexact)
    tokens for SFT data."""

    server: ChatServer
    template: ChatTemplate | None = None

    @property
    def token_exact(self) -> bool:
        return False

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        return _ChatSession(self.server, tuple(tools), self.template)


# ------------------------------------------------------------------------------ managed mode


@attrs.define
class _TokenSession:
    policy: TokenPolicy
    tools: tuple[ToolSpec, ...]
    ledger: TokenLedger
    turn: int = 0
    used_ids: set[str] = attrs.field(factory=set)  # call ids of earlier turns: ids stay unique

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        prompt = self.ledger.prompt_ids()
        completion = await self.policy.server.generate(prompt, sampling=sampling)
        self.ledger.append_completion(completion)
        self.turn += 1
        text = self.policy.tokenizer.decode(self.policy.turn_ids(completion.token_ids))
        parsed = self.policy.parser.parse(text, tools=self.tools, id_prefix=f"call_{self.turn}")
        parsed = distinct_ids(parsed, self.used_ids, suffix=str(self.turn))
        return ModelTurn(
            parsed=parsed,
            finish_reason=completion.finish_reason,
            completion_tokens=len(completion.token_ids),
            context_tokens=len(prompt) + len(completion.token_ids),
        )

    def add_environment(self, messages: Sequence[Message]) -> None:
        self.policy.template.append_environment(self.ledger, messages)

    def prompt_tokens(self) -> int | None:
        return len(self.ledger)

    def training_tokens(
        self, messages: Sequence[Message], *, max_token_length: int | None
    ) -> TrainingTokens | None:
        return self.ledger.export(max_token_length=max_token_length)

    def drift(self, messages: Sequence[Message]) -> Drift | None:
        return self.policy.template.drift(self.ledger, messages, tools=self.tools)


@attrs.frozen
class TokenPolicy:
    """Managed mode: exact sampled tokens from a ``TokenServer``, parsed by a domain parser.

    Build the template once per tokenizer with ``ChatTemplate.learn(tokenizer)``.
    """

    server: TokenServer
    tokenizer: Tokenizer
    template: ChatTemplate
    parser: ToolCallParser

    @property
    def token_exact(self) -> bool:
        return True

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a turn: the template's end-of-turn, its learnt turn stops (pass the
        generation config's end-of-sequence ids to ``ChatTemplate.learn``) and the tokenizer's
        end-of-sequence id. None of them is ever part of the text the parser reads."""
        shape = self.template.shape
        extra = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        return frozenset({shape.end_of_turn[0], *shape.turn_stops, *extra})

    def turn_ids(self, sampled: Sequence[int]) -> list[int]:
        """The ids of the turn's text: ``sampled`` up to its first stop id.

        The turn ended at the first stop; a server that sampled past it (ignoring stops) adds
        nothing to the message. The ledger keeps every sampled id all the same.
        """
        stops = self.stop_ids
        for i, token in enumerate(sampled):
            if token in stops:
                return list(sampled[:i])
        return list(sampled)

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        ledger = self.template.start(messages, tools=tools)
        return _TokenSession(self, tuple(tools), ledger)
