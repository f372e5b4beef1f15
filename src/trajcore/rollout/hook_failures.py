"""What went wrong in an env's hook (prepare, score, an eval's reward), in one line, and whose
doing it was.

The trajectory runner fails a member by who caused its failure: the infrastructure's
(``InfrastructureError``: a slot that could not run a hook's command, a dead server) as
``infra_error``, anything else a hook raised or answered (a bug, a forgotten ``await``, metadata
that is not a JSON object) as the env's ``env_error``. These functions tell the two apart and
word the detail; they never raise and do no I/O. Of a group of exceptions (a hook's task
group), the first that is not the infrastructure's is the one told.
"""

from __future__ import annotations

import traceback

from trajcore.domain.errors import InfrastructureError, StateError
from trajcore.domain.json_values import check_json
from trajcore.rollout.tools import SlotTools

__all__ = [
    "env_failure",
    "first_failure",
    "forgotten_await",
    "infrastructure_failure",
    "metadata_problem",
]


def forgotten_await(slot_tools: SlotTools, hook: str) -> str | None:
    """Why ``hook`` failed when it called a method of ``slot_tools`` without ``await`` (the
    call never ran, and its coroutine may have passed for a true check), else ``None``."""
    try:
        slot_tools.call_log.check_awaited(hook, "await tools.<method>(...)")
    except StateError as exc:
        return str(exc)
    return None


def metadata_problem(metadata: object) -> str | None:
    """``None`` when ``metadata`` is ``None`` or a JSON object, else what is wrong with it."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return f"{metadata!r} as metadata, not a JSON object"
    problem = check_json(metadata)
    return None if problem is None else f"metadata that is not JSON: {problem}"


def infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the infrastructure's failure: an ``InfrastructureError``, or a group
    of nothing else (a hook's task group whose calls all hit a failed slot)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(InfrastructureError)[1] is None
    return isinstance(exc, InfrastructureError)


def first_failure(exc: BaseException) -> BaseException:
    """``exc``, or the first exception a group of them holds that is not the infrastructure's
    (else its first), looked for through nested groups."""
    while isinstance(exc, BaseExceptionGroup):
        rest = exc.split(InfrastructureError)[1]
        exc = (rest if rest is not None else exc).exceptions[0]
    return exc


def env_failure(where: str, exc: BaseException) -> str:
    """One line for an exception the env's own code raised: what, and where it was raised.

    ``"score hook raised ValueError: bad (at my_env.py:42 in compute_reward)"``; the frame is
    the traceback's last (where the exception was raised). Of a group of exceptions (a task
    group's), the first that is not the infrastructure's is told.
    """
    exc = first_failure(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    at = ""
    if frames:
        last = frames[-1]
        file = last.filename.rsplit("/", 1)[-1]
        at = f" (at {file}:{last.lineno} in {last.name})"
    message = str(exc)
    return f"{where} raised {type(exc).__name__}{': ' + message if message else ''}{at}"
