"""The slot tools: one ``ExecuteCall`` carried out in its slot, and the reply made its result.

``bash``, ``bash_stateful`` and ``tmux`` become one request to the lease's exec agent (started
on the slot's first command); ``read_file`` and ``write_file`` run in the server, confined by the
slot's ``Workspace``. Unknown tools and bad arguments are ``REJECTED`` with ``reason @ $.path``;
a sandbox that dies mid-call is ``INFRA_ERROR`` (and the lease ends with it: its processes,
shell and ``/tmp`` are gone, so the next call of that epoch is refused, not run elsewhere).
"""

from __future__ import annotations

import asyncio
from typing import cast

from trajcore.adapters.slot_server.channel import MAX_REQUEST_BYTES, AgentLost, encode_request
from trajcore.adapters.slot_server.sandboxes import Sandboxes, Slot
from trajcore.domain.errors import ToolArgumentError
from trajcore.domain.isolation import clamp_timeout
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_calls import StaleEpoch
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS, ExecuteCall
from trajcore.domain.tools import ExecReport, ToolOutcome, ToolResult, ToolSpec

__all__ = ["failure", "run_call"]

_TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in SLOT_TOOL_SPECS}


def _result(
    call: ExecuteCall, outcome: ToolOutcome, content: str, *, error: str | None = None,
    exec_report: ExecReport | None = None,
) -> ToolResult:  # fmt: skip
    return ToolResult(
        call_id=call.call_id,
        name=call.tool,
        outcome=outcome,
        content=content,
        error=error,
        exec=exec_report,
    )


def failure(
    call: ExecuteCall, outcome: ToolOutcome, reason: str, exec_report: ExecReport | None = None
) -> ToolResult:
    return _result(call, outcome, f"Error: {reason}", error=reason, exec_report=exec_report)


async def run_call(
    sandboxes: Sandboxes, slot: Slot, call: ExecuteCall, *, unsandboxed_why: str
) -> ToolResult:
    """Run ``call`` in ``slot`` now; its failure is its result, never an exception.
    ``unsandboxed_why``: why the host has no usable sandbox (for a isolation that requires one)."""
    spec = _TOOLS.get(call.tool)
    if spec is None:
        known = ", ".join(_TOOLS)
        return failure(
            call,
            ToolOutcome.REJECTED,
            f"unknown tool {call.tool!r} (this slot runs {known}) @ $.tool",
        )
    problems = spec.validate_arguments(call.arguments)
    if problems:
        return failure(call, ToolOutcome.REJECTED, f"{problems[0]} (tool {call.tool})")
    isolation = sandboxes.config.isolation
    if isolation.require_sandbox and not sandboxes.sandboxed:
        reason = f"a sandbox is required and bubblewrap is unusable: {unsandboxed_why}"
        return failure(call, ToolOutcome.INFRA_ERROR, reason)
    timeout = clamp_timeout(isolation, call.timeout_s, call.arguments.get("timeout"))
    if call.tool == "read_file":
        return await _read_file(sandboxes, slot, call)
    if call.tool == "write_file":
        return await _write_file(sandboxes, slot, call)
    return await _run_command(sandboxes, slot, call, timeout)


# ------------------------------------------------------------------------- commands


async def _run_command(
    sandboxes: Sandboxes, slot: Slot, call: ExecuteCall, limit_s: float
) -> ToolResult:
    timeout = limit_s
    cap = sandboxes.config.isolation.output_cap_bytes
    args = call.arguments
    fields: list[str]
    if call.tool == "bash":
        fields = ["exec", repr(timeout), str(cap), "/bin/sh", "-c", str(args["command"])]
    elif call.tool == "bash_stateful":
        fields = ["stateful", repr(timeout), str(cap), str(args["command"])]
    else:
        keys = args["keys"]
        wait = args.get("wait_s", 0.3)
        lines = args.get("lines", 50)
        fields = [
            "tmux",
            "1" if args.get("literal", True) is True else "0",
            "1" if args.get("enter", True) is True else "0",
            repr(min(max(float(wait), 0.0), timeout) if isinstance(wait, int | float) else 0.3),
            str(min(max(int(lines), 1), 10_000) if isinstance(lines, int) else 50),
            *([keys] if isinstance(keys, str) else [str(k) for k in cast("list[JSON]", keys)]),
        ]
    name = "keys" if call.tool == "tmux" else "command"
    if any("\0" in field for field in fields):
        reason = "holds a NUL character, which no command line can carry @ $." + name
        return failure(call, ToolOutcome.REJECTED, reason)
    try:
        payload = encode_request(fields)
    except UnicodeEncodeError as error:
        reason = f"not valid Unicode text (a lone surrogate at {error.start}) @ $.{name}"
        return failure(call, ToolOutcome.REJECTED, reason)
    if len(payload) > MAX_REQUEST_BYTES:
        reason = f"{len(payload)} bytes, over the limit of {MAX_REQUEST_BYTES} @ $.{name}"
        return failure(call, ToolOutcome.REJECTED, reason)
    if slot.agent_epoch == call.epoch and (slot.agent is None or not slot.agent.alive()):
        if slot.agent is not None:
            await sandboxes.stop_agent(slot)
        reason = (
            f"the slot's sandbox ended during lease epoch {call.epoch}, and its processes, "
            "shell and /tmp with it; reset the slot to start a new lease"
        )
        return failure(call, ToolOutcome.INFRA_ERROR, reason)
    try:
        agent = await sandboxes.ensure_agent(slot)
    except AgentLost as error:
        return failure(call, ToolOutcome.INFRA_ERROR, f"the slot's sandbox did not start: {error}")
    retired = slot.calls.retired_epoch
    if call.epoch <= retired:
        # a reset came while the sandbox started: its stop found no lease to interrupt, so the
        # call must not begin in the lease that reset is about to end
        stale = StaleEpoch(epoch=call.epoch, retired=retired)
        return failure(call, ToolOutcome.REJECTED, stale.message)
    slot.agent_epoch = call.epoch
    try:
        reply = await agent.request(payload, timeout + sandboxes.config.agent_grace_s)
    except AgentLost as error:
        await sandboxes.stop_agent(slot)
        return failure(call, ToolOutcome.INFRA_ERROR, str(error))
    return _command_result(call, reply, timeout, sandboxed=agent.sandboxed)


