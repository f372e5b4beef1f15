"""Drift on long conversations: measured in bounded time, since it runs on the event loop.

A trajectory's drift is measured when it ends, synchronously, in the task that runs it. Aligning
two 30,000-token conversations with ``difflib`` took seconds (tens of seconds for repetitive
tool output) and stalled every other trajectory meanwhile.
"""

from __future__ import annotations

import random
import time

from trajcore.domain.token_ledger.drift import ALIGN_LIMIT, Drift, measure_drift


def _qwen3_shape(turns: int, alphabet: int) -> tuple[list[int], list[int]]:
    """A ledger with a think block before every turn, and its re-render, which keeps only the
    last turn's (Qwen3's template drops the others): the re-render only drops tokens."""
    rng = random.Random(7)
    ledger: list[int] = []
    rendered: list[int] = []
    for turn in range(turns):
        think = [rng.randrange(alphabet) for _ in range(300)]
        body = [rng.randrange(alphabet) for _ in range(600)]
        ledger += think + body
        rendered += think + body if turn == turns - 1 else body
    return ledger, rendered


def test_a_long_repetitive_conversation_is_measured_quickly_and_exactly() -> None:
    ledger, rendered = _qwen3_shape(turns=30, alphabet=50)  # 27,000 ledger tokens
    started = time.perf_counter()
    drift = measure_drift(ledger, rendered)
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0, f"drift took {elapsed:.1f}s"
    assert drift.ledger_only_tokens == len(ledger) - len(rendered)
    assert drift.rendered_only_tokens == 0
    assert drift.first_difference == 0


def test_past_the_alignment_limit_changed_tokens_are_counted_on_both_sides() -> None:
    side = 2100  # just past ALIGN_LIMIT's ~2,048 tokens a side
    assert side * side > ALIGN_LIMIT
    ledger = [1, *range(10, 10 + side), 2]
    rendered = [1, *range(10, 10 + side), 2]
    ledger[500], rendered[1500] = 7_000_000, 7_000_001  # one token changed on each side
    assert measure_drift(ledger, rendered) == Drift(
        ledger_tokens=side + 2,
        rendered_tokens=side + 2,
        first_difference=500,
        ledger_only_tokens=2,  # its new token, and the one the re-render changed
        rendered_only_tokens=2,
    )
