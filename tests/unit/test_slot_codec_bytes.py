"""The codec's bytes are exactly what ``json.dumps`` with the same options wrote before the
encoders were made once: for every protocol value (and any JSON tree, lone surrogates and
non-ASCII text included), ``encode`` gives the same bytes, so no peer sees a change."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_slot_codec import WIRE_VALUES, json_value
from trajcore.adapters.slot_server.codec import encode, unstructure


def old_encode(value: object) -> bytes:
    """``codec.encode`` as it was: ``json.dumps`` per call."""
    tree = unstructure(value)
    text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(tree, ensure_ascii=True, separators=(",", ":")).encode()


@given(value=WIRE_VALUES)
def test_every_wire_value_encodes_to_the_same_bytes(value: Any) -> None:
    assert encode(value) == old_encode(value)


@given(tree=st.dictionaries(st.text(), json_value, max_size=4), odd=st.text(max_size=4))
def test_any_tree_encodes_to_the_same_bytes_lone_surrogates_too(
    tree: dict[str, Any], odd: str
) -> None:
    tree["odd"] = odd + "\udcff" + "\u00e9\u4e2d"
    assert encode(tree) == old_encode(tree)
    assert encode({"plain": odd}) == old_encode({"plain": odd})
