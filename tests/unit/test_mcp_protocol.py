"""MCP values into trajcore values (``trajcore.adapters.mcp.protocol``): decisions that the
mapping tests beside the MCP contract suite (``tests/contract/test_mcp_tool_server.py``) do not
pin one by one. Pure functions over the SDK's types; no server."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'trajcore[mcp]')")

import mcp_types as types

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.adapters.mcp.protocol import (
    CONTEXT_META_KEY,
    OUTCOME_META_KEY,
    context_from_meta,
    outcome_meta,
    tool_result,
    tool_spec,
)
from trajcore.domain.errors import WireError
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

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


def test_a_key_of_the_servers_own_is_refused_saying_where_it_goes_and_passes_once_named() -> None:
    schema: dict[str, object] = {"type": "object", "enumDescriptions": ["a"]}
    with pytest.raises(WireError) as caught:
        tool_spec(types.Tool(name="look", input_schema=schema), 1)
    assert caught.value.field == "$.tools[1].inputSchema.enumDescriptions"
    assert caught.value.reason == (
        "tool 'look': 'enumDescriptions' is not a keyword of this JSON Schema draft, so nothing "
        "would enforce it (misspelt? extensions are named 'x-...'); a key of the server's own, "
        "not to be enforced, goes in its annotations"
    )
    with pytest.raises(WireError) as caught:  # another fault: no word about annotations
        tool_spec(types.Tool(name="look", input_schema={"type": "objec"}), 1)
    assert "annotations" not in caught.value.reason
    named = JSONSchemaValidator(annotations=["enumDescriptions"])
    assert tool_spec(types.Tool(name="look", input_schema=schema), 1, named).name == "look"


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


def _with_meta(
    meta: dict[str, object], *, text: str = "", is_error: bool = False
) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": text}] if text else [],
            "isError": is_error,
            "_meta": meta,
        }
    )


def test_a_tool_keeps_its_description() -> None:
    tool = types.Tool(name="look", description="Look it up.", input_schema={"type": "object"})
    assert tool_spec(tool, 0).description == "Look it up."


@pytest.mark.parametrize(
    ("entry", "field", "reason"),
    [
        ("t-1", "", "expected an object with trajectory_id and slot"),
        ({"trajectory_id": ""}, ".trajectory_id", "expected a non-empty string"),
        ({"trajectory_id": "t", "slot": 3}, ".slot", "expected a string or null"),
    ],
)
def test_a_malformed_context_says_what_was_expected(entry: object, field: str, reason: str) -> None:
    with pytest.raises(WireError) as caught:
        context_from_meta({CONTEXT_META_KEY: entry})
    assert (caught.value.field, caught.value.reason) == (
        f'$._meta["{CONTEXT_META_KEY}"]{field}',
        reason,
    )


def test_our_outcome_travels_in_the_result_meta() -> None:
    result = ToolResult.failure(CALL, ToolOutcome.REJECTED, "no @ look.q")
    assert outcome_meta(result) == {
        OUTCOME_META_KEY: {"outcome": "rejected", "error": "no @ look.q"}
    }
    assert outcome_meta(ToolResult.success(CALL, "ok")) == {
        OUTCOME_META_KEY: {"outcome": "ok", "error": None}
    }


def test_a_declared_ok_outcome_without_is_error_is_a_success_with_the_text() -> None:
    answer = _with_meta({OUTCOME_META_KEY: {"outcome": "ok", "error": None}}, text="fine")
    assert tool_result(CALL, answer) == ToolResult.success(CALL, "fine")


def test_a_declared_failure_wins_even_without_is_error() -> None:
    answer = _with_meta({OUTCOME_META_KEY: {"outcome": "timeout"}}, text="took\n too long")
    result = tool_result(CALL, answer)
    assert (result.outcome, result.error) == (ToolOutcome.TIMEOUT, "took too long")


def test_a_declared_error_that_is_not_text_is_ignored() -> None:
    answer = _with_meta(
        {OUTCOME_META_KEY: {"outcome": "rejected", "error": 5}}, text="bad q", is_error=True
    )
    result = tool_result(CALL, answer)
    assert (result.outcome, result.error) == (ToolOutcome.REJECTED, "bad q")


def test_a_blob_without_a_media_type_is_named_as_octet_stream() -> None:
    answer = types.CallToolResult(
        content=[
            types.EmbeddedResource(
                resource=types.BlobResourceContents(uri="file:///b.bin", blob="AAE=")
            )
        ]
    )
    assert tool_result(CALL, answer).content == (
        "[resource file:///b.bin: application/octet-stream, not text]"
    )


def test_structured_content_is_sent_as_json_text() -> None:
    answer = types.CallToolResult(content=[], structured_content={"a": "x"})
    assert tool_result(CALL, answer).content == '{"a": "x"}'


def test_structured_content_that_is_not_json_is_named_not_sent() -> None:
    answer = types.CallToolResult(content=[], structured_content={"t": math.inf})
    assert tool_result(CALL, answer).content == (
        "[structured content that is not JSON: non-finite number inf @ $.t]"
    )
