"""Throughput of the pure domain's hot paths, beside a bare-Python floor measured in the same run.

Run: ``.venv/bin/python -m bench.domain [--seconds 1.0] [--only parsers]``
(``--only`` picks groups of rows: ``planner``, ``slot_book``, ``parsers`` (the hermes parser row
and every family's turn), ``validator``; repeat it for several).

- **planner**: offer one call per slot for 64 slots over 4 containers, ``due`` them as batches,
  ``complete`` every batch; an operation is one call offered and flushed.
- **slot book**: request a slot and release it, then report its reset done; an operation is
  one lease-and-release cycle, on a book of 4 containers of 16 slots.
- **hermes parser**: parse model text with prose, a think block and tool calls; MB/s of text.
- **<family> turn**: every registered parser family on the hermes bench's turn (a think
  block, prose, two shell calls) written in the family's own format by its ``render``; the
  families whose values are text (``qwen3_coder``, ``glm45``) get the tools' schemas, so their
  figure includes typing the values and checking them (``+schema``); MB/s of text.
- **tool-argument validator**: check valid arguments of three typical tool calls (a shell
  command, a file write, a pydantic-written search tool) against their schemas through
  ``JSONSchemaValidator``, compiled once per tool; the floor is the same check hand-written.
  Valid arguments are the common case and take its ``jsonschema-rs`` path; invalid ones are
  explained by ``jsonschema`` and are not what this row measures.

Each figure is printed with its target from the issue (100,000 ops/s; 10 MB/s) and with a floor
measured in the same run: the same bookkeeping done with a bare dict and deque (planner, slot
book) or a bare ``str.find`` scan of the text for the family's call marker (parsers), which
is roughly the fastest any Python implementation could be. The ratios say how far from that
floor the domain objects are.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.batch_planner import BatchConfig, BatchPlanner
from trajcore.domain.json_values import JSONObject
from trajcore.domain.slot_book import SlotBook
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser
from trajcore.domain.tool_parsers.base import ToolCallParser
from trajcore.domain.tools import ToolCall, ToolSpec

CONTAINERS = 4
SLOTS = 16


def _rate(run: Callable[[], int], seconds: float) -> float:
    """Operations per second of ``run`` (which returns how many operations it did)."""
    run()  # warm up
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += run()
    return done / elapsed


def _planner_round(planner: BatchPlanner, calls: list[SlotCall], clock: list[float]) -> int:
    clock[0] += 0.001
    now = clock[0]
    for call in calls:
        planner.offer(call, now)
    for batch in planner.due(now):
        planner.complete(batch.id, now)
    return len(calls)


def _floor_planner_round(calls: list[SlotCall]) -> int:
    queues: dict[str, deque[SlotCall]] = {}
    for call in calls:
        queues.setdefault(call.container, deque()).append(call)
    for queue in queues.values():
        while queue:
            queue.popleft()
    return len(calls)


def bench_planner(seconds: float) -> tuple[float, float]:
    calls: list[SlotCall] = []
    for c in range(CONTAINERS):
        for i in range(SLOTS):
            lease = Lease(slot=SlotId(container=f"c{c}", index=i), epoch=1, holder=f"t{c}-{i}")
            call = ToolCall(id="x", name="bash", arguments={"command": "true"})
            calls.append(SlotCall(lease=lease, call=call, timeout_s=10.0))
    # Each round offers the same calls again: a call id is only busy while pending.
    planner = BatchPlanner(BatchConfig(window_ms=0.0, max_batch_size=64))
    clock = [0.0]
    measured = _rate(lambda: _planner_round(planner, calls, clock), seconds)
    floor = _rate(lambda: _floor_planner_round(calls), seconds)
    return measured, floor


def bench_slot_book(seconds: float) -> tuple[float, float]:
    book = SlotBook()
    for c in range(CONTAINERS):
        book.add_container(f"c{c}", SLOTS, now=0.0)
    clock = [0.0]

    def cycle() -> int:
        for _ in range(100):
            clock[0] += 0.001
            lease = book.request("t", now=clock[0], deadline=clock[0] + 10)
            assert isinstance(lease, Lease)
            slot = book.release(lease, now=clock[0])
            book.reset_done(slot, ok=True, now=clock[0])
        return 100

    free: deque[int] = deque(range(CONTAINERS * SLOTS))
    leased: dict[int, int] = {}

    def floor_cycle() -> int:
        for epoch in range(100):
            slot = free.popleft()
            leased[slot] = epoch
            del leased[slot]
            free.append(slot)
        return 100

    return _rate(cycle, seconds), _rate(floor_cycle, seconds)


TEXT_TURN = (
    "<think>The user wants the failing test fixed. Let me look at the file first, then run the "
    "suite to see the error.</think>\nI'll inspect the repository and run the tests.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la src && cat src/app.py"}}\n'
    "</tool_call>\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "python -m pytest -x -q"}}\n'
    "</tool_call>"
)


def bench_parser(seconds: float) -> tuple[float, float]:
    parser = get_parser("hermes")
    text = TEXT_TURN * 8
    size = len(text.encode())

    def parse() -> int:
        parsed = parser.parse(text)
        assert len(parsed.calls) == 16
        return size

    def floor() -> int:
        pos, found = 0, 0
        while (pos := text.find("<tool_call>", pos)) != -1:
            end = text.find("</tool_call>", pos)
            found += 1
            pos = end + 12
        assert found == 16
        return size

    return _rate(parse, seconds) / 1e6, _rate(floor, seconds) / 1e6


# ------------------------------------------------------------------------ parser families

FAMILY_TOOLS = [
    ToolSpec(
        name="bash",
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["command"],
        },
        validator=JSONSchemaValidator(),
    ),
    ToolSpec(
        name="read_file",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    ),
]
FAMILY_CALLS = [
    ToolCall(
        id="call_0",
        name="bash",
        arguments={"command": "ls -la src && cat src/app.py", "timeout": 60},
    ),
    ToolCall(id="call_1", name="bash", arguments={"command": "python -m pytest -x -q"}),
]
# Families whose values are text on the wire need the schemas to type them (and then the
# arguments are checked against them too); the others are measured as parsers alone.
TEXT_VALUED = ("qwen3_coder", "seed_oss", "glm45")
FAMILY_MARKERS = {
    "hermes": "<tool_call>",
    "qwen": "<tool_call>",
    "qwen3_coder": "<function=",
    "llama3_json": '"name"',
    "mistral": "[TOOL_CALLS]",
    "deepseek_v3": "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "deepseek_v31": "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "kimi_k2": "<|tool_call_begin|>",
    "glm45": "<tool_call>",
    "pythonic": "(",
    "llama4_pythonic": "(",
    "granite": '"name"',
    "seed_oss": "<function=",
}


def bench_parser_families(seconds: float) -> list[tuple[str, float, float, float, str]]:
    """One row per registered parser family: measured MB/s, floor MB/s, target, unit.

    The text is the hermes bench's turn (a think block, prose, two shell calls) written in the
    family's own format by its ``render``; one operation parses it 8 times.
    """
    rows = []
    for family in PARSER_NAMES:
        parser = get_parser(family)
        text = (
            "<think>The user wants the failing test fixed. Let me look at the file first, then "
            "run the suite to see the error.</think>\n"
            + parser.render(FAMILY_CALLS, content="I'll inspect the repository and run the tests.")
        )
        size = 8 * len(text.encode())
        tools = FAMILY_TOOLS if family in TEXT_VALUED else None
        marker = FAMILY_MARKERS[family]
        expected = text.count(marker)

        def parse(
            parser: ToolCallParser = parser,
            text: str = text,
            size: int = size,
            tools: list[ToolSpec] | None = tools,
        ) -> int:
            for _ in range(8):
                parsed = parser.parse(text, tools=tools)
                assert len(parsed.calls) == len(FAMILY_CALLS), parsed.errors
            return size

        def floor(
            text: str = text, marker: str = marker, expected: int = expected, size: int = size
        ) -> int:
            for _ in range(8):
                pos, found = 0, 0
                while (pos := text.find(marker, pos)) != -1:
                    found += 1
                    pos += len(marker)
                assert found == expected
            return size

        name = f"{family} turn" + ("+schema" if tools else "")
        rows.append((name, _rate(parse, seconds) / 1e6, _rate(floor, seconds) / 1e6, 10.0, "MB/s"))
    return rows


# Typical tool calls: a shell command, a file write, and a pydantic-written search tool (an
# Optional through anyOf, an enum through $ref, bounds, a length limit, no extra properties).
VALIDATOR_TOOLS: list[tuple[JSONObject, JSONObject]] = [
    (
        {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
        {"command": "python -m pytest -x -q tests/test_app.py", "timeout": 30},
    ),
    (
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "content": {"type": "string"},
                "append": {"type": "boolean"},
            },
            "required": ["path", "content"],
        },
        {"path": "src/app.py", "content": "def add(a, b):\n    return a + b\n"},
    ),
    (
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 200},
                "limit": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                "lang": {"$ref": "#/$defs/Lang"},
            },
            "required": ["query"],
            "additionalProperties": False,
            "$defs": {"Lang": {"enum": ["py", "rs", "go"], "type": "string"}},
        },
        {"query": "def parse_config", "limit": 5, "lang": "py"},
    ),
]


def _floor_check(arguments: JSONObject) -> bool:
    """The same three calls checked by hand-written Python: the floor of any validator."""
    command = arguments.get("command")
    if command is not None:
        timeout = arguments.get("timeout")
        return isinstance(command, str) and (
            timeout is None or (isinstance(timeout, int | float) and not isinstance(timeout, bool))
        )
    path = arguments.get("path")
    if path is not None:
        return isinstance(path, str) and bool(path) and isinstance(arguments.get("content"), str)
    query, limit = arguments.get("query"), arguments.get("limit")
    return (
        isinstance(query, str)
        and len(query) <= 200
        and (limit is None or (type(limit) is int and limit >= 1))
        and arguments.get("lang", "py") in ("py", "rs", "go")
        and not (arguments.keys() - {"query", "limit", "lang"})
    )


def bench_validator(seconds: float) -> tuple[float, float]:
    """Validations per second of typical tool calls through ``JSONSchemaValidator``, compiled
    once per tool, beside the hand-written floor."""
    checks = [
        (ToolSpec(name=f"t{i}", parameters=schema, validator=JSONSchemaValidator()), args)
        for i, (schema, args) in enumerate(VALIDATOR_TOOLS)
    ]

    def validate() -> int:
        for _ in range(100):
            for spec, arguments in checks:
                assert not spec.validate_arguments(arguments)
        return 100 * len(checks)

    def floor() -> int:
        for _ in range(100):
            for _, arguments in checks:
                assert _floor_check(arguments)
        return 100 * len(checks)

    return _rate(validate, seconds), _rate(floor, seconds)


GROUPS = ("planner", "slot_book", "parsers", "validator")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per figure")
    parser.add_argument(
        "--only",
        action="append",
        choices=GROUPS,
        help="run only this group of rows (repeatable; default: every group)",
    )
    args = parser.parse_args()
    groups = args.only or GROUPS
    rows: list[tuple[str, float, float, float, str]] = []
    if "planner" in groups:
        rows.append(("planner offer+flush", *bench_planner(args.seconds), 100_000.0, "ops/s"))
    if "slot_book" in groups:
        rows.append(("slot book lease+release", *bench_slot_book(args.seconds), 100_000.0, "ops/s"))
    if "parsers" in groups:
        rows.append(("hermes parser", *bench_parser(args.seconds), 10.0, "MB/s"))
        rows.extend(bench_parser_families(args.seconds / 4))
    if "validator" in groups:
        rows.append(("tool-argument validator", *bench_validator(args.seconds), 100_000.0, "ops/s"))
    print(f"{'path':<26}{'measured':>17}{'floor':>19}{'of floor':>10}{'target':>16}  verdict")
    for name, measured, floor, target, unit in rows:
        verdict = "met" if measured >= target else "NOT met"
        print(
            f"{name:<26}{measured:>11,.1f} {unit:<5}{floor:>13,.1f} {unit:<5}"
            f"{measured / floor:>10.3f}{target:>10,.0f} {unit:<5}  {verdict}"
        )


if __name__ == "__main__":
    main()
