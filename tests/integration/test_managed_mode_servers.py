"""Managed mode against loopback servers that answer the way real vLLM and SGLang builds do.

Each server here is a real HTTP server on 127.0.0.1 (``adapters.http1.HTTPServer``) whose answers
copy a quirk of a released server; the real adapters and ``TokenPolicy`` drive it.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.llm.token_wire import parse_sglang_generate_body
from trajcore.adapters.llm.tokens import SGLangTokenServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.errors import WireError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec
from trajcore.rollout.policy import TokenPolicy
from trajcore.testing.llm_stubs import LoopbackLLMServer

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryRules(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01)
BASH = ToolSpec(
    name="bash",
    description="Run a command.",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def qwen() -> TransformersTokenizer:
    return TransformersTokenizer.from_path(Path(qwen3_tokenizer_path()))


async def test_sglang_output_ids_led_by_the_prompts_last_ids_are_accepted(
    qwen: TransformersTokenizer,
) -> None:
    # SGLang's detokenizer sends its incremental-decoding context (the prompt's last five ids)
    # in front of the sampled ids in ``output_ids`` (sgl-project/sglang#17240); the sampled ids
    # and their logprobs are in ``meta_info.output_token_logprobs``.
    parser = get_parser("hermes")
    im_end = qwen.encode("<|im_end|>")
    replies = [
        [
            *qwen.encode(parser.render([ToolCall(id="a", name="bash", arguments={"cmd": "ls"})])),
            *im_end,
        ],
        [*qwen.encode("Done."), *im_end],
    ]
    prompts: list[list[int]] = []

    def handle(request: Request) -> Reply:
        body = json.loads(request.body)
        prompt = [int(t) for t in body["input_ids"]]
        sampled = replies[len(prompts)]
        prompts.append(prompt)
        answer = {
            "text": qwen.decode(sampled),
            "output_ids": [*prompt[-5:], *sampled],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": im_end[0]},
                "prompt_tokens": len(prompt),
                "completion_tokens": len(sampled),
                "output_token_logprobs": [[-0.25, t, None] for t in sampled],
            },
        }
        return Reply(status=200, body=json.dumps(answer).encode())

    http = HTTPServer(handle, idle_timeout_s=60.0)
    _, port = await http.listen_tcp("127.0.0.1", 0)
    server = SGLangTokenServer(base_url=f"http://127.0.0.1:{port}", retry=FAST_RETRY)
    try:
        policy = TokenPolicy(
            server=server, tokenizer=qwen, template=ChatTemplate.learn(qwen), parser=parser
        )
        session = policy.start([Message.user("List the files.")], tools=[BASH])
        with anyio.fail_after(30):
            first = await session.sample([], sampling=SamplingParams(max_tokens=64))
            assert [c.name for c in first.parsed.calls] == ["bash"]
            call = first.parsed.calls[0]
            result = ToolResult(
                call_id=call.id, name=call.name, outcome=ToolOutcome.OK, content="a.txt"
            )
            session.add_environment([Message.tool(result)])
            second = await session.sample([], sampling=SamplingParams(max_tokens=64))
        assert second.parsed.content == "Done."
        tokens = session.training_tokens([], max_token_length=None)
        assert tokens is not None
        trained = [t for t, m in zip(tokens.tokens, tokens.masks, strict=True) if m != -100]
        assert trained == [*replies[0], *replies[1]]
        assert prompts[1] == list(tokens.tokens[: len(prompts[1])])
    finally:
        await server.aclose()
        await http.aclose(grace_s=0.0)


def test_sglang_output_ids_led_by_ids_that_are_not_the_prompts_are_refused() -> None:
    body = {
        "output_ids": [1, 2, 7],
        "meta_info": {"finish_reason": "stop", "output_token_logprobs": [[-0.1, 7, None]]},
    }
    with pytest.raises(WireError) as caught:
        parse_sglang_generate_body(body, prompt_ids=[5, 1, 3])
    assert "1 logprobs for 3 token ids" in caught.value.reason
    assert parse_sglang_generate_body(body, prompt_ids=[5, 1, 2]).token_ids == (7,)
    # a prompt shorter than SGLang's five ids of context: all of it comes first
    assert parse_sglang_generate_body(body, prompt_ids=[1, 2]).token_ids == (7,)
    with pytest.raises(WireError):
        parse_sglang_generate_body(body, prompt_ids=[2])


async def test_sglang_sampling_keys_of_extra_body_reach_sampling_params() -> None:
    # SGLang's /generate reads sampling settings only inside ``sampling_params``; the same keys
    # at the top level are dropped without an error, so the run would sample with defaults.
    async with LoopbackLLMServer(generate_dialect="sglang") as stub:
        server = SGLangTokenServer(base_url=stub.url, retry=FAST_RETRY)
        sampling = SamplingParams(
            max_tokens=8,
            extra_body={
                "top_k": 20,
                "min_p": 0.0,
                "sampling_params": {"repetition_penalty": 1.05},
                "rid": "r1",
            },
        )
        try:
            with anyio.fail_after(30):
                await server.generate([1, 2, 3], sampling=sampling)
        finally:
            await server.aclose()
    body = stub.requests[-1].body
    assert isinstance(body, dict)
    params = body["sampling_params"]
    assert isinstance(params, dict)
    assert (params["top_k"], params["min_p"], params["repetition_penalty"]) == (20, 0.0, 1.05)
    assert params["max_new_tokens"] == 8
    assert {"top_k", "min_p"}.isdisjoint(body)
    assert body["rid"] == "r1"
