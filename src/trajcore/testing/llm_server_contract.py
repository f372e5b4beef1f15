"""What the ``ChatServer`` and ``TokenServer`` pytest suites share (fsspec's abstract-test shape).

``LLMServerContract`` runs the port's state machine (``test_generated_sequences``) and the
scenarios worth naming on their own, each one step of that machine called directly: many calls at
once, and closing. ``LLMServerFaultContract`` adds the fault scenarios for implementations that
can stage ``LLMFault`` values: transient faults retried away, persistent 5xx and 429, a 4xx
rejection with its body, a malformed body, a cancellation while the answer is late, and a
``Retry-After`` past the caller's deadline. ``chat_server_contract`` and
``token_server_contract`` subclass them with the machine and the example request of their port.

Settings (class attributes of a subclass):

- ``attempts``: the attempts per call the factory's retry rules allows (default 5). Give the
  retry rules millisecond backoff, or the retry steps are slow.
- ``honours_retry_after``: whether a call waits at least what a 429's ``Retry-After`` asks, and
  gives up at once when that is past its deadline (default ``True``).
- ``machine_scale``: sequences of ``test_generated_sequences``, as a fraction of the loaded
  hypothesis profile's ``max_examples`` (default 0.1: 10 under ``ci``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, ClassVar

import pytest

from trajcore.adapters.fakes.llm import LLMFault
from trajcore.testing.llm_server_machine import (
    LLMServerMachine,
    ServerFactory,
    opened_machine,
    run_llm_machine,
)

__all__ = ["LLMServerContract", "LLMServerFaultContract"]


class LLMServerContract:
    """Abstract: a port's suite sets ``machine``, ``llm_server_factory`` and
    ``example_request``."""

    machine: ClassVar[type[LLMServerMachine[Any, Any, Any]]]
    attempts: ClassVar[int] = 5
    honours_retry_after: ClassVar[bool] = True
    machine_scale: ClassVar[float] = 0.1

    @pytest.fixture
    def llm_server_factory(self) -> ServerFactory[Any]:
        raise NotImplementedError

    def example_request(self, state: Any) -> Any:
        """A fixed request registered with ``state`` (a ``machine`` instance)."""
        raise NotImplementedError

    def opened(self, factory: ServerFactory[Any]) -> AbstractContextManager[Any]:
        """A ``machine`` instance over one server from ``factory``, for a scenario."""
        return opened_machine(
            self.machine,
            [factory],
            attempts=self.attempts,
            honours_retry_after=self.honours_retry_after,
        )

    def test_generated_sequences(self, llm_server_factory: ServerFactory[Any]) -> None:
        run_llm_machine(
            self.machine,
            [llm_server_factory],
            attempts=self.attempts,
            honours_retry_after=self.honours_retry_after,
            scale=self.machine_scale,
        )

    def test_concurrent_calls_get_their_own_answers(
        self, llm_server_factory: ServerFactory[Any]
    ) -> None:
        with self.opened(llm_server_factory) as state:
            state.concurrently([self.example_request(state) for _ in range(24)])

    def test_aclose_is_idempotent_and_later_calls_raise_pool_closed(
        self, llm_server_factory: ServerFactory[Any]
    ) -> None:
        with self.opened(llm_server_factory) as state:
            state.exchange(self.example_request(state), [])
            state.close_twice()
            state.refuse_after_close(self.example_request(state))


class LLMServerFaultContract(LLMServerContract):
    """The fault scenarios, for implementations whose factory yields an ``inject``."""

    def test_transient_failures_are_retried(self, llm_server_factory: ServerFactory[Any]) -> None:
        faults = [
            LLMFault.rate_limited(retry_after_s=0.01),
            LLMFault.server_error(503),
            LLMFault.dropped(),
        ]
        with self.opened(llm_server_factory) as state:
            state.exchange(self.example_request(state), faults)

    @pytest.mark.parametrize(
        ("fault", "persistent", "error"),
        [
            (LLMFault.server_error(502), True, ("ModelServerError", 502)),
            (LLMFault.dropped(), True, ("ModelServerError", None)),
            (LLMFault.rate_limited(), True, ("RateLimited", 429)),
            (
                LLMFault.rejected(422, "tools schema is invalid"),
                False,
                ("ModelServerRejected", 422),
            ),
        ],
        ids=["persistent-5xx", "persistent-drops", "persistent-429", "rejection-with-body"],
    )
    def test_failures_raise_their_typed_error(
        self,
        llm_server_factory: ServerFactory[Any],
        fault: LLMFault,
        persistent: bool,
        error: tuple[str, int | None],
    ) -> None:
        faults = [fault] * (self.attempts if persistent else 1)
        with self.opened(llm_server_factory) as state:
            assert state.exchange(self.example_request(state), faults) == error

    def test_malformed_body_is_a_wire_error(self, llm_server_factory: ServerFactory[Any]) -> None:
        with self.opened(llm_server_factory) as state:
            for body in (b'{"choices": [', b"\xff\xfe{"):
                got = state.exchange(self.example_request(state), [LLMFault.malformed(body)])
                assert got == ("WireError", None)

    def test_cancellation_is_prompt_and_server_stays_usable(
        self, llm_server_factory: ServerFactory[Any]
    ) -> None:
        with self.opened(llm_server_factory) as state:
            state.cancel(self.example_request(state), 0.2)
            state.exchange(self.example_request(state), [])

    def test_retry_after_past_the_deadline_gives_up_at_once(
        self, llm_server_factory: ServerFactory[Any]
    ) -> None:
        if not self.honours_retry_after:
            pytest.skip("this implementation does not wait for Retry-After (honours_retry_after)")
        with self.opened(llm_server_factory) as state:
            state.give_up_before_the_deadline(self.example_request(state))
            state.exchange(self.example_request(state), [])
