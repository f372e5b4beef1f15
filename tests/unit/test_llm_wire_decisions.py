"""The LLM wire formats' decisions that ``test_llm_wire`` checks only in part (found by mutation
testing): every key of each request body, which field a value is read from when servers send it
under several, and the path and reason of each refusal."""

from __future__ import annotations

import json

import pytest

from trajcore.adapters.llm.chat_wire import chat_request, parse_chat_body
from trajcore.adapters.llm.token_wire import (
    atropos_generate_request,
    check_prompt_ids,
    parse_atropos_generate_body,
    parse_sglang_generate_body,
    parse_vllm_completion_body,
    response_parser,
    sglang_generate_parser,
    sglang_generate_request,
    vllm_completion_request,
)
from trajcore.adapters.llm.wire import decode_json
from trajcore.domain.errors import ModelServerRejected, WireError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, Usage
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParseProblem

SAMPLING = SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, stop=("x",), seed=3)


def _refusal(parse: object, body: object) -> tuple[str, str]:
    assert callable(parse)
    with pytest.raises(WireError) as caught:
        parse(body)
    return caught.value.field, caught.value.reason


# ------------------------------------------------------------------------------ requests


def test_a_chat_request_holds_every_field_and_extra_body_overrides_last() -> None:
    """Pins the chat body: model, messages, sampling, ``n`` 1, the tools when there are some, and
    ``extra_body`` merged last (it may override ``n``)."""
    spec = ToolSpec(name="bash", description="Run.")
    body = chat_request(model="m", messages=[Message.user("hi")], tools=[spec], sampling=SAMPLING)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["x"],
        "seed": 3,
        "n": 1,
        "tools": [spec.to_openai()],
    }
    override = SamplingParams(extra_body={"n": 2, "model": "other"})
    body = chat_request(model="m", messages=[Message.user("hi")], tools=(), sampling=override)
    assert (body["n"], body["model"]) == (2, "other")


