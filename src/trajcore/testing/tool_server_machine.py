"""The ``ToolServer`` contract as a hypothesis state machine, for one server or several in lockstep.

The servers under test offer ``CONTRACT_TOOLS`` (``trajcore.testing.tool_server_contract``) with
a per-call limit of ``CONTRACT_CALL_TIMEOUT_S``. Each example opens a fresh server from each
factory (in an anyio blocking portal's loop) and runs generated steps on every server:

- batches of calls with arguments generated against the tools' schemas (``echo`` of any text,
  ``add`` of any integers, ``whoami`` under a generated context, ``fail`` with any message), and
  calls that miss the schema (a missing, mistyped or unexpected argument) or name no tool;
- two batches at once; a batch cancelled mid-way; a call past its limit; closing.

After every batch: one result per call, with its id and tool name, in the order of the calls;
valid calls answer what the tool computes (text verbatim, JSON answers as JSON text), a tool's
exception is ``TOOL_ERROR`` carrying its message, bad arguments are ``REJECTED`` naming the field
(``@ add.b``), an unknown tool is ``REJECTED`` naming it, a call past its limit is ``TIMEOUT`` and
the others of its batch still run; a cancelled batch propagates cancellation promptly and the
server answers the next batch; after ``aclose`` (twice) ``execute`` raises ``PoolClosed``. No
other exception escapes. With several servers every result must also be the same on each.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack

import anyio
import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from trajcore.domain.errors import PoolClosed
from trajcore.domain.messages import JSON, ToolCall, ToolContext, ToolOutcome, ToolResult
from trajcore.ports.tool_server import ToolServer

__all__ = ["ToolServerFactory", "run_tool_server_machine", "tool_server_machine"]

ToolServerFactory = Callable[[], AbstractAsyncContextManager[ToolServer]]

_ids = itertools.count(1)
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Co")), max_size=30)
_ints = st.integers(-(2**40), 2**40)
_contexts = st.builds(
    ToolContext,
    trajectory_id=st.text(alphabet="abcxyz-019", min_size=1, max_size=10),
    slot=st.none() | st.text(alphabet="c0/13", min_size=1, max_size=5),
)
_BAD_ADD: tuple[tuple[dict[str, JSON], str, str], ...] = (
    ({"a": 1}, "add.b", "required"),
    ({"a": "1", "b": 2}, "add.a", "expected integer"),
    ({"a": 1, "b": 2.5}, "add.b", "expected integer"),
    ({"a": 1, "b": 2, "c": 3}, "add.c", "unexpected property"),
)


@attrs.frozen
class _Expect:
    """What a call must give: an outcome, and the content or a pattern its error must match."""

    outcome: ToolOutcome
    content: str | None = None
    error: str | None = None


@st.composite
def _calls(draw: st.DrawFn, context: ToolContext) -> tuple[ToolCall, _Expect]:
    kind = draw(st.sampled_from(["echo", "add", "whoami", "fail", "bad", "unknown"]))
    call_id = f"tool-{next(_ids)}"
    if kind == "echo":
        text = draw(_text)
        return ToolCall(id=call_id, name="echo", arguments={"text": text}), _Expect(
            ToolOutcome.OK, text
        )
    if kind == "add":
        a, b = draw(_ints), draw(_ints)
        return ToolCall(id=call_id, name="add", arguments={"a": a, "b": b}), _Expect(
            ToolOutcome.OK, str(a + b)
        )
    if kind == "whoami":
        answer = json.dumps({"trajectory": context.trajectory_id, "slot": context.slot})
        return ToolCall(id=call_id, name="whoami", arguments={}), _Expect(ToolOutcome.OK, answer)
    if kind == "fail":
        message = draw(st.text(alphabet="abc xyz!019", min_size=1, max_size=20))
        expect = _Expect(ToolOutcome.TOOL_ERROR, error=re.escape(message))
        return ToolCall(id=call_id, name="fail", arguments={"message": message}), expect
    if kind == "bad":
        arguments, field, reason = draw(st.sampled_from(_BAD_ADD))
        pattern = rf"{reason}[^;@]* @ {re.escape(field)}(;|$)"
        return ToolCall(id=call_id, name="add", arguments=arguments), _Expect(
            ToolOutcome.REJECTED, error=pattern
        )
    name = draw(st.from_regex(r"no_such_[a-z]{1,6}", fullmatch=True))
    return ToolCall(id=call_id, name=name, arguments={"x": 1}), _Expect(
        ToolOutcome.REJECTED, error=re.escape(name)
    )


def _check(call: ToolCall, expect: _Expect, result: ToolResult) -> None:
    assert (result.call_id, result.name) == (call.id, call.name), (call, result)
    assert result.outcome is expect.outcome, (call, result)
    if expect.content is not None:
        assert result.content == expect.content, (call, result)
    if expect.error is not None:
        assert result.error is not None, (call, result)
        assert re.search(expect.error, result.error), (call, result)


def tool_server_machine(
    portal: BlockingPortal, factories: Sequence[ToolServerFactory]
) -> type[RuleBasedStateMachine]:
    """A state machine class opening a server from each factory per example, in lockstep."""
    assert factories, "give at least one tool server factory"

    class ToolServerMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.stack = ExitStack()
            self.servers = [
                self.stack.enter_context(portal.wrap_async_context_manager(factory()))
                for factory in factories
            ]
            self.closed = False

        def run(self, calls: list[ToolCall], context: ToolContext, expects: list[_Expect]) -> None:
            answers: list[list[ToolResult]] = []
            for server in self.servers:
                results = portal.call(_execute, server, calls, context)
                assert len(results) == len(calls), "not one result per call"
                for call, expect, result in zip(calls, expects, results, strict=True):
                    _check(call, expect, result)
                answers.append(results)
            for results in answers[1:]:
                assert results == answers[0], "servers disagree on a batch"

        @precondition(lambda self: not self.closed)
        @rule(data=st.data(), context=_contexts, size=st.integers(0, 6))
        def batch(self, data: st.DataObject, context: ToolContext, size: int) -> None:
            drawn = [data.draw(_calls(context), label="call") for _ in range(size)]
            self.run([c for c, _ in drawn], context, [e for _, e in drawn])

        @precondition(lambda self: not self.closed)
        @rule(data=st.data(), contexts=st.lists(_contexts, min_size=2, max_size=3))
        def concurrent_batches(self, data: st.DataObject, contexts: list[ToolContext]) -> None:
            batches = [
                [data.draw(_calls(context), label="call") for _ in range(3)] for context in contexts
            ]
            for server in self.servers:
                answers = portal.call(_concurrently, server, batches, contexts)
                for drawn, results in zip(batches, answers, strict=True):
                    assert len(results) == len(drawn)
                    for (call, expect), result in zip(drawn, results, strict=True):
                        _check(call, expect, result)

        @precondition(lambda self: not self.closed)
        @rule(context=_contexts, text=_text)
        def call_past_its_limit(self, context: ToolContext, text: str) -> None:
            calls = [
                ToolCall(id=f"tool-{next(_ids)}", name="sleep", arguments={"seconds": 60}),
                ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": text}),
            ]
            expects = [_Expect(ToolOutcome.TIMEOUT), _Expect(ToolOutcome.OK, text)]
            self.run(calls, context, expects)

        @precondition(lambda self: not self.closed)
        @rule(context=_contexts, after_s=st.sampled_from([0.0, 0.01, 0.1]))
        def cancelled_batch(self, context: ToolContext, after_s: float) -> None:
            call = ToolCall(id=f"tool-{next(_ids)}", name="sleep", arguments={"seconds": 30})
            for server in self.servers:
                portal.call(_cancelled, server, call, context, after_s)
            ok = ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": "ok"})
            self.run([ok], context, [_Expect(ToolOutcome.OK, "ok")])

        @precondition(lambda self: not self.closed)
        @rule()
        def close(self) -> None:
            for server in self.servers:
                portal.call(server.aclose)
                portal.call(server.aclose)
            self.closed = True

        @precondition(lambda self: self.closed)
        @rule(context=_contexts)
        def closed_server_refuses(self, context: ToolContext) -> None:
            call = ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": "late"})
            for server in self.servers:
                with pytest.raises(PoolClosed):
                    portal.call(_execute, server, [call], context)

        def teardown(self) -> None:
            self.stack.close()

    return ToolServerMachine


async def _execute(
    server: ToolServer, calls: list[ToolCall], context: ToolContext
) -> list[ToolResult]:
    with anyio.fail_after(20):  # the slowest batch holds one call past its 0.5 s limit
        return await server.execute(calls, context=context)


async def _concurrently(
    server: ToolServer, batches: list[list[tuple[ToolCall, _Expect]]], contexts: list[ToolContext]
) -> list[list[ToolResult]]:
    answers: list[list[ToolResult]] = [[] for _ in batches]

    async def one(k: int) -> None:
        answers[k] = await _execute(server, [c for c, _ in batches[k]], contexts[k])

    async with anyio.create_task_group() as group:
        for k in range(len(batches)):
            group.start_soon(one, k)
    return answers


async def _cancelled(
    server: ToolServer, call: ToolCall, context: ToolContext, after_s: float
) -> None:
    with anyio.fail_after(5), anyio.move_on_after(after_s) as scope:
        await server.execute([call], context=context)
        pytest.fail("execute answered a 30 s sleep instead of being cancelled")
    assert scope.cancelled_caught


def run_tool_server_machine(
    factories: Sequence[ToolServerFactory], *, scale: float = 0.2, step_scale: float = 0.3
) -> None:
    """Drive servers from ``factories`` with generated sequences: ``scale`` times the loaded
    profile's ``max_examples`` sequences of ``step_scale`` times its ``stateful_step_count``."""
    base = settings.default
    assert base is not None, "hypothesis has no settings profile loaded"
    budget = settings(
        base,
        max_examples=max(2, math.ceil(base.max_examples * scale)),
        stateful_step_count=max(5, math.ceil(base.stateful_step_count * step_scale)),
        deadline=None,
        report_multiple_bugs=False,
    )
    with start_blocking_portal("asyncio") as portal:
        run_state_machine_as_test(tool_server_machine(portal, factories), settings=budget)
