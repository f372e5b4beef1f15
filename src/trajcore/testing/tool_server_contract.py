"""The ``ToolServer`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``ToolServerContract`` and provide ``tool_server_factory``: a function of no arguments
returning an async context manager that yields a ``ToolServer`` offering exactly
``CONTRACT_TOOLS`` (also available as ``CONTRACT_REGISTRY`` for servers that take a
``ToolRegistry``, e.g. ``trajcore tool-server --app
trajcore.testing.tool_server_contract:CONTRACT_REGISTRY``) with a per-call timeout of
``CONTRACT_CALL_TIMEOUT_S``. The suite then checks what ``trajcore.ports.tool_server`` promises:

- ``list_tools`` returns the offered specs;
- ``execute`` gives one result per call, in order, sync and async tools alike, with JSON answers
  rendered as JSON text and text kept verbatim (unicode, newlines);
- an unknown tool and bad arguments are ``REJECTED`` naming the tool or the field, a tool that
  raises is ``TOOL_ERROR`` with its message, a tool past its limit is ``TIMEOUT``; the other calls
  of the same request still run;
- the caller's context reaches the tool;
- concurrent requests each get their own results;
- cancellation is prompt (it propagates, never becomes a result) and the server stays usable;
- ``release`` of a trajectory (seen or not, once or twice, and after ``aclose``) returns
  quietly, and a later request for the same trajectory is answered afresh;
- ``aclose`` is idempotent and later calls raise ``PoolClosed``.

Besides these scenarios, ``test_generated_sequences`` runs the state machine of
``trajcore.testing.tool_server_machine``: generated batches (arguments drawn against the tools'
schemas, bad arguments, unknown tools, generated contexts), concurrent batches, calls past their
limit, cancelled batches and closing, checked after every step. When the subclass also provides
``tool_registry_server_factory`` (a function of a ``ToolRegistry`` returning an async context
manager that yields a server offering its tools), ``test_generated_tools`` offers generated tool
lists with JSON-Schema parameters (``trajcore.testing.tool_schemas``) and sends arguments that fit
each schema or miss it in one named place. ``machine_scale`` sets how many sequences each runs,
as a fraction of the loaded hypothesis profile's ``max_examples``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

import anyio
import pytest

from trajcore.adapters.tool_server import ToolHandler, ToolRegistry
from trajcore.domain.errors import PoolClosed
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolSpec
from trajcore.ports.tool_server import ToolServer
from trajcore.testing.tool_server_machine import (
    ToolRegistryServerFactory,
    run_generated_tools_machine,
    run_tool_server_machine,
)

__all__ = [
    "CONTRACT_CALL_TIMEOUT_S",
    "CONTRACT_REGISTRY",
    "CONTRACT_TOOLS",
    "ToolServerContract",
    "ToolServerFactory",
]

ToolServerFactory = Callable[[], AbstractAsyncContextManager[ToolServer]]

CONTRACT_CALL_TIMEOUT_S = 2.0


async def _echo(arguments: JSONObject, _context: ToolContext) -> JSON:
    return arguments["text"]


def _add(arguments: JSONObject, _context: ToolContext) -> JSON:
    a, b = arguments["a"], arguments["b"]
    assert isinstance(a, int)
    assert isinstance(b, int)
    return a + b


def _whoami(_arguments: JSONObject, context: ToolContext) -> JSON:
    return {"trajectory": context.trajectory_id, "slot": context.slot}


def _fail(arguments: JSONObject, _context: ToolContext) -> JSON:
    raise ValueError(str(arguments["message"]))


async def _sleep(arguments: JSONObject, _context: ToolContext) -> JSON:
    seconds = arguments["seconds"]
    assert isinstance(seconds, int | float)
    await anyio.sleep(seconds)
    return "slept"


def _required(*, closed: bool = False, **types: str) -> JSONObject:
    """An object schema whose properties (named, with their JSON types) are all required."""
    properties: JSONObject = {name: {"type": kind} for name, kind in types.items()}
    schema: JSONObject = {"type": "object", "properties": properties, "required": [*types]}
    if closed:
        schema["additionalProperties"] = False
    return schema


def _tool(name: str, description: str, parameters: JSONObject | None = None) -> ToolSpec:
    if parameters is None:
        return ToolSpec(name=name, description=description)
    return ToolSpec(name=name, description=description, parameters=parameters)


CONTRACT_TOOLS: tuple[tuple[ToolSpec, ToolHandler], ...] = (
    (_tool("echo", "Repeat the text.", _required(text="string")), _echo),
    (_tool("add", "Add two integers.", _required(closed=True, a="integer", b="integer")), _add),
    (_tool("whoami", "The caller's trajectory and slot."), _whoami),
    (_tool("fail", "Raise ValueError.", _required(message="string")), _fail),
    (_tool("sleep", "Sleep, then answer.", _required(seconds="number")), _sleep),
)


def _contract_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for spec, handler in CONTRACT_TOOLS:
        registry.register(spec, handler)
    return registry


CONTRACT_REGISTRY = _contract_registry()

CONTEXT = ToolContext(trajectory_id="traj-7", slot="c0/3")


def _call(call_id: str, name: str, **arguments: JSON) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


class ToolServerContract:
    """Abstract suite: subclass and override ``tool_server_factory``."""

    machine_scale: ClassVar[float] = 0.05

    def test_generated_sequences(self, tool_server_factory: ToolServerFactory) -> None:
        run_tool_server_machine([tool_server_factory], scale=self.machine_scale)

    @pytest.fixture
    def tool_registry_server_factory(self) -> ToolRegistryServerFactory | None:
        """A server offering the tools of a given registry, or ``None`` (the default) for a
        server that offers a fixed tool set."""
        return None

    def test_generated_tools(
        self, tool_registry_server_factory: ToolRegistryServerFactory | None
    ) -> None:
        if tool_registry_server_factory is None:
            pytest.skip("this server offers a fixed tool set (tool_registry_server_factory)")
        run_generated_tools_machine([tool_registry_server_factory], scale=self.machine_scale)

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def tool_server_factory(self) -> ToolServerFactory:
        raise NotImplementedError

    @pytest.mark.anyio
    async def test_list_tools_offers_the_contract_tools(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        async with tool_server_factory() as server:
            specs = await server.list_tools()
        assert sorted(specs, key=lambda s: s.name) == sorted(
            (spec for spec, _ in CONTRACT_TOOLS), key=lambda s: s.name
        )

    @pytest.mark.anyio
    async def test_one_result_per_call_in_order(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        calls = [
            _call("c1", "echo", text="first"),
            _call("c2", "add", a=2, b=40),
            _call("c3", "echo", text="third"),
            _call("c4", "add", a=-1, b=1),
        ]
        async with tool_server_factory() as server:
            results = await server.execute(calls, context=CONTEXT)
        assert [(r.call_id, r.name, r.outcome, r.content) for r in results] == [
            ("c1", "echo", ToolOutcome.OK, "first"),
            ("c2", "add", ToolOutcome.OK, "42"),
            ("c3", "echo", ToolOutcome.OK, "third"),
            ("c4", "add", ToolOutcome.OK, "0"),
        ]
        assert all(r.error is None for r in results)

    @pytest.mark.anyio
    async def test_empty_request_gives_no_results(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        async with tool_server_factory() as server:
            assert await server.execute([], context=CONTEXT) == []

    @pytest.mark.anyio
    async def test_text_is_kept_verbatim(self, tool_server_factory: ToolServerFactory) -> None:
        text = 'ünïcode ✓ 日本 "quoted" \\ back\nslash\ttab {"json": [1]}'
        async with tool_server_factory() as server:
            (result,) = await server.execute([_call("c1", "echo", text=text)], context=CONTEXT)
        assert result.outcome is ToolOutcome.OK
        assert result.content == text

    @pytest.mark.anyio
    @pytest.mark.parametrize(
        ("failing", "outcome", "in_error", "in_content"),
        [
            (_call("c1", "no_such_tool", x=1), ToolOutcome.REJECTED, "no_such_tool", "Error:"),
            (_call("c1", "fail", message="fire"), ToolOutcome.TOOL_ERROR, "fire", "fire"),
            (_call("c1", "sleep", seconds=60), ToolOutcome.TIMEOUT, "", ""),
        ],
        ids=["unknown-tool", "tool-raises", "past-its-limit"],
    )
    async def test_a_failed_call_is_its_result_and_the_next_still_runs(
        self,
        tool_server_factory: ToolServerFactory,
        failing: ToolCall,
        outcome: ToolOutcome,
        in_error: str,
        in_content: str,
    ) -> None:
        """An unknown tool is REJECTED, a tool that raises a TOOL_ERROR with its message, a call
        past its limit a TIMEOUT (well before the tool would end); the batch goes on after it."""
        calls = [failing, _call("c2", "echo", text="after")]
        async with tool_server_factory() as server:
            with anyio.fail_after(20):
                failed, echo = await server.execute(calls, context=CONTEXT)
        assert failed.outcome is outcome
        assert (failed.call_id, failed.name) == ("c1", failing.name)
        assert failed.error is not None
        assert in_error in failed.error
        assert in_content in failed.content
        assert (echo.outcome, echo.content) == (ToolOutcome.OK, "after")

    @pytest.mark.anyio
    @pytest.mark.parametrize(
        ("arguments", "field", "reason"),
        [
            ({"a": 1}, "add.b", "required"),
            ({"a": "1", "b": 2}, "add.a", "expected integer"),
            ({"a": 1, "b": 2.5}, "add.b", "expected integer"),
            ({"a": 1, "b": 2, "c": 3}, "add.c", "unexpected property"),
        ],
    )
    async def test_bad_arguments_are_rejected_naming_the_field(
        self,
        tool_server_factory: ToolServerFactory,
        arguments: JSONObject,
        field: str,
        reason: str,
    ) -> None:
        call = ToolCall(id="c1", name="add", arguments=arguments)
        async with tool_server_factory() as server:
            (result,) = await server.execute([call], context=CONTEXT)
        assert result.outcome is ToolOutcome.REJECTED
        assert result.error is not None
        assert re.search(rf"{reason}[^;@]* @ {re.escape(field)}(;|$)", result.error), result.error

    @pytest.mark.anyio
    async def test_context_reaches_the_tool(self, tool_server_factory: ToolServerFactory) -> None:
        contexts = [CONTEXT, ToolContext(trajectory_id="traj-without-slot")]
        async with tool_server_factory() as server:
            answers = [
                (await server.execute([_call("c1", "whoami")], context=context))[0]
                for context in contexts
            ]
        assert [a.outcome for a in answers] == [ToolOutcome.OK, ToolOutcome.OK]
        assert [a.content for a in answers] == [
            '{"trajectory": "traj-7", "slot": "c0/3"}',
            '{"trajectory": "traj-without-slot", "slot": null}',
        ]

    @pytest.mark.anyio
    async def test_concurrent_requests_get_their_own_results(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        seen: dict[int, list[str]] = {}
        async with tool_server_factory() as server:

            async def one(i: int) -> None:
                context = ToolContext(trajectory_id=f"t{i}")
                calls = [
                    _call(f"{i}-a", "sleep", seconds=0.01),
                    _call(f"{i}-b", "add", a=i, b=1000),
                    _call(f"{i}-c", "whoami"),
                ]
                results = await server.execute(calls, context=context)
                assert [r.call_id for r in results] == [c.id for c in calls]
                seen[i] = [r.content for r in results]

            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    for i in range(16):
                        group.start_soon(one, i)
        assert seen == {
            i: ["slept", str(i + 1000), f'{{"trajectory": "t{i}", "slot": null}}']
            for i in range(16)
        }

    @pytest.mark.anyio
    async def test_cancellation_is_prompt_and_the_server_stays_usable(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        async with tool_server_factory() as server:
            with anyio.move_on_after(0.1) as scope:
                await server.execute([_call("c1", "sleep", seconds=30)], context=CONTEXT)
                pytest.fail("execute returned instead of being cancelled")
            assert scope.cancelled_caught
            with anyio.fail_after(10):
                (result,) = await server.execute([_call("c2", "echo", text="ok")], context=CONTEXT)
        assert (result.outcome, result.content) == (ToolOutcome.OK, "ok")

    @pytest.mark.anyio
    async def test_aclose_is_idempotent_and_later_calls_raise_pool_closed(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        async with tool_server_factory() as server:
            await server.execute([_call("c1", "echo", text="hi")], context=CONTEXT)
            await server.aclose()
            await server.aclose()
            with pytest.raises(PoolClosed):
                await server.execute([_call("c2", "echo", text="hi")], context=CONTEXT)
            with pytest.raises(PoolClosed):
                await server.list_tools()

    @pytest.mark.anyio
    async def test_release_ends_a_trajectory_quietly_and_it_may_come_back(
        self, tool_server_factory: ToolServerFactory
    ) -> None:
        """``release`` returns for a trajectory that ran, twice, and for one never seen; the
        released trajectory's next request is answered, as is another's; after ``aclose``
        ``release`` is still quiet."""
        other = ToolContext(trajectory_id="traj-other")
        async with tool_server_factory() as server:
            with anyio.fail_after(20):
                await server.execute([_call("c1", "whoami")], context=CONTEXT)
                await server.execute([_call("c2", "whoami")], context=other)
                await server.release(CONTEXT.trajectory_id)
                await server.release(CONTEXT.trajectory_id)
                await server.release("traj-never-seen")
                again = await server.execute([_call("c3", "whoami")], context=CONTEXT)
                still = await server.execute([_call("c4", "echo", text="on")], context=other)
                await server.aclose()
                await server.release(other.trajectory_id)
        assert [(r.outcome, r.content) for r in [*again, *still]] == [
            (ToolOutcome.OK, '{"trajectory": "traj-7", "slot": "c0/3"}'),
            (ToolOutcome.OK, "on"),
        ]