def test_token_requests_hold_every_field_each_server_needs() -> None:
    """Pins each token-in request body: the ids under the server's name, the settings that make
    it send the sampled ids and their logprobs back (and keep special tokens), the sampling under
    the server's names."""
    assert vllm_completion_request(model="m", prompt_ids=[0, 2], sampling=SAMPLING) == {
        "model": "m",
        "prompt": [0, 2],
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["x"],
        "seed": 3,
        "n": 1,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    assert sglang_generate_request(prompt_ids=[0, 2], sampling=SAMPLING) == {
        "input_ids": [0, 2],
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["x"],
            "sampling_seed": 3,
            "skip_special_tokens": False,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_text_in_logprobs": False,
    }
    assert atropos_generate_request(prompt_ids=[0, 2], sampling=SAMPLING) == {
        "prompt": {"prompt_token_ids": [0, 2]},
        "logprobs": 0,
        "n": 1,
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["x"],
        "seed": 3,
        "skip_special_tokens": False,
    }
    extra = SamplingParams(extra_body={"n": 4, "input_ids": [9], "logprobs": 2})
    assert vllm_completion_request(model="m", prompt_ids=[1], sampling=extra)["n"] == 4
    assert sglang_generate_request(prompt_ids=[1], sampling=extra)["input_ids"] == [9]
    assert atropos_generate_request(prompt_ids=[1], sampling=extra)["logprobs"] == 2


@pytest.mark.parametrize(
    ("ids", "field", "reason"),
    [
        ([True], "prompt_ids[0]", "expected a non-negative integer, got True"),
        ([1, 1.5], "prompt_ids[1]", "expected a non-negative integer, got 1.5"),
        ([0, -1], "prompt_ids[1]", "expected a non-negative integer, got -1"),
        ([], "prompt_ids", "must not be empty"),
    ],
)
def test_prompt_ids_are_non_negative_integers_and_some(
    ids: list[int], field: str, reason: str
) -> None:
    """Pins ``check_prompt_ids``: booleans, floats and negative ids are refused by index, id 0
    is an id, and an empty prompt is refused."""
    assert _refusal(check_prompt_ids, ids) == (field, reason)
    assert check_prompt_ids((0, 5)) == [0, 5]


# ------------------------------------------------------------------------------ chat responses


def _chat(message: JSONObject, finish: str | None = "stop", **root: JSON) -> JSONObject:
    return {"choices": [{"message": message, "finish_reason": finish}], **root}


def _fn(arguments: JSON, name: str = "bash", call_id: str = "c0") -> JSONObject:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ([], "$", "expected an object, got array"),
        ({"choices": []}, "$.choices", "expected at least one choice, got none"),
        ({"choices": [3]}, "$.choices[0]", "expected an object, got integer"),
        (
            _chat({"tool_calls": "x"}),
            "$.choices[0].message.tool_calls",
            "expected an array, got string",
        ),
        (
            _chat({"tool_calls": [3]}),
            "$.choices[0].message.tool_calls[0]",
            "expected an object, got integer",
        ),
        (
            _chat({"tool_calls": [{"id": "c", "function": 3}]}),
            "$.choices[0].message.tool_calls[0].function",
            "expected an object, got integer",
        ),
        (
            _chat({"tool_calls": [{"id": 7, "function": {"name": "bash", "arguments": "{}"}}]}),
            "$.choices[0].message.tool_calls[0].id",
            "expected a string, got integer",
        ),
        (
            _chat({"tool_calls": [_fn("{}", name="")]}),
            "$.choices[0].message.tool_calls[0].function.name",
            "must not be empty",
        ),
        (
            _chat({"tool_calls": [_fn(3)]}),
            "$.choices[0].message.tool_calls[0].function.arguments",
            "expected a string, got integer",
        ),
        (
            _chat({"reasoning": 3}),
            "$.choices[0].message.reasoning",
            "expected a string, got integer",
        ),
        (
            _chat({"reasoning_content": 3}),
            "$.choices[0].message.reasoning_content",
            "expected a string, got integer",
        ),
        (
            _chat({"reasoning_details": "x"}),
            "$.choices[0].message.reasoning_details",
            "expected an array, got string",
        ),
        (
            _chat({"reasoning_details": [3]}),
            "$.choices[0].message.reasoning_details[0]",
            "expected an object, got integer",
        ),
        (
            _chat({"reasoning_details": [{"summary": 3}]}),
            "$.choices[0].message.reasoning_details[0].summary",
            "expected a string, got integer",
        ),
        (_chat({}, usage=3), "$.usage", "expected an object, got integer"),
        (
            _chat({}, usage={"completion_tokens": 1.5}),
            "$.usage.completion_tokens",
            "expected an integer, got number",
        ),
    ],
)
def test_a_chat_response_that_breaks_the_protocol_is_refused_at_its_path(
    body: JSON, field: str, reason: str
) -> None:
    """Pins the path and reason of each refusal of a chat-completions body."""
    assert _refusal(parse_chat_body, body) == (field, reason)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"reasoning_content": "a", "reasoning": "b"}, "a"),
        ({"reasoning": "b", "reasoning_details": [{"text": "c"}]}, "b"),
        ({"reasoning_details": [{"text": "a", "summary": "b"}, {"summary": "c"}]}, "ac"),
        ({"reasoning_details": [{"type": "reasoning.encrypted"}, {"text": "t"}]}, "t"),
        ({"reasoning_details": [{"type": "reasoning.encrypted"}]}, None),
        ({"reasoning_details": []}, None),
        ({"reasoning_content": None, "reasoning": "b"}, "b"),
    ],
)
def test_reasoning_is_read_from_the_first_name_present(
    message: JSONObject, expected: str | None
) -> None:
    """Pins the order reasoning is looked for in (``reasoning_content``, ``reasoning``, then the
    details), one part per detail entry (its text before its summary), entries with neither
    skipped, and no reasoning when no entry has any."""
    assert parse_chat_body(_chat({"content": "x", **message})).message.reasoning == expected


def test_arguments_sent_as_an_object_or_blank_text_are_accepted() -> None:
    """Pins that a call's arguments may come as an object, and that blank text means none."""
    body = _chat({"tool_calls": [_fn({"a": 1}), _fn("  \n", call_id="c1")]}, finish="tool_calls")
    turn = parse_chat_body(body)
    assert turn.message.tool_calls == (
        ToolCall(id="c0", name="bash", arguments={"a": 1}),
        ToolCall(id="c1", name="bash", arguments={}),
    )
    assert turn.problems == ()
    assert turn.finish_reason is FinishReason.TOOL_CALLS


