"""Chat messages: who speaks, what they say, and the tool calls and results they carry.

A message is a small frozen value, keyword-only and validated when built, so a message that exists
makes sense: an assistant message is the only one that carries tool calls or reasoning, a tool
message always names the call it answers. The tool values live in ``trajcore.domain.tools``, JSON
in ``trajcore.domain.json_values``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import attrs

from trajcore.domain import converters
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.tools import ToolCall, ToolResult

__all__ = ["LONE_SURROGATE", "ROLES", "Message", "Role", "escape_lone_surrogates"]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@attrs.frozen(kw_only=True)
class Message:
    """One chat message.

    Attributes:
        role: system, user, assistant or tool.
        content: The visible text.
        reasoning: The assistant's reasoning (think block, ``reasoning_content``), if any.
        tool_calls: The calls an assistant message asks for, in order.
        tool_call_id: For a tool message, the id of the call it answers.
        name: For a tool message, the tool's name.
    """

    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=converters.tool_calls)
    tool_call_id: str | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        # Checked here rather than by a validator of its own: a call fewer for each of the
        # three messages built on every turn of every trajectory.
        if self.role not in ROLES:
            raise ConfigError(
                "role", f"unknown role {self.role!r}; expected one of {sorted(ROLES)}"
            )
        if self.tool_calls and self.role != "assistant":
            raise ConfigError(
                "tool_calls", f"only assistant messages carry tool calls, not {self.role}"
            )
        if self.role == "tool" and not self.tool_call_id:
            raise ConfigError("tool_call_id", "a tool message must name the call it answers")
        if self.reasoning is not None and self.role != "assistant":
            raise ConfigError(
                "reasoning", f"only assistant messages carry reasoning, not {self.role}"
            )

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(
        cls, content: str = "", *, tool_calls: Sequence[ToolCall] = (), reasoning: str | None = None
    ) -> Message:
        return cls(
            role="assistant", content=content, tool_calls=tuple(tool_calls), reasoning=reasoning
        )

    @classmethod
    def tool(cls, result: ToolResult) -> Message:
        return cls(
            role="tool", content=result.content, tool_call_id=result.call_id, name=result.name
        )

    def to_chat_dict(self, *, arguments_as_json: bool = False) -> JSONObject:
        """The message as a chat-template / OpenAI-style dict.

        ``arguments_as_json`` renders tool-call arguments as JSON text (the OpenAI wire format)
        instead of a nested object (what most chat templates expect); without it, a call's
        ``raw_arguments``, when it has them, stand in its arguments' place as text.
        """
        out: JSONObject = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments_json()
                        if arguments_as_json
                        else call.arguments
                        if call.raw_arguments is None
                        else call.raw_arguments,
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate: a code point no encoding can write (``escape_lone_surrogates``)."""


def escape_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written as its JSON escape (``\\udcff``, six
    characters), what a tokenizer takes in its place.

    A lone surrogate is no character of any encoding, so no tokenizer encodes it; yet text
    carries one: a file name's undecodable byte as the slot protocol writes it (``\\udcXX``),
    or a tool call's JSON argument in which the model wrote such an escape. The escape is how
    the model (or the slot) wrote it in the first place.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return LONE_SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
    return text
