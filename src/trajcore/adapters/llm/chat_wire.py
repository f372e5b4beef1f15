"""The OpenAI chat-completions wire format: the request we send and the response we accept.

``chat_request`` builds the JSON body of ``POST /v1/chat/completions`` from domain values;
``parse_chat_response`` turns ``(status, headers, body)`` into a ``ChatTurn`` or a typed error.
Both are pure functions (gidgethub's sansio shape); ``OpenAIChatServer`` only moves bytes.

What a response may contain, and how it is read:

- ``choices[0].message``: ``content`` (string or null), native ``tool_calls`` (each with ``id``,
  ``function.name`` and ``function.arguments`` as JSON text; an object is accepted too, and an
  empty string means no arguments), and reasoning under any of the names servers use:
  ``reasoning_content`` (vLLM, DeepSeek), ``reasoning`` (OpenRouter, newer vLLM) or
  ``reasoning_details`` (OpenRouter's list of ``{"type": "reasoning.text", "text": ...}`` or
  ``{"type": "reasoning.summary", "summary": ...}`` entries, joined in order).
- ``choices[0].finish_reason`` through ``FinishReason.parse``; ``usage`` when present.

The one decision worth recording: a tool call whose ``arguments`` are not a JSON object (the model
wrote broken JSON, or the generation was cut at ``max_tokens`` in the middle of a call) is the
*model's* mistake, not the server's. Dropping it would hide it; an exception would turn it
into an infrastructure-looking failure the agent loop cannot answer. So the turn comes back whole:
``ChatTurn.message`` holds content, reasoning and every well-formed call, and ``ChatTurn.problems``
one ``ParseProblem`` per malformed call with its raw text and the call's id (the reason names
``arguments`` and says when the generation was cut at ``max_tokens``). The agent loop answers every
problem to the model (``ParseProblem.message_for_model``) and counts it, exactly as for the
managed-mode parsers.
Such a call stays in the assistant message the conversation replays (``ParsedTurn.to_message``,
with empty arguments), so the tool message that answers it answers a call of the message before
it: a chat-completions server refuses a ``tool`` message whose ``tool_call_id`` no earlier
assistant call has (OpenAI answers HTTP 400), and that would end the trajectory as a model error.
Anything else that breaks the protocol (a missing ``name``, a wrong type) is a plain
``WireError``: the server, not the model, is at fault.

Ids are read as sent, two calls with one id included (``ParsedTurn.with_distinct_ids`` tells
them apart before the agent loop sees them, and the OpenAI-mode session keeps them distinct from
earlier turns'). A call whose ``id`` is absent, ``null`` or blank (several OpenAI-compatible
servers and proxies send no id) gets one, ``generated_call_<index>``: the call is well formed
otherwise, and the conversation we send back carries that id on the call and on its result,
which is all the chat-completions protocol asks of an id. A missing id is not worth ending the
trajectory as a model error for. A ``refusal`` (OpenAI's field for a model that
declines) with no other content becomes the turn's content, so the env scores the answer the
model gave instead of an empty turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from trajcore.domain.errors import ToolArgumentError, WireError
from trajcore.domain.json_values import JSON, JSONObject, json_type
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, Usage
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParseProblem

from .wire import (
    array,
    integer,
    obj,
    optional,
    optional_string,
    read_response,
    sampling_fields,
    string,
)

__all__ = ["chat_request", "parse_chat_body", "parse_chat_response"]


def chat_request(
    *,
    model: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    sampling: SamplingParams,
) -> JSONObject:
    """The JSON body of a chat-completions request.

    Tool-call arguments go out as JSON text (the OpenAI wire format); ``tools`` is omitted when
    empty; ``sampling.extra_body`` is merged last, so it may set or override any key.
    """
    body: JSONObject = {
        "model": model,
        "messages": [m.to_chat_dict(arguments_as_json=True) for m in messages],
        **sampling_fields(sampling),
        "n": 1,
    }
    if tools:
        body["tools"] = [spec.to_openai() for spec in tools]
    body.update(sampling.extra_body)
    return body


def _reasoning(message: Mapping[str, object], at: str) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = optional(message, key)
        if value is not None:
            return string(value, f"{at}.{key}")
    details = optional(message, "reasoning_details")
    if details is None:
        return None
    parts: list[str] = []
    for i, item in enumerate(array(details, f"{at}.reasoning_details")):
        where = f"{at}.reasoning_details[{i}]"
        entry = obj(item, where)
        for key in ("text", "summary"):
            value = optional(entry, key)
            if value is not None:
                parts.append(string(value, f"{where}.{key}"))
                break
    return "".join(parts) if parts else None


def _arguments(raw: object, at: str) -> tuple[JSONObject | None, str, str]:
    """(decoded object or None, raw text, reason when None)."""
    if isinstance(raw, dict):
        return raw, json.dumps(raw), ""
    text = string(raw, at)
    if not text.strip():
        return {}, text, ""
    try:
        value: JSON = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, text, f"arguments are not valid JSON ({exc.msg} at column {exc.colno})"
    except ValueError as exc:  # a number past int()'s limit on digits
        return None, text, f"arguments are not valid JSON ({exc})"
    except RecursionError:
        return None, text, "arguments are not valid JSON (nested too deeply)"
    if not isinstance(value, dict):
        return None, text, f"arguments must be a JSON object, got {json_type(value)}"
    return value, text, ""


def parse_chat_body(data: object) -> ChatTurn:
    """The ``ChatTurn`` in a decoded chat-completions response.

    Raises:
        WireError: anything missing or mistyped, naming its path. (Garbled tool-call arguments
            are the model's mistake and come back as ``ChatTurn.problems``; see module doc.)
    """
    root = obj(data, "$")
    choices = array(root.get("choices"), "$.choices")
    if not choices:
        raise WireError("$.choices", "expected at least one choice, got none")
    choice = obj(choices[0], "$.choices[0]")
    at = "$.choices[0].message"
    message = obj(choice.get("message"), at)
    finish_reason = FinishReason.parse(
        optional(choice, "finish_reason"), field="$.choices[0].finish_reason"
    )
    content_raw = optional(message, "content")
    content = "" if content_raw is None else string(content_raw, f"{at}.content")
    refusal = optional_string(message, "refusal", f"{at}.refusal")
    if refusal and not content.strip():
        content = refusal  # the model's answer is its refusal: kept, never an empty turn
    reasoning = _reasoning(message, at)

    calls: list[ToolCall] = []
    problems: list[ParseProblem] = []
    raw_calls = optional(message, "tool_calls")
    for i, item in enumerate(array(raw_calls, f"{at}.tool_calls") if raw_calls else []):
        where = f"{at}.tool_calls[{i}]"
        call = obj(item, where)
        call_id = optional_string(call, "id", f"{where}.id") or ""
        if not call_id.strip():
            call_id = f"generated_call_{i}"  # a server that sends no id: see the module doc
        function = obj(call.get("function"), f"{where}.function")
        name = string(function.get("name"), f"{where}.function.name")
        if not name:
            raise WireError(f"{where}.function.name", "must not be empty")
        arguments, raw, reason = _arguments(
            function.get("arguments"), f"{where}.function.arguments"
        )
        if arguments is not None:
            try:
                calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
                continue
            except ToolArgumentError as exc:  # nested past MAX_DEPTH among them
                arguments, reason = None, exc.reason
        if arguments is None:
            if finish_reason is FinishReason.LENGTH:
                reason = f"cut at max_tokens: {reason}"
            problems.append(
                ParseProblem(
                    index=i, raw=raw, reason=f"{reason} @ arguments", name=name, call_id=call_id
                )
            )

    usage = Usage()
    raw_usage = optional(root, "usage")
    if raw_usage is not None:
        u = obj(raw_usage, "$.usage")
        usage = Usage(
            prompt_tokens=integer(u.get("prompt_tokens", 0), "$.usage.prompt_tokens"),
            completion_tokens=integer(u.get("completion_tokens", 0), "$.usage.completion_tokens"),
        )
    return ChatTurn(
        message=Message.assistant(content, tool_calls=calls, reasoning=reasoning),
        finish_reason=finish_reason,
        usage=usage,
        problems=problems,
    )


def parse_chat_response(status: int, headers: Mapping[str, str], body: bytes) -> ChatTurn:
    """The ``ChatTurn`` a chat-completions response carries.

    ``headers`` have lower-case names.

    Raises:
        RateLimited, ModelServerError, ModelServerRejected: for a non-2xx status
            (see ``error_for_status``).
        WireError: for a 2xx body that breaks the protocol.
    """
    return read_response(status, headers, body, parse_chat_body)