def test_each_malformed_call_is_a_problem_with_its_index_text_reason_name_and_id() -> None:
    """Pins each ``ParseProblem`` of a chat turn: its index among all calls, the raw text (an
    object's as JSON), why (broken JSON with where, not an object with what it is, not a JSON
    tree), the name and the id; well-formed calls around it are kept."""
    body = _chat(
        {
            "content": None,
            "tool_calls": [
                _fn("{", call_id="c0"),
                _fn('{"a": 1}', name="read", call_id="c1"),
                _fn("[1]", call_id="c2"),
                _fn({"a": float("nan")}, call_id="c3"),
            ],
        }
    )
    turn = parse_chat_body(json.loads(json.dumps(body)))
    assert turn.message.content == ""
    assert turn.message.tool_calls == (ToolCall(id="c1", name="read", arguments={"a": 1}),)
    assert turn.problems == (
        ParseProblem(
            index=0,
            raw="{",
            reason="arguments are not valid JSON (Expecting property name enclosed in double "
            "quotes at column 2) @ arguments",
            name="bash",
            call_id="c0",
        ),
        ParseProblem(
            index=2,
            raw="[1]",
            reason="arguments must be a JSON object, got array @ arguments",
            name="bash",
            call_id="c2",
        ),
        ParseProblem(
            index=3,
            raw='{"a": NaN}',
            reason="non-finite number nan @ $.a @ arguments",
            name="bash",
            call_id="c3",
        ),
    )


@pytest.mark.parametrize(
    ("arguments", "got"),
    [("null", "null"), ("true", "boolean"), ("3", "integer"), ("2.5", "number"), ('"a"', "string")],
)
def test_arguments_that_are_not_an_object_are_named_in_json_words(arguments: str, got: str) -> None:
    """Pins that the reason names what the arguments are in JSON's words (``null``, never
    Python's ``NoneType``), as the text parsers of managed mode name them."""
    turn = parse_chat_body(_chat({"tool_calls": [_fn(arguments)]}))
    assert turn.problems[0].reason == f"arguments must be a JSON object, got {got} @ arguments"


def test_a_malformed_call_cut_at_max_tokens_says_so_and_others_do_not() -> None:
    """Pins that only a turn cut at ``max_tokens`` prefixes its problems' reasons with it."""
    for finish, prefix in (("length", "cut at max_tokens: "), ("stop", ""), (None, "")):
        turn = parse_chat_body(_chat({"tool_calls": [_fn("[1]")]}, finish=finish))
        assert turn.problems[0].reason == (
            f"{prefix}arguments must be a JSON object, got array @ arguments"
        )


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 3}, Usage(prompt_tokens=3, completion_tokens=0)),
        ({"completion_tokens": 4}, Usage(prompt_tokens=0, completion_tokens=4)),
        (None, Usage()),
    ],
)
def test_usage_counts_default_to_zero(usage: JSON, expected: Usage) -> None:
    """Pins that a missing usage, or a missing count in it, reads as 0."""
    assert parse_chat_body(_chat({"content": "x"}, usage=usage)).usage == expected


# ------------------------------------------------------------------------------ vLLM


def _vllm(logprobs: JSONObject, **choice: JSON) -> JSONObject:
    return {"choices": [{"finish_reason": "length", "logprobs": logprobs, **choice}]}


