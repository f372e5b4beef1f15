"""Drift: the exact counts ``measure_drift`` reports (found by mutation testing: the ledger tests
only ever saw no drift or drift at the ends)."""

from __future__ import annotations

import pytest

from trajcore.domain.token_ledger.drift import Drift, measure_drift


@pytest.mark.parametrize(
    ("ledger", "rendered", "expected"),
    [
        # the same ids: exact, nothing only on one side
        ([4, 4], [4, 4], Drift(ledger_tokens=2, rendered_tokens=2, first_difference=None,
                                ledger_only_tokens=0, rendered_only_tokens=0)),
        # one token changed between a shared start and a shared end
        ([1, 2, 7, 8, 3], [1, 7, 8, 9, 3], Drift(ledger_tokens=5, rendered_tokens=5,
         first_difference=1, ledger_only_tokens=1, rendered_only_tokens=1)),
        # the ledger is a prefix: the shared end may not reuse tokens of the shared start
        ([5, 5], [5, 5, 5], Drift(ledger_tokens=2, rendered_tokens=3, first_difference=2,
                                   ledger_only_tokens=0, rendered_only_tokens=1)),
        # the shared end is compared from the last token of each side
        ([3, 2, 3], [1, 2, 1, 3, 2, 2], Drift(ledger_tokens=3, rendered_tokens=6,
         first_difference=0, ledger_only_tokens=1, rendered_only_tokens=4)),
    ],
)  # fmt: skip
def test_drift_counts_the_tokens_outside_the_matching_runs(
    ledger: list[int], rendered: list[int], expected: Drift
) -> None:
    assert measure_drift(ledger, rendered) == expected


def test_frequent_tokens_of_a_long_middle_still_match() -> None:
    # difflib's "autojunk" would treat tokens making up over 1% of a 200+ token middle as junk
    # and report nearly all of it as drift; every token counts here.
    ledger = [1] + [5, 6] * 150 + [7]
    rendered = [2] + [6, 5] * 150 + [8]
    assert measure_drift(ledger, rendered) == Drift(
        ledger_tokens=302,
        rendered_tokens=302,
        first_difference=0,
        ledger_only_tokens=3,
        rendered_only_tokens=3,
    )


def test_a_middle_at_the_align_limit_is_aligned_and_one_past_it_is_counted() -> None:
    # 2048 x 2048 is ALIGN_LIMIT: aligned token by token, a shift of one costs one on each side
    shifted = measure_drift([1, 2] * 1024, [2, 1] * 1024)
    assert (shifted.ledger_only_tokens, shifted.rendered_only_tokens) == (1, 1)
    # one more pair: counted by the tokens the sides share, which a shift does not change
    counted = measure_drift([1, 2] * 1025, [2, 1] * 1025)
    assert (counted.ledger_only_tokens, counted.rendered_only_tokens) == (0, 0)


def test_a_long_middle_whose_render_only_drops_tokens_counts_exactly() -> None:
    # Qwen3's shape: the re-render drops tokens (earlier think blocks), adds none
    ledger = [0] + [1, 2, 3] * 1500 + [9]
    rendered = [0] + [1, 3] * 1500 + [9]
    assert measure_drift(ledger, rendered) == Drift(
        ledger_tokens=4502,
        rendered_tokens=3002,
        first_difference=2,
        ledger_only_tokens=1500,
        rendered_only_tokens=0,
    )
    added = measure_drift(rendered, ledger)  # and the other way round
    assert (added.ledger_only_tokens, added.rendered_only_tokens) == (0, 1500)
