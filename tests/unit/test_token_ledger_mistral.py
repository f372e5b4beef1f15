"""Mistral, token for token: trajcore's managed-mode ledger against ``mistral_common``'s encoder.

For Mistral's real tokenizers (SentencePiece v3 and v7, Tekken v3 and v7), hypothesis builds
conversations (system prompt, user, 1-4 assistant turns with 0-3 tool calls each, JSON arguments,
tool results; unicode and whitespace edge cases) and plays them through trajcore's managed-mode
machinery: ``TokenPolicy`` over the ``MistralCommonTokenizer`` adapter, ``ChatTemplate.learn``,
the ``mistral`` parser, and a ``FakeTokenServer`` that "samples" exactly the ids Mistral's
encoder writes for each assistant turn (with or without its final ``</s>``, as servers that strip
the end-of-sequence id return it; the bridge then supplies it as environment). Then:

1. the ledger equals ``mistral_common``'s encoding of the whole conversation, token for token
   (the reference is built with ``mistral_common``'s own types and its own tokenizer object, not
   through the adapter); masks are ``-100`` exactly off the sampled ids, logprobs verbatim;
2. the drift against a full re-render through the adapter is zero;
3. the ``mistral`` parser reads back the calls Mistral's encoder wrote (names and arguments, no
   problems; for text-only turns, the text).

What the properties do not hide:

- **Tool-call ids.** Mistral v3/v7 models write an ``"id"`` in each call, and the reference
  answers each result with it. The ``mistral`` parser drops that id and numbers calls itself
  (``call_1_0``), so a result answered by the parser's id carries a different id than the one
  the model wrote. The properties answer results with the ids the model wrote (what the parser
  would return if it kept them); ``test_parser_keeps_the_ids_the_model_wrote`` shows the gap.
- **Marker text.** Decoding is text: a special token and its spelling (``[TOOL_CALLS]`` typed in
  an argument) decode to the same string, so no text parser can tell them apart. The ledger
  property draws such spellings; the read-back property draws text without them, and
  ``test_spelled_markers_decode_like_the_special_tokens`` shows why.
- **Several user messages.** Mistral writes the tool list (and, in v3, the system prompt) in
  front of the *last* user message, so a later user message moves them: no append-only ledger
  can equal that re-render. Conversations with several user messages are exact without tools
  (and, in v3, without a system prompt); ``test_a_later_user_message_moves_the_tool_list``
  measures where the others differ.
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Sequence

import anyio
import attrs
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from mistral_common.protocol.instruct.messages import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool
from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralToolCall

from tests.mistral_tokenizers import NAMES, ChatMessage, adapter, encode
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.mistral import BundledMistral
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.token_ledger.drift import Drift
from trajcore.domain.token_ledger.ledger import MASKED_LABEL, MASKED_LOGPROB, TrainingTokens
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.domain.turns import ParsedTurn
from trajcore.rollout.policy import TokenPolicy

# Spellings of Mistral's markers and of reasoning tags: text-level parsing cannot tell them from
# the real tokens once decoded.
MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "<think>", "</think>")
EDGES = (
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "\u200b",
    "\u2028",
    "e\u0301",
    "☃",
    "😀",
    "中文",
    "ﬁ",
    '"',
    "\\",
    "{}",
    "[",
    "]",
    "</s>",
    "<s>",
    "[INST]",
    "[/INST]",
    "[TOOL_RESULTS]",
    "[AVAILABLE_TOOLS]",
    *MARKERS,
)
SAMPLING = SamplingParams(max_tokens=100_000)


def _texts(*, markers: bool, min_size: int = 0) -> st.SearchStrategy[str]:
    piece = st.one_of(
        st.text(st.characters(codec="utf-8"), min_size=1, max_size=8),
        st.sampled_from(EDGES),
    )
    text = st.lists(piece, min_size=min_size, max_size=5).map("".join)
    if not markers:
        text = text.filter(lambda t: not any(m in t for m in MARKERS))
    return text


def _json_values(*, markers: bool) -> st.SearchStrategy[JSON]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63),
        st.floats(allow_nan=False, allow_infinity=False),
        _texts(markers=markers),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(_texts(markers=markers), inner, max_size=3),
        ),
        max_leaves=6,
    )


@attrs.frozen
class Call:
    id: str
    name: str
    arguments: JSONObject


@attrs.frozen
class Turn:
    content: str
    calls: tuple[Call, ...]
    results: tuple[str, ...]


@attrs.frozen
class Conversation:
    system: str | None
    users: tuple[str, ...]  # the first opens; each later one follows a text-only turn
    tools: tuple[str, ...]
    turns: tuple[Turn, ...]
    listed: bool = True  # whether the tools are listed in the prompt ([AVAILABLE_TOOLS])


TOOL_NAMES = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
IDS = st.text(string.ascii_letters + string.digits, min_size=5, max_size=5)


@st.composite
def conversations(
    draw: st.DrawFn,
    name: BundledMistral,
    *,
    markers: bool,
    users: int = 1,
    listed: bool = True,
    system: bool = True,
) -> Conversation:
    """1-4 turns, 0-3 calls each, up to ``users`` user messages.

    A turn without calls other than the last is followed by the next user message; while none is
    left, every turn but the last makes 1-3 calls.
    """
    tools = tuple(draw(st.lists(TOOL_NAMES, min_size=1, max_size=3, unique=True)))
    follow_ups = users - 1
    with_content = name.endswith("v7")  # v3 writes a turn as text or as calls, never both
    count = draw(st.integers(1, 4))
    # Unique by their last four characters; the first five are drawn.
    ids = iter(f"{draw(IDS)}{i:04d}" for i in range(3 * count))
    turns: list[Turn] = []
    for index in range(count):
        last = index == count - 1
        n_calls = draw(
            st.sampled_from((0, 0, 1, 2, 3)) if follow_ups else st.integers(0 if last else 1, 3)
        )
        if not n_calls and not last:
            follow_ups -= 1
        calls = tuple(
            Call(
                id=next(ids),
                name=draw(st.sampled_from(tools)),
                arguments=draw(
                    st.dictionaries(
                        _texts(markers=markers), _json_values(markers=markers), max_size=3
                    )
                ),
            )
            for _ in range(n_calls)
        )
        if calls and not with_content:
            content = ""
        else:
            content = draw(_texts(markers=markers, min_size=0 if calls else 1))
        results = tuple(draw(_texts(markers=True)) for _ in calls)
        turns.append(Turn(content=content, calls=calls, results=results))
    opened = users - follow_ups
    texts = tuple(draw(_texts(markers=True, min_size=1)) for _ in range(opened))
    prompt = draw(st.none() | _texts(markers=True, min_size=1)) if system else None
    return Conversation(system=prompt, users=texts, tools=tools, turns=tuple(turns), listed=listed)


# ------------------------------------------------------------------------------ the two sides


def _reference_messages(conversation: Conversation, turns: int) -> list[ChatMessage]:
    """The first ``turns`` turns (and their results) in ``mistral_common``'s own types."""
    messages: list[ChatMessage] = []
    if conversation.system is not None:
        messages.append(SystemMessage(content=conversation.system))
    messages.append(UserMessage(content=conversation.users[0]))
    later_users = iter(conversation.users[1:])
    for turn in conversation.turns[:turns]:
        calls = [
            MistralToolCall(
                id=call.id,
                function=FunctionCall(name=call.name, arguments=json.dumps(call.arguments)),
            )
            for call in turn.calls
        ]
        messages.append(AssistantMessage(content=turn.content or None, tool_calls=calls or None))
        for call, result in zip(turn.calls, turn.results, strict=True):
            messages.append(ToolMessage(content=result, tool_call_id=call.id, name=call.name))
        if not turn.calls and (user := next(later_users, None)) is not None:
            messages.append(UserMessage(content=user))
    return messages


