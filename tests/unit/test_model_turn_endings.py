"""How a model's turn ends a trajectory, at the seams: OpenAI mode over real HTTP on loopback
(the real ``OpenAIChatServer`` against a server that answers raw chat-completions JSON and, as
OpenAI does, refuses a ``tool`` message that answers no call of the assistant message before
it), managed mode through ``AgentEnv`` with the shipped ``FakeTokenServer``.

- A tool call the server sends without an ``id`` (absent, ``null`` or ``""``: several
  OpenAI-compatible servers and proxies do) runs under a generated id, unique in the
  trajectory, and its result pairs with it when the conversation is replayed. It used to end
  the trajectory as ``model_error``.
- ``finish_reason: "content_filter"`` ends the trajectory as ``content_filter``, a finish the env
  scores (the policy wrote what the server filtered). It used to be ``model_error``, unscored.
- A managed turn cut by the context window (prompt plus turn reached it) ends the trajectory at
  once as ``token_budget``: its calls do not run and no request with one token left goes out.
  It used to run the calls and ask the model again with ``max_tokens=1``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import attrs
import pytest

from tests.strict_chat import chat_trajectory, pairing_problem, refusal
from tests.unit.test_agent_env import FileEnv
from tests.unit.test_agent_env_truncation import config, prompt_length
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.llm.chat_wire import parse_chat_body
from trajcore.domain.agent_loop import (
    AgentLoop,
    AgentLoopConfig,
    Finish,
    RunTools,
    StopReason,
)
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.json_values import JSONObject
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall
from trajcore.domain.turns import ParsedTurn
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import TrajectoryResult, Transcript

pytestmark = pytest.mark.anyio

MISSING = object()  # a call with no "id" key at all


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@attrs.define
class StrictChatServer:
    """Answers each request with the next scripted ``(message, finish_reason)``; then "done"."""

    script: list[tuple[JSONObject, str]]
    requests: list[JSONObject] = attrs.field(factory=list)

    def handle(self, request: Request) -> Reply:
        body = json.loads(request.body)
        self.requests.append(body)
        problem = pairing_problem(body["messages"])
        if problem is not None:
            return refusal(problem)
        message, finish = self.script.pop(0) if self.script else ({"content": "done"}, "stop")
        choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        answer = {"id": "chatcmpl-1", "model": "m", "choices": [choice]}
        return Reply(body=json.dumps(answer).encode())


async def _run(script: list[tuple[JSONObject, str]]) -> tuple[TrajectoryResult, StrictChatServer]:
    server = StrictChatServer(script)
    seen: list[StopReason | None] = []

    async def score(tools: SlotTools, transcript: Transcript) -> float:
        seen.append(transcript.stats.stop_reason)  # what the env sees when it scores
        return -1.0 if transcript.stats.stop_reason is StopReason.CONTENT_FILTER else 1.0

    result = await chat_trajectory(server.handle, score)
    if result.outcome.score is not None:
        assert seen == [result.stats.stop_reason]
    return result, server


def _call(call_id: object, path: str, arguments: str | None = None) -> JSONObject:
    call: JSONObject = {
        "type": "function",
        "function": {
            "name": "write_file",
            "arguments": arguments or json.dumps({"path": path, "content": "x"}),
        },
    }
    if call_id is not MISSING:
        call["id"] = call_id  # type: ignore[assignment]  # None or a string, as the test says
    return call


def _tool_calls(message: JSONObject, *calls: JSONObject) -> tuple[JSONObject, str]:
    return {"content": None, **message, "tool_calls": list(calls)}, "tool_calls"


# ------------------------------------------------------------------------ calls without an id


@pytest.mark.parametrize("missing", [MISSING, None, ""], ids=["absent", "null", "empty"])
def test_a_call_without_an_id_is_parsed_with_one(missing: object) -> None:
    body = {
        "choices": [
            {
                "message": {"content": None, "tool_calls": [_call(missing, "a.txt")]},
                "finish_reason": "tool_calls",
            }
        ]
    }
    (call,) = parse_chat_body(body).message.tool_calls
    assert call.id
    assert call.arguments == {"path": "a.txt", "content": "x"}


async def test_calls_without_ids_run_under_ids_unique_in_the_trajectory() -> None:
    result, server = await _run(
        [
            _tool_calls(
                {},
                _call(MISSING, "a.txt"),
                _call(None, "b.txt"),
                _call("", "c.txt", arguments="{"),  # garbled too: answered, and paired
                _call("call_0", "d.txt"),
            ),
            _tool_calls({}, _call(MISSING, "e.txt"), _call(None, "f.txt")),
        ]
    )
    assert result.outcome.status is TrajectoryStatus.FINISHED, result.stats.detail
    assert result.stats.stop_reason is StopReason.NATURAL
    assert result.stats.tool_calls == 5
    assert result.stats.parse_errors == 1
    assert result.stats.tool_errors.total == 0
    assert len(server.requests) == 3  # the strict server took every replay
    ids = [call.id for m in result.messages for call in m.tool_calls]
    assert len(ids) == 6
    assert len(set(ids)) == 6, ids
    assert all(ids)
    assert "call_0" in ids  # a server's own id is kept
    answered = [m.tool_call_id or "" for m in result.messages if m.role == "tool"]
    assert sorted(answered) == sorted(ids)
    paths = [e.call.arguments["path"] for e in result.exchanges]
    assert paths == ["a.txt", "b.txt", "d.txt", "e.txt", "f.txt"]


# ------------------------------------------------------------------------------ content filter


async def test_a_filtered_turn_ends_as_content_filter_and_is_scored() -> None:
    result, server = await _run(
        [
            _tool_calls({}, _call("c1", "a.txt")),
            ({"content": "I will now"}, "content_filter"),
        ]
    )
    assert result.stats.stop_reason is StopReason.CONTENT_FILTER, result.stats.detail
    assert result.outcome.status is TrajectoryStatus.FINISHED
    assert result.outcome.score == -1.0  # the env saw why and scored it
    assert "content_filter" in (result.stats.detail or "")
    assert len(server.requests) == 2


async def test_the_calls_of_a_filtered_turn_do_not_run() -> None:
    result, server = await _run(
        [({"content": None, "tool_calls": [_call("c1", "a.txt")]}, "content_filter")]
    )
    assert result.stats.stop_reason is StopReason.CONTENT_FILTER
    assert result.stats.tool_calls == 0
    assert result.exchanges == ()
    assert len(server.requests) == 1


def test_content_filter_is_its_own_finish_reason() -> None:
    assert FinishReason.parse("content_filter") is FinishReason.CONTENT_FILTER
    assert StopReason.CONTENT_FILTER.status is TrajectoryStatus.FINISHED


# ----------------------------------------------------------------- a turn cut by the context


def test_a_turn_cut_at_the_context_window_ends_at_once() -> None:
    call = ToolCall(id="c1", name="bash", arguments={"command": "ls"})
    for window, config_window in ((100, None), (None, 100)):
        loop = AgentLoop(AgentLoopConfig(max_turns=4, max_context_tokens=config_window))
        loop.start(0.0)
        decision = loop.assistant_turn(
            ParsedTurn(content="x", calls=[call]),
            finish_reason=FinishReason.LENGTH,
            completion_tokens=40,
            context_tokens=100,
            context_window=window,
            now=1.0,
        )
        assert isinstance(decision, Finish), decision
        assert decision.reason is StopReason.TOKEN_BUDGET
        assert "context window" in (decision.detail or "")
        loop.check_valid()
    loop = AgentLoop(AgentLoopConfig(max_turns=4))
    loop.start(0.0)
    below = loop.assistant_turn(
        ParsedTurn(calls=[call]),
        finish_reason=FinishReason.LENGTH,
        completion_tokens=40,
        context_tokens=99,
        context_window=100,
        now=1.0,
    )
    assert isinstance(below, RunTools)  # cut by max_tokens, not by the context


def test_a_plain_max_tokens_cut_is_named_so() -> None:
    loop = AgentLoop(AgentLoopConfig(max_turns=4))
    loop.start(0.0)
    decision = loop.assistant_turn(
        ParsedTurn(content="half a sen"),
        finish_reason=FinishReason.LENGTH,
        completion_tokens=40,
        context_tokens=60,
        now=1.0,
    )
    assert isinstance(decision, Finish)
    assert decision.reason is StopReason.MAX_TOKENS
    assert decision.reason.value == "max_tokens"


def _long_turn(env: FileEnv) -> Callable[[Sequence[int]], TokenCompletion]:
    """Writes done.txt, then keeps talking well past any window; later turns answer."""
    tokenizer = env.tokenizer_port()
    end = tokenizer.encode("<|im_end|>")
    call = ToolCall(id="x", name="write_file", arguments={"path": "done.txt", "content": "ok"})

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1:
            text = "Done."
        else:
            text = get_parser("hermes").render([call]) + " and then" * 200
        ids = [*tokenizer.encode(text), *end]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    return respond


async def test_a_managed_turn_cut_by_the_context_window_ends_the_trajectory() -> None:
    env = FileEnv(config(max_tokens=None, max_token_length=await prompt_length() + 120))
    server = FakeTokenServer(policy=_long_turn(env))
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        group = await env.run_task("ok", pool=pool, policy=env.make_policy(token=server))
    assert [r.sampling.max_tokens > 1 for r in server.requests] == [True, True]
    for member in group.members:
        assert member.stats.stop_reason is StopReason.TOKEN_BUDGET, member.stats.detail
        assert member.outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED
        assert member.stats.turns == 1
        assert member.stats.tool_calls == 0  # the cut turn's call did not run
        assert member.outcome.score == 0.0  # scored: done.txt was never written
