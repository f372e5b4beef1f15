"""``RunEnd``: how ``trajcore run`` and ``trajcore demo`` say that a run ended before its groups
were done (a signal, an error, no more items), and that a complete run says nothing more."""

from __future__ import annotations

import signal

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.run import RunEnd
from trajcore.entrypoints.signals import Interrupted


def test_a_run_that_did_every_group_adds_nothing() -> None:
    end = RunEnd.of(None, asked=3, done=3)
    assert end.line() is None
    assert end.title("trajcore run: Env") == "trajcore run: Env"
    assert end.notes() == []


def test_a_signal_is_named_with_the_groups_done_of_those_asked_for() -> None:
    end = RunEnd.of(Interrupted(signal.SIGTERM), asked=3, done=1)
    assert end.line() == "stopped by SIGTERM after 1 of 3 groups"
    assert end.title("run: Env") == "run: Env: stopped by SIGTERM after 1 of 3 groups"
    assert end.notes() == []
    done_all = RunEnd.of(Interrupted(signal.SIGINT), asked=2, done=2)  # stopped while closing
    assert done_all.line() == "stopped by SIGINT after 2 of 2 groups"


def test_an_error_is_named_by_its_type_and_the_report_gets_its_message() -> None:
    end = RunEnd.of(ConfigError("dataset", "cannot be read"), asked=1, done=0)
    assert end.line() == "stopped by ConfigError after 0 of 1 groups"
    assert end.notes() == ["error: ConfigError: cannot be read @ dataset"]


def test_a_run_out_of_items_says_so() -> None:
    end = RunEnd.of(None, asked=3, done=1)
    assert end.line() == (
        "ended after 1 of 3 groups: the env had no more items (get_next_item gave None)"
    )
