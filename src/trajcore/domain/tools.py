"""Tools as the conversation sees them: specs, calls, results and who calls.

Everything here is a small frozen value, keyword-only and validated when built: a call's arguments
are a JSON object, a result names the call it answers and says how the call ended, a spec's
parameters are a JSON-schema object compiled once by an ``ArgumentValidator``
(``trajcore.domain.tool_schema``).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, InvalidInput, ToolArgumentError
from trajcore.domain.json_values import JSONObject, check_json
from trajcore.domain.tool_schema import (
    BUILTIN_VALIDATOR,
    ArgumentCheck,
    ArgumentProblem,
    ArgumentValidator,
)

__all__ = [
    "ExecReport",
    "SandboxBudget",
    "ToolCall",
    "ToolContext",
    "ToolOutcome",
    "ToolResult",
    "ToolSpec",
    "timeout_end",
]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


_FLAT = frozenset({str, int, bool, type(None)})


def _json_object(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    if not isinstance(value, dict):
        raise ToolArgumentError(
            attribute.name, f"expected a JSON object, got {type(value).__name__}"
        )
    # Every call is built through here at least twice (parsed, then sent under its slot id):
    # the common flat object of str keys and plain scalars is decided inline, without the
    # tree walk's call per item; anything else is left to ``check_json``.
    for key, item in value.items():
        if type(key) is not str or type(item) not in _FLAT:
            break
    else:
        return
    problem = check_json(value)
    if problem:
        raise ToolArgumentError(attribute.name, problem)


_nonempty = validators.nonempty_string()


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model asked for.

    Attributes:
        id: The call's id, unique within its trajectory; results answer it by this id.
        name: The tool's name.
        arguments: The decoded arguments, a JSON object.
        raw_arguments: The arguments text as the model wrote it, when it was no JSON object
            (broken JSON, an array, ``null``) and ``arguments`` stands empty in its place.
            Chat templates are given this text (``Message.to_chat_dict``), so that a render
            for training writes what the model wrote; the wire and the tools get
            ``arguments``. ``None`` for every call the model wrote well.
    """

    id: str = attrs.field(validator=_nonempty)
    name: str = attrs.field(validator=_nonempty)
    arguments: JSONObject = attrs.field(factory=dict, validator=_json_object)
    raw_arguments: str | None = None

    def arguments_json(self) -> str:
        """The arguments as compact JSON text, keys in insertion order."""
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))


class ToolOutcome(enum.Enum):
    """How a tool call ended.

    ``OK`` and ``TOOL_ERROR`` are the tool's own answers (a command may exit non-zero and still be
    ``OK``: the exit code is data for the model). ``TIMEOUT`` means the call ran past its limit and
    was killed. ``REJECTED`` means policy or validation refused to run it (unknown tool, bad
    arguments, path escape). ``INFRA_ERROR`` means the sandbox or server failed; it is never the
    model's fault and is never scored as such.
    """

    OK = "ok"
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    INFRA_ERROR = "infra_error"


class SandboxBudget(enum.Enum):
    """A budget of the lease itself that the slot server enforces by ending the lease.

    A call's result names it (``ToolResult.sandbox_budget``) when the lease the call ran in was
    ended for passing it: what the policy did, not a failure of the infrastructure.
    """

    DISK = "disk"  # the bytes or files of its writable area (disk_bytes, disk_files)


def _budget_not_ok(
    result: ToolResult, _: attrs.Attribute[SandboxBudget | None], value: SandboxBudget | None
) -> None:
    if value is not None and result.outcome is ToolOutcome.OK:
        raise InvalidInput("sandbox_budget", "a call whose lease was ended cannot be OK")


def _lease_refusal_rejected(result: ToolResult, _: attrs.Attribute[bool], value: bool) -> None:
    if value and result.outcome is not ToolOutcome.REJECTED:
        raise InvalidInput("lease_refused", "a refusal of the call's lease is REJECTED")


_SIGKILL = 9


