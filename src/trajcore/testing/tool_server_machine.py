"""The ``ToolServer`` contract as a hypothesis state machine, for one server or several in lockstep.

The servers under test offer ``CONTRACT_TOOLS`` (``trajcore.testing.tool_server_contract``) with
a per-call limit of ``CONTRACT_CALL_TIMEOUT_S``. Each example opens a fresh server from each
factory (in an anyio blocking portal's loop) and runs generated steps on every server:

- batches of calls with arguments generated against the tools' schemas (``echo`` of any text,
  ``add`` of any integers, ``whoami`` under a generated context, ``fail`` with any message), and
  calls that miss the schema (a missing, mistyped or unexpected argument) or name no tool;
- two batches at once; a batch cancelled mid-way; a call past its limit (once per sequence);
  releasing a trajectory; closing.

After every batch: one result per call, with its id and tool name, in the order of the calls;
valid calls answer what the tool computes (text verbatim, JSON answers as JSON text), a tool's
exception is ``TOOL_ERROR`` carrying its message, bad arguments are ``REJECTED`` naming the field
(``@ add.b``), an unknown tool is ``REJECTED`` naming it, a call past its limit is ``TIMEOUT`` and
the others of its batch still run; a cancelled batch propagates cancellation promptly and the
server answers the next batch; a released trajectory's next batch is answered as before;
after ``aclose`` (twice) ``execute`` raises ``PoolClosed`` and ``release`` stays quiet. No
other exception escapes. With several servers every result must also be the same on each.

``generated_tools_machine`` does the same with a generated tool list per example
(``trajcore.testing.tool_schemas``: JSON-Schema parameters of strings, integers, numbers,
booleans, enums, arrays and nested objects, required subsets, closed objects), for servers built
from a ``ToolRegistry``. Each generated tool answers its arguments and the caller's trajectory as
JSON, or (a generated choice) raises. Calls carry arguments that fit the schema (``OK`` with that
JSON), that miss it in one place (``REJECTED`` naming ``<tool>.<property>``), or name no tool;
``list_tools`` must give the generated specs.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack

import anyio
import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trajcore.adapters.tool_server import ToolHandler, ToolRegistry
from trajcore.domain.errors import PoolClosed
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec
from trajcore.ports.tool_server import ToolServer
from trajcore.testing.budget import machine_settings
from trajcore.testing.tool_schemas import (
    arguments_for,
    bad_arguments_for,
    can_be_missed,
    tool_lists,
)

__all__ = [
    "ToolRegistryServerFactory",
    "ToolServerFactory",
    "generated_tools_machine",
    "run_generated_tools_machine",
    "run_tool_server_machine",
    "tool_server_machine",
]

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


def _run_batch(
    portal: BlockingPortal,
    servers: Sequence[ToolServer],
    drawn: Sequence[tuple[ToolCall, _Expect]],
    context: ToolContext,
) -> None:
    """Run the calls on every server; check each result and that the servers agree."""
    calls = [call for call, _ in drawn]
    answers: list[list[ToolResult]] = []
    for server in servers:
        results = portal.call(_execute, server, calls, context)
        assert len(results) == len(calls), "not one result per call"
        for (call, expect), result in zip(drawn, results, strict=True):
            _check(call, expect, result)
        answers.append(results)
    for results in answers[1:]:
        assert results == answers[0], "servers disagree on a batch"


def _close_twice(portal: BlockingPortal, servers: Sequence[ToolServer]) -> bool:
    """Close every server twice (``aclose`` is idempotent); ``True``."""
    for server in servers:
        portal.call(server.aclose)
        portal.call(server.aclose)
    return True


def _refused(
    portal: BlockingPortal, servers: Sequence[ToolServer], call: ToolCall, context: ToolContext
) -> None:
    """Every (closed) server refuses ``execute`` and ``list_tools`` with ``PoolClosed``, and
    ``release`` returns quietly."""
    for server in servers:
        portal.call(_release, server, context.trajectory_id)
        with pytest.raises(PoolClosed):
            portal.call(_execute, server, [call], context)
        with pytest.raises(PoolClosed):
            portal.call(server.list_tools)


class _LockstepMachine(RuleBasedStateMachine):
    """Servers driven in lockstep: ``close`` closes every one (twice), after which each refuses."""

    def __init__(self, portal: BlockingPortal) -> None:
        super().__init__()
        self.portal = portal
        self.stack = ExitStack()
        self.servers: list[ToolServer] = []
        self.closed = False

    def late_call(self) -> ToolCall:
        """A call that a closed server must refuse."""
        raise NotImplementedError

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.closed = _close_twice(self.portal, self.servers)

    @precondition(lambda self: self.closed)
    @rule(context=_contexts)
    def closed_server_refuses(self, context: ToolContext) -> None:
        _refused(self.portal, self.servers, self.late_call(), context)

    def teardown(self) -> None:
        self.stack.close()


def tool_server_machine(
    portal: BlockingPortal, factories: Sequence[ToolServerFactory]
) -> type[RuleBasedStateMachine]:
    """A state machine class opening a server from each factory per example, in lockstep."""
    assert factories, "give at least one tool server factory"

    class ToolServerMachine(_LockstepMachine):
        def __init__(self) -> None:
            super().__init__(portal)
            self.servers = [
                self.stack.enter_context(portal.wrap_async_context_manager(factory()))
                for factory in factories
            ]
            self.waited_past_a_limit = False

        def late_call(self) -> ToolCall:
            return ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": "late"})

        def run(self, calls: list[ToolCall], context: ToolContext, expects: list[_Expect]) -> None:
            _run_batch(portal, self.servers, list(zip(calls, expects, strict=True)), context)

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

        # Once per sequence: each costs the whole limit, and the limit is long enough that a
        # trivial call on a loaded machine never reaches it.
        @precondition(lambda self: not self.closed and not self.waited_past_a_limit)
        @rule(context=_contexts, text=_text)
        def call_past_its_limit(self, context: ToolContext, text: str) -> None:
            self.waited_past_a_limit = True
            calls = [
                ToolCall(id=f"tool-{next(_ids)}", name="sleep", arguments={"seconds": 60}),
                ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": text}),
            ]
            expects = [_Expect(ToolOutcome.TIMEOUT), _Expect(ToolOutcome.OK, text)]
            self.run(calls, context, expects)

        @precondition(lambda self: not self.closed)
        @rule(context=_contexts)
        def released_trajectory_comes_back(self, context: ToolContext) -> None:
            for server in self.servers:
                portal.call(_release, server, context.trajectory_id)
            answer = json.dumps({"trajectory": context.trajectory_id, "slot": context.slot})
            call = ToolCall(id=f"tool-{next(_ids)}", name="whoami", arguments={})
            self.run([call], context, [_Expect(ToolOutcome.OK, answer)])

        @precondition(lambda self: not self.closed)
        @rule(context=_contexts, after_s=st.sampled_from([0.0, 0.01, 0.1]))
        def cancelled_batch(self, context: ToolContext, after_s: float) -> None:
            call = ToolCall(id=f"tool-{next(_ids)}", name="sleep", arguments={"seconds": 30})
            for server in self.servers:
                portal.call(_cancelled, server, call, context, after_s)
            ok = ToolCall(id=f"tool-{next(_ids)}", name="echo", arguments={"text": "ok"})
            self.run([ok], context, [_Expect(ToolOutcome.OK, "ok")])

    return ToolServerMachine


async def _execute(
    server: ToolServer, calls: list[ToolCall], context: ToolContext
) -> list[ToolResult]:
    with anyio.fail_after(
        20
    ):  # the slowest batch holds one call past its limit (CONTRACT_CALL_TIMEOUT_S)
        return await server.execute(calls, context=context)


async def _release(server: ToolServer, trajectory_id: str) -> None:
    with anyio.fail_after(20):
        await server.release(trajectory_id)


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


@st.composite
def _generated_call(
    draw: st.DrawFn, tools: Sequence[ToolSpec], context: ToolContext
) -> tuple[ToolCall, _Expect]:
    spec = draw(st.sampled_from(tools))
    call_id = f"tool-{next(_ids)}"
    kind = draw(st.sampled_from(["fits", "misses", "unknown"]))
    if kind == "misses" and can_be_missed(spec.parameters):
        bad = draw(bad_arguments_for(spec.parameters))
        pattern = rf"@ {re.escape(spec.name + bad.field[1:])}(;|$)"
        expect = _Expect(ToolOutcome.REJECTED, error=pattern)
        return ToolCall(id=call_id, name=spec.name, arguments=bad.arguments), expect
    if kind == "unknown":
        name = draw(st.from_regex(r"unknown_[a-z]{1,6}", fullmatch=True))
        return ToolCall(id=call_id, name=name, arguments={}), _Expect(
            ToolOutcome.REJECTED, error=re.escape(repr(name))
        )
    arguments = draw(arguments_for(spec.parameters))
    if spec.description.startswith("fails"):
        failure = re.escape(f"{spec.name} failed for {context.trajectory_id}")
        return ToolCall(id=call_id, name=spec.name, arguments=arguments), _Expect(
            ToolOutcome.TOOL_ERROR, error=failure
        )
    answer = {"tool": spec.name, "arguments": arguments, "trajectory": context.trajectory_id}
    content = json.dumps(answer, ensure_ascii=False)
    return ToolCall(id=call_id, name=spec.name, arguments=arguments), _Expect(
        ToolOutcome.OK, content
    )


ToolRegistryServerFactory = Callable[[ToolRegistry], AbstractAsyncContextManager[ToolServer]]
"""A server offering the tools of the ``ToolRegistry`` it is given (yielded started)."""


def _tool_answer(spec: ToolSpec) -> ToolHandler:
    def answer(arguments: JSONObject, context: ToolContext) -> JSON:
        if spec.description.startswith("fails"):
            raise ValueError(f"{spec.name} failed for {context.trajectory_id}")
        return {"tool": spec.name, "arguments": arguments, "trajectory": context.trajectory_id}

    return answer


def generated_tools_machine(
    portal: BlockingPortal, factories: Sequence[ToolRegistryServerFactory]
) -> type[RuleBasedStateMachine]:
    """A state machine class that generates a tool list per example and opens a server offering
    it from each factory, in lockstep (see ``run_generated_tools_machine``)."""
    assert factories, "give at least one tool server factory"

    class GeneratedToolsMachine(_LockstepMachine):
        def __init__(self) -> None:
            super().__init__(portal)
            self.tools: list[ToolSpec] = []

        def late_call(self) -> ToolCall:
            return ToolCall(id=f"tool-{next(_ids)}", name=self.tools[0].name)

        @initialize(
            tools=tool_lists(max_size=4),
            failing=st.lists(st.booleans(), min_size=4, max_size=4),
        )
        def open_servers(self, tools: list[ToolSpec], failing: list[bool]) -> None:
            self.tools = [
                attrs.evolve(spec, description=f"fails: {spec.description}") if fails else spec
                for spec, fails in zip(tools, failing, strict=False)
            ]
            for factory in factories:
                registry = ToolRegistry()
                for spec in self.tools:
                    registry.register(spec, _tool_answer(spec))
                manager = portal.wrap_async_context_manager(factory(registry))
                self.servers.append(self.stack.enter_context(manager))

        @precondition(lambda self: not self.closed)
        @rule()
        def list_tools(self) -> None:
            want = sorted(self.tools, key=lambda spec: spec.name)
            for server in self.servers:
                specs = portal.call(server.list_tools)
                assert sorted(specs, key=lambda spec: spec.name) == want

        @precondition(lambda self: not self.closed)
        @rule(data=st.data(), context=_contexts, size=st.integers(1, 5))
        def batch(self, data: st.DataObject, context: ToolContext, size: int) -> None:
            drawn = [
                data.draw(_generated_call(self.tools, context), label="call") for _ in range(size)
            ]
            _run_batch(portal, self.servers, drawn, context)

    return GeneratedToolsMachine


def run_tool_server_machine(
    factories: Sequence[ToolServerFactory], *, scale: float = 0.2, step_scale: float = 0.3
) -> None:
    """Drive servers from ``factories`` with generated sequences: ``scale`` times the loaded
    profile's ``max_examples`` sequences of ``step_scale`` times its ``stateful_step_count``."""
    budget = machine_settings(scale, step_scale)
    with start_blocking_portal("asyncio") as portal:
        run_state_machine_as_test(tool_server_machine(portal, factories), settings=budget)


def run_generated_tools_machine(
    factories: Sequence[ToolRegistryServerFactory],
    *,
    scale: float = 0.05,
    step_scale: float = 0.2,
) -> None:
    """Drive servers that offer generated tools (one list per sequence) with generated calls;
    ``scale`` and ``step_scale`` as for ``run_tool_server_machine``."""
    budget = machine_settings(scale, step_scale)
    with start_blocking_portal("asyncio") as portal:
        run_state_machine_as_test(generated_tools_machine(portal, factories), settings=budget)
