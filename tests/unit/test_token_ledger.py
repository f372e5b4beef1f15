"""The token ledger's pure rules: segments, export, truncation, drift, end-of-turn accounting.

The template-dependent rules (bridging, drift against real templates, render cost) are in
``test_token_ledger_templates.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.drift import measure_drift
from trajcore.domain.token_ledger.ledger import (
    MASKED_LABEL,
    MASKED_LOGPROB,
    Segment,
    SegmentKind,
    TokenLedger,
)
from trajcore.domain.token_ledger.template import TemplateShape

IDS = st.lists(st.integers(0, 50_000), min_size=1, max_size=20)
LOGPROB = st.floats(-30.0, 0.0, allow_nan=False)


@st.composite
def completions(draw: st.DrawFn) -> TokenCompletion:
    ids = draw(st.lists(st.integers(0, 50_000), max_size=20))
    logprobs = draw(st.lists(LOGPROB, min_size=len(ids), max_size=len(ids)))
    reason = draw(st.sampled_from(list(FinishReason)))
    return TokenCompletion.of(ids, logprobs, reason)


@st.composite
def ledgers(draw: st.DrawFn) -> TokenLedger:
    ledger = TokenLedger.from_prompt(draw(IDS))
    for _ in range(draw(st.integers(0, 5))):
        ledger.append_completion(draw(completions()))
        if draw(st.booleans()):
            ledger.append_environment(draw(IDS))
        else:
            break
    return ledger


# ------------------------------------------------------------------------------ segments


def test_segment_rejects_logprobs_outside_completions() -> None:
    with pytest.raises(ConfigError) as info:
        Segment(kind=SegmentKind.PROMPT, token_ids=(1,), logprobs=(0.0,))
    assert info.value.field == "logprobs"
    with pytest.raises(ConfigError) as info:
        Segment(kind=SegmentKind.COMPLETION, token_ids=(1, 2), logprobs=(0.0,))
    assert "2 token ids" in str(info.value)


def test_ledger_order_is_enforced() -> None:
    with pytest.raises(ConfigError):
        TokenLedger.from_prompt([])
    ledger = TokenLedger.from_prompt([1, 2])
    with pytest.raises(StateError):
        ledger.append_environment([3])
    ledger.append_completion(TokenCompletion.of([4], [-0.1], FinishReason.STOP))
    with pytest.raises(StateError):
        ledger.append_completion(TokenCompletion.of([5], [-0.1], FinishReason.STOP))
    with pytest.raises(ConfigError):
        ledger.append_environment([])


def test_from_segments_checks_the_rules() -> None:
    prompt = Segment(kind=SegmentKind.PROMPT, token_ids=(1,))
    bare = Segment(kind=SegmentKind.COMPLETION, token_ids=(2,))
    with pytest.raises(StateError, match="needs logprobs"):
        TokenLedger.from_segments([prompt, bare], token_exact=True)
    assert len(TokenLedger.from_segments([prompt, bare], token_exact=False)) == 2
    with pytest.raises(StateError, match="expected completion"):
        TokenLedger.from_segments([prompt, prompt], token_exact=False)


def test_inexact_ledger_takes_no_sampled_completions() -> None:
    prompt = Segment(kind=SegmentKind.PROMPT, token_ids=(1,))
    ledger = TokenLedger.from_segments([prompt], token_exact=False)
    with pytest.raises(StateError):
        ledger.append_completion(TokenCompletion.of([2], [-0.1], FinishReason.STOP))


# ------------------------------------------------------------------------------ export


@given(ledgers())
def test_export_masks_and_logprobs_follow_the_segments(ledger: TokenLedger) -> None:
    out = ledger.export()
    assert out.inference_logprobs is not None
    position = 0
    for segment in ledger.segments:
        n = len(segment.token_ids)
        window = slice(position, position + n)
        assert out.tokens[window] == segment.token_ids
        if segment.kind is SegmentKind.COMPLETION:
            assert out.masks[window] == segment.token_ids
            assert out.inference_logprobs[window] == segment.logprobs
        else:
            assert out.masks[window] == (MASKED_LABEL,) * n
            assert out.inference_logprobs[window] == (MASKED_LOGPROB,) * n
        position += n
    assert position == len(out.tokens) == len(out.masks) == len(out.inference_logprobs)
    assert out.prompt_tokens + out.completion_tokens + out.environment_tokens == len(out.tokens)
    assert out.truncation is None
    assert out.tokens == ledger.prompt_ids()


@given(ledgers(), st.integers(1, 200))
def test_truncation_keeps_the_head_and_reports_the_cut(ledger: TokenLedger, limit: int) -> None:
    full = ledger.export()
    cut = ledger.export(max_token_length=limit)
    kept = min(limit, len(full.tokens))
    assert cut.tokens == full.tokens[:kept]
    assert cut.masks == full.masks[:kept]
    assert cut.inference_logprobs == (full.inference_logprobs or ())[:kept]
    if limit >= len(full.tokens):
        assert cut.truncation is None
        return
    report = cut.truncation
    assert report is not None
    assert report.kept_tokens == limit
    assert report.cut_tokens == len(full.tokens) - limit
    assert report.cut_completion_tokens == full.completion_tokens - cut.completion_tokens
    assert report.cut_prompt_tokens == full.prompt_tokens - cut.prompt_tokens
    assert report.cut_environment_tokens == full.environment_tokens - cut.environment_tokens
    assert report.first_cut_segment < len(ledger.segments)


def test_truncation_limit_must_be_positive() -> None:
    with pytest.raises(ConfigError) as info:
        TokenLedger.from_prompt([1]).export(max_token_length=0)
    assert info.value.field == "max_token_length"


# ------------------------------------------------------------------------------ drift


@given(st.lists(st.integers(0, 9), max_size=40))
def test_identical_sequences_have_no_drift(ids: list[int]) -> None:
    drift = measure_drift(ids, list(ids))
    assert drift.exact
    assert drift.ledger_only_tokens == drift.rendered_only_tokens == 0


@given(st.lists(st.integers(0, 9), max_size=40), st.data())
def test_an_insertion_is_located_and_counted(ids: list[int], data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(ids)))
    inserted = data.draw(st.lists(st.integers(10, 19), min_size=1, max_size=5))
    rendered = ids[:at] + inserted + ids[at:]
    drift = measure_drift(ids, rendered)
    assert drift.first_difference == at
    assert drift.rendered_only_tokens == len(inserted)
    assert drift.ledger_only_tokens == 0
    back = measure_drift(rendered, ids)
    assert back.ledger_only_tokens == len(inserted)
    assert back.rendered_only_tokens == 0


@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.data())
def test_a_substitution_is_counted_on_both_sides(ids: list[int], data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(ids) - 1))
    changed = [*ids[:at], 99, *ids[at + 1 :]]
    drift = measure_drift(ids, changed)
    assert drift.first_difference == at
    assert drift.ledger_only_tokens == drift.rendered_only_tokens == 1


# ------------------------------------------------------------------------------ end of turn

QWEN_LIKE = TemplateShape(end_of_turn=(7, 8), turn_stops=(7, 3), stand_in_reasoning=True)


@pytest.mark.parametrize(
    ("sampled", "missing"),
    [
        ((1, 2, 7), (8,)),  # end-of-turn sampled: only the separator is missing
        ((1, 2), (7, 8)),  # server dropped it: the bridge supplies it all
        ((1, 2, 3), (8,)),  # another stop id (end-of-sequence) closed the turn
        ((1, 7, 8), ()),  # the whole end-of-turn was sampled
        ((), (7, 8)),  # nothing sampled
        ((8,), (7, 8)),  # the separator alone is not an end of turn
    ],
)
def test_missing_end_of_turn(sampled: tuple[int, ...], missing: tuple[int, ...]) -> None:
    assert QWEN_LIKE.missing_end_of_turn(sampled) == missing


def test_shape_needs_an_end_of_turn() -> None:
    with pytest.raises(ConfigError) as info:
        TemplateShape(end_of_turn=(), turn_stops=(), stand_in_reasoning=False)
    assert info.value.field == "end_of_turn"


# ------------------------------------------------------------------------------ state machine


class LedgerMachine(RuleBasedStateMachine):
    """Appends in any allowed order; the ledger's rules and its export hold throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = TokenLedger.from_prompt([1, 2, 3])
        self.sampled: list[int] = []

    @precondition(lambda self: self.ledger.last_kind is not SegmentKind.COMPLETION)
    @rule(completion=completions())
    def sample(self, completion: TokenCompletion) -> None:
        self.ledger.append_completion(completion)
        self.sampled.extend(completion.token_ids)

    @precondition(lambda self: self.ledger.last_kind is SegmentKind.COMPLETION)
    @rule(ids=IDS)
    def environment(self, ids: list[int]) -> None:
        self.ledger.append_environment(ids)

    @rule(completion=completions(), ids=IDS)
    def refuse_out_of_order(self, completion: TokenCompletion, ids: list[int]) -> None:
        before = self.ledger.prompt_ids()
        if self.ledger.last_kind is SegmentKind.COMPLETION:
            with pytest.raises(StateError):
                self.ledger.append_completion(completion)
        else:
            with pytest.raises(StateError):
                self.ledger.append_environment(ids)
        assert self.ledger.prompt_ids() == before

    @invariant()
    def valid(self) -> None:
        self.ledger.check_valid()
        out = self.ledger.export()
        trained = [t for t, m in zip(out.tokens, out.masks, strict=True) if m != MASKED_LABEL]
        assert trained == [t for t in self.sampled if t != MASKED_LABEL]
        assert out.completion_tokens == len(self.sampled)


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=50, stateful_step_count=20)
