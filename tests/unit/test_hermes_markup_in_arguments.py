"""A hermes call whose JSON arguments hold the format's own markup as text (a command that
writes ``</tool_call>`` or ``<tool_call>`` into a file, as an agent editing a parser or a chat
template does) is read as the one call the model wrote, not cut at the marker inside the string
and refused as truncated JSON with its tail left in the content.
"""

from __future__ import annotations

import json

import pytest

from trajcore.domain.tool_parsers import get_parser

COMMANDS = [
    "echo '</tool_call>' > end.txt",
    "echo '<tool_call>{}' > start.txt",
    'printf \'<tool_call>\\n{"name": "x"}\\n</tool_call>\' > both.txt',
]


def _call(command: str) -> str:
    body = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.mark.parametrize("command", COMMANDS)
def test_markup_inside_an_argument_string_is_text(command: str) -> None:
    turn = get_parser("hermes").parse(f"Writing it.\n{_call(command)}\n{_call('ls')}")
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("bash", {"command": command}),
        ("bash", {"command": "ls"}),
    ]
    assert not turn.errors
    assert turn.content == "Writing it."


def test_a_broken_call_after_a_good_one_is_still_reported() -> None:
    text = _call("echo '</tool_call>'") + '\n<tool_call>\n{"name": "bash", "arguments": {"co'
    turn = get_parser("hermes").parse(text)
    assert [c.arguments for c in turn.calls] == [{"command": "echo '</tool_call>'"}]
    assert [e.reason for e in turn.errors] == ["truncated JSON @ arguments"]
