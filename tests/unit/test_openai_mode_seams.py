"""OpenAI mode at its seams: the real ``OpenAIChatServer`` over HTTP on loopback, against a server
that answers raw chat-completions JSON and refuses, as OpenAI does, a conversation whose ``tool``
messages do not answer the calls of the assistant message before them; the trajectory runs end to
end over the shipped fake sandbox."""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
import httpx2
import openai
import pytest

from tests.strict_chat import chat_trajectory, pairing_problem, refusal
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.llm.atropos import ServerManagerChatServer
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import ContextFull
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tools import ToolCall
from trajcore.domain.turns import ParsedTurn, ParseProblem
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import TrajectoryResult, Transcript

pytestmark = pytest.mark.anyio

GOOD = json.dumps({"path": "a.txt", "content": "x"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@attrs.define
class StrictChatServer:
    """Answers each chat request with the next scripted assistant message (raw JSON)."""

    script: list[JSONObject]
    requests: list[JSONObject] = attrs.field(factory=list)
    failures: dict[int, tuple[int, JSONObject]] = attrs.field(factory=dict)  # request number

    def handle(self, request: Request) -> Reply:
        body = json.loads(request.body)
        self.requests.append(body)
        failure = self.failures.get(len(self.requests))
        if failure is not None:
            return Reply(status=failure[0], body=json.dumps(failure[1]).encode())
        problem = pairing_problem(body["messages"])
        if problem is not None:
            return refusal(problem)
        message = self.script.pop(0) if self.script else {"role": "assistant", "content": "done"}
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        }
        return Reply(body=json.dumps(answer).encode())


async def _score(tools: SlotTools, transcript: Transcript) -> float:
    return 1.0 if transcript.final_response else 0.0


async def _run(
    script: list[JSONObject], failures: dict[int, tuple[int, JSONObject]] | None = None
) -> tuple[TrajectoryResult, StrictChatServer]:
    server = StrictChatServer(script, failures=failures or {})
    return await chat_trajectory(server.handle, _score), server


def _call(call_id: str, arguments: str) -> JSONObject:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "write_file", "arguments": arguments},
    }


def _replayed_assistant(request: JSONObject) -> JSONObject:
    messages = request["messages"]
    assert isinstance(messages, list)
    (assistant,) = [m for m in messages if isinstance(m, dict) and m["role"] == "assistant"]
    assert isinstance(assistant, dict)
    return assistant


def _ids(calls: object) -> Sequence[object]:
    assert isinstance(calls, list)
    return [call["id"] for call in calls if isinstance(call, dict)]


async def test_a_garbled_call_is_replayed_so_the_answer_to_it_pairs() -> None:
    """A call whose arguments are broken JSON is answered with an error; the next request must
    still carry that call in the assistant message, or OpenAI refuses it with HTTP 400 and the
    model's mistake ends the trajectory as a model error."""
    result, server = await _run(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", GOOD), _call("c2", "{")],
            }
        ]
    )
    assert result.outcome.status is TrajectoryStatus.FINISHED, result.stats.detail
    assert result.stats.stop_reason is StopReason.NATURAL
    assert result.stats.parse_errors == 1
    assert result.stats.tool_calls == 1
    replayed = _replayed_assistant(server.requests[1])
    assert _ids(replayed["tool_calls"]) == ["c1", "c2"]
    calls = replayed["tool_calls"]
    assert isinstance(calls, list)
    assert isinstance(calls[1], dict)
    assert calls[1]["function"] == {"name": "write_file", "arguments": "{}"}
    tool_ids = [m.tool_call_id for m in result.messages if m.role == "tool"]
    assert tool_ids == ["c1", "c2"]


async def test_two_calls_with_one_id_both_run_under_distinct_ids() -> None:
    """A server that gives two calls of a turn the same id used to crash the trajectory
    (``InvalidInput`` out of the agent loop, counted as an infrastructure failure)."""
    result, server = await _run(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", GOOD), _call("c1", GOOD)],
            }
        ]
    )
    assert result.outcome.status is TrajectoryStatus.FINISHED, result.stats.detail
    assert result.stats.tool_calls == 2
    assert result.stats.tool_errors.total == 0
    assert _ids(_replayed_assistant(server.requests[1])["tool_calls"]) == ["c1", "c1_1"]


