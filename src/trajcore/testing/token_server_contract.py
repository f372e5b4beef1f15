"""The ``TokenServer`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``TokenServerFaultContract`` (or ``TokenServerContract`` when the implementation cannot
stage faults) and provide ``token_server_factory``: a function of the model's policy (a
``TokenResponder``: prompt ids in, a ``TokenCompletion`` out) returning an async context manager
that yields a ``ServerUnderTest``: your ``TokenServer`` wired to a backend that answers with that
policy, cutting completions at the request's ``max_tokens`` as real servers do, and ``inject`` to
stage ``LLMFault`` values on it (``None`` when it cannot). ``LoopbackLLMServer`` in
``trajcore.testing.llm_stubs`` speaks the vLLM, SGLang and Atropos wire formats.

The suite checks what ``trajcore.ports.token_server`` promises. ``test_generated_sequences`` runs
the state machine of ``trajcore.testing.token_server_machine``: generated prompts, sampled ids,
logprobs and ``max_tokens`` through generated faults (429 with and without ``Retry-After``, 5xx,
dropped connections, 4xx, malformed bodies, late answers), refused prompts, concurrent calls,
cancellations and closing, checked after every step. The named scenarios are single steps of
that machine: awkward ids and logprobs bit for bit, ``max_tokens`` cutting with ``LENGTH``, an
empty prompt, many calls at once, closing, and with faults those of ``LLMServerFaultContract``.
Settings (``attempts``, ``honours_retry_after``, ``machine_scale``) are described in
``trajcore.testing.llm_server_contract``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from trajcore.adapters.fakes.llm import TokenResponder
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.ports.token_server import TokenServer
from trajcore.testing.llm_server_contract import LLMServerContract, LLMServerFaultContract
from trajcore.testing.llm_server_machine import ServerFactory, ServerUnderTest
from trajcore.testing.token_server_machine import TokenRequest, TokenServerMachine

__all__ = ["TokenServerContract", "TokenServerFactory", "TokenServerFaultContract"]

TokenServerFactory = Callable[
    [TokenResponder], AbstractAsyncContextManager[ServerUnderTest[TokenServer]]
]

IDS = (151643, 0, 42, 151645, 7, 99999)
LOGPROBS = (-0.0, -1e-9, -23.456789012345678, -0.1, -3.0000000000000004, -7.25)
_EXACT = TokenCompletion(token_ids=IDS, logprobs=LOGPROBS, finish_reason=FinishReason.STOP)
_PROMPT = (151644, 8948, 198, 0, 151645)


class TokenServerContract(LLMServerContract):
    """Abstract suite: subclass and override ``token_server_factory``."""

    machine = TokenServerMachine

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        raise NotImplementedError

    @pytest.fixture
    def llm_server_factory(
        self, token_server_factory: TokenServerFactory
    ) -> ServerFactory[TokenServer]:
        return token_server_factory

    def example_request(self, state: TokenServerMachine) -> TokenRequest:
        return state.ask(_PROMPT, _EXACT)

    def test_sampled_ids_and_logprobs_come_back_verbatim(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        with self.opened(token_server_factory) as state:
            ids, bits, finish = state.exchange(state.ask(_PROMPT, _EXACT), [])
        assert (ids, bits, finish) == (IDS, tuple(lp.hex() for lp in LOGPROBS), FinishReason.STOP)

    def test_max_tokens_cuts_the_generation_and_reports_length(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        with self.opened(token_server_factory) as state:
            ids, _, finish = state.exchange(state.ask([1], _EXACT, max_tokens=4), [])
        assert (ids, finish) == (IDS[:4], FinishReason.LENGTH)

    def test_empty_prompt_is_a_wire_error(self, token_server_factory: TokenServerFactory) -> None:
        with self.opened(token_server_factory) as state:
            state.refuse_prompt([])


class TokenServerFaultContract(TokenServerContract, LLMServerFaultContract):
    """The fault half of the contract, for implementations that can stage ``LLMFault`` values.

    An implementation that cannot stage them (atroposlib's ``ServerManager``, which retries on
    its own schedule) subclasses ``TokenServerContract`` alone and is held to the rest.
    """
