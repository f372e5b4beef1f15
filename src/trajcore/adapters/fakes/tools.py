"""``FakeToolServer``: the ``ToolServer`` port in memory, with a record and injectable faults.

It runs registered Python handlers exactly as the tool-server app does (``run_tool`` in
``trajcore.adapters.tool_server``: the same rejections, tool errors and timeouts), without a
socket, and passes the same contract suite as ``HTTPToolServer``
(``trajcore.testing.tool_server_contract``). Two differences, both on purpose: a sync handler runs
inline on the event loop (deterministic, no worker threads), and nothing is encoded as JSON.

Inspection: every call answered is recorded in ``calls`` with its context and result, in the
order answered; ``requests`` counts the requests (``list_tools`` and ``execute`` alike).

Faults are ``ToolFault`` values queued with ``inject``; each one shapes exactly one request, in
order, and a request with no fault queued runs normally. They mirror what a real server can do:

- ``unreachable``: ``list_tools`` raises ``ToolServerError``; every call is an ``INFRA_ERROR``.
- ``crash``: the server fails in the middle of the request (after ``delay_s``), with the same
  effect as ``unreachable``.
- ``hang``: the request never answers; it ends only by ``request_timeout_s`` (``ToolServerError``
  / ``INFRA_ERROR``, as the HTTP client's deadline) or by the caller's cancel scope.
- ``slow``: the request answers normally after ``delay_s``.
- ``raises``: every call of the request raises ``RuntimeError(message)`` in place of its tool
  (a ``TOOL_ERROR`` each, after the usual argument checks).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Sequence

import anyio
import attrs

from trajcore.adapters.tool_server import ToolHandler, ToolRegistry, check_answers, run_tool
from trajcore.domain.errors import ConfigError, PoolClosed, ToolServerError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolResult, ToolSpec

__all__ = ["FakeToolServer", "RecordedCall", "ToolFault", "ToolFaultKind"]


class ToolFaultKind(enum.Enum):
    """What goes wrong with one request to a ``FakeToolServer``."""

    UNREACHABLE = "unreachable"
    CRASH = "crash"
    HANG = "hang"
    SLOW = "slow"
    RAISES = "raises"


def _delay(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(attribute.name, f"must be a finite number of seconds >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class ToolFault:
    """One injected fault; build it with the class methods.

    Attributes:
        kind: What goes wrong.
        delay_s: For ``SLOW`` and ``CRASH``: how long the request runs first.
        message: For ``RAISES``: the exception's message; for ``CRASH``: the failure's.
    """

    kind: ToolFaultKind
    delay_s: float = attrs.field(default=0.0, validator=_delay)
    message: str = ""

    @classmethod
    def unreachable(cls) -> ToolFault:
        return cls(kind=ToolFaultKind.UNREACHABLE)

    @classmethod
    def crash(cls, *, delay_s: float = 0.0, message: str = "server crashed") -> ToolFault:
        return cls(kind=ToolFaultKind.CRASH, delay_s=delay_s, message=message)

    @classmethod
    def hang(cls) -> ToolFault:
        return cls(kind=ToolFaultKind.HANG)

    @classmethod
    def slow(cls, delay_s: float) -> ToolFault:
        return cls(kind=ToolFaultKind.SLOW, delay_s=delay_s)

    @classmethod
    def raises(cls, message: str) -> ToolFault:
        return cls(kind=ToolFaultKind.RAISES, message=message)


@attrs.frozen(kw_only=True)
class RecordedCall:
    """A call the fake answered.

    Attributes:
        call: The call as received.
        context: The context it came with.
        result: What the fake answered.
    """

    call: ToolCall
    context: ToolContext
    result: ToolResult


def _raising(message: str) -> ToolHandler:
    def handler(_arguments: JSONObject, _context: ToolContext) -> JSON:
        raise RuntimeError(message)

    return handler


@attrs.define
class FakeToolServer:
    """An in-memory tool server.

    Attributes:
        registry: The tools it offers (``register`` and ``tool`` add to it).
        call_timeout_s: Per-call limit; a tool past it is a ``TIMEOUT`` result.
        request_timeout_s: Per-request limit, as the HTTP client's deadline; a request past it
            fails as the server being unreachable.
        calls: Every call answered, in order (inspection).
        requests: How many requests arrived (inspection).
        released: Every trajectory released before ``aclose``, in order (inspection).
    """

    call_timeout_s: float = attrs.field(default=60.0, kw_only=True, validator=_delay)
    request_timeout_s: float = attrs.field(default=60.0, kw_only=True, validator=_delay)
    calls: list[RecordedCall] = attrs.field(init=False, factory=list)
    requests: int = attrs.field(init=False, default=0)
    released: list[str] = attrs.field(init=False, factory=list)
    registry: ToolRegistry = attrs.field(factory=ToolRegistry, kw_only=True)
    _faults: deque[ToolFault] = attrs.field(init=False, factory=deque)
    _closed: bool = attrs.field(init=False, default=False)

    @classmethod
    def with_tools(
        cls, tools: Sequence[tuple[ToolSpec, ToolHandler]], *, call_timeout_s: float = 60.0
    ) -> FakeToolServer:
        """A fake serving ``tools`` (spec and handler pairs). Raises ``ConfigError`` on a
        duplicate name."""
        registry = ToolRegistry()
        for spec, handler in tools:
            registry.register(spec, handler)
        return cls(registry=registry, call_timeout_s=call_timeout_s)

    def register(self, spec: ToolSpec, handler: ToolHandler) -> None:
        """Offer ``spec``, answered by ``handler``.

        Raises:
            ConfigError: a tool of that name is already registered (field ``name``).
        """
        self.registry.register(spec, handler)

    def inject(self, *faults: ToolFault) -> None:
        """Queue ``faults``; each shapes the next request not yet shaped."""
        self._faults.extend(faults)

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` has been called."""
        return self._closed

    async def list_tools(self) -> list[ToolSpec]:
        """Every registered spec, in registration order.

        Raises:
            ToolServerError: an ``unreachable``, ``crash`` or timed-out ``hang`` fault.
            PoolClosed: after ``aclose``.
        """
        fault = self._arrive()
        failure = await self._suffer(fault)
        if failure:
            raise ToolServerError(failure)
        return self.registry.specs()

    async def execute(self, calls: Sequence[ToolCall], *, context: ToolContext) -> list[ToolResult]:
        """Run ``calls`` one after another; one result per call, in order.

        Raises:
            PoolClosed: after ``aclose``.
        """
        calls = tuple(calls)
        fault = self._arrive()
        if not calls:
            return []
        failure = await self._suffer(fault)
        if failure:
            results = ToolResult.infra_errors(calls, failure)
        else:
            results = []
            for call in calls:
                spec, handler = self.registry.lookup(call.name) or (None, None)
                if handler is not None and fault is not None and fault.kind is ToolFaultKind.RAISES:
                    handler = _raising(fault.message)
                results.append(
                    await run_tool(
                        spec,
                        handler,
                        call,
                        context,
                        timeout_s=self.call_timeout_s,
                        sync_in_thread=False,
                    )
                )
        check_answers(calls, results)
        for call, result in zip(calls, results, strict=True):
            self.calls.append(RecordedCall(call=call, context=context, result=result))
        return results

    async def release(self, trajectory_id: str) -> None:
        """Record ``trajectory_id`` in ``released`` (the fake keeps no state per trajectory);
        a no-op after ``aclose``."""
        if not self._closed:
            self.released.append(trajectory_id)

    async def aclose(self) -> None:
        """Close. Idempotent; later calls raise ``PoolClosed``."""
        self._closed = True

    def _arrive(self) -> ToolFault | None:
        if self._closed:
            raise PoolClosed("the fake tool server is closed")
        self.requests += 1
        return self._faults.popleft() if self._faults else None

    async def _suffer(self, fault: ToolFault | None) -> str | None:
        """Play ``fault`` out; the failure message when the request fails, else ``None``."""
        if fault is None or fault.kind is ToolFaultKind.RAISES:
            return None
        if fault.kind is ToolFaultKind.UNREACHABLE:
            return "fake tool server is unreachable (injected fault)"
        if fault.kind is ToolFaultKind.HANG:
            with anyio.move_on_after(self.request_timeout_s):
                await anyio.sleep_forever()
            return f"fake tool server did not answer within {self.request_timeout_s:g} s"
        with anyio.move_on_after(self.request_timeout_s) as scope:
            await anyio.sleep(fault.delay_s)
        if scope.cancelled_caught:
            return f"fake tool server did not answer within {self.request_timeout_s:g} s"
        if fault.kind is ToolFaultKind.CRASH:
            return f"fake tool server failed mid-request: {fault.message}"
        return None
