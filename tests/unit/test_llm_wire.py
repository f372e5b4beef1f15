"""Bad and good input for the pure LLM wire parsers: each fault a typed error naming its field."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.adapters.llm.chat_wire import (
    chat_request,
    parse_chat_body,
    parse_chat_response,
)
from trajcore.adapters.llm.token_wire import (
    atropos_generate_request,
    parse_atropos_generate,
    parse_atropos_generate_body,
    parse_sglang_generate,
    parse_sglang_generate_body,
    parse_vllm_completion,
    parse_vllm_completion_body,
    sglang_generate_request,
    vllm_completion_request,
)
from trajcore.adapters.llm.wire import error_for_status, retry_after_s
from trajcore.domain.errors import (
    ModelServerError,
    ModelServerRejected,
    RateLimited,
    WireError,
)
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message
from trajcore.domain.sampling import (
    ChatTurn,
    FinishReason,
    SamplingParams,
    TokenCompletion,
    Usage,
)
from trajcore.domain.tools import ToolCall
from trajcore.testing.llm_stubs import (
    _atropos_json,
    _sglang_json,
    _vllm_json,
    chat_completion_json,
)


def _chat(message: dict[str, JSON], finish: str = "tool_calls") -> bytes:
    return json.dumps(
        {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    ).encode()


def _call(i: int, arguments: str) -> dict[str, JSON]:
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "bash", "arguments": arguments},
    }


# --------------------------------------------------------------------------------- chat


def test_malformed_json_is_a_wire_error_at_the_root() -> None:
    with pytest.raises(WireError) as caught:
        parse_chat_response(200, {}, b'{"choices": [')
    assert caught.value.field == "$"
    assert "not JSON" in caught.value.reason


def test_invalid_utf8_is_a_wire_error_naming_the_offset() -> None:
    with pytest.raises(WireError) as caught:
        parse_chat_response(200, {}, b'{"a": "\xff"}')
    assert caught.value.field == "$"
    assert "not UTF-8" in caught.value.reason
    assert "offset 7" in caught.value.reason


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "$.choices"),
        ({"choices": []}, "$.choices"),
        ({"choices": [{"finish_reason": "stop"}]}, "$.choices[0].message"),
        (
            {"choices": [{"message": {"content": 3}, "finish_reason": "stop"}]},
            "$.choices[0].message.content",
        ),
        (
            {"choices": [{"message": {"content": ""}, "finish_reason": "exploded"}]},
            "$.choices[0].finish_reason",
        ),
        (
            {"choices": [{"message": {"tool_calls": [{"id": 3, "function": {"name": "x"}}]}}]},
            "$.choices[0].message.tool_calls[0].id",
        ),
        (
            {"choices": [{"message": {"tool_calls": [{"id": "a", "function": {}}]}}]},
            "$.choices[0].message.tool_calls[0].function.name",
        ),
        (
            {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "3"}},
            "$.usage.prompt_tokens",
        ),
    ],
)
def test_missing_or_mistyped_fields_are_named(body: JSON, field: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_chat_body(body)
    assert caught.value.field == field


def test_malformed_arguments_keep_the_turn_and_name_the_field() -> None:
    body = _chat(
        {"role": "assistant", "content": "ok", "tool_calls": [_call(0, '{"a": 1}'), _call(1, "{")]}
    )
    turn = parse_chat_response(200, {}, body)
    parsed = turn.parsed()
    assert parsed.content == "ok"
    assert parsed.calls == (ToolCall(id="c0", name="bash", arguments={"a": 1}),)
    (problem,) = parsed.errors
    assert (problem.index, problem.raw, problem.call_id) == (1, "{", "c1")
    assert "not valid JSON" in problem.reason


def test_arguments_that_are_not_an_object_are_a_parse_problem() -> None:
    body = _chat({"tool_calls": [_call(0, "[1, 2]")]})
    turn = parse_chat_response(200, {}, body)
    assert "must be a JSON object" in turn.problems[0].reason


def test_cut_at_max_tokens_in_the_middle_of_a_tool_call_says_so() -> None:
    body = _chat({"tool_calls": [_call(0, '{"command": "ec')]}, finish="length")
    turn = parse_chat_response(200, {}, body)
    assert turn.finish_reason is FinishReason.LENGTH
    assert turn.problems[0].reason.startswith("cut at max_tokens")


def test_empty_arguments_mean_no_arguments() -> None:
    turn = parse_chat_response(200, {}, _chat({"tool_calls": [_call(0, "")]}))
    assert turn.message.tool_calls[0].arguments == {}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"reasoning_content": "think"}, "think"),
        ({"reasoning": "think"}, "think"),
        (
            {
                "reasoning_details": [
                    {"type": "reasoning.text", "text": "a"},
                    {"type": "reasoning.summary", "summary": "b"},
                ]
            },
            "ab",
        ),
        ({}, None),
    ],
)
def test_reasoning_is_read_under_every_name(extra: dict[str, JSON], expected: str | None) -> None:
    turn = parse_chat_response(200, {}, _chat({"content": "x", **extra}, finish="stop"))
    assert turn.message.reasoning == expected


def test_request_passes_extra_body_through_and_sends_arguments_as_text() -> None:
    call = ToolCall(id="c", name="bash", arguments={"command": "ls"})
    sampling = SamplingParams(extra_body={"top_k": 20, "chat_template_kwargs": {"x": True}})
    body = chat_request(
        model="m", messages=[Message.assistant("", tool_calls=[call])], tools=(), sampling=sampling
    )
    assert body["top_k"] == 20
    assert body["chat_template_kwargs"] == {"x": True}
    assert "tools" not in body
    message = body["messages"]
    assert isinstance(message, list)
    assert message[0] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    }


# ------------------------------------------------------------------------------- status


def test_http_4xx_is_rejected_with_status_and_body() -> None:
    body = LLMFault.rejected(400, "max_tokens is too large").body
    with pytest.raises(ModelServerRejected) as caught:
        parse_chat_response(400, {}, body)
    assert caught.value.status == 400
    assert caught.value.body == body.decode()
    assert "max_tokens is too large" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, RateLimited), (500, ModelServerError), (503, ModelServerError), (408, ModelServerError)],
)
def test_transient_statuses_are_model_server_errors(status: int, kind: type[Exception]) -> None:
    error = error_for_status(status, {}, b'{"detail": "busy"}')
    assert type(error) is kind
    assert "busy" in str(error)


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after_s({"retry-after": "2.5"}, now=0.0) == 2.5
    date = "Thu, 01 Jan 1970 00:00:10 GMT"
    assert retry_after_s({"retry-after": date}, now=4.0) == 6.0
    assert retry_after_s({"retry-after": "soon"}, now=0.0) is None
    assert retry_after_s({}, now=0.0) is None


# ------------------------------------------------------------------------------- tokens


def _vllm(tokens: list[str], logprobs: list[float], **choice: JSON) -> JSON:
    return {
        "choices": [
            {
                "finish_reason": "stop",
                "logprobs": {"tokens": [*tokens], "token_logprobs": [*logprobs]},
                **choice,
            }
        ]
    }


def test_vllm_logprobs_whose_length_differs_from_the_ids() -> None:
    with pytest.raises(WireError) as caught:
        parse_vllm_completion_body(_vllm(["token_id:1", "token_id:2"], [-0.1]))
    assert caught.value.field == "$.choices[0].logprobs.token_logprobs"
    assert "1 logprobs for 2 token ids" in caught.value.reason


def test_vllm_tokens_must_be_token_ids() -> None:
    with pytest.raises(WireError) as caught:
        parse_vllm_completion_body(_vllm(["token_id:1", "hello"], [-0.1, -0.2]))
    assert caught.value.field == "$.choices[0].logprobs.tokens[1]"
    assert "return_tokens_as_token_ids" in caught.value.reason


def test_vllm_token_ids_and_tokens_must_agree() -> None:
    with pytest.raises(WireError) as caught:
        parse_vllm_completion_body(_vllm(["token_id:1"], [-0.1], token_ids=[2]))
    assert caught.value.field == "$.choices[0].logprobs.tokens"


def test_vllm_null_logprob_is_named() -> None:
    body: JSON = _vllm(["token_id:1"], [-0.1])
    assert isinstance(body, dict)
    json_body = json.loads(json.dumps(body).replace("-0.1", "null"))
    with pytest.raises(WireError) as caught:
        parse_vllm_completion_body(json_body)
    assert caught.value.field == "$.choices[0].logprobs.token_logprobs[0]"


def test_sglang_entry_without_a_token_id_is_named() -> None:
    body = {"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.1]]}}
    with pytest.raises(WireError) as caught:
        parse_sglang_generate_body(body)
    assert caught.value.field == "$.meta_info.output_token_logprobs[0]"


def test_sglang_output_ids_must_match_the_logprobs() -> None:
    body = {
        "output_ids": [5, 6],
        "meta_info": {"finish_reason": "stop", "output_token_logprobs": [[-0.1, 5, None]]},
    }
    with pytest.raises(WireError) as caught:
        parse_sglang_generate_body(body)
    assert "1 logprobs for 2 token ids" in caught.value.reason


def test_atropos_logprobs_whose_length_differs_from_the_ids() -> None:
    body = {"finish_reasons": ["stop"], "logprobs": [[[{"5": -0.1}]]], "token_ids": [[5, 6]]}
    with pytest.raises(WireError) as caught:
        parse_atropos_generate_body(body)
    assert caught.value.field == "$.logprobs[0]"


def test_atropos_position_without_the_sampled_id_is_named() -> None:
    body = {"finish_reasons": ["stop"], "logprobs": [[[{"9": -0.1}]]], "token_ids": [[5]]}
    with pytest.raises(WireError) as caught:
        parse_atropos_generate_body(body)
    assert caught.value.field == "$.logprobs[0][0]"
    assert "sampled token 5" in caught.value.reason


def test_atropos_topk_dicts_are_read_under_the_sampled_id() -> None:
    body = {
        "finish_reasons": ["length"],
        "logprobs": [[[{"9": -0.1, "5": -2.0}]]],
        "token_ids": [[5]],
    }
    done = parse_atropos_generate_body(body)
    assert (done.token_ids, done.logprobs) == ((5,), (-2.0,))


@pytest.mark.parametrize(
    "parse", [parse_vllm_completion, parse_sglang_generate, parse_atropos_generate]
)
def test_token_parsers_reject_invalid_utf8_and_4xx(
    parse: Callable[[int, dict[str, str], bytes], TokenCompletion],
) -> None:
    with pytest.raises(WireError) as caught:
        parse(200, {}, b"\xc3\x28")
    assert caught.value.field == "$"
    with pytest.raises(ModelServerRejected) as rejected:
        parse(404, {}, b'{"object": "error", "message": "model not found"}')
    assert "model not found" in str(rejected.value)


def test_token_requests_pass_extra_body_and_refuse_bad_prompts() -> None:
    sampling = SamplingParams(max_tokens=7, extra_body={"min_p": 0.1})
    assert vllm_completion_request(model="m", prompt_ids=[1], sampling=sampling)["min_p"] == 0.1
    assert sglang_generate_request(prompt_ids=[1], sampling=sampling)["sampling_params"] == {
        "max_new_tokens": 7,
        "temperature": 1.0,
        "top_p": 1.0,
        "skip_special_tokens": False,
        "min_p": 0.1,
    }
    atropos = atropos_generate_request(prompt_ids=[1], sampling=sampling)
    assert atropos["prompt"] == {"prompt_token_ids": [1]}
    assert atropos["max_tokens"] == 7
    with pytest.raises(WireError) as caught:
        sglang_generate_request(prompt_ids=[1, -2], sampling=sampling)
    assert caught.value.field == "prompt_ids[1]"


# ------------------------------------------------------------- round trips and openai types


@st.composite
def completions(draw: st.DrawFn) -> TokenCompletion:
    ids = draw(st.lists(st.integers(0, 2**31 - 1), max_size=20))
    logprobs = draw(
        st.lists(
            st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
            min_size=len(ids),
            max_size=len(ids),
        )
    )
    finish = draw(st.sampled_from([FinishReason.STOP, FinishReason.LENGTH]))
    return TokenCompletion(token_ids=ids, logprobs=logprobs, finish_reason=finish)


@given(completions())
def test_every_token_dialect_round_trips_ids_and_logprobs_exactly(done: TokenCompletion) -> None:
    vllm = json.dumps(_vllm_json(done, model="m", serial=1, prompt_len=3)).encode()
    sglang = json.dumps(_sglang_json(done, serial=1, prompt_len=3)).encode()
    atropos = json.dumps(_atropos_json(done, prompt_ids=[1, 2, 3])).encode()
    for parsed in (
        parse_vllm_completion(200, {}, vllm),
        parse_sglang_generate(200, {}, sglang),
        parse_atropos_generate(200, {}, atropos),
    ):
        assert parsed.token_ids == done.token_ids
        assert [x.hex() for x in parsed.logprobs] == [x.hex() for x in done.logprobs]
        assert parsed.finish_reason is done.finish_reason
    Completion.model_validate_json(vllm)


json_leaf = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8)
arguments = st.dictionaries(st.text(min_size=1, max_size=6), json_leaf, max_size=4)
tool_calls = st.lists(
    st.builds(
        ToolCall,
        id=st.text("abc123_", min_size=1, max_size=8),
        name=st.sampled_from(["bash", "read_file", "write_file"]),
        arguments=arguments,
    ),
    max_size=3,
)


@given(
    content=st.text(max_size=40),
    reasoning=st.none() | st.text(min_size=1, max_size=20),
    calls=tool_calls,
)
def test_chat_turns_round_trip_through_the_openai_shape(
    content: str, reasoning: str | None, calls: list[ToolCall]
) -> None:
    finish = FinishReason.TOOL_CALLS if calls else FinishReason.STOP
    turn = ChatTurn(
        message=Message.assistant(content, tool_calls=calls, reasoning=reasoning),
        finish_reason=finish,
        usage=Usage(prompt_tokens=5, completion_tokens=7),
    )
    wire = chat_completion_json(turn, model="m", serial=1)
    ChatCompletion.model_validate(wire)
    assert parse_chat_response(200, {}, json.dumps(wire).encode()) == turn
