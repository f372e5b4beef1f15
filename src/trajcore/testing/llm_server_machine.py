"""What the ``ChatServer`` and ``TokenServer`` state machines share: staged faults, what a call
must give through them, and one call run on several servers at once.

An implementation under test is a ``ServerUnderTest``: the server, and (when it can stage them)
``inject``, which queues ``LLMFault`` values that each replace the answer to one upcoming request
(attempt) -- ``FakeChatServer.inject``, ``FakeTokenServer.inject`` and
``trajcore.testing.llm_stubs.LoopbackLLMServer.inject`` all fit. A factory takes the model's
policy (what it answers to a conversation or a prompt) and yields one, started, closing it on exit.

``LLMServerMachine`` is the hypothesis ``RuleBasedStateMachine`` both machines subclass. Each
example opens a server from every factory (in an anyio blocking portal's loop) and runs every
step on each of them in turn, the same faults staged on each:

- ``call``: one generated request (the subclass draws it and the model's answer) through a
  generated list of faults: up to ``attempts`` transient ones (429 with and without
  ``Retry-After``, 5xx, a dropped connection), then possibly a terminal one (a 4xx, a malformed
  body, a late answer, and what the subclass adds: a garbled tool call for chat);
- ``concurrent_calls``: two to four requests at once, no faults;
- ``cancelled_call`` (fault-staging servers only): a late answer, cancelled at a generated
  moment, then a call that must be answered;
- ``retry_after_past_the_deadline`` (servers that honour ``Retry-After``): a 429 asking for more
  time than the caller's deadline leaves must end the call with ``RateLimited`` at once;
- ``close`` (twice), after which every call raises ``PoolClosed``.

After every call, ``expected_outcome`` of the staged faults says what it must give: the answer
(checked by the subclass: exact content, tool calls, ids, logprobs), or the one typed error with
its status -- ``RateLimited`` / ``ModelServerError`` once the transient faults use up the
attempts, ``ModelServerRejected`` with the status and the server's message, ``WireError`` at a
``$`` path. No other exception may escape. A call through ``Retry-After`` faults takes at least
the time they asked for; every call ends within ``CALL_LIMIT_S``. With several servers, every
observable result (the answer's digest, or the error's type and status) must be the same on each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import anyio
import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from trajcore.adapters.fakes.llm import FaultKind, LLMFault
from trajcore.domain.errors import (
    ModelServerError,
    ModelServerRejected,
    PoolClosed,
    RateLimited,
    WireError,
)
from trajcore.testing.budget import machine_settings

__all__ = [
    "CALL_LIMIT_S",
    "TERMINAL_FAULTS",
    "TRANSIENT_FAULTS",
    "Expected",
    "InjectFaults",
    "LLMServerMachine",
    "ServerUnderTest",
    "expected_outcome",
    "fault_lists",
    "opened_machine",
    "run_llm_machine",
]

S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")
M = TypeVar("M", bound="LLMServerMachine[Any, Any, Any]")

CALL_LIMIT_S = 20.0
"""The longest any call of the machines may take (retries and late answers included)."""


LATE_ANSWER_S = 1.5
"""How late the answer a cancelled call waits for comes (a cancellation must beat it)."""


class InjectFaults(Protocol):
    """Queue faults; each replaces the answer to one upcoming request (attempt)."""

    def __call__(self, *faults: LLMFault) -> None: ...


@attrs.frozen
class ServerUnderTest(Generic[S]):
    """A server, and the way to stage faults on it (``None`` when it cannot)."""

    server: S
    inject: InjectFaults | None = None


RATE_LIMITS = st.builds(
    LLMFault.rate_limited, retry_after_s=st.none() | st.sampled_from([0.0, 0.01, 0.05])
)
TRANSIENT_FAULTS = st.one_of(
    RATE_LIMITS,
    st.builds(LLMFault.server_error, status=st.sampled_from([500, 502, 503, 504])),
    st.just(LLMFault.dropped()),
)
"""Faults a client must retry: 429 (with and without ``Retry-After``), 5xx, a dropped connection."""
TERMINAL_FAULTS = st.one_of(
    st.builds(
        LLMFault.rejected,
        status=st.sampled_from([400, 404, 413, 422]),
        message=st.text(alphabet="abc xyz", min_size=1, max_size=20),
    ),
    st.builds(
        LLMFault.malformed,
        body=st.sampled_from([b'{"choices": [', b"[]", b"not json", b"\xff\xfe{"]),
    ),
)
"""Faults that end a call at once: a 4xx rejection, a malformed 200 body."""


@attrs.frozen
class Expected:
    """What a call must give through its staged faults.

    Attributes:
        error: The exception class it must raise, exactly; ``None`` for an answer.
        status: The error's ``status``.
        message: Text the rejection's body must hold.
        waits_s: The least time the call takes (the ``Retry-After`` it went through).
        garbled: The garbled tool call that must come back as a problem.
    """

    error: type[Exception] | None = None
    status: int | None = None
    message: str | None = None
    waits_s: float = 0.0
    garbled: LLMFault | None = None


def expected_outcome(faults: Sequence[LLMFault], attempts: int) -> Expected:
    """What a call allowed ``attempts`` attempts gives when ``faults`` are staged before it.

    ``faults`` must be consumed by this call alone: at most ``attempts`` transient ones, and a
    terminal one only when the transient ones leave an attempt for it.
    """
    waits = 0.0
    for n, fault in enumerate(faults, start=1):
        if fault.transient:
            if n < attempts:  # the client waits before its next attempt
                waits += fault.retry_after_s or 0.0
            if n == attempts:
                if fault.kind is FaultKind.RATE_LIMITED:
                    return Expected(RateLimited, status=429, waits_s=waits)
                status = fault.status if fault.kind is FaultKind.SERVER_ERROR else None
                return Expected(ModelServerError, status=status, waits_s=waits)
            continue
        assert n == len(faults), "a terminal fault must come last"
        if fault.kind is FaultKind.REJECTED:
            text = fault.body.decode()
            return Expected(ModelServerRejected, status=fault.status, message=text, waits_s=waits)
        if fault.kind is FaultKind.MALFORMED:
            return Expected(WireError, waits_s=waits)
        if fault.kind is FaultKind.GARBLED_TOOL_CALL:
            return Expected(waits_s=waits, garbled=fault)
        return Expected(waits_s=waits)  # a late answer is still the answer
    return Expected(waits_s=waits)


def _observed_error(error: Exception, expected: Expected) -> Hashable:
    assert type(error) is expected.error, f"expected {expected.error}, got {error!r}"
    if isinstance(error, ModelServerError | ModelServerRejected):
        assert error.status == expected.status, (error, expected)
    if isinstance(error, ModelServerRejected):
        assert expected.message is not None
        assert "error" in error.body, error.body
        assert _rejection_message(expected.message) in error.body, (error.body, expected)
    if isinstance(error, WireError):
        assert error.field.startswith("$"), error.field
    return (type(error).__name__, getattr(error, "status", None))


def _rejection_message(body: str) -> str:
    # LLMFault.rejected's body is {"error": {"message": ...}}: the message is what must survive
    return body.split('"message": "', 1)[1].split('"', 1)[0]


@st.composite
def fault_lists(
    draw: st.DrawFn, attempts: int, extra: st.SearchStrategy[LLMFault] | None = None
) -> list[LLMFault]:
    """Faults for one call: up to ``attempts`` transient ones, then possibly one terminal one
    (``TERMINAL_FAULTS``, ``extra``, or a late answer) when an attempt is left for it."""
    transient = draw(st.integers(0, attempts))
    faults = [draw(TRANSIENT_FAULTS) for _ in range(transient)]
    if transient < attempts and draw(st.booleans()):
        late = st.just(LLMFault.delay(0.01))
        faults.append(
            draw(st.one_of(TERMINAL_FAULTS, extra if extra is not None else st.nothing(), late))
        )
    return faults


ServerFactory = Callable[[Callable[..., Any]], AbstractAsyncContextManager[ServerUnderTest[S]]]


class LLMServerMachine(RuleBasedStateMachine, Generic[S, Q, R]):
    """The shared rules (see the module doc); subclasses draw requests and check answers.

    Class attributes set by ``run_llm_machine``: ``portal``, ``factories``, ``attempts`` (the
    attempts per call the factories' retry rules allows), ``honours_retry_after``.
    """

    portal: ClassVar[BlockingPortal]
    factories: ClassVar[Sequence[ServerFactory[Any]]]
    attempts: ClassVar[int] = 5
    honours_retry_after: ClassVar[bool] = True
    extra_terminal_faults: ClassVar[st.SearchStrategy[LLMFault]] = st.nothing()

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.under_test: list[ServerUnderTest[S]] = [
            self.stack.enter_context(self.portal.wrap_async_context_manager(factory(self.respond)))
            for factory in self.factories
        ]
        self.staging = all(u.inject is not None for u in self.under_test)
        self.closed = False
        self.serial = 0

    # -------------------------------------------------------------------- for subclasses

    def respond(self, request: Any) -> Any:
        """The model: answer what a server's backend received (and record it)."""
        raise NotImplementedError

    def draw_request(self, data: st.DataObject, *, garbled: bool = False) -> Q:
        """A new request, with the model's answer to it registered (``garbled``: an answer that
        a garbled tool call can be added to)."""
        raise NotImplementedError

    async def send(self, server: S, request: Q) -> R:
        """Send ``request`` to ``server``."""
        raise NotImplementedError

    def check_answer(self, request: Q, answer: R, expected: Expected) -> Hashable:
        """Assert ``answer`` is the model's answer to ``request`` (through ``expected``'s
        garbled call) and the backend saw the request as sent; return what lockstep compares."""
        raise NotImplementedError

    def next_tag(self) -> int:
        self.serial += 1
        return self.serial

    # -------------------------------------------------------------------- running a call

    def exchange(
        self, request: Q, faults: Sequence[LLMFault], *, limit_s: float = CALL_LIMIT_S
    ) -> Hashable:
        """Run ``request`` through ``faults`` on every server; check and compare the results."""
        expected = expected_outcome(faults, self.attempts)
        seen: list[Hashable] = []
        for under in self.under_test:
            if faults:
                assert under.inject is not None
                under.inject(*faults)
            started = time.monotonic()
            answer, error = self.portal.call(self._attempt, under.server, request, limit_s)
            took = time.monotonic() - started
            if error is not None:
                seen.append(_observed_error(error, expected))
            else:
                assert expected.error is None, f"expected {expected.error}, got {answer!r}"
                seen.append(self.check_answer(request, cast("R", answer), expected))
            if self.honours_retry_after:
                assert took >= expected.waits_s - 0.002, (
                    f"the call took {took:.3f} s through Retry-After asking {expected.waits_s} s"
                )
        for other in seen[1:]:
            assert other == seen[0], f"servers disagree: {seen[0]!r} != {other!r}"
        return seen[0]

    async def _attempt(
        self, server: S, request: Q, limit_s: float
    ) -> tuple[R | None, Exception | None]:
        with anyio.fail_after(limit_s):
            try:
                return await self.send(server, request), None
            except (ModelServerError, ModelServerRejected, WireError, PoolClosed) as error:
                return None, error

    # -------------------------------------------------------------------- rules

    @precondition(lambda self: not self.closed)
    @rule(data=st.data())
    def call(self, data: st.DataObject) -> None:
        faults: list[LLMFault] = []
        if self.staging:
            faults = data.draw(
                fault_lists(self.attempts, self.extra_terminal_faults), label="faults"
            )
        garbled = any(f.kind is FaultKind.GARBLED_TOOL_CALL for f in faults)
        request = self.draw_request(data, garbled=garbled)
        self.exchange(request, faults)

    @precondition(lambda self: not self.closed)
    @rule(data=st.data(), count=st.integers(2, 4))
    def concurrent_calls(self, data: st.DataObject, count: int) -> None:
        self.concurrently([self.draw_request(data) for _ in range(count)])

    @precondition(lambda self: not self.closed and self.staging)
    @rule(data=st.data(), after_s=st.sampled_from([0.0, 0.02, 0.1]))
    def cancelled_call(self, data: st.DataObject, after_s: float) -> None:
        self.cancel(self.draw_request(data), after_s)
        # The late answer is queued until a request arrives: a cancelled call may have gone
        # before its request did. This call takes it if it is still there, and must be answered.
        self.exchange(self.draw_request(data), [])

    @precondition(lambda self: not self.closed and self.staging and self.honours_retry_after)
    @rule(data=st.data())
    def retry_after_past_the_deadline(self, data: st.DataObject) -> None:
        self.give_up_before_the_deadline(self.draw_request(data))

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.close_twice()

    @precondition(lambda self: self.closed)
    @rule(data=st.data())
    def closed_server_refuses(self, data: st.DataObject) -> None:
        self.refuse_after_close(self.draw_request(data))

    # -------------------------------------------------------------------- scenarios

    def concurrently(self, requests: list[Q]) -> None:
        """Send ``requests`` at once to each server (no faults); each must get its answer."""
        for under in self.under_test:
            results = self.portal.call(self._concurrently, under.server, requests)
            for request, (answer, error) in zip(requests, results, strict=True):
                assert error is None, f"a concurrent call failed: {error!r}"
                self.check_answer(request, cast("R", answer), Expected())

    async def _concurrently(
        self, server: S, requests: list[Q]
    ) -> list[tuple[R | None, Exception | None]]:
        results: list[tuple[R | None, Exception | None]] = [(None, None)] * len(requests)

        async def one(k: int) -> None:
            results[k] = await self._attempt(server, requests[k], CALL_LIMIT_S)

        async with anyio.create_task_group() as group:
            for k in range(len(requests)):
                group.start_soon(one, k)
        return results

    def cancel(self, request: Q, after_s: float) -> None:
        """Cancel ``request`` after ``after_s`` while its answer is late: the cancellation must
        come first, promptly. (A late answer may stay queued: send a call after this one.)"""
        for under in self.under_test:
            assert under.inject is not None
            under.inject(LLMFault.delay(LATE_ANSWER_S))
            took = self.portal.call(self._cancelled, under.server, request, after_s)
            assert took < after_s + 1.0, f"cancelling after {after_s} s took {took:.2f} s"

    async def _cancelled(self, server: S, request: Q, after_s: float) -> float:
        started = anyio.current_time()
        with anyio.move_on_after(after_s) as scope:
            await self.send(server, request)
        assert scope.cancelled_caught, "a late answer came before the cancellation"
        return anyio.current_time() - started

    def give_up_before_the_deadline(self, request: Q) -> None:
        """A 429 asking for 30 s under a 2 s deadline must end the call with ``RateLimited``
        at once, not in a cancellation at the deadline."""
        for under in self.under_test:
            assert under.inject is not None
            under.inject(LLMFault.rate_limited(retry_after_s=30.0))
            started = time.monotonic()
            answer, error = self.portal.call(self._attempt, under.server, request, 2.0)
            took = time.monotonic() - started
            assert isinstance(error, RateLimited), (answer, error)
            assert took < 1.5, f"giving up before the deadline took {took:.2f} s"

    def close_twice(self) -> None:
        """Close every server twice (``aclose`` is idempotent)."""
        for under in self.under_test:
            self.portal.call(self._aclose, under.server)
            self.portal.call(self._aclose, under.server)
        self.closed = True

    @staticmethod
    async def _aclose(server: Any) -> None:
        with anyio.fail_after(10):
            await server.aclose()

    def refuse_after_close(self, request: Q) -> None:
        """After ``close_twice``, ``request`` must raise ``PoolClosed`` on every server."""
        for under in self.under_test:
            _, error = self.portal.call(self._attempt, under.server, request, 10.0)
            assert isinstance(error, PoolClosed), error

    def teardown(self) -> None:
        self.stack.close()


def _bound(
    machine: type[M],
    portal: BlockingPortal,
    factories: Sequence[ServerFactory[Any]],
    attempts: int,
    honours_retry_after: bool,
) -> type[M]:
    assert factories, "give at least one server factory"
    return type(
        machine.__name__,
        (machine,),
        {
            "portal": portal,
            "factories": tuple(factories),
            "attempts": attempts,
            "honours_retry_after": honours_retry_after,
        },
    )


@contextmanager
def opened_machine(
    machine: type[M],
    factories: Sequence[ServerFactory[Any]],
    *,
    attempts: int,
    honours_retry_after: bool,
) -> Iterator[M]:
    """One instance of ``machine`` over servers from ``factories``, for explicit scenarios:
    call its methods (``exchange``, ``concurrently``, ``cancel``...) directly."""
    with start_blocking_portal("asyncio") as portal:
        state = _bound(machine, portal, factories, attempts, honours_retry_after)()
        try:
            yield state
        finally:
            state.teardown()


def run_llm_machine(
    machine: type[LLMServerMachine[Any, Any, Any]],
    factories: Sequence[ServerFactory[Any]],
    *,
    attempts: int = 5,
    honours_retry_after: bool = True,
    scale: float = 0.1,
    step_scale: float = 0.3,
) -> None:
    """Drive servers from ``factories`` with ``machine``'s rules: ``scale`` x the loaded
    profile's ``max_examples`` sequences of ``step_scale`` x its ``stateful_step_count`` steps.

    ``attempts`` is what the factories' retry rules allows per call; ``honours_retry_after``
    whether the servers wait for ``Retry-After`` and give up when it is past the deadline."""
    with start_blocking_portal("asyncio") as portal:
        bound = _bound(machine, portal, factories, attempts, honours_retry_after)
        run_state_machine_as_test(bound, settings=machine_settings(scale, step_scale))
