"""The marker of a call whose lease a sandbox budget ended (``ToolResult.sandbox_budget``) on the
slot server's wire: it round-trips through every writer and reader (the converter, the slot
codec's fast path, the env's ``batch_wire``), a result without it reads as before, and a value
no budget has is refused naming the field."""

from __future__ import annotations

import json

import pytest

from trajcore.adapters.pools.batch_wire import batch_results
from trajcore.adapters.slot_server.batch_codec import FAST_STRUCTURE, FAST_UNSTRUCTURE
from trajcore.adapters.slot_server.codec import converter, decode, encode
from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import ExecuteResponse
from trajcore.domain.tools import ExecReport, SandboxBudget, ToolOutcome, ToolResult

REASON = "disk budget of 4194304 bytes (disk_bytes) reached: ...; the lease was ended"
MARKED = ToolResult(
    call_id="c1",
    name="bash",
    outcome=ToolOutcome.TOOL_ERROR,
    content=f"Error: {REASON}",
    error=REASON,
    sandbox_budget=SandboxBudget.DISK,
)
PLAIN = ToolResult(
    call_id="c2",
    name="bash",
    outcome=ToolOutcome.OK,
    content="hi\n",
    exec=ExecReport(exit_code=0, stdout="hi\n", duration_s=0.01, sandboxed=True),
)
RESPONSE = ExecuteResponse(results=[MARKED, PLAIN], boot="b1")


def test_the_marker_travels_as_a_field_and_round_trips_every_path() -> None:
    body = encode(RESPONSE)
    tree = json.loads(body)
    assert tree["results"][0]["sandbox_budget"] == "disk"
    assert "sandbox_budget" not in tree["results"][1]  # left out at its default
    assert decode(body, ExecuteResponse) == RESPONSE  # the fast path reads it
    assert FAST_STRUCTURE[ExecuteResponse](tree) == RESPONSE
    assert converter.structure(tree, ExecuteResponse) == RESPONSE  # the general path too
    general = converter.unstructure(RESPONSE)
    assert general["results"][0]["sandbox_budget"] == "disk"
    assert converter.structure(general, ExecuteResponse) == RESPONSE
    assert FAST_UNSTRUCTURE[ExecuteResponse](RESPONSE) == tree
    read = batch_results(body, ["c1", "c2"])  # the env's reader of a batch's answer
    assert read == ([MARKED, PLAIN], "b1")


def test_a_result_without_the_field_reads_as_unmarked() -> None:
    """What a slot server that predates the field sends."""
    old = {"results": [{"call_id": "c1", "name": "bash", "outcome": "tool_error", "error": "x"}]}
    body = json.dumps(old).encode()
    (result,) = decode(body, ExecuteResponse).results
    assert result.sandbox_budget is None
    found = batch_results(body, ["c1"])
    assert found is not None
    assert found[0][0].sandbox_budget is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [("memory", "not a valid SandboxBudget"), (1, "not a valid"), ("disk", "cannot be OK")],
)
def test_a_marker_no_budget_has_is_refused_naming_the_field(value: object, reason: str) -> None:
    outcome = "ok" if reason == "cannot be OK" else "tool_error"
    item = {"call_id": "c1", "name": "bash", "outcome": outcome, "sandbox_budget": value}
    body = json.dumps({"results": [item]}).encode()
    assert batch_results(body, ["c1"]) is None  # the fast path leaves it to the general one
    with pytest.raises(WireError, match=reason) as caught:
        decode(body, ExecuteResponse)
    assert caught.value.field == "$.results[0].sandbox_budget"
