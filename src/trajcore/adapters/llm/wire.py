"""Reading LLM servers' responses: status codes, JSON bodies and the paths of their faults
(and the sampling fields every request carries).

This module is sans-IO in the manner of gidgethub's ``sansio``: every function takes what the
socket delivered (status, headers, body bytes) or a decoded JSON value and returns a value or
raises a typed error. Nothing here opens a connection, sleeps or reads a clock, so every branch is
a unit test away.

Rules it keeps:

- A status decides first. 2xx is read; 429 is ``RateLimited``; 5xx and 408 are
  ``ModelServerError`` (transient: the transport retries both); any other 4xx is
  ``ModelServerRejected`` with the status and the body, and is never retried (``ContextFull``,
  its kind, when a 400 or 413 says the request is longer than the model's context). Anything else
  (1xx, 3xx) is a ``ModelServerError`` the transport does not retry.
- A body that is not UTF-8 or not JSON is a ``WireError`` at ``$`` saying which and where.
- Every accessor names the JSON path of the value it checks (``$.choices[0].message.content``), so a
  ``WireError`` from a response always says which field broke the protocol and why.
- Integers are strict (``true`` is not ``1``, ``"3"`` is not ``3``). Numbers accept JSON ints and
  floats; NaN and +inf are refused, -inf is accepted because a sampler may report it as a logprob.
"""

from __future__ import annotations

import email.utils
import json
import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from trajcore.domain.errors import (
    ContextFull,
    ModelServerError,
    ModelServerRejected,
    RateLimited,
    TrajcoreError,
    WireError,
)
from trajcore.domain.json_values import JSONObject, json_type
from trajcore.domain.sampling import SamplingParams

__all__ = [
    "BODY_EXCERPT_BYTES",
    "array",
    "boolean",
    "decode_json",
    "error_for_status",
    "integer",
    "integers",
    "is_transient",
    "number",
    "obj",
    "optional",
    "optional_string",
    "read_response",
    "rejection",
    "retry_after_s",
    "sampling_fields",
    "string",
]

T = TypeVar("T")

BODY_EXCERPT_BYTES = 64 * 1024
"""How much of an error body ``ModelServerRejected.body`` keeps."""


def decode_json(body: bytes, *, field: str = "$") -> object:
    """The JSON value in ``body``.

    Raises:
        WireError: at ``field`` when the body is not UTF-8 (naming the byte offset) or not JSON
            (naming line and column).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(field, f"body is not UTF-8: invalid byte at offset {exc.start}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WireError(
            field, f"body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # a number past int()'s limit on digits
        raise WireError(field, f"body is not JSON: {exc}") from None
    except RecursionError:
        raise WireError(field, "body is not JSON: nested too deeply") from None


def obj(value: object, field: str) -> dict[str, object]:
    """``value`` as a JSON object, or ``WireError`` at ``field``."""
    if not isinstance(value, dict):
        raise WireError(field, f"expected an object, got {json_type(value)}")
    return value


def array(value: object, field: str) -> list[object]:
    """``value`` as a JSON array, or ``WireError`` at ``field``."""
    if not isinstance(value, list):
        raise WireError(field, f"expected an array, got {json_type(value)}")
    return value


def string(value: object, field: str) -> str:
    """``value`` as a string, or ``WireError`` at ``field``."""
    if not isinstance(value, str):
        raise WireError(field, f"expected a string, got {json_type(value)}")
    return value


def boolean(value: object, field: str) -> bool:
    """``value`` as a boolean, or ``WireError`` at ``field``."""
    if not isinstance(value, bool):
        raise WireError(field, f"expected a boolean, got {json_type(value)}")
    return value


def integer(value: object, field: str) -> int:
    """``value`` as an integer (never a boolean, never a float), or ``WireError`` at ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(field, f"expected an integer, got {json_type(value)}")
    return value


def integers(value: object, field: str) -> list[int]:
    """``value`` as a list of integers, or ``WireError`` at ``field`` / ``field[i]``."""
    return [integer(item, f"{field}[{i}]") for i, item in enumerate(array(value, field))]


