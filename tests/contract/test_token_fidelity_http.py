"""Token fidelity through the ``/generate`` adapters over real loopback HTTP, with truncation.

The ledger properties elsewhere feed sampled ids to the ledger directly. Here they travel the way
they do in training: a ``LoopbackLLMServer`` speaking SGLang's native ``/generate`` or the Atropos
vLLM server's ``/generate`` (and vLLM's ``/v1/completions``, for comparison) over real sockets,
``SGLangTokenServer`` / ``AtroposTokenServer`` / ``VLLMTokenServer`` parsing its JSON,
``TokenPolicy`` (the managed-mode session) putting them in the ledger and bridging tool results
with the template, and ``export(max_token_length=...)`` cutting the result.
Templates: Qwen3's real one (transformers) and Mistral's own encoder (``mistral_common``,
SentencePiece v3 and Tekken v7).

Hypothesis draws awkward samples: ids anywhere in the vocabulary (special ids, the end-of-turn
mid-turn or missing at the end), logprobs at the edges of what JSON carries (``-0.0``, subnormals,
long fractions, large magnitudes), ``length`` and ``stop`` finishes. Then:

1. each request's prompt is exactly the ledger so far;
2. every sampled id comes back verbatim, in order, with its logprob bit for bit (``float.hex``)
   and its finish reason;
3. masks are the id on sampled tokens and ``-100`` elsewhere; inference logprobs ``1.0`` elsewhere;
4. with ``max_token_length`` the head is kept exactly, and the ``Truncation`` report's counts per
   kind equal those of the positions cut.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Sequence
from typing import Literal

import anyio
import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.mistral_tokenizers import adapter
from trajcore.adapters.llm.tokens import AtroposTokenServer, SGLangTokenServer, VLLMTokenServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.token_ledger.ledger import (
    MASKED_LABEL,
    MASKED_LOGPROB,
    SegmentKind,
    TrainingTokens,
)
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolOutcome, ToolResult, ToolSpec
from trajcore.ports.tokenizer import Tokenizer
from trajcore.rollout.policy import TokenPolicy
from trajcore.testing.llm_stubs import GenerateDialect, LoopbackLLMServer, StubRequest

FAST_RETRY = RetryRules(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01)
TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
FIRST = (Message.system("You are a careful agent."), Message.user("list the files"))
TEMPLATES = ("qwen3", "mistral-v3", "mistral-tekken-v7")
Dialect = Literal["sglang", "atropos", "vllm"]  # vllm: /v1/completions, for comparison
DIALECTS: tuple[Dialect, ...] = ("sglang", "atropos", "vllm")
SAMPLING = SamplingParams(max_tokens=64)


@attrs.frozen
class Setup:
    name: str
    tokenizer: Tokenizer
    template: ChatTemplate
    parser: str
    vocab: int  # ids below this decode
    awkward: tuple[int, ...]  # ids worth sampling on purpose: end-of-turn, specials, edges

    def __repr__(self) -> str:
        return f"Setup({self.name!r})"


@functools.cache
def _setup(name: str) -> Setup:
    if name == "qwen3":
        qwen = TransformersTokenizer.from_path(qwen3_tokenizer_path())
        template = ChatTemplate.learn(qwen, turn_stops=[qwen.eos_token_id or 0])
        specials = [*template.shape.end_of_turn, *template.shape.turn_stops, 151643, 151644]
        return Setup("qwen3", qwen, template, "hermes", 151_643, (0, 151_642, *specials))
    mistral = adapter("v3" if name == "mistral-v3" else "tekken-v7")
    template = ChatTemplate.learn(mistral, turn_stops=[2])
    vocab = 32_768 if name == "mistral-v3" else 131_072
    marks = ("[TOOL_CALLS]", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")
    awkward = (0, 1, 2, vocab - 1, *(mistral.special_id(m) for m in marks))
    return Setup(name, mistral, template, "mistral", vocab, awkward)


# ------------------------------------------------------------------------------ samples

LOGPROBS = st.one_of(
    st.floats(max_value=0.0, allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([-0.0, 0.0, -5e-324, -2.2250738585072014e-308, -1e-300, -1e4, -1 / 3]),
)


@attrs.frozen
class Sample:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: FinishReason
    tool_result: str | None  # answered with a tool result, else with a user message


@st.composite
def samples(draw: st.DrawFn, setup: Setup) -> list[Sample]:
    out: list[Sample] = []
    for _ in range(draw(st.integers(1, 4))):
        token = st.one_of(st.integers(0, setup.vocab - 1), st.sampled_from(setup.awkward))
        ids = draw(st.lists(token, min_size=1, max_size=24))
        if draw(st.booleans()):  # end the turn as the template does (or not: a cut turn)
            ids.append(setup.template.shape.end_of_turn[0])
        out.append(
            Sample(
                ids=tuple(ids),
                logprobs=tuple(draw(st.lists(LOGPROBS, min_size=len(ids), max_size=len(ids)))),
                finish=draw(st.sampled_from([FinishReason.STOP, FinishReason.LENGTH])),
                tool_result=draw(st.none() | st.text("abc xyz\n", min_size=1, max_size=12)),
            )
        )
    return out


# ------------------------------------------------------------------------------ the run


@attrs.frozen
class Run:
    cuts: dict[int, TrainingTokens]  # exported with max_token_length, by limit
    full: TrainingTokens  # exported whole
    received: list[tuple[int, ...]]  # the prompt ids each request carried on the wire


def _wire_prompt(request: StubRequest) -> tuple[int, ...]:
    body = request.body
    assert isinstance(body, dict)
    holder = body.get("input_ids", body.get("prompt"))  # SGLang; vLLM completions
    if isinstance(holder, dict):  # Atropos: {"prompt": {"prompt_token_ids": [...]}}
        holder = holder["prompt_token_ids"]
    assert isinstance(holder, list)
    ids = [i for i in holder if isinstance(i, int)]
    assert len(ids) == len(holder)
    return tuple(ids)


def _environment(index: int, sample: Sample) -> list[Message]:
    if sample.tool_result is None:
        return [Message.user("go on")]
    result = ToolResult(
        call_id=f"call_{index + 1}_0",
        name="bash",
        outcome=ToolOutcome.OK,
        content=sample.tool_result,
    )
    return [Message.tool(result)]


def _play(setup: Setup, dialect: Dialect, script: Sequence[Sample], where: float) -> Run:
    """Play ``script``; export it whole and cut at ``where`` of its length (and at every segment
    boundary, one token either side)."""
    queue = deque(TokenCompletion.of(s.ids, s.logprobs, s.finish) for s in script)

    def respond(prompt_ids: Sequence[int]) -> TokenCompletion:
        del prompt_ids  # checked from the recorded requests
        return queue.popleft()

    async def main() -> Run:
        generate: GenerateDialect = "atropos" if dialect == "atropos" else "sglang"
        async with LoopbackLLMServer(token_policy=respond, generate_dialect=generate) as stub:
            server: SGLangTokenServer | AtroposTokenServer | VLLMTokenServer
            rng = random.Random(0)
            if dialect == "sglang":
                server = SGLangTokenServer(base_url=stub.url, retry=FAST_RETRY, rng=rng)
            elif dialect == "vllm":
                url = f"{stub.url}/v1"
                server = VLLMTokenServer(base_url=url, model="m", retry=FAST_RETRY, rng=rng)
            else:
                server = AtroposTokenServer(base_url=f"{stub.url}/v1", retry=FAST_RETRY, rng=rng)
            policy = TokenPolicy(
                server=server,
                tokenizer=setup.tokenizer,
                template=setup.template,
                parser=get_parser(setup.parser),
            )
            messages = list(FIRST)
            session = policy.start(messages, tools=TOOLS)
            try:
                for index, sample in enumerate(script):
                    turn = await session.sample(messages, sampling=SAMPLING)
                    assert turn.finish_reason is sample.finish
                    assert turn.completion_tokens == len(sample.ids)
                    if index < len(script) - 1:
                        session.add_environment(_environment(index, sample))
            finally:
                await server.aclose()
            full = session.training_tokens(messages, max_token_length=None)
            assert full is not None
            length = len(full.tokens)
            paths = ("/generate", "/v1/completions")
            received = [_wire_prompt(r) for r in stub.requests if r.path in paths]
            boundaries = {len(p) + d for p in received for d in (-1, 0, 1)}
            boundaries |= {
                p + len(s.ids) + d
                for p, s in zip(map(len, received), script, strict=True)
                for d in (-1, 0, 1)
            }
            limits = {max(1, round(where * (length + 2))), length, length + 1}
            limits |= {b for b in boundaries if b >= 1}
            cuts: dict[int, TrainingTokens] = {}
            for limit in sorted(limits):
                cut = session.training_tokens(messages, max_token_length=limit)
                assert cut is not None
                cuts[limit] = cut
            return Run(cuts=cuts, full=full, received=received)

    return anyio.run(main)


def _kinds(run: Run, script: Sequence[Sample]) -> list[SegmentKind]:
    """The kind of every ledger position, from the wire alone: the first request's prompt, then
    each sample where the request for it ended, and the environment up to the next request."""
    kinds = [SegmentKind.PROMPT] * len(run.received[0])
    for index, sample in enumerate(script):
        kinds += [SegmentKind.COMPLETION] * len(sample.ids)
        end = len(run.received[index + 1]) if index + 1 < len(script) else len(kinds)
        kinds += [SegmentKind.ENVIRONMENT] * (end - len(kinds))
    return kinds


def _check(run: Run, script: Sequence[Sample]) -> None:
    full = run.full.tokens
    assert len(run.received) == len(script)
    # 1. each request's prompt is the ledger so far, and the next one extends it by the
    #    sample, verbatim, then the environment.
    for index, sample in enumerate(script):
        start = len(run.received[index])
        assert full[:start] == run.received[index]
        assert full[start : start + len(sample.ids)] == sample.ids
    assert full[len(run.received[-1]) :] == script[-1].ids
    kinds = _kinds(run, script)
    assert len(kinds) == len(full)
    # 2 and 3. ids, masks and logprobs, bit for bit.
    sampled = iter(lp for s in script for lp in s.logprobs)
    assert run.full.inference_logprobs is not None
    for position, kind in enumerate(kinds):
        logprob = run.full.inference_logprobs[position]
        if kind is SegmentKind.COMPLETION:
            assert run.full.masks[position] == full[position]
            assert logprob.hex() == next(sampled).hex()
        else:
            assert run.full.masks[position] == MASKED_LABEL
            assert logprob == MASKED_LOGPROB
    assert run.full.completion_tokens == sum(len(s.ids) for s in script)
    # 4. truncation: the head, exactly, and a report that counts what was cut.
    for limit, cut in run.cuts.items():
        _check_cut(run, kinds, limit, cut)
    # Every segment boundary was cut at, one token either side: each kind was cut into.
    event(f"turns: {len(script)}")


def _check_cut(run: Run, kinds: list[SegmentKind], limit: int, cut: TrainingTokens) -> None:
    assert cut.tokens == run.full.tokens[:limit]
    assert cut.masks == run.full.masks[:limit]
    assert cut.inference_logprobs is not None
    assert run.full.inference_logprobs is not None
    assert [x.hex() for x in cut.inference_logprobs] == [
        x.hex() for x in run.full.inference_logprobs[:limit]
    ]
    kept, lost = kinds[:limit], kinds[limit:]
    assert cut.prompt_tokens == kept.count(SegmentKind.PROMPT)
    assert cut.completion_tokens == kept.count(SegmentKind.COMPLETION)
    assert cut.environment_tokens == kept.count(SegmentKind.ENVIRONMENT)
    if not lost:
        assert cut.truncation is None
        return
    report = cut.truncation
    assert report is not None
    assert report.max_token_length == limit
    assert report.kept_tokens == limit
    assert report.cut_tokens == len(lost)
    assert report.cut_prompt_tokens == lost.count(SegmentKind.PROMPT)
    assert report.cut_completion_tokens == lost.count(SegmentKind.COMPLETION)
    assert report.cut_environment_tokens == lost.count(SegmentKind.ENVIRONMENT)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=25)
@given(data=st.data())
def test_sampled_ids_and_logprobs_survive_the_wire_and_truncation(
    name: str, dialect: Dialect, data: st.DataObject
) -> None:
    setup = _setup(name)
    script = data.draw(samples(setup), label="script")
    # Where to cut, as a share of the ledger's length (its length is known only once played).
    where = data.draw(st.floats(0.0, 1.0), label="cut at")
    run = _play(setup, dialect, script, where)
    _check(run, script)
