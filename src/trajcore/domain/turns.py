"""What the model said in one assistant turn, once its raw text or native message is parsed.

A parsed turn keeps everything: the visible content, the reasoning, the well-formed tool calls in
order, and one ``ParseProblem`` for every call that could not be understood. A malformed call is
never dropped silently: the agent loop answers each problem to the model as an error and counts it.
In OpenAI mode (``pair_problems``) the malformed call also stays in the assistant message, with
empty arguments, so that the answer to it pairs with a call when the conversation is replayed.
"""

from __future__ import annotations

import itertools

import attrs

from trajcore.domain import converters
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

__all__ = ["ParseProblem", "ParsedTurn"]


@attrs.frozen(kw_only=True)
class ParseProblem:
    """One tool call the parser could not accept.

    Attributes:
        index: Position of the call among all calls the turn attempted (good and bad), from 0.
        raw: The text of the attempted call, verbatim (possibly truncated mid-way by the model).
        reason: Why it was refused, naming the part at fault ("truncated JSON @ arguments",
            "unknown tool 'x' @ name", "expected integer, got string @ arguments.count").
        name: The tool name, when it could be read.
        call_id: The id the call would have had, so the answer to the model can refer to it.
    """

    index: int = attrs.field(validator=attrs.validators.ge(0))
    raw: str
    reason: str
    name: str | None = None
    call_id: str | None = None

    def message_for_model(self) -> str:
        """A one-line error the agent loop sends back to the model."""
        who = f"tool call {self.index}" + (f" ({self.name})" if self.name else "")
        return f"Error: {who} was not run: {self.reason}"

    def rejection(self, turn: int) -> ToolResult:
        """The ``REJECTED`` result that answers this problem in the conversation; its
        ``call_id`` is the problem's, or ``invalid-<turn>-<index>`` when it had none."""
        return ToolResult(
            call_id=self.call_id or f"invalid-{turn}-{self.index}",
            name=self.name or "",
            outcome=ToolOutcome.REJECTED,
            content=self.message_for_model(),
            error=self.reason,
        )


@attrs.frozen(kw_only=True)
class ParsedTurn:
    """One assistant turn, parsed.

    Attributes:
        content: Visible text with tool-call markup and reasoning removed.
        reasoning: The reasoning (think block), or ``None`` when there was none.
        calls: Well-formed tool calls, in the order the model wrote them.
        errors: One problem per malformed call.
        pair_problems: Whether the assistant message keeps a call for each malformed call that
            has an id (OpenAI mode): a chat-completions server reads the whole conversation
            again each turn and refuses a ``tool`` message (here, the rejection answering the
            malformed call) whose ``tool_call_id`` no call of the assistant message before it
            has. Managed mode keeps its sampled tokens and leaves this off.
    """

    content: str = ""
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=converters.tool_calls)
    errors: tuple[ParseProblem, ...] = attrs.field(default=(), converter=converters.parse_problems)
    pair_problems: bool = False

    def to_message(self) -> Message:
        """The assistant message to put in the conversation: the well-formed calls, and with
        ``pair_problems`` also each malformed call that has an id and a name, with empty
        arguments, in the model's order."""
        return Message.assistant(
            self.content, tool_calls=self.message_calls(), reasoning=self.reasoning
        )

    def with_distinct_ids(self) -> ParsedTurn:
        """This turn with no id shared by two of its calls (well-formed or not): a later call
        whose id an earlier one has gets ``<id>_<index>`` (its position in the turn, repeated
        until new), so each result answers exactly one call. ``self`` when the ids are already
        distinct. A server may send one id twice (a model that writes its own ids, a server
        that numbers each turn's calls badly); the agent loop refuses such a turn."""
        problems = {p.index: p for p in self.errors}
        free = (i for i in itertools.count() if i not in problems)
        order = sorted(
            [(next(free), call.id, call) for call in self.calls]
            + [(p.index, p.call_id, p) for p in self.errors if p.call_id],
            key=lambda item: item[0],
        )
        taken: set[str] = set()
        renamed: dict[int, str] = {}
        for index, call_id, _ in order:
            fresh = call_id
            while fresh in taken:
                fresh = f"{fresh}_{index}"
            taken.add(fresh)
            if fresh != call_id:
                renamed[index] = fresh
        if not renamed:
            return self
        calls = tuple(
            attrs.evolve(item, id=renamed.get(index, item.id))
            for index, _, item in order
            if isinstance(item, ToolCall)
        )
        errors = tuple(
            attrs.evolve(p, call_id=renamed.get(p.index, p.call_id)) for p in self.errors
        )
        return attrs.evolve(self, calls=calls, errors=errors)

    def message_calls(self) -> tuple[ToolCall, ...]:
        """The calls ``to_message`` puts in the assistant message (see ``pair_problems``)."""
        if not self.pair_problems or not self.errors:
            return self.calls
        indexes = {problem.index for problem in self.errors}
        free = (i for i in itertools.count() if i not in indexes)
        placed = [(next(free), call) for call in self.calls]
        placed += [
            (p.index, ToolCall(id=p.call_id, name=p.name))
            for p in self.errors
            if p.call_id and p.name
        ]
        placed.sort(key=lambda pair: pair[0])
        return tuple(call for _, call in placed)

    @classmethod
    def from_message(cls, message: Message) -> ParsedTurn:
        """A turn whose calls a server already parsed (OpenAI mode)."""
        return cls(content=message.content, reasoning=message.reasoning, calls=message.tool_calls)
