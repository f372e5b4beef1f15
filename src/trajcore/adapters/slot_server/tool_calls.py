"""The slot tools: one ``ExecuteCall`` carried out in its slot, and the reply made its result.

``bash``, ``bash_stateful`` and ``tmux`` become one request to the lease's exec agent (started
on the slot's first command); ``read_file`` and ``write_file`` run in the server, confined by the
slot's ``Workspace``. Unknown tools and bad arguments are ``REJECTED`` with ``reason @ $.path``
(for a file tool's path: a malformed one, absolute, with ``..``, empty); what a well-formed path
finds is the tool's answer, ``TOOL_ERROR`` naming the path and what is there (missing, a
directory, a FIFO, socket or device, a symlink leading out of the workspace or looping);
a sandbox that dies mid-call is ``INFRA_ERROR`` (and the lease ends with it: its processes,
shell and ``/tmp`` are gone, so the next call of that epoch is refused, not run elsewhere).

A command during which the kernel's out-of-memory killer ended processes of the slot says so in
a line after its output, naming the slot's ``memory_bytes``: a shell prints only ``Killed``, as
for any SIGKILL. The count of the slot's memory cgroup (``SlotCgroup.new_oom_kills``) is read
when the slot's first call is sent and after a reply that shows a kill (a signal, an exit code
above 128, a timeout, an error), never on a plain command's path (a read costs about 15 us,
a quarter of the server's CPU per call); so a kill in the middle of a pipeline whose last
command ends well is told at the next reply that shows one. Without a memory cgroup nothing
counts such kills (rlimits make an allocation fail instead), and no line is added.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from typing import cast

from trajcore.adapters.slot_server.channel import MAX_REQUEST_BYTES, AgentLost, encode_request
from trajcore.adapters.slot_server.disk_budget import over_for
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.workspace import RefusedFile
from trajcore.domain.errors import ToolArgumentError
from trajcore.domain.file_calls import file_call_problem
from trajcore.domain.isolation import SlotIsolation, clamp_timeout
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_calls import Refusal, StaleEpoch
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS, ExecuteCall, home_relative
from trajcore.domain.tool_schema import BUILTIN_VALIDATOR
from trajcore.domain.tools import (
    ExecReport,
    SandboxBudget,
    ToolOutcome,
    ToolResult,
    ToolSpec,
    timeout_end,
)

__all__ = [
    "agent_result", "failure", "flat_check", "lease_root", "lost_result", "refused", "run_call",
    "start_call",
]  # fmt: skip

_TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in SLOT_TOOL_SPECS}
_COMMANDS = frozenset({"bash", "bash_stateful", "tmux"})  # what the lease's agent runs
_NO_TMUX = "no_tmux"  # the agent's error ``code``: its lease's root has no tmux

# JSON-schema types a flat schema's properties may have, as the exact Python types that
# ``json.loads`` makes for them (``bool`` is not an ``int`` here, nor an ``int`` a ``float``'s
# only form: ``number`` takes both).
_FLAT_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
}  # fmt: skip
_ANNOTATIONS = frozenset({"description", "title"})


def flat_check(spec: ToolSpec) -> Callable[[dict[str, JSON]], bool] | None:
    """A quick test that is true only for arguments ``spec``'s checker finds nothing wrong
    with: every required property present, every known property of its exact type, anything
    else allowed. ``None`` when the schema is not that flat (or the spec has another checker).

    ``run_call`` asks it before ``spec.validate_arguments``, which it then skips; arguments the
    test does not pass still go through the checker, which names the fault.
    """
    schema = spec.parameters
    if spec.validator is not BUILTIN_VALIDATOR or schema.get("type") != "object":
        return None
    if set(schema) - {"type", "properties", "required"} - _ANNOTATIONS:
        return None
    properties, required = schema.get("properties", {}), schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    kinds: dict[str, tuple[type, ...]] = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or set(sub) - {"type"} - _ANNOTATIONS:
            return None
        kind = sub.get("type")
        if not isinstance(kind, str) or kind not in _FLAT_TYPES:
            return None
        kinds[name] = _FLAT_TYPES[kind]
    needed = tuple(name for name in required if isinstance(name, str))
    if len(needed) != len(required):
        return None
    typed = tuple(kinds.items())

    def fits(arguments: dict[str, JSON]) -> bool:
        for name in needed:
            if name not in arguments:
                return False
        for name, types in typed:
            if name in arguments and type(arguments[name]) not in types:
                return False
        return True

    return fits


_FLAT: dict[str, Callable[[dict[str, JSON]], bool] | None] = {
    name: flat_check(spec) for name, spec in _TOOLS.items()
}


def _result(
    call: ExecuteCall, outcome: ToolOutcome, content: str, *, error: str | None = None,
    exec_report: ExecReport | None = None, sandbox_budget: SandboxBudget | None = None,
    lease_refused: bool = False,
) -> ToolResult:  # fmt: skip
    return ToolResult(
        call_id=call.call_id,
        name=call.tool,
        outcome=outcome,
        content=content,
        error=error,
        exec=exec_report,
        sandbox_budget=sandbox_budget,
        lease_refused=lease_refused,
    )


def failure(
    call: ExecuteCall, outcome: ToolOutcome, reason: str, exec_report: ExecReport | None = None
) -> ToolResult:
    return _result(call, outcome, f"Error: {reason}", error=reason, exec_report=exec_report)


def _over_disk(call: ExecuteCall, reason: str) -> ToolResult:
    """The result of a call whose lease was ended for its disk budget: ``TOOL_ERROR`` naming
    the budget (``reason``), marked ``SandboxBudget.DISK`` so that the caller knows without
    reading the text that the policy's own writes ended the lease."""
    return _result(
        call, ToolOutcome.TOOL_ERROR, f"Error: {reason}", error=reason,
        sandbox_budget=SandboxBudget.DISK,
    )  # fmt: skip


