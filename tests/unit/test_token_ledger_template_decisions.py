"""The chat template's decisions, each over a toy template that shows it (found by mutation
testing: the template tests saw only real templates' usual conversations, which take the same
path through ``learn`` and ``environment_ids`` whatever those decisions are).

The toy renders ids that can be read by eye: a role id, reasoning and content as code points, the
end of turn; its switches each give it one habit a real template has (leaving a final turn open,
dropping old reasoning, rewriting a turn once a user query follows, checking that tool results
answer the calls made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import pytest

from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.ledger import TokenLedger
from trajcore.domain.token_ledger.template import ChatTemplate, TemplateShape, _common_suffix
from trajcore.domain.tools import ToolSpec

USER, ASSISTANT, THINK, TOOL, CALL = 1, 2, 3, 4, 5
EOT = (200, 201)
MERGED = 300  # the id a toy tokenizer gives to every character it merges

UNBRIDGEABLE = (
    "rendering messages after an assistant turn changes the tokens before them, so they cannot "
    "be appended without re-encoding the history"
)


@attrs.frozen
class Toy:
    """A toy chat template. Each message: its role id, then (assistant) ``THINK`` and the
    reasoning, the content, ``CALL`` and the name of each call; (tool) the content, or with
    ``strict`` the name of the call it answers and the content; then the end of turn. The
    generation prompt is ``ASSISTANT``.

    Switches: ``open_final`` leaves the last message open (no end of turn) when it is an
    assistant turn with reasoning (``"reasoning"``) or without (``"plain"``), as a prefill the
    model continues; ``prompt_continues`` writes no end of turn between a final assistant turn
    and the generation prompt; ``drops_reasoning`` writes reasoning only in the last message,
    ``drops_reasoning_before_query`` only in assistant turns no user message follows (Qwen3);
    ``empty_think_when_last`` writes an empty ``THINK`` in a last assistant turn without
    reasoning (Qwen3's empty think block);
    ``query_rewrites`` writes ``THINK`` (even with no reasoning) only in assistant turns no user
    message follows, as Qwen3 does; ``followed_eot`` ends an assistant turn that a message of a
    role in ``followed_by`` follows with other ids; ``merged`` characters share one id;
    ``strict`` refuses a tool result that answers no call of the last assistant turn, a message
    other than a tool result after calls not yet answered, and an assistant turn with neither
    content nor calls; ``names_required`` and ``content_required`` refuse a tool result without a
    name or content.
    """

    end_of_turn: tuple[int, ...] = EOT
    open_final: str | None = None
    prompt_continues: bool = False
    drops_reasoning: bool = False
    drops_reasoning_before_query: bool = False
    empty_think_when_last: bool = False
    query_rewrites: bool = False
    followed_eot: tuple[int, ...] | None = None
    followed_by: frozenset[str] = frozenset({"user", "tool"})
    merged: frozenset[str] = frozenset()
    strict: bool = False
    names_required: bool = False
    content_required: bool = False

    def text(self, value: str) -> list[int]:
        return [MERGED if c in self.merged else ord(c) for c in value]

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        ids: list[int] = []
        calls: dict[str, str] = {}
        unanswered: set[str] = set()
        for index, message in enumerate(messages):
            last = index == len(messages) - 1
            later = [m.role for m in messages[index + 1 :]]
            if message.role == "assistant":
                ids += self._assistant(message, last=last, query_follows="user" in later)
                if self.strict and not message.content and not message.tool_calls:
                    raise ConfigError(f"messages[{index}]", "an empty assistant turn")
                calls = {call.id: call.name for call in message.tool_calls}
                unanswered = set(calls)
                if last and self.open_final == ("reasoning" if message.reasoning else "plain"):
                    continue
                if last and add_generation_prompt and self.prompt_continues:
                    continue
                follower = later[0] if later else None
                if self.followed_eot is not None and follower in self.followed_by:
                    ids += self.followed_eot
                    continue
            elif message.role == "tool":
                ids += self._tool(index, message, calls)
                unanswered.discard(message.tool_call_id or "")
            else:
                if self.strict and unanswered:
                    raise ConfigError(f"messages[{index}]", "calls not answered")
                ids += [USER, *self.text(message.content)]
            ids += self.end_of_turn
        if add_generation_prompt:
            ids.append(ASSISTANT)
        return ids

    def _assistant(self, message: Message, *, last: bool, query_follows: bool) -> list[int]:
        ids = [ASSISTANT]
        if self.query_rewrites:
            if not query_follows:
                ids += [THINK, *self.text(message.reasoning or "")]
        elif message.reasoning is None:
            if last and self.empty_think_when_last:
                ids.append(THINK)
        elif (last or not self.drops_reasoning) and not (
            query_follows and self.drops_reasoning_before_query
        ):
            ids += [THINK, *self.text(message.reasoning)]
        ids += self.text(message.content)
        for call in message.tool_calls:
            ids += [CALL, *self.text(call.name)]
        return ids

    def _tool(self, index: int, message: Message, calls: Mapping[str, str]) -> list[int]:
        if self.names_required and not message.name:
            raise ConfigError(f"messages[{index}].name", "a tool result needs a name")
        if self.content_required and not message.content:
            raise ConfigError(f"messages[{index}].content", "a tool result needs content")
        if not self.strict:
            return [TOOL, *self.text(message.content)]
        answered = calls.get(message.tool_call_id or "")
        if answered is None:
            raise ConfigError(f"messages[{index}].tool_call_id", "answers no call")
        return [TOOL, *self.text(answered), *self.text(message.content)]


def _completion(*ids: int) -> TokenCompletion:
    return TokenCompletion(
        token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=FinishReason.STOP
    )


def _result(call_id: str, content: str, name: str | None) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id, name=name)


# ------------------------------------------------------------------------------ learn


def test_the_common_suffix_counts_from_the_last_id_and_stops_at_the_shorter() -> None:
    """Pins ``_common_suffix``: it starts at nothing shared, stops at the first difference from
    the end, and never reads past the shorter sequence."""
    assert _common_suffix([1, 2], [3, 4]) == 0
    assert _common_suffix([1, 2], [3, 2]) == 1
    assert _common_suffix([5], [5]) == 1
    assert _common_suffix([1, 2, 3], [2, 3]) == 2
    assert _common_suffix([], [1]) == 0


@pytest.mark.parametrize("merged", ["", "se", "oe", "so"])
def test_the_end_of_turn_is_what_all_three_probe_replies_share(merged: str) -> None:
    """Pins that ``learn`` takes the end of turn from the first probe render, as the ids every
    other probe render ends with too: two replies whose last tokens happen to be one id (a
    tokenizer's merge) do not make that id part of the end of turn."""
    template = ChatTemplate.learn(Toy(merged=frozenset(merged)))
    assert template.shape.end_of_turn == EOT


@pytest.mark.parametrize("open_final", ["plain", "reasoning"])
def test_the_end_of_turn_is_learnt_from_a_reply_with_reasoning_then_without(
    open_final: str,
) -> None:
    """Pins the order and both tries of ``learn``'s end-of-turn probes: a template that leaves a
    final reply open (no end of turn) when it has no reasoning is learnt from the reply with
    reasoning, and one that leaves it open when it has reasoning, from the reply without."""
    template = ChatTemplate.learn(Toy(open_final=open_final))
    assert template.shape.end_of_turn == EOT


def test_a_template_that_writes_nothing_after_a_reply_is_refused() -> None:
    """Pins ``learn``'s refusal of a template with no end of turn: its field and reason."""
    with pytest.raises(ConfigError) as caught:
        ChatTemplate.learn(Toy(end_of_turn=()))
    assert (caught.value.field, caught.value.reason) == (
        "chat_template",
        "an assistant turn ends with no template tokens",
    )


def test_the_stand_in_carries_reasoning_unless_the_template_drops_old_reasoning() -> None:
    """Pins the two bridge tries of ``learn`` (with reasoning, then without) and what the shape
    records: a template that keeps reasoning bridges with it; one that drops reasoning from a turn
    once anything follows it bridges only without, and the shape says so."""
    keeps = ChatTemplate.learn(Toy(), turn_stops=[7])
    assert keeps.shape.stand_in_reasoning is True
    assert keeps.shape.turn_stops == frozenset({7, EOT[0]})
    drops = ChatTemplate.learn(Toy(drops_reasoning=True))
    assert drops.shape.stand_in_reasoning is False
    # and the environment is bridged with the stand-in the shape names
    assert drops.environment_ids([9], [Message.user("c")]) == (
        *EOT,
        USER,
        ord("c"),
        *EOT,
        ASSISTANT,
    )


def test_a_template_that_rewrites_a_reply_once_a_tool_result_follows_is_refused() -> None:
    """Pins ``learn``'s refusal when no stand-in bridges a tool result: its field and reason."""
    with pytest.raises(ConfigError) as caught:
        ChatTemplate.learn(Toy(followed_eot=(200, 202)))
    assert (caught.value.field, caught.value.reason) == ("chat_template", UNBRIDGEABLE)


def test_the_probe_tool_result_has_a_name_and_content_and_answers_the_stand_in_call() -> None:
    """Pins the probe ``learn`` bridges: a tool result with a name and content, answering a call
    the stand-in makes, so templates that require each of these learn."""
    for toy in (Toy(strict=True), Toy(names_required=True), Toy(content_required=True)):
        assert ChatTemplate.learn(toy).shape.end_of_turn == EOT


# ------------------------------------------------------------------------------ start, bridge


def test_refused_prompts_and_environments_name_the_field_and_why() -> None:
    """Pins the fields and reasons of ``start``'s and ``environment_ids``'s refusals of no
    messages."""
    template = ChatTemplate.learn(Toy())
    with pytest.raises(ConfigError) as caught:
        template.start([])
    assert (caught.value.field, caught.value.reason) == (
        "messages",
        "a trajectory starts with at least one message",
    )
    with pytest.raises(ConfigError) as caught:
        template.environment_ids([9], [])
    assert (caught.value.field, caught.value.reason) == (
        "messages",
        "at least one environment message is needed",
    )
    with pytest.raises(ConfigError) as caught:
        template.environment_ids([9], [Message.user("c"), Message.assistant("d")])
    assert (caught.value.field, caught.value.reason) == (
        "messages[1].role",
        "environment messages are not assistant",
    )


def test_tool_results_are_bridged_after_stand_in_calls_named_as_the_results() -> None:
    """Pins the stand-in calls a bridge makes: one per tool result, with its id, named as the
    result names its tool, or ``tool`` when it names none (a strict template writes the name of
    the call a result answers)."""
    template = ChatTemplate.learn(Toy(strict=True))
    named = template.environment_ids([9, *EOT], [_result("c1", "r", "read")])
    assert named == (TOOL, *map(ord, "read"), ord("r"), *EOT, ASSISTANT)
    unnamed = template.environment_ids([9, *EOT], [_result("c1", "r", None)])
    assert unnamed == (TOOL, *map(ord, "tool"), ord("r"), *EOT, ASSISTANT)


def test_the_environment_is_bridged_after_the_stand_in_the_shape_prefers() -> None:
    """Pins that ``environment_ids`` tries the stand-in ``learn`` chose first: a template that
    writes an empty think block in a last turn without reasoning (Qwen3) bridges tool results only
    after a stand-in with reasoning, and the suffix bridge cannot stand in for it (its stand-in
    makes no calls, which a strict template refuses)."""
    template = ChatTemplate.learn(Toy(strict=True, empty_think_when_last=True))
    assert template.shape.stand_in_reasoning is True
    assert template.environment_ids([9, *EOT], [_result("c1", "r", "read")]) == (
        TOOL,
        *map(ord, "read"),
        ord("r"),
        *EOT,
        ASSISTANT,
    )


def test_the_other_stand_in_is_tried_when_the_preferred_one_is_rewritten() -> None:
    """Pins ``environment_ids``'s second try: a template that drops reasoning from a turn a user
    query follows (Qwen3) learns a stand-in with reasoning from a tool result, and bridges a tool
    result then a user nudge after the stand-in without reasoning (the suffix bridge, whose
    stand-in makes no calls, would be refused by this strict template)."""
    template = ChatTemplate.learn(Toy(strict=True, drops_reasoning_before_query=True))
    assert template.shape.stand_in_reasoning is True
    environment = [_result("c1", "r", "read"), Message.user("c")]
    assert template.environment_ids([9], environment) == (
        *EOT,
        TOOL,
        *map(ord, "read"),
        ord("r"),
        *EOT,
        USER,
        ord("c"),
        *EOT,
        ASSISTANT,
    )


def test_only_tool_results_answer_stand_in_calls() -> None:
    """Pins that a message other than a tool result makes no stand-in call, even when it names a
    call id (a strict template refuses a user message after calls not answered)."""
    template = ChatTemplate.learn(Toy(strict=True))
    odd = Message(role="user", content="u", tool_call_id="c9")
    assert template.environment_ids([9], [odd]) == (*EOT, USER, ord("u"), *EOT, ASSISTANT)


def test_the_stand_in_reply_has_content() -> None:
    """Pins that the stand-in assistant turn has content, so a template that refuses an empty
    assistant turn (no content, no calls) bridges a user message."""
    template = ChatTemplate.learn(Toy(strict=True))
    assert template.environment_ids([9], [Message.user("c")]) == (
        *EOT,
        USER,
        ord("c"),
        *EOT,
        ASSISTANT,
    )


def test_a_template_that_rewrites_the_reply_before_a_new_query_is_bridged_by_its_suffix() -> None:
    """Pins the suffix bridge for a template that rewrites an assistant turn once a user query
    follows (Qwen3): the tail two stand-in renders share, with the generation prompt, after the
    end of turn."""
    template = ChatTemplate.learn(Toy(query_rewrites=True))
    assert template.environment_ids([9], [Message.user("c")]) == (
        *EOT,
        USER,
        ord("c"),
        *EOT,
        ASSISTANT,
    )


def test_a_user_message_the_template_cannot_bridge_even_by_suffix_is_refused() -> None:
    """Pins the last refusal of ``environment_ids``: a template whose end of turn changes once a
    user message follows bridges tool results but not the user message (field and reason)."""
    template = ChatTemplate.learn(Toy(followed_eot=(200, 202), followed_by=frozenset({"user"})))
    assert template.environment_ids([9, *EOT], [_result("c1", "r", "x")]) == (
        TOOL,
        ord("r"),
        *EOT,
        ASSISTANT,
    )
    with pytest.raises(ConfigError) as caught:
        template.environment_ids([9], [Message.user("c")])
    assert (caught.value.field, caught.value.reason) == ("chat_template", UNBRIDGEABLE)


def test_environment_messages_follow_only_a_completion() -> None:
    """Pins ``append_environment``'s refusal (and its message) for a ledger that is empty or
    ends in anything but a completion: the last segment is the one looked at."""
    template = ChatTemplate.learn(Toy())
    message = r"^environment messages must follow a completion$"
    with pytest.raises(StateError, match=message):
        template.append_environment(TokenLedger(), [Message.user("c")])
    ledger = template.start([Message.user("a")])
    with pytest.raises(StateError, match=message):
        template.append_environment(ledger, [Message.user("c")])
    ledger.append_completion(_completion(ord("b"), *EOT))
    segment = template.append_environment(ledger, [Message.user("c")])
    assert segment.token_ids == (USER, ord("c"), *EOT, ASSISTANT)
    # the ledger now ends in environment tokens (its second segment is the completion)
    with pytest.raises(StateError, match=message):
        template.append_environment(ledger, [Message.user("d")])


# ------------------------------------------------------------------------------ rerender


def test_a_span_is_pulled_back_only_when_it_ends_with_the_whole_end_of_turn() -> None:
    """Pins ``rerender``'s span end: when the template ends a reply with other ids once a message
    follows, the span keeps what the reply shares with the full render (its content and the end of
    turn's first id) instead of being pulled back as if it ended with the whole end of turn."""
    toy = Toy(followed_eot=(200, 202), followed_by=frozenset({"user"}))
    shape = TemplateShape(end_of_turn=EOT, turn_stops=(), stand_in_reasoning=False)
    ledger = ChatTemplate(renderer=toy, shape=shape).rerender(
        [Message.user("a"), Message.assistant("bb"), Message.user("c")]
    )
    assert [(s.kind.value, s.token_ids) for s in ledger.segments] == [
        ("prompt", (USER, ord("a"), *EOT, ASSISTANT)),
        ("completion", (ord("b"), ord("b"), 200)),
        ("environment", (202, USER, ord("c"), *EOT)),
    ]


def test_a_span_never_starts_before_the_previous_one_ends() -> None:
    """Pins that ``rerender``'s spans do not overlap: with a template that writes no end of turn
    between a final assistant turn and the generation prompt, the render before a second reply in
    a row parts from the full render inside the first reply's span; the second span starts where
    the first ends, and the ledger's ids are the full render's."""
    toy = Toy(prompt_continues=True)
    shape = TemplateShape(end_of_turn=EOT, turn_stops=(), stand_in_reasoning=False)
    messages = [Message.user("a"), Message.assistant("b"), Message.assistant("d")]
    ledger = ChatTemplate(renderer=toy, shape=shape).rerender(messages)
    assert [(s.kind.value, s.token_ids) for s in ledger.segments] == [
        ("prompt", (USER, ord("a"), *EOT, ASSISTANT)),
        ("completion", (ord("b"), 200)),
        ("environment", ()),
        ("completion", (201, ASSISTANT, ord("d"), 200)),
        ("environment", (201,)),
    ]
    assert list(ledger.prompt_ids()) == toy.render(messages)