def test_vllm_ids_come_from_token_ids_or_from_the_tokens() -> None:
    """Pins where vLLM's sampled ids are read: ``token_ids`` when sent (the tokens may be
    absent), else the ``token_id:<id>`` tokens; and the text and finish reason beside them."""
    from_ids = parse_vllm_completion_body(
        _vllm({"token_logprobs": [-0.5, -1.0]}, token_ids=[7, 0], text="hi")
    )
    assert (from_ids.token_ids, from_ids.logprobs, from_ids.text) == ((7, 0), (-0.5, -1.0), "hi")
    assert from_ids.finish_reason is FinishReason.LENGTH
    from_tokens = parse_vllm_completion_body(
        _vllm({"tokens": ["token_id:7"], "token_logprobs": [-0.5]})
    )
    assert (from_tokens.token_ids, from_tokens.text) == ((7,), None)
    both = parse_vllm_completion_body(
        _vllm({"tokens": ["token_id:7"], "token_logprobs": [-0.5]}, token_ids=[7])
    )
    assert both.token_ids == (7,)


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ([], "$", "expected an object, got array"),
        ({"choices": 3}, "$.choices", "expected an array, got integer"),
        ({"choices": []}, "$.choices", "expected at least one choice, got none"),
        ({"choices": [3]}, "$.choices[0]", "expected an object, got integer"),
        ({"choices": [{}]}, "$.choices[0].logprobs", "expected an object, got null"),
        (
            _vllm({"tokens": [3], "token_logprobs": [-0.5]}),
            "$.choices[0].logprobs.tokens[0]",
            "expected a string, got integer",
        ),
        (
            _vllm({"token_logprobs": [-0.5]}),
            "$.choices[0].logprobs.tokens",
            "missing: no sampled token ids in the response",
        ),
        (
            _vllm({"tokens": ["token_id:7"], "token_logprobs": [-0.5]}, token_ids=[8]),
            "$.choices[0].logprobs.tokens",
            "disagrees with token_ids",
        ),
        (
            _vllm({"tokens": ["7"], "token_logprobs": [-0.5]}),
            "$.choices[0].logprobs.tokens[0]",
            "expected 'token_id:<id>' (return_tokens_as_token_ids), got '7'",
        ),
        (
            _vllm({"tokens": ["token_id:-7"], "token_logprobs": [-0.5]}),
            "$.choices[0].logprobs.tokens[0]",
            "expected 'token_id:<id>' (return_tokens_as_token_ids), got 'token_id:-7'",
        ),
        (
            _vllm({"tokens": "x", "token_logprobs": []}),
            "$.choices[0].logprobs.tokens",
            "expected an array, got string",
        ),
        (
            _vllm({"token_logprobs": [-0.5]}, token_ids=[True]),
            "$.choices[0].token_ids[0]",
            "expected an integer, got boolean",
        ),
        (_vllm({}), "$.choices[0].logprobs.token_logprobs", "expected an array, got null"),
        (
            _vllm({"token_logprobs": [-0.5, -0.5]}, token_ids=[1]),
            "$.choices[0].logprobs.token_logprobs",
            "2 logprobs for 1 token ids",
        ),
        (
            _vllm({"token_logprobs": []}, token_ids=[], text=3),
            "$.choices[0].text",
            "expected a string, got integer",
        ),
        (
            _vllm({"token_logprobs": []}, token_ids=[], finish_reason="exploded"),
            "$.choices[0].finish_reason",
            "unknown finish reason 'exploded'",
        ),
    ],
)
def test_a_vllm_response_that_breaks_the_protocol_is_refused_at_its_path(
    body: JSON, field: str, reason: str
) -> None:
    """Pins the path and reason of each refusal of a vLLM completions body."""
    assert _refusal(parse_vllm_completion_body, body) == (field, reason)


# ------------------------------------------------------------------------------ SGLang


def _sglang(entries: JSON, finish: JSON = "stop", **root: JSON) -> JSONObject:
    return {"meta_info": {"finish_reason": finish, "output_token_logprobs": entries}, **root}