def number(value: object, field: str) -> float:
    """``value`` as a float: a JSON number that is not NaN or +inf, else ``WireError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(field, f"expected a number, got {json_type(value)}")
    out = float(value)
    if math.isnan(out) or out == math.inf:
        raise WireError(field, f"expected a finite number or -inf, got {out}")
    return out


def optional(mapping: Mapping[str, object], key: str) -> object:
    """``mapping[key]``, or ``None`` when it is absent (JSON ``null`` and absence read alike)."""
    return mapping.get(key)


def optional_string(mapping: Mapping[str, object], key: str, field: str) -> str | None:
    """``mapping[key]`` as a string, ``None`` when absent or null, else ``WireError`` at
    ``field``."""
    value = mapping.get(key)
    return None if value is None else string(value, field)


def sampling_fields(
    sampling: SamplingParams, *, max_tokens: str = "max_tokens", seed: str = "seed"
) -> JSONObject:
    """The sampling fields every request carries, under the server's names for the length cap
    and the seed (``stop`` and the seed only when set; ``extra_body`` is the caller's to merge,
    last)."""
    fields: JSONObject = {
        max_tokens: sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        fields[seed] = sampling.seed
    return fields


def read_response(
    status: int, headers: Mapping[str, str], body: bytes, parse_body: Callable[[object], T]
) -> T:
    """``parse_body`` of the decoded JSON body of a 2xx response.

    Raises:
        RateLimited, ModelServerError, ModelServerRejected: a non-2xx status
            (``error_for_status``).
        WireError: a body that is not JSON, or whatever ``parse_body`` refuses.
    """
    error = error_for_status(status, headers, body)
    if error is not None:
        raise error
    return parse_body(decode_json(body))


def _error_message(body: bytes) -> str:
    """The human part of an error body: OpenAI's ``error.message``, vLLM's ``message``,
    FastAPI's ``detail``, else the start of the text."""
    text = body[:BODY_EXCERPT_BYTES].decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, a number past int()'s digits, depth
        return text[:300]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text[:300]


def error_for_status(status: int, headers: Mapping[str, str], body: bytes) -> TrajcoreError | None:
    """The error a response's status means, or ``None`` for 2xx.

    ``headers`` must have lower-case names. Returns ``RateLimited`` (429), ``ModelServerError``
    (5xx, 408 and anything not 2xx/4xx) or ``ModelServerRejected`` (other 4xx, with the body).
    It returns rather than raises so the transport can decide whether to retry.
    """
    if 200 <= status < 300:
        return None
    reason = _error_message(body)
    if status == 429:
        return RateLimited(f"model server rate-limited the request: {reason}", status=status)
    if 400 <= status < 500 and status != 408:
        text = body[:BODY_EXCERPT_BYTES].decode("utf-8", errors="replace")
        return rejection(
            f"model server refused the request with HTTP {status}: {reason}",
            status=status,
            body=text,
        )
    return ModelServerError(f"model server failed with HTTP {status}: {reason}", status=status)


_CONTEXT_FULL = (
    "context length",  # vLLM, SGLang, OpenAI: "maximum context length is 32768 tokens"
    "context_length_exceeded",  # OpenAI's error code
    "context size",  # llama.cpp: "the request exceeds the available context size"
    "context window",
)


def rejection(message: str, *, status: int, body: str) -> ModelServerRejected:
    """The error for a 4xx refusal: ``ContextFull`` when the status is 400 or 413 and the body
    says the request is longer than the model's context, else ``ModelServerRejected``."""
    lowered = body.lower()
    full = status in (400, 413) and any(marker in lowered for marker in _CONTEXT_FULL)
    kind = ContextFull if full else ModelServerRejected
    return kind(message, status=status, body=body)


def is_transient(error: BaseException) -> bool:
    """Whether retrying the same request may succeed: 429, 5xx, 408 and connection failures.

    ``ModelServerError`` carries ``status=None`` for connection failures; 1xx/3xx are not
    transient.
    """
    if not isinstance(error, ModelServerError):
        return False
    status = error.status
    return status is None or status in (408, 429) or status >= 500


def retry_after_s(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the server asked us to wait (``Retry-After``: delta-seconds or an HTTP date),
    or ``None`` when it did not say or said something unreadable. ``now`` is the Unix time."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
