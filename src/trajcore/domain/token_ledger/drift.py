"""Drift: how a ledger differs from a full re-render of its conversation, as a metric."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence

import attrs

__all__ = ["ALIGN_LIMIT", "Drift", "measure_drift"]

ALIGN_LIMIT = 1 << 22
"""The largest product of the two differing middles' lengths that is aligned token by token
(about 2,000 tokens a side: a fraction of a second even for a middle of a few repeated ids)."""


@attrs.frozen(kw_only=True)
class Drift:
    """How a ledger differs from a full re-render of its conversation.

    Attributes:
        ledger_tokens: Length of the ledger.
        rendered_tokens: Length of the re-render.
        first_difference: The first position where they differ (``None`` when identical; the
            shorter length when one is a prefix of the other).
        ledger_only_tokens: Ledger tokens outside the longest matching runs (what the re-render
            lost or changed, such as stripped think blocks).
        rendered_only_tokens: Re-render tokens outside the matching runs (what it added).
    """

    ledger_tokens: int
    rendered_tokens: int
    first_difference: int | None
    ledger_only_tokens: int
    rendered_only_tokens: int

    @property
    def exact(self) -> bool:
        """Whether the ledger and the re-render are the same ids."""
        return self.first_difference is None


def measure_drift(ledger_ids: Sequence[int], rendered_ids: Sequence[int]) -> Drift:
    """Compare a ledger's ids with a re-render's ids; returns a ``Drift``, never raises.

    The common prefix and suffix are stripped first; the middle is aligned with
    ``difflib.SequenceMatcher`` (no junk heuristic) to count differing tokens on each side.
    A middle whose sides multiply to more than ``ALIGN_LIMIT`` is not aligned (that is
    quadratic or worse, and the caller runs on the event loop): the tokens its sides share,
    counted with multiplicity, are taken as matched. That count is exact when one side only
    drops tokens from the other (Qwen3's re-render dropping earlier think blocks) and otherwise
    a lower bound of the tokens that differ.
    """
    a, b = list(ledger_ids), list(rendered_ids)
    shorter = min(len(a), len(b))
    prefix = 0
    while prefix < shorter and a[prefix] == b[prefix]:
        prefix += 1
    if prefix == len(a) == len(b):
        return Drift(
            ledger_tokens=len(a),
            rendered_tokens=len(b),
            first_difference=None,
            ledger_only_tokens=0,
            rendered_only_tokens=0,
        )
    suffix = 0
    while suffix < shorter - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    middle_a, middle_b = a[prefix : len(a) - suffix], b[prefix : len(b) - suffix]
    if len(middle_a) * len(middle_b) <= ALIGN_LIMIT:
        matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
        matched = sum(block.size for block in matcher.get_matching_blocks())
    else:  # tokens in common, counted with multiplicity: linear time
        matched = (Counter(middle_a) & Counter(middle_b)).total()
    return Drift(
        ledger_tokens=len(a),
        rendered_tokens=len(b),
        first_difference=prefix,
        ledger_only_tokens=len(middle_a) - matched,
        rendered_only_tokens=len(middle_b) - matched,
    )
