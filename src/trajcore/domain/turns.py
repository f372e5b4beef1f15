"""What the model said in one assistant turn, once its raw text or native message is parsed.

A parsed turn keeps everything: the visible content, the reasoning, the well-formed tool calls in
order, and one ``ParseProblem`` for every call that could not be understood. A malformed call is
never dropped silently: the agent loop answers each problem to the model as an error and counts it.
"""

from __future__ import annotations

import attrs

from trajcore.domain import converters
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall

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


@attrs.frozen(kw_only=True)
class ParsedTurn:
    """One assistant turn, parsed.

    Attributes:
        content: Visible text with tool-call markup and reasoning removed.
        reasoning: The reasoning (think block), or ``None`` when there was none.
        calls: Well-formed tool calls, in the order the model wrote them.
        errors: One problem per malformed call.
    """

    content: str = ""
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=converters.tool_calls)
    errors: tuple[ParseProblem, ...] = attrs.field(default=(), converter=converters.parse_problems)

    def to_message(self) -> Message:
        """The assistant message to put in the conversation (well-formed calls only)."""
        return Message.assistant(self.content, tool_calls=self.calls, reasoning=self.reasoning)

    @classmethod
    def from_message(cls, message: Message) -> ParsedTurn:
        """A turn whose calls a server already parsed (OpenAI mode)."""
        return cls(content=message.content, reasoning=message.reasoning, calls=message.tool_calls)
