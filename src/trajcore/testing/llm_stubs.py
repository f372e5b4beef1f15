"""Loopback LLM servers that speak the real wire formats, for contract tests and benchmarks.

``LoopbackLLMServer`` listens on 127.0.0.1 on an ephemeral port and answers:

- ``POST /v1/chat/completions`` -- OpenAI chat completions with native ``tool_calls`` (the shape
  the ``openai`` package's ``ChatCompletion`` model validates);
- ``POST /v1/completions`` -- vLLM's completions with a token-id prompt, ``logprobs`` whose
  ``tokens`` are ``"token_id:<id>"`` strings, and ``token_ids``;
- ``POST /generate`` -- SGLang's native shape or the Atropos vLLM API server's shape, as chosen by
  ``generate_dialect``;
- ``GET /health``.

Answers come from policies over domain values (a ``ChatResponder`` of the conversation, a
``TokenResponder`` of the prompt ids), serialised here into each server's JSON; a
``chat_request_policy`` may answer a chat request from its whole body first. A policy that
raises ``PolicyFailed`` is answered with its status and message; ``KeyError``, ``TypeError``,
``ValueError`` and ``InvalidInput`` are answered 400 as a bad request. Completions are cut
at the request's ``max_tokens`` and marked ``length``, as a real server does. ``LLMFault`` values
queued with ``inject`` replace the answer to one request each: HTTP 429 (with ``Retry-After``),
5xx, a 4xx with an OpenAI-style error body, a malformed body, a late answer, a dropped connection,
a tool call with broken arguments. Every request is recorded (path, headers, JSON body).

The server is ``adapters.http1.HTTPServer`` with a handler that answers directly (no task per
request; only a delayed answer waits), so the benchmark's ceiling measures the client, not the
stub.

``memory_transport()`` gives the same stub to an adapter without a socket (unit tests).

``python -m trajcore.testing.llm_stubs`` serves one in its own process (for ``bench/llm.py``) and
prints its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import attrs

from trajcore.adapters.fakes.llm import (
    ChatResponder,
    FaultKind,
    LLMFault,
    TokenResponder,
    truncate_completion,
)
from trajcore.adapters.http1.client import MemoryTransport
from trajcore.adapters.http1.server import AbortConnection, HTTPServer
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.lifetime import ClosedOnExit
from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, TokenCompletion
from trajcore.domain.tools import ToolCall

__all__ = [
    "GenerateDialect",
    "LoopbackLLMServer",
    "PolicyFailed",
    "StubRequest",
    "chat_completion_json",
    "echo_chat_policy",
    "echo_token_policy",
    "messages_from_request",
]

GenerateDialect = Literal["sglang", "atropos"]


class PolicyFailed(Exception):
    """A policy could not answer a request: the stub answers ``status`` (a 4xx or 5xx) with
    this message in an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen(kw_only=True)
