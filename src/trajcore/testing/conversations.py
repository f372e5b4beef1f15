"""Hypothesis strategies for the parts that every generated conversation shares.

- ``openings(text)``: how a conversation opens: a system message or none, then a user message,
  each of ``text``. The contract suites build their turns (tool calls and their results, plain
  answers) on top of it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from trajcore.domain.messages import Message

__all__ = ["openings"]


@st.composite
def openings(draw: st.DrawFn, text: st.SearchStrategy[str]) -> list[Message]:
    """A system message of ``text`` (or none), then a user message of ``text``."""
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message.system(draw(text)))
    messages.append(Message.user(draw(text)))
    return messages