async def test_a_refusal_is_the_answer_the_env_scores() -> None:
    """OpenAI puts a model's refusal in ``refusal`` with ``content`` null; it used to be dropped,
    leaving an empty turn that the env never scored."""
    result, _ = await _run([{"role": "assistant", "content": None, "refusal": "I can't do that."}])
    assert result.messages[-1].content == "I can't do that."
    assert result.stats.produced_output
    assert result.outcome.score == 1.0


def _problem(index: int, call_id: str) -> ParseProblem:
    return ParseProblem(
        index=index, raw="{", reason="bad @ arguments", name="bash", call_id=call_id
    )


def test_distinct_ids_rename_later_repeats_in_the_models_order() -> None:
    turn = ParsedTurn(
        calls=[ToolCall(id="a", name="bash"), ToolCall(id="a_1", name="bash")],
        errors=[_problem(1, "a")],
        pair_problems=True,
    )
    distinct = turn.with_distinct_ids()
    assert [c.id for c in distinct.calls] == ["a", "a_1_2"]
    assert [p.call_id for p in distinct.errors] == ["a_1"]
    assert [c.id for c in distinct.to_message().tool_calls] == ["a", "a_1", "a_1_2"]
    plain = ParsedTurn(calls=[ToolCall(id="a", name="bash")])
    assert plain.with_distinct_ids() is plain


def test_managed_mode_keeps_malformed_calls_out_of_the_message() -> None:
    turn = ParsedTurn(calls=[ToolCall(id="a", name="bash")], errors=[_problem(0, "b")])
    assert [c.id for c in turn.to_message().tool_calls] == ["a"]
    paired = attrs.evolve(turn, pair_problems=True)
    assert [(c.id, c.arguments) for c in paired.to_message().tool_calls] == [("b", {}), ("a", {})]


VLLM_TOO_LONG: JSONObject = {
    "object": "error",
    "message": "This model's maximum context length is 32768 tokens. However, you requested "
    "33000 tokens (32744 in the messages, 256 in the completion).",
    "type": "BadRequestError",
    "code": 400,
}


async def test_a_conversation_past_the_models_context_ends_on_its_token_budget() -> None:
    """A tool result that fills the context makes the server refuse the next request (vLLM:
    HTTP 400 "maximum context length"). That used to end the trajectory as a model error,
    unscored; managed mode ends the same trajectory on its token budget and scores it."""
    result, server = await _run(
        [{"role": "assistant", "content": None, "tool_calls": [_call("c1", GOOD)]}],
        failures={2: (400, VLLM_TOO_LONG)},
    )
    assert result.stats.stop_reason is StopReason.TOKEN_BUDGET, result.stats.detail
    assert result.outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED
    assert result.outcome.score == 0.0
    assert "maximum context length" in (result.stats.detail or "")
    assert len(server.requests) == 2


async def test_any_other_refusal_is_still_a_model_error() -> None:
    refused: JSONObject = {"error": {"message": "unknown model 'm'", "type": "invalid_request"}}
    result, _ = await _run([], failures={1: (400, refused)})
    assert result.stats.stop_reason is StopReason.MODEL_ERROR
    assert result.outcome.score is None


@attrs.define
class _RefusingManager:
    """Stands in for atroposlib's ``ServerManager``: its openai client got this refusal."""

    error: Exception

    async def chat_completion(self, **_: object) -> object:
        raise self.error


async def test_the_server_manager_path_reads_a_context_refusal_alike() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    response = httpx2.Response(400, json=VLLM_TOO_LONG, request=request)
    error = openai.BadRequestError("Error code: 400", response=response, body=VLLM_TOO_LONG)
    chat = ServerManagerChatServer(_RefusingManager(error))
    with pytest.raises(ContextFull) as caught:
        await chat.chat([Message.user("hi")], tools=(), sampling=SamplingParams())
    assert caught.value.status == 400