def test_sglang_reads_a_single_result_or_a_batch_of_one_and_both_finish_shapes() -> None:
    """Pins SGLang's reply shapes: a result or a list holding one, the finish reason as an object
    with ``type`` or a bare string, the ids and logprobs from the entries, and the text."""
    single = parse_sglang_generate_body(
        _sglang([[-0.5, 7, "a"], [-1.0, 0]], {"type": "length"}, text="hi")
    )
    assert (single.token_ids, single.logprobs, single.text) == ((7, 0), (-0.5, -1.0), "hi")
    assert single.finish_reason is FinishReason.LENGTH
    batch = parse_sglang_generate_body([_sglang([[-0.5, 7]], "length", output_ids=[7])])
    assert (batch.token_ids, batch.finish_reason, batch.text) == ((7,), FinishReason.LENGTH, None)


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ([], "$", "expected one result, got 0"),
        ([_sglang([]), _sglang([])], "$", "expected one result, got 2"),
        ([3], "$[0]", "expected an object, got integer"),
        (
            {"meta_info": {"output_token_logprobs": 3}},
            "$.meta_info.output_token_logprobs",
            "expected an array, got integer",
        ),
        (
            _sglang([[-0.5, 7], 3]),
            "$.meta_info.output_token_logprobs[1]",
            "expected an array, got integer",
        ),
        (_sglang([], output_ids="x"), "$.output_ids", "expected an array, got string"),
        ([{}], "$[0].meta_info", "expected an object, got null"),
        (
            [_sglang([[-0.5]])],
            "$[0].meta_info.output_token_logprobs[0]",
            "expected [logprob, token_id, text]",
        ),
        (
            _sglang([[-0.5, 7], [-0.5]]),
            "$.meta_info.output_token_logprobs[1]",
            "expected [logprob, token_id, text]",
        ),
        (
            _sglang([["x", 7]]),
            "$.meta_info.output_token_logprobs[0][0]",
            "expected a number, got string",
        ),
        (
            _sglang([[-0.5, "7"]]),
            "$.meta_info.output_token_logprobs[0][1]",
            "expected an integer, got string",
        ),
        (
            _sglang([[-0.5, 7]], {"type": "exploded"}),
            "$.meta_info.finish_reason.type",
            "unknown finish reason 'exploded'",
        ),
        (
            _sglang([[-0.5, 7]], "exploded"),
            "$.meta_info.finish_reason",
            "unknown finish reason 'exploded'",
        ),
        (
            _sglang([[-0.5, 7]], output_ids=[8]),
            "$.output_ids",
            "disagrees with output_token_logprobs",
        ),
        (
            [_sglang([[-0.5, 7]], output_ids=[7, 8])],
            "$[0].meta_info.output_token_logprobs",
            "1 logprobs for 2 token ids",
        ),
        (
            [_sglang([[-0.5, 7]], output_ids=[8])],
            "$[0].output_ids",
            "disagrees with output_token_logprobs",
        ),
        ([_sglang([], text=3)], "$[0].text", "expected a string, got integer"),
    ],
)
def test_an_sglang_response_that_breaks_the_protocol_is_refused_at_its_path(
    body: JSON, field: str, reason: str
) -> None:
    """Pins the path and reason of each refusal of an SGLang ``/generate`` body (inside a batch
    of one, paths start at ``$[0]``)."""
    assert _refusal(parse_sglang_generate_body, body) == (field, reason)


# ------------------------------------------------------------------------------ Atropos


def test_atropos_without_token_ids_takes_each_positions_first_id_and_reads_the_first_text() -> None:
    """Pins how an Atropos reply without ``token_ids`` is read: each position's id is the first
    key of its first non-empty table; the text is the first completion's."""
    body = {
        "finish_reasons": ["length", "stop"],
        "logprobs": [[[{}, {"7": -0.5, "8": -0.1}], [{"0": -1.0}]], [[{"9": -0.2}]]],
        "text": ["ab", "c"],
    }
    done = parse_atropos_generate_body(body)
    assert (done.token_ids, done.logprobs, done.text) == ((7, 0), (-0.5, -1.0), "ab")
    assert done.finish_reason is FinishReason.LENGTH
    assert parse_atropos_generate_body({**body, "text": []}).text is None


def test_atropos_with_token_ids_looks_the_id_up_in_every_table_of_its_position() -> None:
    """Pins that a sampled id's logprob is looked up in each table of its position in turn, and
    that only the first completion's ids are read."""
    body = {
        "finish_reasons": ["stop"],
        "logprobs": [[[{"9": -0.1}, {"5": -2.0}]]],
        "token_ids": [[5], [9, 9]],
    }
    done = parse_atropos_generate_body(body)
    assert (done.token_ids, done.logprobs, done.text) == ((5,), (-2.0,), None)