def refused(call: ExecuteCall, reason: Refusal) -> ToolResult:
    """The result of a call the slot's queue refused: a stale epoch is the caller's mistake
    (``REJECTED``, marked ``lease_refused``), a broken slot or a closing server is the
    infrastructure's."""
    if isinstance(reason, StaleEpoch):
        return lease_refusal(call, reason.message)
    return failure(call, ToolOutcome.INFRA_ERROR, reason.message)


def lease_refusal(call: ExecuteCall, reason: str) -> ToolResult:
    """The result of a call refused for its lease (``ToolResult.lease_refused``): its epoch,
    its slot."""
    return _result(call, ToolOutcome.REJECTED, f"Error: {reason}", error=reason, lease_refused=True)


def _refusal(sandboxes: Sandboxes, call: ExecuteCall, unsandboxed_why: str) -> ToolResult | None:
    """Why ``call`` is not run at all (an unknown tool, bad arguments, no sandbox where one is
    required), or ``None``."""
    spec = _TOOLS.get(call.tool)
    if spec is None:
        known = ", ".join(_TOOLS)
        return failure(
            call,
            ToolOutcome.REJECTED,
            f"unknown tool {call.tool!r} (this slot runs {known}) @ $.tool",
        )
    fits = _FLAT[call.tool]
    if fits is None or not fits(call.arguments):
        problems = spec.validate_arguments(call.arguments)
        if problems:
            return failure(call, ToolOutcome.REJECTED, f"{problems[0]} (tool {call.tool})")
    if sandboxes.config.isolation.require_sandbox and not sandboxes.sandboxed:
        reason = f"a sandbox is required and bubblewrap is unusable: {unsandboxed_why}"
        return failure(call, ToolOutcome.INFRA_ERROR, reason)
    return None


async def run_call(
    sandboxes: Sandboxes, slot: Slot, call: ExecuteCall, *, unsandboxed_why: str,
    time_left_s: float | None = None,
) -> ToolResult:  # fmt: skip
    """Run ``call`` in ``slot`` now; its failure is its result, never an exception.
    ``unsandboxed_why``: why the host has no usable sandbox (for a isolation that requires one).
    ``time_left_s``: what remains of its turn's time (> 0), a cut to its limit."""
    refused = _refusal(sandboxes, call, unsandboxed_why)
    if refused is not None:
        return refused
    isolation = sandboxes.config.isolation
    timeout = _limit(isolation, call, time_left_s)
    if call.tool == "read_file":
        return await _read_file(sandboxes, slot, call)
    if call.tool == "write_file":
        return await _write_file(sandboxes, slot, call)
    return await _run_command(sandboxes, slot, call, timeout)


