"""MCP values into trajcore values (``trajcore.adapters.mcp.protocol``): decisions that the
mapping tests beside the MCP contract suite (``tests/contract/test_mcp_tool_server.py``) do not
pin one by one. Pure functions over the SDK's types; no server."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

import mcp_types as types

from trajcore.adapters.mcp.protocol import tool_result, tool_spec
from trajcore.domain.errors import WireError
from trajcore.domain.tools import ToolCall, ToolOutcome

CALL = ToolCall(id="c1", name="look", arguments={"q": "x"})


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"type": "object", "properties": {"n": {"type": "number", "default": math.nan}}},
            "non-finite number nan @ $.properties.n.default",
        ),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "examples": [{1, 2}]}}},
            "set is not a JSON value @ $.properties.n.examples[0]",
        ),
    ],
)
def test_an_input_schema_that_is_not_json_is_a_wire_error_naming_the_tool(
    schema: dict[str, object], problem: str
) -> None:
    # A listed schema must be a JSON tree before anything else reads it: a value JSON cannot
    # carry (here in annotations, which no validator looks at) is refused, not passed on.
    with pytest.raises(WireError) as caught:
        tool_spec(types.Tool(name="look", input_schema=schema), 2)
    assert caught.value.field == "$.tools[2].inputSchema"
    assert caught.value.reason == f"tool 'look': {problem}"


def test_an_embedded_text_resource_is_text_so_structured_content_is_not_added() -> None:
    # Structured content stands in for the text only when the result has none; the text of an
    # embedded text resource counts as text.
    answer = types.CallToolResult(
        content=[
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="file:///a.txt", text="inside")
            )
        ],
        structured_content={"a": 1},
    )
    result = tool_result(CALL, answer)
    assert (result.outcome, result.content) == (ToolOutcome.OK, "inside")


def test_structured_content_stands_in_beside_a_resource_that_is_not_text() -> None:
    # The control of the test above: a blob resource is named, and the structured content
    # comes first as JSON text.
    answer = types.CallToolResult(
        content=[
            types.EmbeddedResource(
                resource=types.BlobResourceContents(
                    uri="file:///b.bin", blob="AAE=", mime_type="application/zip"
                )
            )
        ],
        structured_content={"a": 1},
    )
    first, second = tool_result(CALL, answer).content.splitlines()
    assert json.loads(first) == {"a": 1}
    assert second == "[resource file:///b.bin: application/zip, not text]"
