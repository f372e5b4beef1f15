"""Every error trajcore raises on purpose, in one tree.

::

    TrajcoreError
    ├── InvalidInput            data from outside is malformed; ``field`` says where, ``reason`` why
    │   ├── ConfigError         an env or pool setting
    │   ├── WireError           a peer's message (LLM server, slot server, Nomad) broke the protocol
    │   └── ToolArgumentError   a tool call's arguments do not fit the tool's schema
    ├── StateError              an operation that the current state does not allow
    │   ├── StaleLease          a release or use with an epoch that is no longer current
    │   └── UnknownSlot         a slot or container the book has never seen (or has forgotten)
    ├── InfrastructureError     outside the model and the env failed; never the model's fault
    │   ├── SandboxUnavailable  isolation was required and cannot be provided
    │   ├── SlotServerError     a slot server is down, crashed, or answered garbage
    │   ├── SlotInfraError      a hook's call in its slot could not run (infra error, refused,
    │   │   │                   lost lease): never a score
    │   │   └── SlotBudgetSpent ... as its lease was ended for a budget the model spent (its
    │   │                       disk): ``sandbox_budget_score``, not a failure
    │   ├── ModelServerError    an LLM server failed after retries (``status`` when HTTP gave one)
    │   │   └── RateLimited     the server kept answering 429 until the deadline
    │   ├── ToolServerError     an external tool server failed
    │   └── AcquireTimeout      no slot became free before the lease deadline
    ├── ModelServerRejected     the LLM server refused the request itself (4xx other than 429)
    │   └── ContextFull         ... as longer than the model's context (a budget, not a fault)
    ├── SlotFileError           a hook's file read or write in its slot failed (missing file,
    │                           not a regular file, too large)
    ├── DeadlineExceeded        a trajectory's single deadline passed
    ├── IdleLimitExceeded       a model turn kept the slot idle past its idle lifetime (a loop
    │                           budget, not a failure)
    └── PoolClosed              the pool or server was closed while the call was pending

Rules: an error that is about a piece of data names it as a path (``$.messages[2].role``,
``sampling.temperature``) and says why; the message reads ``reason @ field`` in the style of
cattrs' ``transform_error``. Infrastructure errors are what group assembly refuses to turn into
a zero score.
"""

from __future__ import annotations

__all__ = [
    "AcquireTimeout",
    "ConfigError",
    "ContextFull",
    "DeadlineExceeded",
    "IdleLimitExceeded",
    "InfrastructureError",
    "InvalidInput",
    "ModelServerError",
    "ModelServerRejected",
    "PoolClosed",
    "RateLimited",
    "SandboxUnavailable",
    "SlotBudgetSpent",
    "SlotFileError",
    "SlotInfraError",
    "SlotServerError",
    "StaleLease",
    "StateError",
    "ToolArgumentError",
    "ToolServerError",
    "TrajcoreError",
    "UnknownSlot",
    "WireError",
]


class TrajcoreError(Exception):
    """Root of every error that trajcore raises on purpose."""


class InvalidInput(TrajcoreError):
    """Data from outside failed validation: ``field`` names where, ``reason`` says why.

    ``problems`` lists every fault found as ``reason @ path`` when a validator collected several;
    ``field`` and ``reason`` are the first of them.
    """

    def __init__(self, field: str, reason: str, *, problems: tuple[str, ...] = ()) -> None:
        super().__init__(f"{reason} @ {field}")
        self.field = field
        self.reason = reason
        self.problems = problems or (f"{reason} @ {field}",)


class ConfigError(InvalidInput):
    """An env, pool or server setting is invalid."""


class WireError(InvalidInput):
    """A peer's message (LLM server, slot server, Nomad, tool server) broke the protocol."""


class ToolArgumentError(InvalidInput):
    """A tool call's arguments do not fit the tool's schema."""


class StateError(TrajcoreError):
    """An operation that the object's current state does not allow."""


class StaleLease(StateError):
    """A release or use with a lease epoch that is no longer the slot's current one."""


class UnknownSlot(StateError):
    """A slot or container that the slot book does not know."""


class InfrastructureError(TrajcoreError):
    """Something outside the model and the env failed; never scored as the model's fault."""


class SandboxUnavailable(InfrastructureError):
    """Isolation was required (``require_sandbox``) and this host cannot provide it."""


class SlotServerError(InfrastructureError):
    """A slot server is unreachable, crashed, or answered outside its protocol."""


class SlotInfraError(InfrastructureError):
    """A call that a hook (prepare, verify and score) made in its slot could not run.

    The slot server failed (``INFRA_ERROR``), refused the call (``REJECTED``, which is also how a
    lost or stale lease answers), or gave no report. A score computed past it would be a lie, so
    the trajectory is an infrastructure failure instead. (What a file call finds at a workspace
    path, a FIFO or a symlink leading out, is the slot's ``TOOL_ERROR`` and a ``SlotFileError``;
    a path of the hook's own that names no file there is its ``InvalidInput``.)
    """


class SlotBudgetSpent(SlotInfraError):
    """A hook's call found its lease ended for a budget the model spent (its disk budget).

    The model's doing, not the slot's: the rollout gives the member ``sandbox_budget_score``
    (``RolloutConfig``) instead of failing it, as when the model's own call met the end.
    """


class ModelServerError(InfrastructureError):
    """An LLM server failed (connection, 5xx, timeout) and retries did not help."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimited(ModelServerError):
    """The LLM server kept answering 429 until the deadline."""


class ToolServerError(InfrastructureError):
    """An external tool server failed."""


class AcquireTimeout(InfrastructureError):
    """No sandbox slot became free before the lease deadline."""


class ModelServerRejected(TrajcoreError):
    """The LLM server refused the request itself (HTTP 4xx other than 429): a caller bug."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ContextFull(ModelServerRejected):
    """The LLM server refused the request as longer than the model's context (HTTP 400 or 413
    saying so): the conversation outgrew the model. The trajectory ends on its token budget, as
    when its own context cap ends it, rather than as a model error."""


class SlotFileError(TrajcoreError):
    """A hook's ``read_file``/``write_file`` in its slot ran and failed (the slot's
    ``TOOL_ERROR``): the file is missing, is not a regular file (a directory, a FIFO, a socket,
    a device, a symlink leading out of the workspace), is too large, or the write failed.
    ``path`` is the file, ``reason`` why.

    Not an infrastructure failure: a file the model should have written and did not is the
    model's doing, and the env may catch this to score it. Left uncaught in a hook, the
    trajectory ends as an ``env_error`` (the env's code did not handle it) rather than with a
    made-up score.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{reason} @ {path}")
        self.path = path
        self.reason = reason


class DeadlineExceeded(TrajcoreError):
    """The trajectory's single deadline passed (acquire, LLM, tools and scoring share it)."""


class IdleLimitExceeded(TrajcoreError):
    """A model turn kept the trajectory's slot idle longer than ``limit_s`` (the slot's idle
    lifetime). A loop budget that ran out, like the time budget: neither the model server's nor
    the sandbox's failure."""

    def __init__(self, message: str, *, limit_s: float) -> None:
        super().__init__(message)
        self.limit_s = limit_s


class PoolClosed(TrajcoreError):
    """The pool or server was closed while the operation was pending or after it closed."""
