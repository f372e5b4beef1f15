"""In-memory LLM servers: ``FakeChatServer`` and ``FakeTokenServer``, with faults and a record.

They implement the ``ChatServer`` and ``TokenServer`` ports without a socket and pass the same
contract suites as the HTTP adapters (``trajcore.testing.chat_server_contract`` and
``token_server_contract``). A fake answers from a script (a list of turns or completions, served
in order) or from a policy (a function of the conversation or of the prompt ids).

Faults are ``LLMFault`` values queued with ``inject``; each one replaces the answer to exactly one
request (attempt). The same values drive the loopback HTTP stubs in
``trajcore.testing.llm_stubs``, so a test can say "rate-limited once, then fine" to a fake and to
a real adapter alike. The fakes behave as the HTTP adapters do with the faults: transient faults
(rate limit, server error, dropped connection) are retried up to ``max_attempts`` attempts, each
recorded, then raised as ``RateLimited`` / ``ModelServerError``; a rate limit's ``Retry-After`` is
waited for before the next attempt, and one that would end past the caller's deadline (anyio's
effective deadline) raises ``RateLimited`` at once; a rejection raises
``ModelServerRejected`` at once; malformed output raises ``WireError``; a garbled tool call
comes back as a ``ParseProblem`` in ``ChatTurn.problems``; a delay makes that answer late
(and cancellable).

``FakeTokenServer`` honours ``sampling.max_tokens``: a completion longer than it is cut and marked
``FinishReason.LENGTH``, as a real server cuts a generation.

Every request is recorded (``requests``), retries included, in the order received.
"""

from __future__ import annotations

import enum
import json
from collections import deque
from collections.abc import Callable, Iterable, Sequence, Sized

import anyio
import attrs

from trajcore.adapters.llm.token_wire import check_prompt_ids
from trajcore.domain.errors import (
    ConfigError,
    ModelServerError,
    ModelServerRejected,
    PoolClosed,
    RateLimited,
    StateError,
    WireError,
)
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.tools import ToolSpec
from trajcore.domain.turns import ParseProblem
from trajcore.domain.validators import positive_int

__all__ = [
    "ChatRequest",
    "ChatResponder",
    "FakeChatServer",
    "FakeTokenServer",
    "FaultKind",
    "LLMFault",
    "TokenRequest",
    "TokenResponder",
    "truncate_completion",
]

ChatResponder = Callable[[Sequence[Message]], ChatTurn]
"""Answers a conversation with an assistant turn."""
TokenResponder = Callable[[Sequence[int]], TokenCompletion]
"""Answers a prompt (token ids) with a completion."""


class FaultKind(enum.Enum):
    """What an injected fault does to one request."""

    RATE_LIMITED = "rate_limited"  # HTTP 429 (transient)
    SERVER_ERROR = "server_error"  # HTTP 5xx (transient)
    DROPPED = "dropped"  # connection closed without an answer (transient)
    REJECTED = "rejected"  # HTTP 4xx with an error body (not retried)
    MALFORMED = "malformed"  # a 200 whose body breaks the protocol
    DELAY = "delay"  # the normal answer, late
    GARBLED_TOOL_CALL = "garbled_tool_call"  # chat: a tool call with broken arguments


@attrs.frozen(kw_only=True)
class LLMFault:
    """One injected fault; build it with the classmethods.

    Attributes:
        kind: What happens.
        status: HTTP status for rate limits, server errors and rejections.
        body: Response body for rejections and malformed answers.
        delay_s: For ``DELAY``: how late the answer comes.
        retry_after_s: For ``RATE_LIMITED``: the ``Retry-After`` the server sends, if any.
        raw_arguments: For ``GARBLED_TOOL_CALL``: the arguments text the model wrote.
        finish_reason: For ``GARBLED_TOOL_CALL``: why the turn stopped.
    """

    kind: FaultKind
    status: int = 0
    body: bytes = b""
    delay_s: float = 0.0
    retry_after_s: float | None = None
    raw_arguments: str = ""
    finish_reason: FinishReason = FinishReason.TOOL_CALLS

    @classmethod
    def rate_limited(cls, *, retry_after_s: float | None = None) -> LLMFault:
        return cls(kind=FaultKind.RATE_LIMITED, status=429, retry_after_s=retry_after_s)

    @classmethod
    def server_error(cls, status: int = 503) -> LLMFault:
        if not 500 <= status < 600:
            raise ConfigError("status", f"a server error is 5xx, got {status}")
        return cls(kind=FaultKind.SERVER_ERROR, status=status)

    @classmethod
    def dropped(cls) -> LLMFault:
        return cls(kind=FaultKind.DROPPED)

    @classmethod
    def rejected(cls, status: int = 400, message: str = "bad request") -> LLMFault:
        if not 400 <= status < 500 or status in (408, 429):
            raise ConfigError("status", f"a rejection is a 4xx other than 408/429, got {status}")
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        return cls(kind=FaultKind.REJECTED, status=status, body=body.encode())

    @classmethod
    def malformed(cls, body: bytes = b'{"choices": [') -> LLMFault:
        return cls(kind=FaultKind.MALFORMED, status=200, body=body)

    @classmethod
    def delay(cls, seconds: float) -> LLMFault:
        if not seconds >= 0:
            raise ConfigError("delay_s", f"must be non-negative, got {seconds!r}")
        return cls(kind=FaultKind.DELAY, delay_s=seconds)

    @classmethod
    def garbled_tool_call(
        cls,
        raw_arguments: str = '{"command": "ls',
        *,
        finish_reason: FinishReason = FinishReason.LENGTH,
    ) -> LLMFault:
        return cls(
            kind=FaultKind.GARBLED_TOOL_CALL,
            raw_arguments=raw_arguments,
            finish_reason=finish_reason,
        )

    @property
    def transient(self) -> bool:
        """Whether a client retries after this fault."""
        return self.kind in (FaultKind.RATE_LIMITED, FaultKind.SERVER_ERROR, FaultKind.DROPPED)