def timeout_end(tool: str, signal_number: object) -> str:
    """What became of a command that ran out of time, as its result says, from its reply's
    ``signal``: ``bash``'s process group is killed; the persistent shell's command gets Ctrl-C
    (2) and, when the shell is not back at its prompt soon after, or its tmux server does not
    answer, the shell is killed with everything it ran (9), so the next call starts a new one."""
    if tool == "bash":
        return "its process group was killed"
    if signal_number == _SIGKILL:
        return (
            "the shell did not stop on Ctrl-C or its tmux server did not answer, so the shell "
            "was killed with everything it ran; the next call starts a new shell (directory "
            "and variables reset)"
        )
    if tool == "tmux":
        return "keys not sent by then were dropped; the pane is shown as it was"
    return "the command got Ctrl-C and stopped; the shell keeps its state"


@attrs.frozen(kw_only=True)
class ExecReport:
    """What happened when a command ran in a slot.

    Attributes:
        exit_code: The process's exit code, or ``None`` when it was killed or never started.
        stdout: Captured standard output (decoded as UTF-8 with replacement), capped.
        stderr: Captured standard error, capped likewise.
        stdout_dropped: Bytes of stdout cut out by the cap (the head and tail are kept).
        stderr_dropped: Bytes of stderr cut out by the cap.
        timed_out: The call ran past its timeout: a ``bash`` command's process group was killed; a
            ``bash_stateful`` command got Ctrl-C, or its shell was killed (the error says which).
        duration_s: Wall time of the call inside the slot server.
        sandboxed: Whether the command ran inside the slot's bubblewrap sandbox.
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    stderr_dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    timed_out: bool = False
    duration_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    sandboxed: bool = False


@attrs.frozen(kw_only=True)
class ToolResult:
    """The answer to one tool call.

    Attributes:
        call_id: The id of the call this answers.
        name: The tool that was called.
        outcome: How the call ended (see ``ToolOutcome``).
        content: The text the model will see.
        error: For any outcome but ``OK``, a one-line reason naming the field at fault.
        exec: For commands, what the process did.
        sandbox_budget: The lease's budget whose overrun ended the lease this call ran in
            (the slot server's marker, on a non-``OK`` result whose ``error`` names the budget
            and what was measured), or ``None``.
        lease_refused: The slot refused the call for its lease, not for anything in the call
            (a ``REJECTED`` whose ``error`` names ``$.epoch``, ``$.slot`` or ``$.lease...``:
            an epoch stale or released, a slot the server has not, another container's slot):
            it never ran, and the lease is no longer its holder's to use.
    """

    call_id: str
    name: str
    outcome: ToolOutcome
    content: str = ""
    error: str | None = None
    exec: ExecReport | None = None
    sandbox_budget: SandboxBudget | None = attrs.field(default=None, validator=_budget_not_ok)
    lease_refused: bool = attrs.field(default=False, validator=_lease_refusal_rejected)

    @property
    def ok(self) -> bool:
        return self.outcome is ToolOutcome.OK

    def answering(self, call_id: str) -> ToolResult:
        """This result as the answer to the call ``call_id`` (every other field kept).

        The same value as ``attrs.evolve(self, call_id=call_id)``, at under half its cost: every
        slot call's result passes through here on its way back to the model.
        """
        return ToolResult(
            call_id=call_id,
            name=self.name,
            outcome=self.outcome,
            content=self.content,
            error=self.error,
            exec=self.exec,
            sandbox_budget=self.sandbox_budget,
            lease_refused=self.lease_refused,
        )

    @classmethod
    def success(cls, call: ToolCall, content: str) -> ToolResult:
        """An OK result of ``call`` whose content is ``content``."""
        return cls(call_id=call.id, name=call.name, outcome=ToolOutcome.OK, content=content)

    @classmethod
    def failure(
        cls, call: ToolCall, outcome: ToolOutcome, error: str, *, exec: ExecReport | None = None
    ) -> ToolResult:
        """A non-OK result whose content tells the model what went wrong."""
        if outcome is ToolOutcome.OK:
            raise ValueError("failure() needs a non-OK outcome")
        return cls(
            call_id=call.id,
            name=call.name,
            outcome=outcome,
            content=f"Error: {error}",
            error=error,
            exec=exec,
        )

    @classmethod
    def lease_refusal(cls, call: ToolCall, error: str) -> ToolResult:
        """A ``REJECTED`` result of ``call`` refused for its lease (``lease_refused``)."""
        return attrs.evolve(cls.failure(call, ToolOutcome.REJECTED, error), lease_refused=True)

    @classmethod
    def infra_errors(cls, calls: Iterable[ToolCall], error: str) -> list[ToolResult]:
        """An ``INFRA_ERROR`` result for each of ``calls``, in order: their batch broke as one."""
        return [cls.failure(call, ToolOutcome.INFRA_ERROR, error) for call in calls]

    @classmethod
    def unknown_tool(cls, call: ToolCall) -> ToolResult:
        """The ``REJECTED`` result of a call naming a tool that is not offered (``@ name``)."""
        return cls.failure(call, ToolOutcome.REJECTED, f"unknown tool {call.name!r} @ name")


@attrs.frozen(kw_only=True)
class ToolContext:
    """Who calls a tool: the trajectory and, when it holds one, its slot (``container/index``)."""

    trajectory_id: str
    slot: str | None = None


def _tool_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _TOOL_NAME.match(value):
        raise ConfigError(attribute.name, f"{value!r} is not 1-64 of [A-Za-z0-9_.-]")


def _parameters(_: object, attribute: attrs.Attribute[JSONObject], value: JSONObject) -> None:
    if not isinstance(value, dict):
        raise ConfigError(attribute.name, "a schema must be a JSON object")
    problem = check_json(value, attribute.name)
    if problem:
        # the path starts at the attribute's name; a property's name in it may hold " @ " too
        reason, _, below = problem.partition(f" @ {attribute.name}")
        raise ConfigError(attribute.name + below, reason)
    if value.get("type") != "object":
        raise ConfigError(f"{attribute.name}.type", "a tool's parameters must be of type 'object'")


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool the model may call, described by a JSON schema.

    The schema is compiled once, when the spec is built, by ``validator``; a schema the validator
    cannot enforce in full is refused then (``ConfigError`` naming the tool and the schema path),
    so no keyword is ever silently ignored. Two specs are equal when their name, description and
    parameters are; the validator is how they are checked, not what they are.

    Attributes:
        name: 1-64 characters of ``[A-Za-z0-9_.-]``.
        description: What the tool does, for the model.
        parameters: A JSON-schema object (``{"type": "object", "properties": ...}``).
        validator: What compiles ``parameters`` (``BuiltinArgumentValidator`` by default, a strict
            subset; ``trajcore.adapters.json_schema.JSONSchemaValidator`` for full JSON Schema).
    """

    name: str = attrs.field(validator=_tool_name)
    description: str = ""
    parameters: JSONObject = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, validator=_parameters
    )
    validator: ArgumentValidator = attrs.field(
        default=BUILTIN_VALIDATOR, eq=False, repr=False, hash=False
    )
    _check: ArgumentCheck = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_check", self.validator.compile(self.name, self.parameters))

    def validate_arguments(self, arguments: object) -> list[ArgumentProblem]:
        """Every way ``arguments`` miss this tool's schema; empty when they fit."""
        return self._check(arguments)

    def check_call(self, call: ToolCall) -> None:
        """Raise ``ToolArgumentError`` for the first problem with ``call``'s arguments."""
        problems = self.validate_arguments(call.arguments)
        if problems:
            first = problems[0]
            raise ToolArgumentError(
                f"{call.name}{first.path[1:]}",
                first.reason,
                problems=tuple(f"{p.reason} @ {call.name}{p.path[1:]}" for p in problems),
            )

    def to_openai(self) -> JSONObject:
        """The spec in the OpenAI ``tools`` shape, which chat templates also take."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }
