"""A model that is a script: run an env end to end without a model, in either mode.

An env author tests their env (and ``trajcore run`` runs it offline) with a *script* in place
of the model: a function of the conversation so far that says what the model does next.

- ``ModelScript``: ``solve(messages) -> ScriptStep``, where the step is the tool calls to make
  (one ``ToolCall`` or several; ``tool_call("bash", command="ls")`` writes one), the final
  answer (text, which ends the trajectory), or a whole assistant ``Message``. Call ids are
  optional: a call whose id is ``"pending"`` (``tool_call``'s) gets ``call_{turn}_{i}``.
- ``Replay``: recorded tool calls. Built from trajectory records (the lines of a
  ``trajectories.jsonl`` that ``trajcore run`` or ``trajcore demo`` wrote, from a real model or
  a script), it plays the recorded assistant turns of the recording whose opening (the messages
  before the first assistant turn) is the trajectory's own; members of a group take the
  recordings of their opening in turn.
- ``ScriptedPolicy``: a ``Policy`` over a script, in OpenAI mode (``ScriptedPolicy.openai``,
  through a real ``ChatPolicy``) or in managed mode (``ScriptedPolicy.managed``, through a real
  ``TokenPolicy``: each step is written as the model family's text by the parser's ``render``,
  tokenized, and sampled back, so the env's parser, the chat template's bridging and the token
  ledger all run as with a real model; token ids are exact, logprobs 0).

A step that is not a step, or a replay with no recording for a conversation, is the model
failing (``InvalidInput``): the trajectory ends as a model error with the reason as its detail.
Any other exception a script raises is a bug in it: the trajectory ends as a model error too,
its detail naming the script, the exception and where it was raised (``the model script solve
raised IndexError: ... (at my_env.py:12 in solve)``), as ``trajcore model`` answers it; never
as the infrastructure's failure.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import JSON, JSONObject, json_lines, json_object
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers.base import ToolCallParser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.ports.tokenizer import Tokenizer
from trajcore.rollout.hook_failures import env_failure
from trajcore.rollout.policy import (
    ChatPolicy,
    ModelTurn,
    PolicySession,
    SessionWrapper,
    TokenPolicy,
)

__all__ = [
    "ModelScript",
    "Replay",
    "ScriptStep",
    "ScriptedPolicy",
    "chat_turn",
    "replay_records",
    "script_message",
    "tool_call",
]

ScriptStep = str | Message | ToolCall | Sequence[ToolCall]
"""What the scripted model does next: text (a final answer), a whole assistant message, or
tool calls to make."""

ModelScript = Callable[[Sequence[Message]], ScriptStep]
"""The model as a function of the conversation so far (system prompt to the last tool result)."""


def tool_call(name: str, /, **arguments: JSON) -> ToolCall:
    """A call of tool ``name`` with ``arguments``, for a script (its id is filled in per turn).

    Raises:
        ConfigError: an empty name, or arguments that are not JSON.
    """
    return ToolCall(id="pending", name=name, arguments=dict(arguments))


def script_message(step: ScriptStep, turn: int) -> Message:
    """``step`` as the assistant message of turn ``turn`` (call ids filled in where missing).

    Raises:
        InvalidInput: ``step`` is not a step (field ``step``), or a message not the assistant's.
    """
    if isinstance(step, str):
        return Message.assistant(step)
    if isinstance(step, Message):
        if step.role != "assistant":
            raise InvalidInput("step.role", f"a script answers as the assistant, not {step.role}")
        message = step
    elif isinstance(step, ToolCall):
        message = Message.assistant(tool_calls=[step])
    else:
        raw: object = step  # typed as a sequence of calls; a script may return anything
        calls: list[object] = list(raw) if isinstance(raw, Sequence) else [raw]
        if not calls or not all(isinstance(call, ToolCall) for call in calls):
            raise InvalidInput(
                "step", f"expected text, a Message or ToolCalls, got {type(step).__name__}"
            )
        message = Message.assistant(tool_calls=[c for c in calls if isinstance(c, ToolCall)])
    named = [
        call if call.id != "pending" else attrs.evolve(call, id=f"call_{turn}_{i}")
        for i, call in enumerate(message.tool_calls)
    ]
    return attrs.evolve(message, tool_calls=tuple(named))


def _turn(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


def chat_turn(step: ScriptStep, messages: Sequence[Message]) -> ChatTurn:
    """``step``, taken after ``messages``, as an OpenAI-mode answer: what a ``FakeChatServer``
    policy or a loopback endpoint returns (finish reason ``tool_calls`` when it calls tools).

    Raises:
        InvalidInput: as ``script_message``.
    """
    message = script_message(step, _turn(messages))
    reason = FinishReason.TOOL_CALLS if message.tool_calls else FinishReason.STOP
    return ChatTurn(message=message, finish_reason=reason)


def _opening(messages: Sequence[Message]) -> tuple[tuple[str, str], ...]:
    opening = itertools.takewhile(lambda m: m.role != "assistant", messages)
    return tuple((m.role, m.content) for m in opening)


# ------------------------------------------------------------------------------------ replay


def _text(value: object, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(field, f"expected text, got {type(value).__name__}")
    return value


def _recorded_call(raw: object, field: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise InvalidInput(field, "expected a tool call object")
    function = raw.get("function", raw)
    if not isinstance(function, Mapping):
        raise InvalidInput(f"{field}.function", "expected an object")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI wire form: JSON text
        arguments = json_object(arguments, f"{field}.function.arguments")
    if not isinstance(arguments, dict):
        raise InvalidInput(f"{field}.function.arguments", "expected a JSON object")
    name = _text(function.get("name"), f"{field}.function.name")
    return ToolCall(
        id=_text(raw.get("id"), f"{field}.id") or "pending", name=name, arguments=arguments
    )


@attrs.frozen
class _Recording:
    opening: tuple[tuple[str, str], ...]
    turns: tuple[Message, ...]


def _recording(record: Mapping[str, object], where: str) -> _Recording:
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise InvalidInput(f"{where}.messages", "expected the list of the trajectory's messages")
    opening: list[tuple[str, str]] = []
    turns: list[Message] = []
    for i, raw in enumerate(messages):
        field = f"{where}.messages[{i}]"
        if not isinstance(raw, Mapping):
            raise InvalidInput(field, "expected a message object")
        role = _text(raw.get("role"), f"{field}.role")
        content = _text(raw.get("content"), f"{field}.content")
        if role == "assistant":
            calls = raw.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidInput(f"{field}.tool_calls", "expected a list")
            turns.append(
                Message.assistant(
                    content,
                    tool_calls=[
                        _recorded_call(c, f"{field}.tool_calls[{k}]") for k, c in enumerate(calls)
                    ],
                    reasoning=_text(raw.get("reasoning_content"), f"{field}.reasoning_content")
                    or None,
                )
            )
        elif not turns:
            opening.append((role, content))
    return _Recording(opening=tuple(opening), turns=tuple(turns))


@attrs.define
class Replay:
    """Recorded assistant turns, played back per opening (see the module docstring).

    Build it with ``Replay.of(records)``; ``script_for(messages)`` gives one trajectory its
    recording's script (recordings of the same opening are handed out in turn).
    """

    recordings: dict[tuple[tuple[str, str], ...], list[_Recording]]
    _handed: dict[tuple[tuple[str, str], ...], int] = attrs.field(factory=dict, init=False)

    @classmethod
    def of(cls, records: Iterable[Mapping[str, object]]) -> Replay:
        """A replay of ``records`` (trajectory records: each with its ``messages`` as chat
        dicts, tool-call arguments as objects or JSON text).

        Raises:
            InvalidInput: a record that is not a trajectory (field ``records[i]....``), or no
                record with an assistant turn.
        """
        found: dict[tuple[tuple[str, str], ...], list[_Recording]] = {}
        for i, record in enumerate(records):
            recording = _recording(record, f"records[{i}]")
            if recording.turns:
                found.setdefault(recording.opening, []).append(recording)
        if not found:
            raise InvalidInput("records", "no recorded trajectory has an assistant turn")
        return cls(found)

    def script_for(self, messages: Sequence[Message]) -> ModelScript:
        """The script of the next recording whose opening is ``messages``' opening."""
        opening = _opening(messages)
        choices = self.recordings.get(opening)
        if not choices:
            task = next((text for role, text in opening if role == "user"), "")
            return _missing(f"no recorded trajectory opens with this conversation: {task[:200]!r}")
        index = self._handed.get(opening, 0)
        self._handed[opening] = index + 1
        recording = choices[index % len(choices)]

        def play(conversation: Sequence[Message]) -> ScriptStep:
            turn = _turn(conversation)
            if turn < len(recording.turns):
                return recording.turns[turn]
            return "(the recording ends here)"

        return play


