"""What a pytest run in a slot came to, read from its output: counts, failing tests, exit meaning.

``SlotTools.pytest`` runs pytest in the trajectory's slot and hands its output and exit code to
``read_pytest_outcome``, a pure function. The rules it keeps:

- The counts come from pytest's last summary line (``2 failed, 3 passed, 1 error in 0.1s``);
  the failing test ids from the ``FAILED``/``ERROR`` lines of its short summary (``-rfE``), in
  the order pytest printed them. A parametrized id keeps its brackets, spaces and all.
- The exit code says what happened (pytest's ``ExitCode``: 0 all passed, 1 some failed, 2
  interrupted (a collection error), 3 internal error, 4 usage error, 5 no tests collected).
  Output without a summary line means pytest never reported (``NOT_RUN``: pytest is missing,
  or the process died), whatever the code; a run killed at its timeout is ``TIMED_OUT``.
- ``passed_all`` is the one verdict most envs want: exit 0, at least one test passed, none
  failed and none errored. A run that collected nothing never counts as a pass.
"""

from __future__ import annotations

import enum
import re

import attrs

__all__ = ["PytestExit", "PytestOutcome", "read_pytest_outcome"]


class PytestExit(enum.Enum):
    """What a pytest run's exit means (pytest's ``ExitCode``, plus two trajcore adds)."""

    PASSED = "passed"  # 0: every collected test passed (or was skipped / xfailed)
    TESTS_FAILED = "tests_failed"  # 1: some tests failed or errored
    INTERRUPTED = "interrupted"  # 2: stopped early, e.g. a collection error
    INTERNAL_ERROR = "internal_error"  # 3: pytest itself failed
    USAGE_ERROR = "usage_error"  # 4: bad command line, missing file
    NO_TESTS = "no_tests"  # 5: nothing collected
    NOT_RUN = "not_run"  # no summary line: pytest missing, crashed or killed
    TIMED_OUT = "timed_out"  # killed at the call's timeout


_BY_CODE = {
    0: PytestExit.PASSED,
    1: PytestExit.TESTS_FAILED,
    2: PytestExit.INTERRUPTED,
    3: PytestExit.INTERNAL_ERROR,
    4: PytestExit.USAGE_ERROR,
    5: PytestExit.NO_TESTS,
}

# "=== 2 failed, 1 passed, 1 warning in 0.12s (0:00:00) ===", or with -q the same unframed.
_SUMMARY = re.compile(
    r"^(?:=+ )?(?P<body>no tests ran|\d+ [a-z]+(?:, \d+ [a-z]+)*)"
    r" in [\d.]+s(?: \([^)]*\))?(?: =+)?$"
)
_COUNT = re.compile(r"(\d+) ([a-z]+)")
# "FAILED path::test[param - x] - AssertionError: ...": the id ends at its brackets' close.
_FAILING = re.compile(r"^(?:FAILED|ERROR) (?P<id>[^\s\[]+(?:\[.*?\](?= - |$))?)(?: - .*)?$")
_WORDS = {
    "passed": "passed",
    "failed": "failed",
    "error": "errors",
    "errors": "errors",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "deselected": "deselected",
    "warning": "warnings",
    "warnings": "warnings",
}


@attrs.frozen(kw_only=True)
class PytestOutcome:
    """One pytest run in a slot.

    Attributes:
        exit: What the exit means (see ``PytestExit``).
        exit_code: The process's exit code (``None`` when it was killed).
        passed, failed, errors, skipped, xfailed, xpassed, deselected, warnings: pytest's
            counts from its summary line (0 when absent).
        failing: The ids of failed and errored tests (``file.py::test_name[param]``, or a file
            that failed to collect), in pytest's order.
        output: What pytest printed (stdout, then stderr), as the slot returned it (capped).
    """

    exit: PytestExit
    exit_code: int | None
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    deselected: int = 0
    warnings: int = 0
    failing: tuple[str, ...] = ()
    output: str = ""

    @property
    def passed_all(self) -> bool:
        """Exit 0, at least one test passed, and none failed or errored."""
        return (
            self.exit is PytestExit.PASSED
            and self.passed > 0
            and self.failed == 0
            and self.errors == 0
        )

    @property
    def ran(self) -> int:
        """Tests that ran to a verdict: passed, failed, errored, xfailed and xpassed."""
        return self.passed + self.failed + self.errors + self.xfailed + self.xpassed


def read_pytest_outcome(
    output: str, exit_code: int | None, *, timed_out: bool = False
) -> PytestOutcome:
    """What a pytest run came to, from its ``output`` and ``exit_code`` (see the module doc)."""
    lines = [line.rstrip() for line in output.splitlines()]
    counts: dict[str, int] = {}
    summary_found = False
    for line in reversed(lines):
        match = _SUMMARY.match(line.strip())
        if match is None:
            continue
        summary_found = True
        for number, word in _COUNT.findall(match["body"]):
            field = _WORDS.get(word)
            if field is not None:
                counts[field] = counts.get(field, 0) + int(number)
        break
    failing: list[str] = []
    for line in lines:
        found = _FAILING.match(line)
        if found is not None and found["id"] not in failing:
            failing.append(found["id"])
    if timed_out:
        verdict = PytestExit.TIMED_OUT
    elif not summary_found or exit_code is None:
        verdict = PytestExit.NOT_RUN
    else:
        verdict = _BY_CODE.get(exit_code, PytestExit.NOT_RUN)
    return PytestOutcome(
        exit=verdict, exit_code=exit_code, failing=tuple(failing), output=output, **counts
    )
