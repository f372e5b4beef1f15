"""OpenAI mode's re-rendered ledger (``ChatTemplate.rerender``), over a toy template whose ids
can be read by eye (found by mutation testing: the template tests saw only real templates'
usual conversations)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.ledger import Segment
from trajcore.domain.token_ledger.template import (
    ChatTemplate,
    TemplateShape,
    _first_end_of_turn,
    common_prefix,
)
from trajcore.domain.tools import ToolSpec

USER, ASSISTANT, THINK, HEADER = 1, 2, 3, 4
EOT = (100, 101)


@attrs.frozen
class ToyRenderer:
    """Each message: its role id, its content as code points, then the end of turn. The
    generation prompt is the assistant role id. With ``drops_reasoning``, an assistant turn's
    reasoning (``THINK`` and its code points) is written only when it is the last message."""

    end_of_turn: tuple[int, ...] = EOT
    drops_reasoning: bool = False
    header_at_last_user: bool = False  # as Mistral writes its tools before the last user turn

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        ids: list[int] = []
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        for index, message in enumerate(messages):
            if self.header_at_last_user and users and index == users[-1]:
                ids.append(HEADER)
            ids.append(ASSISTANT if message.role == "assistant" else USER)
            last = index == len(messages) - 1
            if message.reasoning and (last or not self.drops_reasoning):
                ids += [THINK, *map(ord, message.reasoning)]
            ids += [*map(ord, message.content), *self.end_of_turn]
        if add_generation_prompt:
            ids.append(ASSISTANT)
        return ids


def _template(renderer: ToyRenderer) -> ChatTemplate:
    shape = TemplateShape(end_of_turn=renderer.end_of_turn, turn_stops=(), stand_in_reasoning=False)
    return ChatTemplate(renderer=renderer, shape=shape)


def _kinds_and_ids(segments: Sequence[Segment]) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.kind.value, s.token_ids) for s in segments]


A, B, C, D = (ord(c) for c in "abcd")


def test_an_assistant_span_ends_after_the_first_id_of_the_end_of_turn() -> None:
    messages = [Message.user("a"), Message.assistant("b"), Message.user("c"), Message.assistant("")]
    ledger = _template(ToyRenderer()).rerender(messages)
    assert ledger.token_exact is False
    assert _kinds_and_ids(ledger.segments) == [
        ("prompt", (USER, A, *EOT, ASSISTANT)),
        ("completion", (B, 100)),
        ("environment", (101, USER, C, *EOT, ASSISTANT)),
        # an empty reply is still its end of turn's first id
        ("completion", (100,)),
        ("environment", (101,)),
    ]


def test_a_span_that_ends_the_text_leaves_no_environment_after_it() -> None:
    messages = [Message.user("a"), Message.assistant("b")]
    ledger = _template(ToyRenderer(end_of_turn=(100,))).rerender(messages)
    assert _kinds_and_ids(ledger.segments) == [
        ("prompt", (USER, A, 100, ASSISTANT)),
        ("completion", (B, 100)),
    ]


def test_a_conversation_without_assistant_turns_is_one_prompt() -> None:
    ledger = _template(ToyRenderer()).rerender([Message.user("a"), Message.user("b")])
    assert _kinds_and_ids(ledger.segments) == [("prompt", (USER, A, *EOT, USER, B, *EOT))]


def test_an_assistant_turn_the_template_rewrites_later_is_trained_as_the_whole_has_it() -> None:
    # The first reply renders with its reasoning only while it is the last message (as Qwen3
    # writes a think block into the last assistant turn only): its span is what the whole
    # conversation holds of it, up to its own end of turn, and it is trained.
    messages = [
        Message.user("a"),
        Message.assistant("b", reasoning="x"),
        Message.user("c"),
        Message.assistant("d"),
    ]
    ledger = _template(ToyRenderer(drops_reasoning=True)).rerender(messages)
    assert _kinds_and_ids(ledger.segments) == [
        ("prompt", (USER, A, *EOT, ASSISTANT)),
        ("completion", (B, 100)),
        ("environment", (101, USER, C, *EOT, ASSISTANT)),
        ("completion", (D, 100)),
        ("environment", (101,)),
    ]


def test_a_turn_after_history_the_template_moves_is_never_a_span_over_user_text() -> None:
    # The header goes before the last user turn, so the render up to the first reply parts from
    # the whole at its first id: that reply gets no span (masked), never one over "a".
    messages = [
        Message.user("a"),
        Message.assistant("b"),
        Message.user("c"),
        Message.assistant("d"),
    ]
    ledger = _template(ToyRenderer(header_at_last_user=True)).rerender(messages)
    assert _kinds_and_ids(ledger.segments) == [
        ("prompt", (USER, A, *EOT, ASSISTANT, B, *EOT, HEADER, USER, C, *EOT, ASSISTANT)),
        ("completion", (D, 100)),
        ("environment", (101,)),
    ]


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        # turn 0 cut at max_tokens: its end of turn is the environment's, not trained
        ((0,), [("prompt", (USER, A, *EOT, ASSISTANT)), ("completion", (B,)),
                ("environment", (*EOT, USER, C, *EOT, ASSISTANT)), ("completion", (D, 100)),
                ("environment", (101,))]),
        # turn 1 (counted among the assistant messages from 0)
        ((1,), [("prompt", (USER, A, *EOT, ASSISTANT)), ("completion", (B, 100)),
                ("environment", (101, USER, C, *EOT, ASSISTANT)), ("completion", (D,)),
                ("environment", EOT)]),
        # a position past the last turn cuts nothing
        ((2,), [("prompt", (USER, A, *EOT, ASSISTANT)), ("completion", (B, 100)),
                ("environment", (101, USER, C, *EOT, ASSISTANT)), ("completion", (D, 100)),
                ("environment", (101,))]),
    ],
)  # fmt: skip
def test_a_turn_cut_at_max_tokens_trains_its_text_but_not_the_end_of_turn(
    cut: tuple[int, ...], expected: list[tuple[str, tuple[int, ...]]]
) -> None:
    messages = [
        Message.user("a"),
        Message.assistant("b"),
        Message.user("c"),
        Message.assistant("d"),
    ]
    ledger = _template(ToyRenderer()).rerender(messages, cut_turns=cut)
    assert _kinds_and_ids(ledger.segments) == expected


def test_an_empty_turn_cut_at_max_tokens_has_no_span() -> None:
    messages = [Message.user("a"), Message.assistant("")]
    ledger = _template(ToyRenderer()).rerender(messages, cut_turns=(0,))
    assert _kinds_and_ids(ledger.segments) == [("prompt", (USER, A, *EOT, ASSISTANT, *EOT))]


@pytest.mark.parametrize(
    ("ids", "end_of_turn", "start", "expected"),
    [
        ([1, 9, 8, 9], (9, 8), 0, 2),  # just after the end of turn's first id
        ([9, 1, 9], (9,), 1, 3),  # at or after the start only
        ([9, 1, 2], (9,), 1, 1),  # none after it: the start (no span)
        ([1, 2], (), 0, 0),  # no end of turn learnt: the start
    ],
)
def test_a_rewritten_turn_ends_after_the_first_id_of_the_next_end_of_turn(
    ids: list[int], end_of_turn: tuple[int, ...], start: int, expected: int
) -> None:
    assert _first_end_of_turn(ids, end_of_turn, start) == expected


@pytest.mark.parametrize(
    "messages", [[], [Message.assistant("b")], [Message.assistant("b"), Message.user("a")]]
)
def test_a_conversation_must_start_with_a_prompt_message(messages: list[Message]) -> None:
    with pytest.raises(ConfigError) as caught:
        _template(ToyRenderer()).rerender(messages)
    assert (caught.value.field, caught.value.reason) == (
        "messages[0].role",
        "a conversation starts with a prompt message",
    )


def test_the_common_prefix_counts_from_the_first_id() -> None:
    assert common_prefix([1, 2], [2, 2]) == 0
    assert common_prefix([1, 2, 3], [1, 2]) == 2