def _missing(reason: str) -> ModelScript:
    def fail(_: Sequence[Message]) -> ScriptStep:
        raise InvalidInput("replay", reason)  # the model's side fails: a model error

    return fail


# ------------------------------------------------------------------------------------ policy


@attrs.define
class _Relay:
    """The server under one scripted session: answers with the step the session queued."""

    turn: ChatTurn | None = None
    completion: TokenCompletion | None = None

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        assert self.turn is not None
        turn, self.turn = self.turn, None
        return turn

    async def generate(
        self, prompt_ids: Sequence[int], *, sampling: SamplingParams
    ) -> TokenCompletion:
        assert self.completion is not None
        completion, self.completion = self.completion, None
        if len(completion.token_ids) > sampling.max_tokens:
            ids = completion.token_ids[: sampling.max_tokens]
            return TokenCompletion.of(ids, completion.logprobs[: len(ids)], FinishReason.LENGTH)
        return completion

    async def aclose(self) -> None:
        return None


@attrs.frozen
class _Managed:
    tokenizer: Tokenizer
    template: ChatTemplate
    parser: ToolCallParser


@attrs.define
class _ScriptedSession(SessionWrapper):
    script: ModelScript
    relay: _Relay
    inner: PolicySession
    managed: _Managed | None

    async def sample(self, messages: Sequence[Message], *, sampling: SamplingParams) -> ModelTurn:
        try:
            step = self.script(messages)
        except InvalidInput:
            raise
        except Exception as error:  # the script's bug: a model error, as ``trajcore model``
            # answers it (never the infrastructure's)
            name = getattr(self.script, "__qualname__", type(self.script).__name__)
            raise InvalidInput("script", env_failure(f"the model script {name}", error)) from error
        turn = chat_turn(step, messages)
        message = turn.message
        if self.managed is None:
            self.relay.turn = turn
        else:
            text = self.managed.parser.render(message.tool_calls, content=message.content)
            ids = [
                *self.managed.tokenizer.encode(text),
                self.managed.template.shape.end_of_turn[0],
            ]
            self.relay.completion = TokenCompletion.of(ids, [0.0] * len(ids), FinishReason.STOP)
        return await self.inner.sample(messages, sampling=sampling)


