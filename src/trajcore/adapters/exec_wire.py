"""A command's report (``ExecReport``) read from the JSON of a batch's results, in one pass.

Both programs read it on every command: the slot server's codec when it takes a batch's results
back (``slot_server.batch_codec``) and the env's client when it reads a slot server's answer
(``pools.batch_wire``). ``read_exec_report`` takes only the exact shapes ``json.loads`` makes
for a well-formed report (compared by exact type: a ``bool`` is no count here), with a field left
out read as its default (a slot server leaves default-valued fields out), and builds the value
through its constructor, so its validators run. Anything else (no ``exit_code``, a wrong type, a
negative count, a duration that is negative, not finite or an integer too large to be a float
exactly) gives ``None``: the caller then hands the data to the general converter, which accepts
or refuses it as it always does and names the field.
"""

from __future__ import annotations

import math

from trajcore.domain.tools import ExecReport

__all__ = ["read_exec_report"]

_EXACT_FLOAT = 1 << 53  # integers up to this convert to float exactly, as the converter's do


def read_exec_report(data: object) -> ExecReport | None:
    """The ``exec`` object ``data`` as an ``ExecReport``, or ``None`` for the converter to
    decide (see the module's docstring)."""
    if type(data) is not dict or "exit_code" not in data:
        return None
    exit_code = data["exit_code"]
    stdout, stderr = data.get("stdout", ""), data.get("stderr", "")
    out_dropped, err_dropped = data.get("stdout_dropped", 0), data.get("stderr_dropped", 0)
    timed_out, sandboxed = data.get("timed_out", False), data.get("sandboxed", False)
    duration = data.get("duration_s", 0.0)
    if type(duration) is not float:
        if type(duration) is not int or not -_EXACT_FLOAT <= duration <= _EXACT_FLOAT:
            return None
        duration = float(duration)
    if (
        (exit_code is not None and type(exit_code) is not int)
        or type(stdout) is not str or type(stderr) is not str
        or type(out_dropped) is not int or out_dropped < 0
        or type(err_dropped) is not int or err_dropped < 0
        or type(timed_out) is not bool or type(sandboxed) is not bool
        or not 0.0 <= duration < math.inf
    ):  # fmt: skip
        return None
    return ExecReport(
        exit_code=exit_code, stdout=stdout, stderr=stderr, stdout_dropped=out_dropped,
        stderr_dropped=err_dropped, timed_out=timed_out, duration_s=duration, sandboxed=sandboxed,
    )  # fmt: skip