def _reference_tools(conversation: Conversation) -> list[Tool]:
    if not conversation.listed:
        return []
    return [
        Tool(function=Function(name=n, description="", parameters={"type": "object"}))
        for n in conversation.tools
    ]


def _specs(conversation: Conversation) -> list[ToolSpec]:
    if not conversation.listed:
        return []
    return [ToolSpec(name=n, parameters={"type": "object"}) for n in conversation.tools]


def _sampled(name: BundledMistral, conversation: Conversation) -> list[tuple[int, ...]]:
    """The ids Mistral's encoder writes for each assistant turn: what the model "samples"."""
    tools = _reference_tools(conversation)
    completions: list[tuple[int, ...]] = []
    for k in range(len(conversation.turns)):
        before = _reference_messages(conversation, k)
        upto = [*before, _reference_messages(conversation, k + 1)[len(before)]]
        head, whole = encode(name, before, tools), encode(name, upto, tools)
        assert whole[: len(head)] == head, "Mistral's encoding of a turn is not append-only"
        completions.append(tuple(whole[len(head) :]))
    return completions


@functools.cache
def _template(name: BundledMistral) -> ChatTemplate:
    tokenizer = adapter(name)
    return ChatTemplate.learn(tokenizer, turn_stops=[tokenizer.eos_token_id or 2])