async def _read_file(sandboxes: Sandboxes, slot: Slot, call: ExecuteCall) -> ToolResult:
    cap = sandboxes.config.isolation.file_cap_bytes
    asked = call.arguments.get("max_bytes")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        cap = min(cap, asked)
    path = cast("str", call.arguments["path"])
    try:
        found = await asyncio.to_thread(slot.workspace.read, path, cap)
    except ToolArgumentError as error:
        return failure(call, ToolOutcome.REJECTED, f"{error.reason} @ $.{error.field}")
    except OSError as error:
        return failure(call, ToolOutcome.TOOL_ERROR, f"cannot read {path!r}: {error.strerror}")
    text = found.data.decode("utf-8", "replace")
    if found.truncated:
        text += f"\n[... truncated: showing {len(found.data)} of {found.size} bytes]"
    return _result(call, ToolOutcome.OK, text)


async def _write_file(sandboxes: Sandboxes, slot: Slot, call: ExecuteCall) -> ToolResult:
    path = cast("str", call.arguments["path"])
    try:
        data = cast("str", call.arguments["content"]).encode("utf-8")
    except UnicodeEncodeError as error:
        reason = f"not valid Unicode text (a lone surrogate at {error.start}) @ $.content"
        return failure(call, ToolOutcome.REJECTED, reason)
    append = call.arguments.get("append") is True
    try:
        limit = sandboxes.config.isolation.file_cap_bytes
        written = await asyncio.to_thread(
            lambda: slot.workspace.write(path, data, append=append, max_bytes=limit)
        )
    except ToolArgumentError as error:
        return failure(call, ToolOutcome.REJECTED, f"{error.reason} @ $.{error.field}")
    except OSError as error:
        return failure(call, ToolOutcome.TOOL_ERROR, f"cannot write {path!r}: {error.strerror}")
    return _result(call, ToolOutcome.OK, f"wrote {written} bytes to {path}")


def _command_result(
    call: ExecuteCall, reply: dict[str, JSON], timeout: float, *, sandboxed: bool
) -> ToolResult:
    def number(key: str) -> int:
        value = reply.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    problem = reply.get("error")
    exit_code = reply.get("exit")
    exit_code = exit_code if isinstance(exit_code, int) else None
    duration = reply.get("duration")
    report = ExecReport(
        exit_code=exit_code,
        stdout=str(reply.get("stdout") or ""),
        stderr=str(reply.get("stderr") or ""),
        stdout_dropped=number("stdout_dropped"),
        stderr_dropped=number("stderr_dropped"),
        timed_out=reply.get("timed_out") is True,
        duration_s=max(float(duration), 0.0) if isinstance(duration, int | float) else 0.0,
        sandboxed=sandboxed,
    )
    if isinstance(problem, str):
        return failure(call, ToolOutcome.TOOL_ERROR, problem, report)
    parts = [report.stdout]
    if report.stderr:
        if parts[0] and not parts[0].endswith("\n"):
            parts.append("\n")
        parts.append(f"[stderr]\n{report.stderr}")
    if report.timed_out:
        reason = f"timed out after {timeout:g} s; its process group was killed"
        return _result(
            call, ToolOutcome.TIMEOUT, "".join([*parts, f"\n[{reason}]"]), error=reason,
            exec_report=report,
        )  # fmt: skip
    signal_number = reply.get("signal")
    if exit_code is None and isinstance(signal_number, int):
        reason = f"killed by signal {signal_number}"
        return _result(
            call, ToolOutcome.TOOL_ERROR, "".join([*parts, f"\n[{reason}]"]), error=reason,
            exec_report=report,
        )  # fmt: skip
    if exit_code:
        parts.append(f"\n[exit code {exit_code}]")
    return _result(call, ToolOutcome.OK, "".join(parts), exec_report=report)
