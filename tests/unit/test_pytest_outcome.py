"""Reading a pytest run's outcome from its output: counts, failing ids, what the exit means."""

from __future__ import annotations

import pytest

from trajcore.rollout.pytest_outcome import PytestExit, read_pytest_outcome

MIXED = """\
F.sxE
=================================== FAILURES ===================================
___________________________________ test_bad ___________________________________
E   assert 1 == 2
=========================== short test summary info ============================
FAILED test_a.py::test_bad - assert 1 == 2
FAILED test_a.py::test_p[a - b] - AssertionError: assert 'a - b' == 'c'
ERROR test_a.py::test_err - RuntimeError: x
2 failed, 2 passed, 1 skipped, 1 xfailed, 1 error, 3 warnings in 1.33s
"""


def test_counts_and_failing_ids_of_a_mixed_run() -> None:
    outcome = read_pytest_outcome(MIXED, 1)
    assert outcome.exit is PytestExit.TESTS_FAILED
    assert (outcome.passed, outcome.failed, outcome.errors) == (2, 2, 1)
    assert (outcome.skipped, outcome.xfailed, outcome.warnings) == (1, 1, 3)
    assert outcome.failing == (
        "test_a.py::test_bad",
        "test_a.py::test_p[a - b]",
        "test_a.py::test_err",
    )
    assert outcome.ran == 6
    assert not outcome.passed_all


def test_a_clean_run_passes_all() -> None:
    outcome = read_pytest_outcome("...\n3 passed in 0.02s\n", 0)
    assert outcome.exit is PytestExit.PASSED
    assert outcome.passed == 3
    assert outcome.failing == ()
    assert outcome.passed_all


def test_a_framed_summary_line_is_read_too() -> None:
    line = "===== 1 failed, 1 passed in 0.12s (0:00:00) ====="
    outcome = read_pytest_outcome(f"x\n{line}\n", 1)
    assert (outcome.passed, outcome.failed) == (1, 1)


@pytest.mark.parametrize(
    ("output", "code", "meaning"),
    [
        ("ERROR test_b.py\n!!! Interrupted: 1 error during collection !!!\n1 error in 1.3s\n", 2,
         PytestExit.INTERRUPTED),
        ("\n7 deselected in 1.13s\n", 5, PytestExit.NO_TESTS),
        ("no tests ran in 0.01s\nERROR: file or directory not found: x.py\n", 4,
         PytestExit.USAGE_ERROR),
        ("/usr/bin/python3: No module named pytest\n", 1, PytestExit.NOT_RUN),
        ("", 0, PytestExit.NOT_RUN),  # exit 0 but never reported: a conftest that exits
        ("3 passed in 0.1s\n", None, PytestExit.NOT_RUN),
    ],
)  # fmt: skip
def test_what_the_exit_means(output: str, code: int | None, meaning: PytestExit) -> None:
    outcome = read_pytest_outcome(output, code)
    assert outcome.exit is meaning
    assert not outcome.passed_all


def test_a_collection_error_names_the_file() -> None:
    outcome = read_pytest_outcome("ERROR test_b.py\n1 error in 1.3s\n", 2)
    assert outcome.failing == ("test_b.py",)
    assert outcome.errors == 1


def test_a_timeout_is_its_own_meaning() -> None:
    outcome = read_pytest_outcome("..", None, timed_out=True)
    assert outcome.exit is PytestExit.TIMED_OUT
    assert not outcome.passed_all


def test_exit_zero_with_nothing_passed_is_no_pass() -> None:
    outcome = read_pytest_outcome("1 skipped in 0.01s\n", 0)
    assert outcome.exit is PytestExit.PASSED
    assert not outcome.passed_all