@attrs.frozen
class Played:
    tokens: TrainingTokens
    completions: list[TokenCompletion]
    parsed: list[ParsedTurn]
    drift_exact: bool


def _play(
    name: BundledMistral,
    conversation: Conversation,
    logprob: float,
    eos_returned: Sequence[bool] = (),
) -> Played:
    """Run the conversation through trajcore's managed mode; results answer the model's ids.

    ``eos_returned[k]`` false: the server returns turn ``k`` without its final ``</s>`` (as
    servers that strip the end-of-sequence id do); the ledger must supply it as environment.
    """
    tokenizer = adapter(name)
    completions: list[TokenCompletion] = []
    for k, written in enumerate(_sampled(name, conversation)):
        ids = written
        if k < len(eos_returned) and not eos_returned[k]:
            assert ids[-1] == tokenizer.eos_token_id
            ids = ids[:-1]
        logprobs = [logprob - i / 1000 for i in range(len(ids))]
        completions.append(TokenCompletion.of(ids, logprobs, FinishReason.STOP))
    policy = TokenPolicy(
        server=FakeTokenServer(script=completions),
        tokenizer=tokenizer,
        template=_template(name),
        parser=get_parser("mistral"),
    )
    messages: list[Message] = []
    if conversation.system is not None:
        messages.append(Message.system(conversation.system))
    messages.append(Message.user(conversation.users[0]))
    later_users = iter(conversation.users[1:])
    specs = _specs(conversation)
    parsed: list[ParsedTurn] = []

    async def run() -> tuple[TrainingTokens | None, Drift | None]:
        session = policy.start(messages, tools=specs)
        for turn in conversation.turns:
            model_turn = await session.sample(messages, sampling=SAMPLING)
            parsed.append(model_turn.parsed)
            calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in turn.calls]
            messages.append(Message.assistant(turn.content, tool_calls=calls))
            environment = [
                Message.tool(
                    ToolResult(call_id=c.id, name=c.name, outcome=ToolOutcome.OK, content=r)
                )
                for c, r in zip(turn.calls, turn.results, strict=True)
            ]
            if not calls and (user := next(later_users, None)) is not None:
                environment.append(Message.user(user))
            if environment:
                messages.extend(environment)
                session.add_environment(environment)
        return session.training_tokens(messages, max_token_length=None), session.drift(messages)

    tokens, drift = anyio.run(run)
    assert tokens is not None
    assert drift is not None
    return Played(
        tokens=tokens,
        completions=completions,
        parsed=parsed,
        drift_exact=drift.exact,
    )