def _limit(isolation: SlotIsolation, call: ExecuteCall, time_left_s: float | None) -> float:
    """The limit ``call`` runs under: its own (``clamp_timeout``), cut to what remains of its
    turn's time when it starts (``time_left_s``; past the isolation's floor, too: the turn's
    time bounds the calls of its turn in the slot all together)."""
    timeout = clamp_timeout(isolation, call.timeout_s, call.arguments.get("timeout"))
    return timeout if time_left_s is None or time_left_s >= timeout else time_left_s


def start_call(
    sandboxes: Sandboxes, slot: Slot, call: ExecuteCall, *, unsandboxed_why: str,
    done: Callable[[ToolResult | AgentLost], None], time_left_s: float | None = None,
) -> ToolResult | bool:  # fmt: skip
    """Start a command on the slot's running lease without a task of its own, when that is all
    it needs: a command tool, for the lease epoch whose agent is up and idle (not warming, not
    just warmed, over the root the lease asks for). Returns ``False`` when the call needs
    ``run_call`` (nothing was done); a ``ToolResult`` when it is answered at once (refused);
    ``True`` when it was sent, and then ``done`` is called once, from the event loop, with its
    result or with the ``AgentLost`` that ended the lease (the caller stops the agent and
    answers ``INFRA_ERROR``, as ``run_call`` does)."""
    agent = slot.agent
    if (
        call.tool not in _COMMANDS or agent is None or slot.warming is not None
        or slot.warmed is agent or not agent.idle() or not agent.alive()
        or slot.agent_epoch != call.epoch or call.epoch <= slot.calls.retired_epoch
        or slot.agent_root != (None if slot.image is None else slot.lease_op())
        or over_for(slot, call.epoch) is not None  # run_call answers it, naming the budget
    ):  # fmt: skip
        return False
    refused = _refusal(sandboxes, call, unsandboxed_why)
    if refused is not None:
        return refused
    isolation = sandboxes.config.isolation
    timeout = _limit(isolation, call, time_left_s)
    asked = _command_request(sandboxes, call, timeout)
    if isinstance(asked, ToolResult):
        return asked
    sandboxed, root = agent.sandboxed, lease_root(slot)
    _oom_baseline(slot)

    def answer(outcome: dict[str, JSON] | AgentLost) -> None:
        if isinstance(outcome, AgentLost):
            done(outcome)
            return
        try:
            oom = _oom_during(sandboxes, slot, outcome)
            result = agent_result(
                call, outcome, timeout, sandboxed=sandboxed, root=root, out_of_memory=oom
            )
        except Exception as error:  # noqa: BLE001 - every call gets a result, whatever failed
            reason = f"slot server fault: {type(error).__name__}: {error}"
            result = failure(call, ToolOutcome.INFRA_ERROR, reason)
        done(result)

    agent.send(asked, timeout + sandboxes.config.agent_grace_s, answer)
    return True


# ------------------------------------------------------------------------- commands


def _command_request(sandboxes: Sandboxes, call: ExecuteCall, timeout: float) -> ToolResult | bytes:
    """The agent request for a command tool's call, or its refusal (a NUL, a lone surrogate,
    a request over ``MAX_REQUEST_BYTES``)."""
    cap = sandboxes.config.isolation.output_cap_bytes
    args = call.arguments
    if call.tool != "tmux":  # the fields before the command are the same for most calls
        command = str(args["command"])
        if "\0" in command:
            reason = "holds a NUL character, which no command line can carry @ $.command"
            return failure(call, ToolOutcome.REJECTED, reason)
        try:
            head = _command_head(call.tool, repr(timeout), cap, hook=call.hook)
            payload = head + encode_request([command])
        except UnicodeEncodeError as error:
            reason = f"not valid Unicode text (a lone surrogate at {error.start}) @ $.command"
            return failure(call, ToolOutcome.REJECTED, reason)
        return _within_limit(call, payload, "command")
    keys = args["keys"]
    wait = args.get("wait_s", 0.3)
    lines = args.get("lines", 50)
    fields = [
        "tmux",
        "1" if args.get("literal", True) is True else "0",
        "1" if args.get("enter", True) is True else "0",
        repr(_wait_s(wait, timeout)),
        str(min(max(int(lines), 1), 10_000) if isinstance(lines, int) else 50),
        *([keys] if isinstance(keys, str) else [str(k) for k in cast("list[JSON]", keys)]),
    ]
    if any("\0" in field for field in fields):
        reason = "holds a NUL character, which no command line can carry @ $.keys"
        return failure(call, ToolOutcome.REJECTED, reason)
    try:  # the call's timeout goes after the op: the agent keeps every tmux step within it
        payload = encode_request([fields[0], repr(timeout), *fields[1:]])
    except UnicodeEncodeError as error:
        reason = f"not valid Unicode text (a lone surrogate at {error.start}) @ $.keys"
        return failure(call, ToolOutcome.REJECTED, reason)
    return _within_limit(call, payload, "keys")