def truncate_completion(completion: TokenCompletion, max_tokens: int) -> TokenCompletion:
    """``completion`` cut to ``max_tokens`` ids (and marked ``LENGTH``) when it is longer."""
    if len(completion.token_ids) <= max_tokens:
        return completion
    return TokenCompletion(
        token_ids=completion.token_ids[:max_tokens],
        logprobs=completion.logprobs[:max_tokens],
        finish_reason=FinishReason.LENGTH,
        text=None,
    )


@attrs.frozen(kw_only=True)
class ChatRequest:
    """One request a ``FakeChatServer`` received (one per attempt)."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    sampling: SamplingParams


@attrs.frozen(kw_only=True)
class TokenRequest:
    """One request a ``FakeTokenServer`` received (one per attempt)."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams


def _fault_error(fault: LLMFault) -> Exception:
    if fault.kind is FaultKind.RATE_LIMITED:
        return RateLimited("fake server: rate limited", status=429)
    if fault.kind is FaultKind.SERVER_ERROR:
        return ModelServerError(f"fake server: HTTP {fault.status}", status=fault.status)
    if fault.kind is FaultKind.DROPPED:
        return ModelServerError("fake server: connection dropped", status=None)
    if fault.kind is FaultKind.REJECTED:
        return ModelServerRejected(
            f"fake server refused the request with HTTP {fault.status}",
            status=fault.status,
            body=fault.body.decode("utf-8", errors="replace"),
        )
    return WireError("$", f"fake server: malformed body {fault.body[:60]!r}")


@attrs.define
class _FaultQueue:
    faults: deque[LLMFault] = attrs.field(factory=deque)
    closed: bool = False

    async def next_fault(self) -> LLMFault | None:
        """The fault for this attempt, after sleeping any delay; ``None`` for a normal answer."""
        if self.closed:
            raise PoolClosed("fake LLM server is closed")
        if not self.faults:
            await anyio.lowlevel.checkpoint()
            return None
        fault = self.faults.popleft()
        if fault.kind is FaultKind.DELAY:
            await anyio.sleep(fault.delay_s)
            return None
        await anyio.lowlevel.checkpoint()
        return fault


async def _with_retries(
    queue: _FaultQueue, max_attempts: int, record: Callable[[], None]
) -> LLMFault | None:
    """Record attempts until one is answered: ``None`` (normal) or a non-transient fault."""
    attempt = 0
    while True:
        attempt += 1
        record()
        fault = await queue.next_fault()
        if fault is None or not fault.transient:
            return fault
        if attempt >= max_attempts:
            raise _fault_error(fault)
        # As the HTTP transport: a Retry-After is waited for, and one that would end past the
        # caller's deadline ends the call now instead of in a cancellation at the deadline.
        wait = fault.retry_after_s or 0.0
        if wait > 0:
            if anyio.current_time() + wait >= anyio.current_effective_deadline():
                raise _fault_error(fault)
            await anyio.sleep(wait)


def _turn_deque(items: Iterable[ChatTurn | Message]) -> deque[ChatTurn]:
    out: deque[ChatTurn] = deque()
    for item in items:
        if isinstance(item, ChatTurn):
            out.append(item)
        else:
            reason = FinishReason.TOOL_CALLS if item.tool_calls else FinishReason.STOP
            out.append(ChatTurn(message=item, finish_reason=reason))
    return out