def _atropos(positions: JSON, **root: JSON) -> JSONObject:
    return {"finish_reasons": ["stop"], "logprobs": [positions], **root}


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ([], "$", "expected an object, got array"),
        ({"logprobs": [[]]}, "$.finish_reasons", "expected an array, got null"),
        ({"finish_reasons": ["stop"]}, "$.logprobs", "expected an array, got null"),
        (
            {"finish_reasons": ["stop"], "logprobs": [3]},
            "$.logprobs[0]",
            "expected an array, got integer",
        ),
        (_atropos([], token_ids=3), "$.token_ids", "expected an array, got integer"),
        (_atropos([], token_ids=[3]), "$.token_ids[0]", "expected an array, got integer"),
        (_atropos([3]), "$.logprobs[0][0]", "expected an array, got integer"),
        (_atropos([[3]]), "$.logprobs[0][0][0]", "expected an object, got integer"),
        (
            {"finish_reasons": [], "logprobs": [[]]},
            "$.finish_reasons",
            "expected one finish reason per completion, got none",
        ),
        (
            {"finish_reasons": ["exploded"], "logprobs": [[]]},
            "$.finish_reasons[0]",
            "unknown finish reason 'exploded'",
        ),
        (
            {"finish_reasons": ["stop"], "logprobs": []},
            "$.logprobs",
            "expected one list per completion, got none",
        ),
        (_atropos([], token_ids=[]), "$.token_ids", "expected one list per completion, got none"),
        (
            _atropos([[{"5": -0.1}]], token_ids=[[5, 6]]),
            "$.logprobs[0]",
            "1 logprobs for 2 token ids",
        ),
        (_atropos([[{"x": -0.1}]]), "$.logprobs[0][0][0]", "key 'x' is not a token id"),
        (_atropos([[{"5": "x"}]]), "$.logprobs[0][0][0].5", "expected a number, got string"),
        (
            _atropos([[{"9": -0.1}, {"5": "x"}]], token_ids=[[5]]),
            "$.logprobs[0][0][1].5",
            "expected a number, got string",
        ),
        (_atropos([[{}]]), "$.logprobs[0][0]", "no logprob for the sampled token None"),
        (_atropos([[{"5": -0.1}]], text="x"), "$.text", "expected an array, got string"),
        (_atropos([[{"5": -0.1}]], text=[3]), "$.text[0]", "expected a string, got integer"),
    ],
)
def test_an_atropos_response_that_breaks_the_protocol_is_refused_at_its_path(
    body: JSONObject, field: str, reason: str
) -> None:
    """Pins the path and reason of each refusal of an Atropos ``/generate`` body."""
    assert _refusal(parse_atropos_generate_body, body) == (field, reason)


def test_a_response_parser_reads_the_status_then_the_decoded_body() -> None:
    """Pins ``response_parser``: a 2xx body is decoded and read by the body parser it wraps; any
    other status is the error that status means, whatever the body."""
    parse = response_parser(parse_vllm_completion_body)
    body = _vllm({"token_logprobs": [-0.5]}, token_ids=[7])
    done = parse(200, {}, json.dumps(body).encode())
    assert (done.token_ids, done.logprobs) == ((7,), (-0.5,))
    with pytest.raises(ModelServerRejected) as rejected:
        parse(404, {}, json.dumps(body).encode())
    assert rejected.value.status == 404


def test_arguments_nested_too_deeply_or_with_too_many_digits_are_a_problem_not_a_crash() -> None:
    """A policy's arguments that the JSON parser cannot read for its depth or for a number's
    digits are a ``ParseProblem`` of that call, as any broken JSON is (the model is told), not
    an exception out of the response's parsing; the call beside them is kept."""
    deep = '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"
    digits = '{"a": ' + "1" * 5_000 + "}"
    walked = '{"a": ' + "[" * 600 + "]" * 600 + "}"  # parses; past the JSON trees' depth
    calls: list[JSON] = [
        _fn(deep, call_id="c0"),
        _fn(digits, call_id="c1"),
        _fn(walked, call_id="c2"),
        _fn('{"a": 1}', call_id="c3"),
    ]
    turn = parse_chat_body(_chat({"content": None, "tool_calls": calls}))
    assert turn.message.tool_calls == (ToolCall(id="c3", name="bash", arguments={"a": 1}),)
    reasons = [problem.reason for problem in turn.problems]
    assert reasons[0] == "arguments are not valid JSON (nested too deeply) @ arguments"
    assert reasons[1].startswith("arguments are not valid JSON (Exceeds the limit (4300 digits)")
    assert reasons[2] == (
        f"nested deeper than 100 arrays and objects @ $.a{'[0]' * 99} @ arguments"
    )
    assert [problem.index for problem in turn.problems] == [0, 1, 2]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[" * 5_000 + b"]" * 5_000, "body is not JSON: nested too deeply"),
        (b"1" * 5_000, "body is not JSON: Exceeds the limit (4300 digits)"),
    ],
)
def test_a_body_the_parser_cannot_read_for_its_depth_or_digits_is_a_wire_error(
    body: bytes, reason: str
) -> None:
    """A server's body nested past the parser's depth, or with a number past its digits, is a
    ``WireError`` at ``$`` as any body that is not JSON is."""
    with pytest.raises(WireError) as refused:
        decode_json(body)
    assert refused.value.field == "$"
    assert refused.value.reason.startswith(reason)


