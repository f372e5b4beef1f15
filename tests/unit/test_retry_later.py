"""How long the pools' client waits before it sends again a request a proxy asked it to send later
(``trajcore.adapters.pools.retry_later``)."""

from __future__ import annotations

import pytest

from trajcore.adapters.pools.retry_later import (
    FIRST_WAIT_S,
    LONGEST_WAIT_S,
    TRY_LATER,
    wait_before_retry,
)


def test_the_statuses_that_ask_for_later_are_408_and_429() -> None:
    assert sorted(TRY_LATER) == [408, 429]


def test_without_a_retry_after_the_waits_double_up_to_the_longest() -> None:
    waits = [wait_before_retry(tries, None, left_s=1e9) for tries in range(1, 40)]
    assert waits[:3] == [FIRST_WAIT_S, 2 * FIRST_WAIT_S, 4 * FIRST_WAIT_S]
    assert max(w for w in waits if w is not None) == LONGEST_WAIT_S
    assert waits[-1] == LONGEST_WAIT_S
    assert wait_before_retry(10_000, None, left_s=1e9) == LONGEST_WAIT_S  # no overflow


@pytest.mark.parametrize(
    ("tries", "asked", "left", "wait"),
    [
        (1, 3.0, 10.0, 3.0),  # a longer Retry-After is waited for in full
        (1, 0.0, 10.0, FIRST_WAIT_S),  # a shorter one never makes a busy loop
        (5, 0.1, 10.0, 16 * FIRST_WAIT_S),
        (1, 3600.0, 10.0, None),  # past the budget: give up now
        (1, None, 0.0, None),
        (1, 10.0, 10.0, 10.0),
    ],
)
def test_a_retry_after_is_honoured_within_the_budget(
    tries: int, asked: float | None, left: float, wait: float | None
) -> None:
    assert wait_before_retry(tries, asked, left) == wait