def _wait_s(wait: JSON, timeout: float) -> float:
    """The tmux tool's wait: the model's ``wait_s`` within ``[0, timeout]`` (past a float's
    range: ``timeout``), 0.3 s when it is not a number."""
    if not isinstance(wait, int | float):
        return 0.3
    try:
        seconds = float(wait)
    except OverflowError:  # an int past a float's range (10**400)
        return timeout
    return 0.3 if math.isnan(seconds) else min(max(seconds, 0.0), timeout)


@functools.lru_cache(maxsize=64)
def _command_head(tool: str, timeout: str, cap: int, *, hook: bool) -> bytes:
    """The encoded fields of a ``bash`` or ``bash_stateful`` request before its command (the
    op, the timeout as ``repr`` writes it, the output cap, and for ``bash`` the shell): they
    hold no NUL and are the same for every call of a lease with one timeout. A hook's ``bash``
    is a ``verify`` request: its command may use the lease's process reserve."""
    if tool == "bash":
        op = "verify" if hook else "exec"
        return encode_request([op, timeout, str(cap), "/bin/sh", "-c"])
    return encode_request(["stateful", timeout, str(cap)])


def _within_limit(call: ExecuteCall, payload: bytes, name: str) -> ToolResult | bytes:
    if len(payload) > MAX_REQUEST_BYTES:
        reason = f"{len(payload)} bytes, over the limit of {MAX_REQUEST_BYTES} @ $.{name}"
        return failure(call, ToolOutcome.REJECTED, reason)
    return payload


async def _run_command(
    sandboxes: Sandboxes, slot: Slot, call: ExecuteCall, limit_s: float
) -> ToolResult:
    timeout = limit_s
    payload = _command_request(sandboxes, call, timeout)
    if isinstance(payload, ToolResult):
        return payload
    if (over := over_for(slot, call.epoch)) is not None:
        return _over_disk(call, over)
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
    if (over := over_for(slot, call.epoch)) is not None:  # marked while the agent started
        return _over_disk(call, over)
    retired = slot.calls.retired_epoch
    if call.epoch <= retired:
        # a reset came while the sandbox started: its stop found no lease to interrupt, so the
        # call must not begin in the lease that reset is about to end
        return lease_refusal(call, StaleEpoch(epoch=call.epoch, retired=retired).message)
    slot.agent_epoch = call.epoch
    root = lease_root(slot)  # the slot may hold the next lease by the time the reply is read
    _oom_baseline(slot)
    try:
        reply = await agent.request(payload, timeout + sandboxes.config.agent_grace_s)
    except AgentLost as error:
        await sandboxes.stop_agent(slot)
        return lost_result(slot, call, error)
    oom = _oom_during(sandboxes, slot, reply)
    return agent_result(
        call, reply, timeout, sandboxed=agent.sandboxed, root=root, out_of_memory=oom
    )


def _oom_baseline(slot: Slot) -> None:
    """Read the slot's out-of-memory kills so far, once (its first call): later calls compare
    with it only when their reply shows a kill (``_oom_during``)."""
    if slot.cgroup is not None and slot.cgroup.oom_seen is None:
        slot.cgroup.new_oom_kills()


def _shows_a_kill(reply: dict[str, JSON]) -> bool:
    """Whether an agent's reply may hide an out-of-memory kill: a signal, an exit code past 128
    (a shell's child killed), a timeout, or an error."""
    code = reply.get("exit")
    return (
        type(reply.get("signal")) is int
        or (type(code) is int and code > 128)
        or reply.get("timed_out") is True
        or "error" in reply
    )


