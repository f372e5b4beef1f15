"""The ``TokenServer`` contract as a hypothesis state machine, for one server or several at once.

``TokenServerMachine`` adds to the shared rules of ``trajcore.testing.llm_server_machine`` what a
managed-mode request is: generated prompt ids (any non-negative ids up to 2**31, the first one
unique to the request) and sampling settings with a generated ``max_tokens``. The model answers
each with generated sampled ids, one logprob per id (zero, tiny, very negative: any finite float
up to 0) and a finish reason. One more rule sends prompts the port refuses (empty, a negative id,
a boolean), which must be a ``WireError`` naming ``prompt_ids`` before anything is sent.

What every answer must be: the sampled ids verbatim and in order, cut at ``max_tokens``, with
their logprobs bit for bit, the finish reason (``LENGTH`` when ``max_tokens`` cut it); and the
backend saw the prompt ids verbatim.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from trajcore.domain.errors import WireError
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.ports.token_server import TokenServer
from trajcore.testing.llm_server_machine import (
    Expected,
    LLMServerMachine,
    run_llm_machine,
)

__all__ = ["TokenRequest", "TokenServerMachine", "run_token_server_machine", "sampled_logprobs"]

_IDS = st.integers(0, 2**31 - 1)

sampled_logprobs = st.one_of(
    st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, -1e-9, -5e-324, -23.456789012345678, -3.0000000000000004]),
)
"""Logprobs a sampler may report: finite floats up to 0, with the awkward ones made likely."""


@attrs.frozen
class TokenRequest:
    """One generated request: prompt ids (the first unique to it) and sampling settings."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams


class TokenServerMachine(LLMServerMachine[TokenServer, TokenRequest, TokenCompletion]):
    """The shared LLM rules over managed-mode requests (see the module doc)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[int, ...], TokenCompletion] = {}
        self.seen: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        super().__init__()

    def respond(self, request: Any) -> TokenCompletion:
        prompt = tuple(request)
        self.seen.setdefault(prompt, []).append(prompt)
        return self.answers[prompt]

    def ask(
        self, prompt_ids: Sequence[int], answer: TokenCompletion, *, max_tokens: int = 64
    ) -> TokenRequest:
        """A request for ``prompt_ids`` (made unique by a leading id) that the model answers
        with ``answer``."""
        prompt = (1_000_000 + self.next_tag(), *prompt_ids)
        self.answers[prompt] = answer
        return TokenRequest(
            prompt_ids=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0)
        )

    def draw_request(self, data: st.DataObject, *, garbled: bool = False) -> TokenRequest:
        prompt = data.draw(st.lists(_IDS, max_size=20), label="prompt")
        ids = data.draw(st.lists(_IDS, max_size=12), label="sampled ids")
        logprobs = data.draw(
            st.lists(sampled_logprobs, min_size=len(ids), max_size=len(ids)), label="logprobs"
        )
        finish = data.draw(st.sampled_from([FinishReason.STOP, FinishReason.LENGTH]))
        answer = TokenCompletion(token_ids=ids, logprobs=logprobs, finish_reason=finish)
        return self.ask(prompt, answer, max_tokens=data.draw(st.integers(1, 16), label="max"))

    async def send(self, server: TokenServer, request: TokenRequest) -> TokenCompletion:
        return await server.generate(request.prompt_ids, sampling=request.sampling)

    def check_answer(
        self, request: TokenRequest, answer: TokenCompletion, expected: Expected
    ) -> Hashable:
        seen = self.seen.pop(request.prompt_ids, [])
        assert seen, "the backend never saw the prompt"
        assert all(prompt == request.prompt_ids for prompt in seen)
        want = self.answers[request.prompt_ids]
        limit = request.sampling.max_tokens
        assert answer.token_ids == want.token_ids[:limit], (answer.token_ids, want.token_ids)
        got_bits = [lp.hex() for lp in answer.logprobs]
        assert got_bits == [lp.hex() for lp in want.logprobs[:limit]], answer.logprobs
        cut = len(want.token_ids) > limit
        assert answer.finish_reason is (FinishReason.LENGTH if cut else want.finish_reason)
        return (answer.token_ids, tuple(got_bits), answer.finish_reason)

    @precondition(lambda self: not self.closed)
    @rule(bad=st.sampled_from([(), (1, -1), (True, 2), (3, 2**31, -(2**40))]))
    def refused_prompt(self, bad: tuple[int, ...]) -> None:
        self.refuse_prompt(bad)

    def refuse_prompt(self, bad: Sequence[int]) -> None:
        """``bad`` must be a ``WireError`` naming ``prompt_ids`` on every server."""
        bad = tuple(bad)
        for under in self.under_test:
            answer, error = self.portal.call(
                self._attempt, under.server, TokenRequest(prompt_ids=bad, sampling=_SAMPLING), 5.0
            )
            assert isinstance(error, WireError), (answer, error)
            assert error.field.startswith("prompt_ids"), error.field
            if not bad:
                assert error.field == "prompt_ids", error.field


_SAMPLING = SamplingParams(max_tokens=4, temperature=1.0)


run_token_server_machine = functools.partial(run_llm_machine, TokenServerMachine)
"""Drive the token servers from ``factories`` (in lockstep when several) with generated
sequences; the settings are those of ``trajcore.testing.llm_server_machine.run_llm_machine``."""
