"""The token adapters against the LLM stub answering in memory: paths, bodies, ids and logprobs.

The contract suites (``tests/contract``) run the same adapters over loopback sockets.
"""

from __future__ import annotations

import pytest

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.adapters.llm.tokens import AtroposTokenServer, SGLangTokenServer, VLLMTokenServer
from trajcore.domain.errors import ModelServerRejected, PoolClosed, WireError
from trajcore.domain.sampling import FinishReason, SamplingParams
from trajcore.testing.llm_stubs import GenerateDialect, LoopbackLLMServer

pytestmark = pytest.mark.anyio
SAMPLING = SamplingParams(max_tokens=2, seed=7)
PROMPT = [11, 12, 13]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("kind", "dialect", "path"),
    [
        ("vllm", "sglang", "/v1/completions"),
        ("sglang", "sglang", "/generate"),
        ("atropos", "atropos", "/generate"),
    ],
)
async def test_each_token_adapter_reads_the_ids_and_logprobs_it_was_sent(
    kind: str, dialect: GenerateDialect, path: str
) -> None:
    stub = LoopbackLLMServer(generate_dialect=dialect)
    transport = stub.memory_transport()
    base = "http://engine.invalid/v1"
    server = (
        VLLMTokenServer(base_url=base, model="m", transport=transport)
        if kind == "vllm"
        else SGLangTokenServer(base_url=base, transport=transport)
        if kind == "sglang"
        else AtroposTokenServer(base_url=base, transport=transport)
    )
    done = await server.generate(PROMPT, sampling=SAMPLING)
    await server.aclose()
    # The echo policy answers the last three ids plus one, cut at max_tokens.
    assert (list(done.token_ids), list(done.logprobs)) == ([12, 13], [-0.5, -0.5])
    assert done.finish_reason is FinishReason.LENGTH
    (request,) = stub.requests
    assert request.path == path
    assert isinstance(request.body, dict)
    assert "7" in str(request.body)  # the seed, under each server's name for it


async def test_bad_prompts_are_refused_unsent_and_a_4xx_is_rejected() -> None:
    stub = LoopbackLLMServer()
    stub.inject(LLMFault.rejected(422, "prompt too long"))
    server = VLLMTokenServer(
        base_url="http://engine.invalid/v1", model="m", transport=stub.memory_transport()
    )
    with pytest.raises(WireError) as bad:
        await server.generate([-1], sampling=SAMPLING)
    assert bad.value.field == "prompt_ids[0]"
    assert stub.requests == []
    with pytest.raises(ModelServerRejected) as caught:
        await server.generate(PROMPT, sampling=SAMPLING)
    await server.aclose()
    with pytest.raises(PoolClosed):
        await server.generate(PROMPT, sampling=SAMPLING)
    assert caught.value.status == 422
    assert "prompt too long" in str(caught.value.body)