class StubRequest:
    """One request the stub received.

    Attributes:
        method: ``GET`` or ``POST``.
        path: The request target.
        headers: Header names lower-cased.
        body: The decoded JSON body, or ``None`` when there was none or it was not JSON.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: JSON


def echo_chat_policy(messages: Sequence[Message]) -> ChatTurn:
    """Answers ``echo: <last user text>`` and stops."""
    last = next((m.content for m in reversed(messages) if m.role == "user"), "")
    return ChatTurn(message=Message.assistant(f"echo: {last}"), finish_reason=FinishReason.STOP)


def echo_token_policy(prompt_ids: Sequence[int]) -> TokenCompletion:
    """Answers the last three prompt ids plus one, with logprob ``-0.5`` each, and stops."""
    ids = [t + 1 for t in prompt_ids[-3:]]
    return TokenCompletion(
        token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=FinishReason.STOP
    )


def messages_from_request(body: JSONObject) -> list[Message]:
    """The domain messages of a chat-completions request body (arguments decoded from JSON).

    Raises:
        InvalidInput: a message does not fit ``Message`` (propagated from its validators), or
            ``KeyError``/``TypeError``/``ValueError`` for a body that is not a chat request.
    """
    out: list[Message] = []
    raw = body["messages"]
    if not isinstance(raw, list):
        raise TypeError("messages must be a list")
    for item in raw:
        if not isinstance(item, dict):
            raise TypeError("a message must be an object")
        calls = []
        raw_calls = item.get("tool_calls")
        for call in raw_calls if isinstance(raw_calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call, dict) or not isinstance(function, dict):
                raise TypeError("a tool call must be an object with a function")
            arguments = function.get("arguments")
            decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
            if not isinstance(decoded, dict):
                raise TypeError("tool-call arguments must be a JSON object")
            call_id, name = str(call["id"]), str(function["name"])
            calls.append(ToolCall(id=call_id, name=name, arguments=decoded))
        reasoning = item.get("reasoning_content")
        out.append(
            Message(
                role=str(item["role"]),  # type: ignore[arg-type]
                content=str(item.get("content") or ""),
                reasoning=reasoning if isinstance(reasoning, str) else None,
                tool_calls=calls,
                tool_call_id=_opt_str(item.get("tool_call_id")),
                name=_opt_str(item.get("name")),
            )
        )
    return out


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


_WIRE_FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.ABORT: "abort",
    FinishReason.CONTENT_FILTER: "content_filter",
}


def chat_completion_json(
    turn: ChatTurn, *, model: str, serial: int, garbled: LLMFault | None = None
) -> JSONObject:
    """``turn`` as an OpenAI ``ChatCompletion`` JSON object (``garbled`` adds a broken call)."""
    message = turn.message
    tool_calls: list[JSON] = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json()},
        }
        for call in message.tool_calls
    ]
    finish = _WIRE_FINISH[turn.finish_reason]
    if garbled is not None:
        tool_calls.append(
            {
                "id": f"call_garbled_{len(tool_calls)}",
                "type": "function",
                "function": {"name": "bash", "arguments": garbled.raw_arguments},
            }
        )
        finish = _WIRE_FINISH[garbled.finish_reason]
    wire_message: JSONObject = {"role": "assistant", "content": message.content or None}
    if tool_calls:
        wire_message["tool_calls"] = tool_calls
    if message.reasoning is not None:
        wire_message["reasoning_content"] = message.reasoning
    return {
        "id": f"chatcmpl-{serial}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": wire_message, "finish_reason": finish, "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": turn.usage.prompt_tokens,
            "completion_tokens": turn.usage.completion_tokens,
            "total_tokens": turn.usage.prompt_tokens + turn.usage.completion_tokens,
        },
    }


def _vllm_json(done: TokenCompletion, *, model: str, serial: int, prompt_len: int) -> JSONObject:
    ids: list[JSON] = [*done.token_ids]
    return {
        "id": f"cmpl-{serial}",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": done.text or "",
                "logprobs": {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": list(done.logprobs),
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": [
                        {f"token_id:{t}": lp}
                        for t, lp in zip(done.token_ids, done.logprobs, strict=True)
                    ],
                },
                "finish_reason": _WIRE_FINISH[done.finish_reason],
                "stop_reason": None,
                "token_ids": ids,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": len(ids),
            "total_tokens": prompt_len + len(ids),
        },
    }


def _sglang_json(done: TokenCompletion, *, serial: int, prompt_len: int) -> JSONObject:
    finish: JSONObject = {"type": _WIRE_FINISH[done.finish_reason]}
    if done.finish_reason is FinishReason.LENGTH:
        finish["length"] = len(done.token_ids)
    return {
        "text": done.text or "",
        "output_ids": list(done.token_ids),
        "meta_info": {
            "id": f"req-{serial}",
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(done.token_ids),
            "output_token_logprobs": [
                [lp, t, None] for t, lp in zip(done.token_ids, done.logprobs, strict=True)
            ],
        },
    }


def _atropos_json(done: TokenCompletion, *, prompt_ids: list[int]) -> JSONObject:
    return {
        "text": [done.text or ""],
        "prompt": "",
        "finish_reasons": [_WIRE_FINISH[done.finish_reason]],
        "logprobs": [[[{str(t): lp}] for t, lp in zip(done.token_ids, done.logprobs, strict=True)]],
        "prompt_token_ids": list(prompt_ids),
        "token_ids": [list(done.token_ids)],
    }


@attrs.frozen
class _Reply:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0
    drop: bool = False


def _json_reply(status: int, value: JSON) -> _Reply:
    return _Reply(status, json.dumps(value, separators=(",", ":")).encode())


def _error_reply(status: int, message: str, kind: str = "invalid_request_error") -> _Reply:
    return _json_reply(status, {"error": {"message": message, "type": kind, "code": status}})


def _int_list(value: object, field: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise ValueError(f"{field} must be a list of token ids")
    return [int(t) for t in value]


def _max_tokens(body: JSONObject, key: str = "max_tokens") -> int:
    value = body.get(key)
    return value if isinstance(value, int) and value > 0 else 16


@attrs.define
class LoopbackLLMServer(ClosedOnExit):
    """A scriptable LLM server on 127.0.0.1 (see the module doc).

    Attributes:
        chat_policy: Answers chat completions.
        chat_request_policy: Answers a chat completion from the request's whole body before
            ``chat_policy`` is asked; ``None`` (as policy or answer): ``chat_policy`` answers.
        token_policy: Answers vLLM completions and ``/generate``.
        generate_dialect: The shape of ``/generate``: ``"sglang"`` or ``"atropos"``.
        model: The ``model`` field of answers.
        record: Whether to keep ``requests`` (off for benchmarks).
        requests: Every request received, in order.
    """

    chat_policy: ChatResponder = echo_chat_policy
    chat_request_policy: Callable[[JSONObject], ChatTurn | None] | None = None
    token_policy: TokenResponder = echo_token_policy
    generate_dialect: GenerateDialect = "sglang"
    model: str = "stub-model"
    record: bool = True
    requests: list[StubRequest] = attrs.field(factory=list, init=False)
    _faults: deque[LLMFault] = attrs.field(factory=deque, init=False)
    _http: HTTPServer | None = attrs.field(default=None, init=False)
    _serial: int = attrs.field(default=0, init=False)
    port: int = attrs.field(default=0, init=False)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the server root."""
        return f"http://127.0.0.1:{self.port}"

    def inject(self, *faults: LLMFault) -> None:
        """Queue ``faults``; each replaces the answer to one upcoming POST."""
        self._faults.extend(faults)

    def memory_transport(self) -> MemoryTransport:
        """This stub as an in-memory transport for an ``HTTPClient`` (no socket, no ``start``):
        the same answers, faults and records; a dropped connection is ``ConnectionLost``."""
        return MemoryTransport(self._handle)

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1 (``port`` 0: an ephemeral one)."""
        # No idle timeout to speak of: a test may leave a connection idle as long as it likes.
        self._http = HTTPServer(self._handle, idle_timeout_s=3600.0)
        _, self.port = await self._http.listen_tcp("127.0.0.1", port, backlog=4096)

    async def aclose(self) -> None:
        """Stop listening and close every connection (delayed answers are dropped). Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose(grace_s=0.0)

    async def __aenter__(self) -> LoopbackLLMServer:
        await self.start()
        return self

    # ------------------------------------------------------------------------------ answers

    def _handle(self, request: Request) -> Reply | Awaitable[Reply]:
        reply = self._answer(request.method, request.target, dict(request.headers), request.body)
        if reply.drop:
            raise AbortConnection
        answer = Reply(status=reply.status, body=reply.body, headers=reply.headers)
        if reply.delay_s > 0:
            return _later(answer, reply.delay_s)
        return answer

    def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> _Reply:
        self._serial += 1
        try:
            body: JSON = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if self.record:
            self.requests.append(StubRequest(method=method, path=path, headers=headers, body=body))
        if method == "GET" and path == "/health":
            return _Reply(200, b"{}")
        if method != "POST":
            return _error_reply(404, f"no route {method} {path}")
        if not isinstance(body, dict):
            return _error_reply(400, "body is not a JSON object")
        fault = self._faults.popleft() if self._faults else None
        if fault is not None:
            early = self._fault_reply(fault)
            if early is not None:
                return early
        try:
            reply = self._route(path, body, fault)
        except PolicyFailed as exc:
            return _error_reply(exc.status, str(exc), "policy_error")
        except (KeyError, TypeError, ValueError, InvalidInput) as exc:
            return _error_reply(400, f"bad request: {exc}")
        if fault is not None and fault.kind is FaultKind.DELAY:
            return attrs.evolve(reply, delay_s=fault.delay_s)
        return reply

    def _fault_reply(self, fault: LLMFault) -> _Reply | None:
        kind = fault.kind
        if kind is FaultKind.RATE_LIMITED:
            reply = _error_reply(429, "rate limit exceeded", "rate_limit_error")
            if fault.retry_after_s is not None:
                return attrs.evolve(reply, headers=(("retry-after", f"{fault.retry_after_s:g}"),))
            return reply
        if kind is FaultKind.SERVER_ERROR:
            return _error_reply(fault.status, "the engine failed", "server_error")
        if kind is FaultKind.DROPPED:
            return _Reply(0, b"", drop=True)
        if kind in (FaultKind.REJECTED, FaultKind.MALFORMED):
            return _Reply(fault.status, fault.body)
        return None

    def _route(self, path: str, body: JSONObject, fault: LLMFault | None) -> _Reply:
        garbled = fault if fault is not None and fault.kind is FaultKind.GARBLED_TOOL_CALL else None
        if path == "/v1/chat/completions":
            first = self.chat_request_policy
            turn = None if first is None else first(body)
            if turn is None:
                turn = self.chat_policy(messages_from_request(body))
            return _json_reply(
                200,
                chat_completion_json(turn, model=self.model, serial=self._serial, garbled=garbled),
            )
        if path == "/v1/completions":
            prompt = _int_list(body["prompt"], "prompt")
            done = truncate_completion(self.token_policy(prompt), _max_tokens(body))
            return _json_reply(
                200, _vllm_json(done, model=self.model, serial=self._serial, prompt_len=len(prompt))
            )
        if path == "/generate" and self.generate_dialect == "sglang":
            prompt = _int_list(body["input_ids"], "input_ids")
            params = body.get("sampling_params")
            limit = _max_tokens(params, "max_new_tokens") if isinstance(params, dict) else 16
            done = truncate_completion(self.token_policy(prompt), limit)
            return _json_reply(200, _sglang_json(done, serial=self._serial, prompt_len=len(prompt)))
        if path == "/generate":
            holder = body["prompt"]
            if not isinstance(holder, dict):
                raise TypeError("prompt must be {'prompt_token_ids': [...]}")
            prompt = _int_list(holder["prompt_token_ids"], "prompt.prompt_token_ids")
            done = truncate_completion(self.token_policy(prompt), _max_tokens(body))
            return _json_reply(200, _atropos_json(done, prompt_ids=prompt))
        return _error_reply(404, f"no route POST {path}")


async def _later(reply: Reply, delay_s: float) -> Reply:
    await asyncio.sleep(delay_s)
    return reply


async def _serve(port: int) -> None:
    server = LoopbackLLMServer(record=False)
    await server.start(port)
    print(server.port, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.aclose()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
