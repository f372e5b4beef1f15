"""The slot-server protocol codec: every wire type round-trips; bad input names its path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.slot_server.codec import decode, encode, structure, unstructure
from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import (
    ArchiveArtifactsRequest,
    ArtifactArchive,
    ArtifactFile,
    Capabilities,
    DirectoryEntry,
    DirectoryListing,
    EntryKind,
    ErrorBody,
    ExecuteCall,
    ExecuteRequest,
    ExecuteResponse,
    Health,
    ListArtifactsRequest,
    ReadArtifactRequest,
    ResetRequest,
    ResetResult,
    SlotInfo,
    SlotListing,
)
from trajcore.domain.tools import ExecReport, ToolOutcome, ToolResult

text = st.text(max_size=20)
count = st.integers(0, 10**9)
positive = st.integers(1, 10**9)
seconds = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), text,
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)
capabilities = st.builds(
    Capabilities, bwrap=st.booleans(), tmux=st.booleans(), network_isolation=st.booleans(),
    cgroups=st.booleans(), detail=text,
)  # fmt: skip
execute_call = st.builds(
    ExecuteCall, slot=count, epoch=count, call_id=text.filter(bool), tool=text.filter(bool),
    arguments=st.dictionaries(text, json_value, max_size=3), timeout_s=seconds,
    time_left_s=st.none() | seconds,
)  # fmt: skip
exec_report = st.builds(
    ExecReport, exit_code=st.none() | st.integers(0, 255), stdout=text, stderr=text,
    stdout_dropped=count, stderr_dropped=count, timed_out=st.booleans(),
    duration_s=st.floats(0, 1e6), sandboxed=st.booleans(),
)  # fmt: skip
tool_result = st.builds(
    ToolResult, call_id=text, name=text, outcome=st.sampled_from(ToolOutcome), content=text,
    error=st.none() | text, exec=st.none() | exec_report,
)  # fmt: skip
slot_info = st.builds(
    SlotInfo, index=count, sandbox_running=st.booleans(), busy=st.booleans(),
    retired_epoch=count, calls_run=count, broken=st.none() | text,
    sandbox_pid=st.none() | positive, sandbox_start_s=st.none() | seconds,
)  # fmt: skip

WIRE_VALUES: st.SearchStrategy[Any] = st.one_of(
    capabilities,
    st.builds(
        Health, protocol_version=positive, slots=positive, capabilities=capabilities,
        sandboxed=st.booleans(), allow_network=st.booleans(), require_sandbox=st.booleans(),
        tools=st.lists(text).map(tuple), min_timeout_s=seconds, max_timeout_s=seconds,
    ),
    execute_call,
    st.builds(ExecuteRequest, calls=st.lists(execute_call, max_size=3)),
    st.builds(ExecuteResponse, results=st.lists(tool_result, max_size=3)),
    st.builds(ResetRequest, slot=count, epoch=count),
    st.builds(
        ResetResult, slot=count, ok=st.booleans(), error=st.none() | text, duration_s=seconds
    ),
    slot_info,
    st.builds(SlotListing, slots=st.lists(slot_info, max_size=3).map(tuple)),
    st.builds(ReadArtifactRequest, slot=count, path=text.filter(bool), max_bytes=positive),
    st.builds(
        ArtifactFile, path=text, size=count, sha256=text, data=st.binary(max_size=64),
        truncated=st.booleans(),
    ),
    st.builds(ListArtifactsRequest, slot=count, path=text.filter(bool), max_entries=positive),
    st.builds(
        DirectoryListing, path=text, truncated=st.booleans(),
        entries=st.lists(
            st.builds(DirectoryEntry, name=text, kind=st.sampled_from(EntryKind), size=count),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        ArchiveArtifactsRequest, slot=count, path=text.filter(bool), max_bytes=positive,
        max_files=positive,
    ),
    st.builds(
        ArtifactArchive, path=text, data=st.binary(max_size=64), sha256=text, files=count,
        truncated=st.booleans(),
    ),
    st.builds(ErrorBody, error=text, field=text),
)  # fmt: skip


@given(value=WIRE_VALUES)
def test_every_wire_type_round_trips(value: Any) -> None:
    kind = type(value)
    assert structure(unstructure(value), kind) == value
    assert decode(encode(value), kind) == value


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (b"not json", "$", "not JSON"),
        (b"{}", "$.calls", "required field missing"),
        (b'{"calls": 3}', "$.calls", ""),
        (
            b'{"calls": [{"slot": "1", "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": 1}]}',
            "$.calls[0].slot",
            "expected an integer",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": true, "call_id": "a", "tool": "b", "timeout_s": 1}]}',
            "$.calls[0].epoch",
            "expected an integer",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "", "tool": "bash", "timeout_s": 1}]}',
            "$.calls[0].call_id",
            "non-empty",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": -1}]}',
            "$.calls[0].timeout_s",
            "> 0",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": 1,'
            b' "time_left_s": 0}]}',
            "$.calls[0].time_left_s",
            "None or finite seconds > 0",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": 1,'
            b' "time_left_s": "2"}]}',
            "$.calls[0].time_left_s",
            "",
        ),
        (
            b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": 1,'
            b' "arguments": [1]}]}',
            "$.calls[0].arguments",
            "JSON object",
        ),
    ],
)
def test_bad_input_names_the_path(body: bytes, field: str, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode(body, ExecuteRequest)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value) == f"{info.value.reason} @ {field}"


def test_a_call_from_a_client_that_sends_no_turn_time_has_none() -> None:
    """An older client's call (no ``time_left_s``) runs under its limit alone."""
    body = b'{"calls": [{"slot": 1, "epoch": 1, "call_id": "a", "tool": "b", "timeout_s": 1}]}'
    (call,) = decode(body, ExecuteRequest).calls
    assert call.time_left_s is None
    with_time = body.replace(b'"timeout_s": 1', b'"timeout_s": 1, "time_left_s": 2.5')
    assert decode(with_time, ExecuteRequest).calls[0].time_left_s == 2.5


def test_bad_base64_is_a_wire_error() -> None:
    body = b'{"path": "x", "size": 1, "sha256": "", "data": "***"}'
    with pytest.raises(WireError) as info:
        decode(body, ArtifactFile)
    assert info.value.field == "$.data"
