"""The ``TokenServer`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``TokenServerContract`` and provide ``token_server_factory``: a function of a policy
(prompt ids -> ``TokenCompletion``) and a list of ``LLMFault`` (one per request, first) returning
an async context manager that yields a ``TokenServer`` wired to a backend following both. The
backend must cut a completion at the request's ``max_tokens`` as real servers do. The suite checks
what ``trajcore.ports.token_server`` promises:

- the sampled ids and their logprobs come back verbatim and in order (large ids, tiny and very
  negative logprobs, bit-exact floats), with the finish reason; the backend sees the prompt ids
  verbatim; ``max_tokens`` cuts the generation and reports ``LENGTH``;
- concurrent calls each get their own answer;
- 429, 5xx and dropped connections are retried; persisting, ``RateLimited`` / ``ModelServerError``;
  4xx is ``ModelServerRejected``; a malformed body is a ``WireError``; an empty prompt is a
  ``WireError`` naming ``prompt_ids``;
- cancellation is prompt and leaves the server usable; ``aclose`` is idempotent and later calls
  raise ``PoolClosed``.

With faults, ``test_generated_completions_through_generated_faults`` also generates prompts, ids
and logprobs and ``max_tokens``, and sends them through up to three generated transient faults
(429 with and without ``Retry-After``, 5xx, drops), optionally followed by a 4xx or a malformed
body. Factories must allow at least 4 attempts per call with millisecond backoff. The fault tests
live in ``TokenServerFaultContract``; an implementation that cannot stage faults subclasses
``TokenServerContract`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajcore.adapters.fakes.llm import LLMFault, TokenResponder
from trajcore.domain.errors import (
    ModelServerError,
    ModelServerRejected,
    PoolClosed,
    RateLimited,
    WireError,
)
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion
from trajcore.ports.token_server import TokenServer
from trajcore.testing.chat_server_contract import TERMINAL_FAULTS, TRANSIENT_FAULTS

__all__ = ["TokenServerContract", "TokenServerFactory"]

TokenServerFactory = Callable[
    [TokenResponder, Sequence[LLMFault]], AbstractAsyncContextManager[TokenServer]
]

SAMPLING = SamplingParams(max_tokens=64, temperature=1.0)
_base = settings.default
assert _base is not None, "hypothesis has no settings profile loaded"
# a server per example: a fifth of the profile's examples; the factory is reused by every one
_fault_settings = settings(
    max_examples=max(5, _base.max_examples // 5),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.differing_executors,
        HealthCheck.too_slow,
    ],
)
IDS = (151643, 0, 42, 151645, 7, 99999)
LOGPROBS = (-0.0, -1e-9, -23.456789012345678, -0.1, -3.0000000000000004, -7.25)


def _exact(_: Sequence[int]) -> TokenCompletion:
    return TokenCompletion(token_ids=IDS, logprobs=LOGPROBS, finish_reason=FinishReason.STOP)


def _shifted(prompt_ids: Sequence[int]) -> TokenCompletion:
    ids = [t + 1000 for t in prompt_ids]
    return TokenCompletion(
        token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=FinishReason.STOP
    )


class TokenServerContract:
    """Abstract suite: subclass and override ``token_server_factory``."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def token_server_factory(self) -> TokenServerFactory:
        raise NotImplementedError

    @pytest.mark.anyio
    async def test_sampled_ids_and_logprobs_come_back_verbatim(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, []) as server:
            done = await server.generate([1, 2, 3], sampling=SAMPLING)
        assert done.token_ids == IDS
        assert [lp.hex() for lp in done.logprobs] == [lp.hex() for lp in LOGPROBS]
        assert done.finish_reason is FinishReason.STOP

    @pytest.mark.anyio
    async def test_backend_sees_the_prompt_ids_verbatim(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        seen: list[list[int]] = []

        def policy(prompt_ids: Sequence[int]) -> TokenCompletion:
            seen.append(list(prompt_ids))
            return _shifted(prompt_ids)

        prompt = [151644, 8948, 198, 0, 151645]
        async with token_server_factory(policy, []) as server:
            done = await server.generate(prompt, sampling=SAMPLING)
        assert seen == [prompt]
        assert list(done.token_ids) == [t + 1000 for t in prompt]

    @pytest.mark.anyio
    async def test_max_tokens_cuts_the_generation_and_reports_length(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, []) as server:
            done = await server.generate([1], sampling=SamplingParams(max_tokens=4))
        assert done.token_ids == IDS[:4]
        assert done.logprobs == LOGPROBS[:4]
        assert done.finish_reason is FinishReason.LENGTH

    @pytest.mark.anyio
    async def test_concurrent_calls_get_their_own_answers(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        answers: dict[int, tuple[int, ...]] = {}
        async with token_server_factory(_shifted, []) as server:

            async def one(i: int) -> None:
                done = await server.generate([i, i + 1], sampling=SAMPLING)
                answers[i] = done.token_ids

            async with anyio.create_task_group() as group:
                for i in range(24):
                    group.start_soon(one, i)
        assert answers == {i: (i + 1000, i + 1001) for i in range(24)}

    @pytest.mark.anyio
    async def test_empty_prompt_is_a_wire_error(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, []) as server:
            with pytest.raises(WireError) as caught:
                await server.generate([], sampling=SAMPLING)
        assert caught.value.field == "prompt_ids"

    @pytest.mark.anyio
    async def test_aclose_is_idempotent_and_later_calls_raise_pool_closed(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, []) as server:
            await server.generate([1], sampling=SAMPLING)
            await server.aclose()
            await server.aclose()
            with pytest.raises(PoolClosed):
                await server.generate([1], sampling=SAMPLING)


class TokenServerFaultContract(TokenServerContract):
    """The fault half of the contract, for implementations that can inject ``LLMFault``s.

    Subclass this instead of ``TokenServerContract`` when the implementation takes faults
    (fakes, loopback stubs). An implementation that cannot stage them (atroposlib's
    ``ServerManager``, which retries on its own schedule) subclasses ``TokenServerContract``
    alone and is held to the rest.
    """

    @_fault_settings
    @given(
        prompt=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=20),
        ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=12),
        data=st.data(),
        max_tokens=st.integers(1, 16),
        transient=st.lists(TRANSIENT_FAULTS, max_size=3),
        last=st.none() | TERMINAL_FAULTS,
    )
    def test_generated_completions_through_generated_faults(
        self,
        token_server_factory: TokenServerFactory,
        *,
        prompt: list[int],
        ids: list[int],
        data: st.DataObject,
        max_tokens: int,
        transient: list[LLMFault],
        last: LLMFault | None,
    ) -> None:
        """Generated ids and logprobs come back verbatim (cut at ``max_tokens``) through up to
        three transient faults; a 4xx or a malformed body after them is its typed error."""
        logprobs = data.draw(
            st.lists(
                st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                min_size=len(ids),
                max_size=len(ids),
            ),
            label="logprobs",
        )
        seen: list[list[int]] = []

        def policy(prompt_ids: Sequence[int]) -> TokenCompletion:
            seen.append(list(prompt_ids))
            return TokenCompletion(
                token_ids=ids, logprobs=logprobs, finish_reason=FinishReason.STOP
            )

        faults = [*transient, *([] if last is None else [last])]
        sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0)

        async def go() -> None:
            async with token_server_factory(policy, faults) as server:
                with anyio.fail_after(20):
                    if last is None:
                        done = await server.generate(prompt, sampling=sampling)
                        assert done.token_ids == tuple(ids[:max_tokens])
                        assert done.logprobs == tuple(logprobs[:max_tokens])
                        cut = len(ids) > max_tokens
                        assert done.finish_reason is (
                            FinishReason.LENGTH if cut else FinishReason.STOP
                        )
                        assert seen[-1] == prompt
                    elif last.status == 200:
                        with pytest.raises(WireError):
                            await server.generate(prompt, sampling=sampling)
                    else:
                        with pytest.raises(ModelServerRejected) as caught:
                            await server.generate(prompt, sampling=sampling)
                        assert caught.value.status == last.status

        anyio.run(go)

    @pytest.mark.anyio
    async def test_transient_failures_are_retried(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        faults = [
            LLMFault.rate_limited(retry_after_s=0.01),
            LLMFault.server_error(500),
            LLMFault.dropped(),
        ]
        async with token_server_factory(_exact, faults) as server:
            with anyio.fail_after(20):
                done = await server.generate([1], sampling=SAMPLING)
        assert done.token_ids == IDS

    @pytest.mark.anyio
    async def test_persistent_server_errors_raise_model_server_error(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, [LLMFault.server_error(503)] * 50) as server:
            with anyio.fail_after(20), pytest.raises(ModelServerError) as caught:
                await server.generate([1], sampling=SAMPLING)
        assert not isinstance(caught.value, RateLimited)
        assert caught.value.status == 503

    @pytest.mark.anyio
    async def test_persistent_rate_limits_raise_rate_limited(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, [LLMFault.rate_limited()] * 50) as server:
            with anyio.fail_after(20), pytest.raises(RateLimited):
                await server.generate([1], sampling=SAMPLING)

    @pytest.mark.anyio
    async def test_rejection_carries_status_and_body(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        fault = LLMFault.rejected(400, "prompt is longer than the context window")
        async with token_server_factory(_exact, [fault]) as server:
            with pytest.raises(ModelServerRejected) as caught:
                await server.generate([1], sampling=SAMPLING)
        assert caught.value.status == 400
        assert "context window" in caught.value.body

    @pytest.mark.anyio
    async def test_malformed_body_is_a_wire_error(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, [LLMFault.malformed(b"\xff\xfe{")]) as server:
            with pytest.raises(WireError) as caught:
                await server.generate([1], sampling=SAMPLING)
        assert caught.value.field.startswith("$")

    @pytest.mark.anyio
    async def test_cancellation_is_prompt_and_server_stays_usable(
        self, token_server_factory: TokenServerFactory
    ) -> None:
        async with token_server_factory(_exact, [LLMFault.delay(30.0)]) as server:
            with anyio.move_on_after(0.2) as scope:
                await server.generate([1], sampling=SAMPLING)
            assert scope.cancelled_caught
            with anyio.fail_after(10):
                done = await server.generate([1], sampling=SAMPLING)
        assert done.token_ids == IDS