def test_sglang_extra_body_sampling_goes_into_sampling_params_and_the_rest_to_the_top() -> None:
    """Pins where ``extra_body`` lands in an SGLang body: a key SGLang samples with, and the
    entries of a ``sampling_params`` object, inside ``sampling_params``; anything else (and a
    ``sampling_params`` that is not an object) at the top level."""
    extra = SamplingParams(
        max_tokens=5,
        extra_body={"top_k": 4, "sampling_params": {"min_p": 0.1}, "rid": "r1"},
    )
    body = sglang_generate_request(prompt_ids=[1], sampling=extra)
    params = body["sampling_params"]
    assert isinstance(params, dict)
    assert (params["top_k"], params["min_p"], params["max_new_tokens"]) == (4, 0.1, 5)
    assert body["rid"] == "r1"
    assert "top_k" not in body
    odd = SamplingParams(extra_body={"sampling_params": "raw"})
    assert sglang_generate_request(prompt_ids=[1], sampling=odd)["sampling_params"] == "raw"


@pytest.mark.parametrize(
    ("output_ids", "prompt", "expected"),
    [
        ([7, 8], [1, 2, 3], (7, 8)),  # as sampled
        ([3, 7, 8], [1, 2, 3], (7, 8)),  # led by the prompt's last id
        ([2, 3, 7, 8], [1, 2, 3], (7, 8)),  # by its last two
    ],
)
def test_sglang_output_ids_led_by_the_prompts_tail_are_the_sampled_ids(
    output_ids: list[int], prompt: list[int], expected: tuple[int, ...]
) -> None:
    """Pins the skip of SGLang's detokenizer context: leading ``output_ids`` equal to the end of
    the prompt the answer is to."""
    body = _sglang([[-0.5, 7], [-0.25, 8]], output_ids=list[JSON](output_ids))
    assert parse_sglang_generate_body(body, prompt).token_ids == expected


@pytest.mark.parametrize(
    ("output_ids", "prompt", "reason"),
    [
        ([9, 7, 8], [1, 2, 3], "2 logprobs for 3 token ids"),  # not the prompt's tail
        ([1, 2, 3, 4, 7, 8], [1, 2, 3], "2 logprobs for 6 token ids"),  # longer than the prompt
        ([3, 7, 8], [], "2 logprobs for 3 token ids"),  # no prompt to recognise
        ([7], [1, 2, 3], "2 logprobs for 1 token ids"),  # fewer
    ],
)
def test_sglang_output_ids_that_are_not_the_prompts_tail_are_refused(
    output_ids: list[int], prompt: list[int], reason: str
) -> None:
    """Pins that only the prompt's own tail is skipped: any other extra id is a ``WireError``."""
    body = _sglang([[-0.5, 7], [-0.25, 8]], output_ids=list[JSON](output_ids))
    with pytest.raises(WireError) as caught:
        parse_sglang_generate_body(body, prompt)
    assert (caught.value.field, caught.value.reason) == (
        "$.meta_info.output_token_logprobs",
        reason,
    )


def test_the_sglang_parser_for_a_prompt_skips_that_prompts_tail() -> None:
    """Pins ``sglang_generate_parser``: a parser of whole responses bound to its prompt."""
    body = json.dumps(_sglang([[-0.5, 7]], output_ids=[3, 7])).encode()
    parse = sglang_generate_parser([1, 2, 3])
    assert parse(200, {}, body).token_ids == (7,)
    with pytest.raises(WireError):
        sglang_generate_parser([1, 2, 4])(200, {}, body)


@pytest.mark.parametrize(
    ("message", "content"),
    [
        ({"content": None, "refusal": "I can't help with that."}, "I can't help with that."),
        ({"content": "  ", "refusal": "No."}, "No."),
        ({"content": "Here it is.", "refusal": "No."}, "Here it is."),
        ({"content": "", "refusal": None}, ""),
    ],
)
def test_a_refusal_is_the_answer_when_the_message_has_no_content(
    message: JSONObject, content: str
) -> None:
    """Pins the refusal rule: a refusal with no other content is the turn's content."""
    assert parse_chat_body(_chat(message)).message.content == content