def _check_ledger(name: BundledMistral, conversation: Conversation, played: Played) -> None:
    expected = encode(
        name,
        _reference_messages(conversation, len(conversation.turns)),
        _reference_tools(conversation),
    )
    tokens = played.tokens
    ledger = list(tokens.tokens)
    if not conversation.turns[-1].calls and played.completions[-1].token_ids[-1:] != (2,):
        # A last turn returned without its </s> and followed by nothing: the ledger holds what
        # was sampled; the re-render closes the turn (drift adds the same missing end-of-turn).
        ledger.append(2)
    assert ledger == expected
    assert played.drift_exact
    # Masks and logprobs: the sampled ids, verbatim and in order, exactly where they were sampled.
    sampled_ids = [i for c in played.completions for i in c.token_ids]
    sampled_logprobs = [lp for c in played.completions for lp in c.logprobs]
    trained = [i for i, m in enumerate(tokens.masks) if m != MASKED_LABEL]
    assert [tokens.tokens[i] for i in trained] == sampled_ids
    assert [tokens.masks[i] for i in trained] == sampled_ids
    assert tokens.inference_logprobs is not None
    assert [tokens.inference_logprobs[i] for i in trained] == sampled_logprobs
    masked = set(range(len(tokens.tokens))) - set(trained)
    assert all(tokens.inference_logprobs[i] == MASKED_LOGPROB for i in masked)
    assert tokens.completion_tokens == len(sampled_ids)


def _check_read_back(conversation: Conversation, played: Played) -> None:
    for turn, parsed in zip(conversation.turns, played.parsed, strict=True):
        assert parsed.errors == ()
        assert [(c.name, c.arguments) for c in parsed.calls] == [
            (c.name, c.arguments) for c in turn.calls
        ]
        if not turn.calls:
            assert parsed.content == turn.content.rstrip(" ").strip()


def _events(conversation: Conversation) -> None:
    event(f"turns: {len(conversation.turns)}")
    calls = sum(len(t.calls) for t in conversation.turns)
    event(f"calls: {calls if calls < 3 else '3+'}")
    event(f"user messages: {len(conversation.users)}")
    event(f"ends with results: {bool(conversation.turns[-1].calls)}")


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data(), logprob=st.floats(-30.0, 0.0))
def test_ledger_equals_mistrals_encoding(
    name: BundledMistral, data: st.DataObject, logprob: float
) -> None:
    conversation = data.draw(conversations(name, markers=True))
    _events(conversation)
    eos = data.draw(st.lists(st.booleans(), min_size=4, max_size=4), label="eos returned")
    played = _play(name, conversation, logprob, eos)
    _check_ledger(name, conversation, played)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_the_mistral_parser_reads_back_the_calls_mistral_wrote(
    name: BundledMistral, data: st.DataObject
) -> None:
    conversation = data.draw(conversations(name, markers=False))
    played = _play(name, conversation, -0.5)
    _check_ledger(name, conversation, played)
    _check_read_back(conversation, played)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_several_user_messages_are_exact_when_nothing_moves(
    name: BundledMistral, data: st.DataObject
) -> None:
    """Later user messages bridged as environment: exact without a tool list (and, in v3,
    without a system prompt), which Mistral writes in front of the last user message."""
    v3 = name.endswith("v3")
    conversation = data.draw(
        conversations(name, markers=True, users=3, listed=False, system=not v3)
    )
    _events(conversation)
    played = _play(name, conversation, -1.0)
    _check_ledger(name, conversation, played)


def _two_users(name: BundledMistral, *, listed: bool, system: str | None) -> Conversation:
    turn = Turn(content="Hi.", calls=(), results=())
    closing = Turn(content="Bye.", calls=(), results=())
    return Conversation(
        system=system,
        users=("Hello.", "Thanks."),
        tools=("add",),
        turns=(turn, closing),
        listed=listed,
    )