def _oom_during(sandboxes: Sandboxes, slot: Slot, reply: dict[str, JSON]) -> str | None:
    """What to tell of the kernel's out-of-memory killer for a reply that shows a kill: a
    sentence naming the slot's memory limit when it ended processes of the slot since the
    count was last read, else ``None`` (also for a reply that shows none: nothing is read)."""
    limit = sandboxes.config.isolation.memory_bytes
    if slot.cgroup is None or limit is None or not _shows_a_kill(reply):
        return None
    count = slot.cgroup.new_oom_kills()
    if count == 0:
        return None
    who = "a process of the slot was" if count == 1 else f"{count} processes of the slot were"
    return (
        f"{who} killed by the kernel's out-of-memory killer: the slot's memory limit of "
        f"{limit} bytes (memory_bytes) was reached"
    )


def _file_failure(
    call: ExecuteCall, verb: str, path: str, error: ToolArgumentError | OSError
) -> ToolResult:
    """The result of a file tool that could not ``verb`` (read, write) ``path``: ``REJECTED``
    naming the argument at fault, else ``TOOL_ERROR`` saying why (what the workspace holds
    there, or the system's reason)."""
    if isinstance(error, RefusedFile):
        return failure(call, ToolOutcome.TOOL_ERROR, f"cannot {verb} {path!r}: it {error.what}")
    if isinstance(error, ToolArgumentError):
        return failure(call, ToolOutcome.REJECTED, f"{error.reason} @ $.{error.field}")
    return failure(call, ToolOutcome.TOOL_ERROR, f"cannot {verb} {path!r}: {error.strerror}")


async def _read_file(sandboxes: Sandboxes, slot: Slot, call: ExecuteCall) -> ToolResult:
    cap = sandboxes.config.isolation.file_cap_bytes
    asked = call.arguments.get("max_bytes")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        cap = min(cap, asked)
    path = cast("str", call.arguments["path"])
    try:
        found = await asyncio.to_thread(slot.workspace.read, home_relative(path), cap)
    except (ToolArgumentError, OSError) as error:
        return _file_failure(call, "read", path, error)
    text, shown = await asyncio.to_thread(_text_within, found.data, cap)
    if found.truncated or shown < len(found.data):
        text += f"\n[... truncated: showing {shown} of {found.size} bytes]"
    return _result(call, ToolOutcome.OK, text)


# What JSON adds to a character of a result's text: 5 bytes for a control character written
# ``\u00XX``, 1 for the ones with a short escape (``\n``) and for ``"`` and ``\``.
_ESCAPE_EXTRA = {chr(c): 5 for c in range(0x20)} | dict.fromkeys('\b\t\n\f\r"\\', 1)


def _json_bytes(text: str) -> int:
    """The bytes ``text`` takes as a JSON string's contents (UTF-8, escapes written out)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return size + sum(text.count(char) * extra for char, extra in _ESCAPE_EXTRA.items())


def _text_within(data: bytes, cap: int) -> tuple[str, int]:
    """The text of the longest prefix of ``data`` whose JSON string fits in ``cap`` bytes, and
    that prefix's length in bytes. A file of control characters (zeros, binary) takes up to six
    times its size as JSON: each read of it kept to ``cap`` bytes keeps a batch's answer within
    what the pool's client accepts, however many slots read such a file at once."""
    shown = len(data)
    while True:
        text = data[:shown].decode("utf-8", "replace")
        size = _json_bytes(text)
        if size <= cap or shown == 0:
            return text, shown
        shown = shown * cap // size  # strictly less: size > cap


def lost_result(slot: Slot, call: ExecuteCall, lost: AgentLost) -> ToolResult:
    """The result of a call whose lease was lost: ``TOOL_ERROR`` naming the disk budget (and
    marked so) when the lease was ended for passing it, else ``INFRA_ERROR`` naming the loss."""
    over = over_for(slot, call.epoch)
    if over is not None:
        return _over_disk(call, over)
    return failure(call, ToolOutcome.INFRA_ERROR, str(lost))