@attrs.frozen
class ScriptedPolicy:
    """A ``Policy`` whose model is ``script`` (see the module docstring); build it with
    ``ScriptedPolicy.openai`` or ``ScriptedPolicy.managed``.

    Attributes:
        script: The model: a function of the conversation, or a ``Replay``.
        template: OpenAI mode: the chat template that re-renders (inexact) training tokens, or
            ``None`` for none. Managed mode: the template of the ledger.
    """

    script: ModelScript | Replay
    template: ChatTemplate | None = None
    _managed: _Managed | None = None

    @classmethod
    def openai(
        cls, script: ModelScript | Replay, *, template: ChatTemplate | None = None
    ) -> ScriptedPolicy:
        """OpenAI mode: each step is the server's parsed answer (``ChatPolicy``)."""
        return cls(script, template)

    @classmethod
    def managed(
        cls,
        script: ModelScript | Replay,
        *,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        parser: ToolCallParser,
    ) -> ScriptedPolicy:
        """Managed mode: each step is rendered by ``parser``, tokenized by ``tokenizer`` and
        sampled back through a ``TokenPolicy`` (exact ids, logprobs 0)."""
        return cls(script, template, _Managed(tokenizer, template, parser))

    @property
    def token_exact(self) -> bool:
        return self._managed is not None

    def start(self, messages: Sequence[Message], *, tools: Sequence[ToolSpec]) -> PolicySession:
        relay = _Relay()
        script = (
            self.script.script_for(messages) if isinstance(self.script, Replay) else self.script
        )
        if self._managed is None:
            inner = ChatPolicy(server=relay, template=self.template).start(messages, tools=tools)
        else:
            m = self._managed
            policy = TokenPolicy(
                server=relay, tokenizer=m.tokenizer, template=m.template, parser=m.parser
            )
            inner = policy.start(messages, tools=tools)
        return _ScriptedSession(script, relay, inner, self._managed)


def replay_records(lines: Iterable[str]) -> list[JSONObject]:
    """The JSON objects of ``lines`` (JSON Lines text), blank lines skipped.

    Raises:
        InvalidInput: a line that is not a JSON object (field ``line N``).
    """
    return [value for _, value in json_lines(lines)]
