"""The slot server's short cuts around ``json.loads`` and the reply check, on every call's path:
each gives exactly what the general path gives (the value, or the same error), whatever the
bytes; they only skip steps for the compact JSON the env and the agent write."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.slot_server import channel, codec
from trajcore.adapters.slot_server.channel import AgentLost, check_reply
from trajcore.domain.errors import WireError
from trajcore.domain.slot_protocol import ExecuteRequest

_JSONISH = st.sampled_from(
    ["{", "}", "[", "]", '"', ":", ",", " ", "\n", "0", "1.5", "-", "e", "true", "null", "NaN",
     "Infinity", "\\u00e9", "\\ud800", "é", "\x00", "a", '{"a":1}', '"exit"']
)  # fmt: skip
_TEXT = st.lists(_JSONISH, max_size=12).map("".join)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


def _outcome(read: Callable[[Any], object], data: object) -> object:
    try:
        return ("value", repr(read(data)))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError too
        return ("error", type(error).__name__, str(error))


@given(_TEXT | st.just("{") | _VALUES.map(json.dumps))
def test_a_replys_text_reads_as_json_loads_reads_it(text: str) -> None:
    assert _outcome(channel.parse_json, text) == _outcome(json.loads, text)


@given(
    st.one_of(
        _TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")),
        _VALUES.map(lambda value: json.dumps({"v": value}).encode()),
        st.binary(max_size=12).map(lambda data: b"{" + data),
        st.sampled_from([b"{", b"{\x00", b"{\x00\x00\x00", b"{\x00a", b"{}\x00", b"{} ", b"{}{}"]),
        _TEXT,
    )
)
def test_a_requests_body_reads_as_json_loads_reads_it(data: bytes | str) -> None:
    assert _outcome(codec._loads, data) == _outcome(json.loads, data)


_FIELD_VALUES: st.SearchStrategy[object] = st.sampled_from(
    [0, 7, -1, 1.5, True, False, None, "", "x", [], {}]
)


@given(st.tuples(*(_FIELD_VALUES for _ in channel._HELPER_KEYS)))
def test_a_helper_shaped_reply_passes_exactly_when_every_field_has_its_type(
    values: tuple[object, ...],
) -> None:
    reply = dict(zip(channel._HELPER_KEYS, values, strict=True))
    fits = all(
        type(value) in channel._REPLY_TYPES[key] for key, value in reply.items()
    )  # the field-by-field rule
    if fits:
        assert check_reply(reply) is reply
    else:
        with pytest.raises(AgentLost, match="malformed reply"):
            check_reply(reply)


def test_a_request_nested_past_the_parsers_depth_is_a_wire_error() -> None:
    """A body nested deeper than the parser recurses is refused as JSON that does not parse
    (``WireError`` at ``$``, which the server answers with a 400), not a crash (a 500)."""
    nested = b'{"calls": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    with pytest.raises(WireError) as refused:
        codec.decode(nested, ExecuteRequest)
    assert refused.value.field == "$"
    assert "not JSON" in refused.value.reason
    assert codec.decode(b'{"calls": []}', ExecuteRequest).calls == ()