async def _write_file(sandboxes: Sandboxes, slot: Slot, call: ExecuteCall) -> ToolResult:
    path = cast("str", call.arguments["path"])
    if (over := over_for(slot, call.epoch)) is not None:
        return _over_disk(call, over)
    refusal = file_call_problem(call.tool, call.arguments)  # every pool's rule: path, content
    if refusal is not None:
        return failure(call, ToolOutcome.REJECTED, refusal)
    data = cast("str", call.arguments["content"]).encode("utf-8")
    append = call.arguments.get("append") is True
    try:
        limit = sandboxes.config.isolation.file_cap_bytes
        written = await asyncio.to_thread(
            lambda: slot.workspace.write(home_relative(path), data, append=append, max_bytes=limit)
        )
    except (ToolArgumentError, OSError) as error:
        return _file_failure(call, "write", path, error)
    slot.disk_written = call.epoch  # the disk budget's watch measures the lease's area next
    return _result(call, ToolOutcome.OK, f"wrote {written} bytes to {path}")


def lease_root(slot: Slot) -> str:
    """What the slot's lease runs over, as a result names it: the image's reference, or the
    slot server's host. Taken when a call is sent: by the time its reply is read, a reset may
    have handed the slot to a lease over another root."""
    return "the slot server's host" if slot.image is None else f"image {slot.image.image.ref}"


def agent_result(
    call: ExecuteCall, reply: dict[str, JSON], timeout: float, *, sandboxed: bool, root: str,
    out_of_memory: str | None = None,
) -> ToolResult:  # fmt: skip
    """The result of a command from the agent's ``reply`` (checked by ``channel.check_reply``:
    each field present has its type). A stateful tool whose lease's root has no tmux (the
    reply's ``code`` says so, not its text) is ``INFRA_ERROR`` naming that root (``root``,
    from ``lease_root`` when the call was sent): the tool offered cannot run there, whatever
    the model does, so it is never the model's error. ``out_of_memory``: what the kernel's
    out-of-memory killer did during the call (``_oom_during``), a line in brackets after the
    output, and part of the ``error`` of a command killed by a signal or timed out."""
    get = reply.get
    exit_code = get("exit")
    exit_code = exit_code if type(exit_code) is int else None
    duration = get("duration")
    stdout, stderr = get("stdout"), get("stderr")
    stdout_dropped, stderr_dropped = get("stdout_dropped", 0), get("stderr_dropped", 0)
    report = ExecReport(
        exit_code=exit_code,
        stdout=stdout if type(stdout) is str else "",
        stderr=stderr if type(stderr) is str else "",
        stdout_dropped=stdout_dropped if type(stdout_dropped) is int else 0,
        stderr_dropped=stderr_dropped if type(stderr_dropped) is int else 0,
        timed_out=get("timed_out") is True,
        duration_s=max(float(duration), 0.0) if isinstance(duration, int | float) else 0.0,
        sandboxed=sandboxed,
    )
    problem = get("error")
    if type(problem) is str and get("code") == _NO_TMUX:
        reason = f"{root} has no tmux: {call.tool} cannot run in this sandbox"
        return failure(call, ToolOutcome.INFRA_ERROR, reason, report)
    if type(problem) is str:
        return failure(call, ToolOutcome.TOOL_ERROR, problem, report)
    content = report.stdout
    if report.stderr:
        if content and not content.endswith("\n"):
            content += "\n"
        content += f"[stderr]\n{report.stderr}"
    memory = ""  # what the error of a command killed or timed out adds
    if out_of_memory is not None:
        content += f"\n[{out_of_memory}]"
        memory = f"; {out_of_memory}"
    signal_number = get("signal")
    if report.timed_out:
        reason = f"timed out after {timeout:g} s; {timeout_end(call.tool, signal_number)}"
        return _result(
            call, ToolOutcome.TIMEOUT, f"{content}\n[{reason}]", error=reason + memory,
            exec_report=report,
        )  # fmt: skip
    if exit_code is None and type(signal_number) is int:
        reason = f"killed by signal {signal_number}"
        return _result(
            call, ToolOutcome.TOOL_ERROR, f"{content}\n[{reason}]", error=reason + memory,
            exec_report=report,
        )  # fmt: skip
    if exit_code is None:  # neither a code nor a signal: never a success
        reason = "the command ended without an exit status"
        return _result(
            call, ToolOutcome.TOOL_ERROR, f"{content}\n[{reason}]", error=reason,
            exec_report=report,
        )  # fmt: skip
    if exit_code:
        content += f"\n[exit code {exit_code}]"
    return ToolResult(
        call_id=call.call_id, name=call.tool, outcome=ToolOutcome.OK, content=content,
        exec=report,
    )  # fmt: skip