def _completion_deque(items: Iterable[TokenCompletion]) -> deque[TokenCompletion]:
    return deque(items)


@attrs.define
class _ScriptedServer:
    """What the fake servers share: a script or a policy (not both), and faults queued ahead
    of the answers, transient ones retried up to ``max_attempts`` attempts."""

    script: Sized
    policy: object | None
    faults: Iterable[LLMFault] = attrs.field(default=(), kw_only=True)
    max_attempts: int = attrs.field(default=3, validator=positive_int, kw_only=True)
    _queue: _FaultQueue = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if self.script and self.policy is not None:
            raise ConfigError("policy", "give a script or a policy, not both")
        self._queue = _FaultQueue(faults=deque(self.faults))

    def inject(self, *faults: LLMFault) -> None:
        """Queue ``faults``; each replaces the answer to one upcoming request."""
        self._queue.faults.extend(faults)

    async def aclose(self) -> None:
        """Idempotent; later calls raise ``PoolClosed``."""
        self._queue.closed = True


@attrs.define
class FakeChatServer(_ScriptedServer):
    """A scripted or policy-driven ``ChatServer``.

    Give ``script`` (turns served in order; a ``Message`` is served with ``finish_reason`` STOP,
    or TOOL_CALLS when it has calls) or ``policy``, not both.

    Attributes:
        script: The turns still to serve.
        policy: A function of the conversation, used when no script is given.
        faults: Faults still to apply, one per request.
        max_attempts: Attempts per call for transient faults (as ``RetryRules.max_attempts``).
        requests: Every request received, retries included.
    """

    script: deque[ChatTurn] = attrs.field(factory=deque, converter=_turn_deque)
    policy: ChatResponder | None = None
    requests: list[ChatRequest] = attrs.field(factory=list, init=False)

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        """Answer from the script or the policy, after applying queued faults.

        Raises:
            RateLimited, ModelServerError, ModelServerRejected, WireError: per the injected
                faults (a garbled tool call is no error: it comes back in ``problems``).
            StateError: the script is exhausted and there is no policy.
            PoolClosed: after ``aclose``.
        """
        request = ChatRequest(messages=tuple(messages), tools=tuple(tools), sampling=sampling)
        fault = await _with_retries(
            self._queue, self.max_attempts, lambda: self.requests.append(request)
        )
        if fault is not None and fault.kind is FaultKind.GARBLED_TOOL_CALL:
            problem = ParseProblem(
                index=0,
                raw=fault.raw_arguments,
                reason="arguments are not valid JSON @ arguments",
                name="bash",
                call_id="call_garbled_0",
            )
            return ChatTurn(
                message=Message.assistant(""),
                finish_reason=fault.finish_reason,
                problems=[problem],
            )
        if fault is not None:
            raise _fault_error(fault)
        if self.script:
            return self.script.popleft()
        if self.policy is not None:
            return self.policy(messages)
        raise StateError(f"FakeChatServer has no turn left for request {len(self.requests)}")


@attrs.define
class FakeTokenServer(_ScriptedServer):
    """A scripted or policy-driven ``TokenServer``.

    Give ``script`` (completions served in order) or ``policy``, not both.

    Attributes:
        script: The completions still to serve.
        policy: A function of the prompt ids, used when no script is given.
        faults: Faults still to apply, one per request.
        max_attempts: Attempts per call for transient faults.
        requests: Every request received, retries included.
    """

    script: deque[TokenCompletion] = attrs.field(factory=deque, converter=_completion_deque)
    policy: TokenResponder | None = None
    requests: list[TokenRequest] = attrs.field(factory=list, init=False)

    async def generate(
        self, prompt_ids: Sequence[int], *, sampling: SamplingParams
    ) -> TokenCompletion:
        """Answer from the script or the policy, cut to ``sampling.max_tokens``.

        Raises:
            RateLimited, ModelServerError, ModelServerRejected, WireError: per injected faults.
            WireError: ``prompt_ids`` empty or not non-negative integers.
            StateError: the script is exhausted and there is no policy.
            PoolClosed: after ``aclose``.
        """
        ids = tuple(check_prompt_ids(prompt_ids))
        request = TokenRequest(prompt_ids=ids, sampling=sampling)
        fault = await _with_retries(
            self._queue, self.max_attempts, lambda: self.requests.append(request)
        )
        if fault is not None:
            raise _fault_error(fault)
        if self.script:
            completion = self.script.popleft()
        elif self.policy is not None:
            completion = self.policy(ids)
        else:
            raise StateError(
                f"FakeTokenServer has no completion left for request {len(self.requests)}"
            )
        return truncate_completion(completion, sampling.max_tokens)