@pytest.mark.parametrize("name", NAMES)
def test_a_later_user_message_moves_the_tool_list(name: BundledMistral) -> None:
    """Mistral writes [AVAILABLE_TOOLS] before the last user message: after a second one, the
    re-render has the list there, while the ledger (what the model saw) has it before the first.
    The two are the same ids with that block moved, and the drift metric says so."""
    tokenizer = adapter(name)
    conversation = _two_users(name, listed=True, system=None)
    played = _play(name, conversation, -1.0)
    expected = encode(
        name,
        _reference_messages(conversation, len(conversation.turns)),
        _reference_tools(conversation),
    )
    ledger = list(played.tokens.tokens)
    assert ledger != expected
    assert not played.drift_exact
    begin, end = (
        tokenizer.special_id("[AVAILABLE_TOOLS]"),
        tokenizer.special_id("[/AVAILABLE_TOOLS]"),
    )
    start, stop = ledger.index(begin), ledger.index(end) + 1
    block = ledger[start:stop]
    assert start == 1  # right after <s>, before the first [INST]
    without = ledger[:start] + ledger[stop:]
    last_inst = len(without) - 1 - without[::-1].index(tokenizer.special_id("[INST]"))
    assert without[:last_inst] + block + without[last_inst:] == expected


@pytest.mark.parametrize("name", ["v3", "tekken-v3"])
def test_v3_moves_the_system_prompt_to_the_last_user_message(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    conversation = _two_users(name, listed=False, system="Be brief.")
    played = _play(name, conversation, -1.0)
    ledger_text = tokenizer.decode(played.tokens.tokens)
    expected = encode(name, _reference_messages(conversation, 2), [])
    assert ledger_text.startswith("<s>[INST]Be brief.\n\nHello.[/INST]")
    assert tokenizer.decode(expected).startswith("<s>[INST]Hello.[/INST]")
    assert "[INST]Be brief.\n\nThanks.[/INST]" in tokenizer.decode(expected)
    assert not played.drift_exact


@pytest.mark.parametrize("name", NAMES)
def test_spelled_markers_decode_like_the_special_tokens(name: BundledMistral) -> None:
    """Why the read-back property draws no marker spellings: after decoding, a call's argument
    that spells ``[TOOL_CALLS]`` is the same text as the real token, for any text parser."""
    tokenizer = adapter(name)
    real = [tokenizer.special_id("[TOOL_CALLS]")]
    spelled = tokenizer.encode("[TOOL_CALLS]")
    assert spelled != real
    assert tokenizer.decode(spelled) == tokenizer.decode(real) == "[TOOL_CALLS]"


@pytest.mark.parametrize("name", ["v3", "tekken-v7"])
def test_parser_keeps_the_ids_the_model_wrote(name: BundledMistral) -> None:
    tokenizer = adapter(name)
    call = Call(id="a1B2c3D4e", name="add", arguments={"a": 1})
    conversation = Conversation(
        system=None,
        users=("Add.",),
        tools=("add",),
        turns=(Turn(content="", calls=(call,), results=("1",)),),
    )
    (sampled,) = _sampled(name, conversation)
    text = tokenizer.decode(sampled[:-1])  # without </s>, as the policy strips stop ids
    parsed = get_parser("mistral").parse(text, tools=_specs(conversation), id_prefix="call_1")
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 1})]
    assert [c.id for c in parsed.calls] == ["a1B2c3D4e"]


@pytest.mark.parametrize("name", ["v3", "tekken-v7"])
def test_an_id_the_model_repeats_in_a_later_turn_is_made_unique(name: BundledMistral) -> None:
    call = Call(id="a1B2c3D4e", name="add", arguments={"a": 1})
    conversation = Conversation(
        system=None,
        users=("Add twice.",),
        tools=("add",),
        turns=(
            Turn(content="", calls=(call,), results=("1",)),
            Turn(content="", calls=(call,), results=("2",)),
            Turn(content="Done.", calls=(), results=()),
        ),
    )
    played = _play(name, conversation, logprob=-0.5)
    assert [[c.id for c in turn.calls] for turn in played.parsed] == [
        ["a1B2c3D4e"],
        ["a1B2c3D4e-2"],
        [],
    ]
