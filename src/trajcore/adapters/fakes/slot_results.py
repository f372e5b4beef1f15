"""The results of the in-process pools' calls (``FakeSandboxPool``, ``UnisolatedSandboxPool``),
worded as the slot server words them, so an env's checks read the same text on every pool.

A command's result carries its stdout, then its stderr under ``[stderr]``, then a non-zero exit
code; past its timeout it is a ``TIMEOUT`` saying so. A file tool's failure is the call's
``TOOL_ERROR`` naming the path and the reason. These functions do no I/O.
"""

from __future__ import annotations

import errno
import os

from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ExecReport, ToolOutcome, ToolResult, timeout_end

__all__ = ["command_result", "file_error", "no_such_file", "wrote"]


def command_result(call: SlotCall, report: ExecReport) -> ToolResult:
    """Shape a report as the slot server does: stdout, then stderr, then the exit code."""
    text = report.stdout
    if report.stderr:
        text += ("\n" if text and not text.endswith("\n") else "") + f"[stderr]\n{report.stderr}"
    if report.timed_out:
        end = timeout_end(call.call.name, None)  # a stateful shell keeps its state here
        reason = f"timed out after {call.timeout_s:g} s; {end}"
        return ToolResult(
            call_id=call.call.id, name=call.call.name, outcome=ToolOutcome.TIMEOUT,
            content=f"{text}\n[{reason}]", error=reason, exec=report,
        )  # fmt: skip
    if report.exit_code:
        text += f"\n[exit code {report.exit_code}]"
    return ToolResult(
        call_id=call.call.id, name=call.call.name, outcome=ToolOutcome.OK, content=text,
        exec=report,
    )  # fmt: skip


def wrote(call: SlotCall, size: int) -> ToolResult:
    """The result of a successful ``write_file`` of ``size`` bytes, as the slot server words it."""
    return ToolResult(
        call_id=call.call.id, name=call.call.name, outcome=ToolOutcome.OK,
        content=f"wrote {size} bytes to {call.arguments['path']}",
    )  # fmt: skip


def file_error(call: SlotCall, reason: str) -> ToolResult:
    """A file tool's ``TOOL_ERROR`` as the slot server words it: ``cannot read 'd': {reason}``."""
    verb = "read" if call.call.name == "read_file" else "write"
    reason = f"cannot {verb} {call.arguments['path']!r}: {reason}"
    return ToolResult.failure(call.call, ToolOutcome.TOOL_ERROR, reason)


def no_such_file(call: SlotCall) -> ToolResult:
    """The result of a ``read_file`` of a path that is not there."""
    return file_error(call, os.strerror(errno.ENOENT))
