"""Token ledger: the decisions ``test_token_ledger`` checks only in part (found by mutation
testing): each refusal's field and reason, the state a refused append names, the first segment a
cut falls in, and each rule ``check_valid`` names."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.ledger import Segment, SegmentKind, TokenLedger

PROMPT = Segment(kind=SegmentKind.PROMPT, token_ids=(1, 2))
COMPLETION = Segment(
    kind=SegmentKind.COMPLETION,
    token_ids=(3, 4),
    logprobs=(-0.5, -0.25),
    finish_reason=FinishReason.STOP,
)
ENVIRONMENT = Segment(kind=SegmentKind.ENVIRONMENT, token_ids=(5,))


def _completion(*ids: int) -> TokenCompletion:
    return TokenCompletion(
        token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason=FinishReason.LENGTH
    )


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        (
            {"kind": SegmentKind.PROMPT, "logprobs": (0.0,)},
            "logprobs",
            "a prompt segment has no logprobs",
        ),
        (
            {"kind": SegmentKind.ENVIRONMENT, "finish_reason": FinishReason.STOP},
            "finish_reason",
            "a environment segment has none",
        ),
        (
            {"kind": SegmentKind.COMPLETION, "logprobs": (0.0,)},
            "logprobs",
            "1 logprobs for 2 token ids",
        ),
    ],
)
def test_a_refused_segment_names_its_field_and_why(
    fields: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Segment(token_ids=(7, 8), **fields)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (field, reason)


def test_refused_prompts_environments_and_cuts_say_why() -> None:
    with pytest.raises(ConfigError) as caught:
        TokenLedger.from_prompt([])
    assert (caught.value.field, caught.value.reason) == (
        "prompt_ids",
        "a ledger starts with a non-empty prompt",
    )
    ledger = TokenLedger.from_prompt([1])
    ledger.append_completion(_completion(2))
    with pytest.raises(ConfigError) as caught:
        ledger.append_environment([])
    assert (caught.value.field, caught.value.reason) == (
        "token_ids",
        "environment tokens must not be empty",
    )
    with pytest.raises(ConfigError) as caught:
        ledger.export(max_token_length=0)
    assert (caught.value.field, caught.value.reason) == (
        "max_token_length",
        "must be at least 1, got 0",
    )


def test_a_refused_append_names_what_the_ledger_ends_in() -> None:
    ledger = TokenLedger.from_prompt([1])
    with pytest.raises(
        StateError, match=r"^environment tokens must follow a completion, not a prompt segment$"
    ):
        ledger.append_environment([2])
    with pytest.raises(
        StateError, match=r"^environment tokens must follow a completion, not an empty ledger$"
    ):
        TokenLedger().append_environment([2])
    ledger.append_completion(_completion(2))
    with pytest.raises(
        StateError,
        match=r"^a completion must follow a prompt or environment tokens, not a completion segment",
    ):
        ledger.append_completion(_completion(3))
    rebuilt = TokenLedger.from_segments([PROMPT], token_exact=False)
    with pytest.raises(
        StateError, match=r"^a ledger rebuilt from messages takes no sampled completions$"
    ):
        rebuilt.append_completion(_completion(3))
    # refused appends leave the ledger as it was
    assert ledger.prompt_ids() == (1, 2)


def test_a_completion_keeps_its_finish_reason_and_completions_are_counted() -> None:
    ledger = TokenLedger.from_prompt([1])
    segment = ledger.append_completion(_completion(2, 3))
    assert segment.finish_reason is FinishReason.LENGTH
    assert segment.logprobs == (-0.1, -0.1)
    ledger.append_environment([4])
    assert ledger.completion_count() == 1  # of three segments
    ledger.append_completion(_completion(5))
    assert ledger.completion_count() == 2


def test_a_cut_names_the_first_segment_it_falls_in_and_its_limit() -> None:
    ledger = TokenLedger.from_segments([PROMPT, COMPLETION, ENVIRONMENT], token_exact=True)
    training = ledger.export(max_token_length=3)
    assert training.token_exact is True
    assert training.tokens == (1, 2, 3)
    truncation = training.truncation
    assert truncation is not None
    assert truncation.max_token_length == 3
    assert truncation.first_cut_segment == 1  # the completion; the environment is cut too
    assert (truncation.cut_completion_tokens, truncation.cut_environment_tokens) == (1, 1)


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ([], "a ledger starts with a prompt segment"),
        ([COMPLETION], "a ledger starts with a prompt segment"),
        ([PROMPT, COMPLETION, COMPLETION], "segment 2 is completion, expected environment"),
        ([PROMPT, ENVIRONMENT], "segment 1 is environment, expected completion"),
        (
            [PROMPT, Segment(kind=SegmentKind.COMPLETION, token_ids=(3,))],
            "segment 1: a token-exact completion needs logprobs",
        ),
    ],
)
def test_check_valid_names_the_first_rule_broken(segments: list[Segment], message: str) -> None:
    with pytest.raises(StateError) as caught:
        TokenLedger.from_segments(segments, token_exact=True)
    assert str(caught.value) == message


def test_check_valid_names_ids_that_are_not_the_segments_concatenated() -> None:
    ledger = TokenLedger(segments=[PROMPT], ids=[1, 9])
    with pytest.raises(StateError) as caught:
        ledger.check_valid()
    assert str(caught.value) == "the ledger's ids are not the concatenation of its segments"
