"""The slot-server protocol on the wire: cattrs (un)structuring of ``domain.slot_protocol``.

One converter, strict about primitive types (JSON ``"5"`` is not an integer here, ``1`` is not a
boolean), bytes carried as base64 text, enums by value. A request (every type in
``REQUEST_TYPES``, the bodies the server reads) is strict about its keys: a key it does not
know, a misspelt ``snapshott`` say, is refused with the key's path and the fields the request
takes, never dropped, since a dropped field would run a different request than the one asked
(a plain lease for a lease from a snapshot). An answer (what a client reads) ignores keys it
does not know, so that a newer server may add fields without breaking an older client. A
field added to a request comes with a new ``PROTOCOL_VERSION``: a client refuses a server of
another version by name at its first health check (``pools/client.py``), before it sends a
request an older server would refuse. Everything malformed is reported as one
``WireError`` whose field is the JSON path of the first fault and whose reason is cattrs' message,
so a bad request reads ``expected an integer @ $.calls[2].slot``.

``encode(value) -> bytes`` and ``decode(data, type) -> value`` are the two entry points; the
round trip ``decode(encode(x), type(x)) == x`` holds for every protocol value.

A batch and its results travel on every tool call, so they have a fast path
(``batch_codec``): plain functions that take the common, well-formed shape straight to the
values (the values' own validators still run) and hand anything else to the converter, which
then accepts or refuses it exactly as it always does. Both paths give equal values and equal
JSON for every input (``tests/unit/test_slot_batch_codec.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

from trajcore.adapters.slot_server.batch_codec import FAST_STRUCTURE, FAST_UNSTRUCTURE
from trajcore.adapters.slot_server.channel import parse_json
from trajcore.adapters.wire import register_strict_primitives
from trajcore.domain.errors import InvalidInput, WireError
from trajcore.domain.json_values import JSONObject, check_json
from trajcore.domain.slot_protocol import (
    ArchiveArtifactsRequest,
    DropSnapshotRequest,
    ExecuteCall,
    ExecuteRequest,
    ForkLease,
    ForkRequest,
    LeaseRequest,
    ListArtifactsRequest,
    ReadArtifactRequest,
    ResetRequest,
    SnapshotRequest,
)

__all__ = ["REQUEST_TYPES", "converter", "decode", "encode", "structure", "unstructure"]

REQUEST_TYPES: tuple[type, ...] = (
    ExecuteRequest,
    ExecuteCall,
    ResetRequest,
    LeaseRequest,
    ForkRequest,
    ForkLease,
    SnapshotRequest,
    DropSnapshotRequest,
    ReadArtifactRequest,
    ListArtifactsRequest,
    ArchiveArtifactsRequest,
)
"""The values a server reads from a request body, and those nested in them: a key none of their
fields has is refused (``unknown field``), not ignored."""

T = TypeVar("T")


def _bytes_from_base64(value: object, _: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"expected base64 text, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as error:
        raise ValueError(f"invalid base64: {error}") from None


def _json_object(value: object, _: object) -> JSONObject:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    problem = check_json(value)
    if problem:
        raise ValueError(problem)
    return value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=False)
    register_strict_primitives(conv)
    conv.register_structure_hook(bytes, _bytes_from_base64)
    conv.register_unstructure_hook(bytes, lambda b: base64.b64encode(b).decode("ascii"))
    for kind in REQUEST_TYPES:
        if kind is ExecuteCall:
            strict: Callable[[Any, Any], object] = make_dict_structure_fn(
                kind,
                conv,
                _cattrs_forbid_extra_keys=True,
                arguments=override(struct_hook=_json_object),
            )
        else:
            strict = make_dict_structure_fn(kind, conv, _cattrs_forbid_extra_keys=True)
        conv.register_structure_hook(kind, _objects_only(strict))
    return conv


def _objects_only(read: Callable[[Any, Any], T]) -> Callable[[Any, Any], T]:
    """``read``, given a JSON object only (a strict reader asks any other value for its keys)."""

    def structure_object(value: object, kind: object) -> T:
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        return read(value, kind)

    return structure_object


converter = _make_converter()


_FIELD_MARK = "\x00"
_UNKNOWN_MARK = "\x01"  # an unknown key: reported before what its absence from the fields caused


def _message(error: BaseException, kind: type | None) -> str:
    # A validator's InvalidInput names its attribute: carry it so the path can be extended.
    if isinstance(error, InvalidInput):
        return f"{error.reason}{_FIELD_MARK}{error.field}"
    if isinstance(error, cattrs.ForbiddenExtraKeysError):
        unknown = sorted(error.extra_fields)
        taken = ", ".join(field.name for field in attrs.fields(error.cl))
        named = ", ".join(repr(key) for key in unknown)
        noun = "field" if len(unknown) == 1 else "fields"
        reason = f"unknown {noun} {named}: {error.cl.__name__} takes only {taken}"
        return f"{reason}{_UNKNOWN_MARK}{_FIELD_MARK}{unknown[0]}"
    if isinstance(error, ValueError) and str(error):
        return str(error)
    return cattrs.v.format_exception(error, kind)


def _first_problem(error: BaseException) -> tuple[str, str]:
    if isinstance(error, InvalidInput):
        return f"$.{error.field}", error.reason
    if isinstance(error, cattrs.BaseValidationError):
        messages = cattrs.transform_error(error, path="$", format_exception=_message)
        # a misspelt key is also a missing field: the unknown key says why, so it comes first
        messages.sort(key=lambda message: _UNKNOWN_MARK not in message)
        if messages:
            text, _, path = messages[0].replace(_UNKNOWN_MARK, "").rpartition(" @ ")
            reason, _, field = text.partition(_FIELD_MARK)
            path = path or "$"
            return (f"{path}.{field}" if field else path), (reason or messages[0])
    return "$", str(error) or type(error).__name__


def structure(data: object, kind: type[T]) -> T:
    """``data`` (parsed JSON) as a ``kind``.

    Raises:
        WireError: ``data`` does not fit ``kind``; the field is the JSON path of the first fault.
    """
    fast = FAST_STRUCTURE.get(kind)
    if fast is not None:
        found = fast(data)
        if found is not None:
            return cast("T", found)
    try:
        return converter.structure(data, kind)
    except (cattrs.BaseValidationError, InvalidInput, ValueError, TypeError, KeyError) as error:
        field, reason = _first_problem(error)
        raise WireError(field, reason) from None


def unstructure(value: object) -> Any:  # a JSON tree, as cattrs returns it
    """``value`` as plain JSON data (dicts, lists, strings, numbers)."""
    fast = FAST_UNSTRUCTURE.get(type(value))
    if fast is not None:
        return fast(value)
    return converter.unstructure(value)


# ``json.dumps`` with any option makes a new encoder per call: these are made once (the same
# output; an encoder keeps no state between calls).
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def encode(value: object) -> bytes:
    """``value`` as compact UTF-8 JSON.

    Text that is not valid Unicode (a lone surrogate: a file name's undecodable byte ``0xNN``
    is ``U+DCNN`` here, as Python's ``surrogateescape`` has it, and a model may write any
    ``\\uDxxx`` escape) travels as a JSON ``\\uXXXX`` escape, which ``decode`` turns back into
    the same text; so every value round-trips and a peer's odd text never fails a message.
    """
    tree = unstructure(value)
    text = _COMPACT.encode(tree)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(tree).encode()


def _loads(data: bytes | str) -> object:
    """``json.loads(data)``. A message that opens with ``{`` is UTF-8 (``json.detect_encoding``
    finds nothing else for it), decoded as ``json.loads`` decodes it and read by the agent
    channel's short cut (``channel.parse_json``); anything else goes through ``json.loads``.
    Raises ``ValueError`` (``UnicodeDecodeError`` too), and ``RecursionError`` for JSON nested
    past the interpreter's depth."""
    if type(data) is bytes and data[:1] == b"{" and data[1:2] != b"\x00":
        return parse_json(data.decode("utf-8", "surrogatepass"))
    return json.loads(data)


def decode(data: bytes | str, kind: type[T]) -> T:
    """Parse JSON ``data`` into a ``kind``.

    Raises:
        WireError: the text is not JSON (field ``$``) or does not fit ``kind``.
    """
    try:
        parsed = _loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError; nested too deep
        raise WireError("$", f"not JSON: {error}") from None
    return structure(parsed, kind)
