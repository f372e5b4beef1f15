"""A slot's call queue: examples of each rule, and a stateful check against a simple model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trajcore.domain.errors import ConfigError, InvalidInput, StateError
from trajcore.domain.slot_calls import (
    Accepted,
    Answered,
    CallTicket,
    Closing,
    Joined,
    RefuseCall,
    Refused,
    ResetTicket,
    RunCall,
    RunReset,
    SlotBroken,
    SlotCalls,
    SlotCallStatistics,
    StaleEpoch,
    Submission,
)


def accepted(submission: Submission[str]) -> CallTicket:
    assert isinstance(submission, Accepted), submission
    return submission.ticket


def run(calls: SlotCalls[str]) -> CallTicket:
    turn = calls.next_turn()
    assert isinstance(turn, RunCall), turn
    return turn.ticket


# ---------------------------------------------------------------------- examples


def test_calls_take_turns_in_submission_order_one_at_a_time() -> None:
    calls: SlotCalls[str] = SlotCalls()
    first = accepted(calls.submit(1, "a"))
    second = accepted(calls.submit(1, "b"))
    assert run(calls) == first
    assert (calls.statistics().busy, calls.next_turn()) == (True, None)  # first is under way
    calls.finish(first, "A")
    assert (calls.statistics().busy, calls.statistics().waiting) == (False, 1)
    assert run(calls) == second
    calls.finish(second, "B")
    assert calls.next_turn() is None
    assert calls.statistics() == SlotCallStatistics(
        retired_epoch=0, broken=None, busy=False, calls_run=2, waiting=0, closed=False
    )
    calls.check_valid()


def test_a_repeat_joins_a_waiting_call_and_is_answered_once_it_finished() -> None:
    calls: SlotCalls[str] = SlotCalls()
    ticket = accepted(calls.submit(1, "a"))
    assert calls.submit(1, "a") == Joined(ticket=ticket)
    calls.finish(run(calls), "first")
    assert calls.submit(1, "a") == Answered(result="first")
    assert calls.next_turn() is None  # nothing ran twice
    assert calls.statistics().calls_run == 1
    assert isinstance(calls.submit(2, "a"), Accepted)  # another epoch is another call


def test_a_reset_retires_its_epoch_at_once_and_refuses_queued_calls_at_their_turn() -> None:
    calls: SlotCalls[str] = SlotCalls()
    running = run_after(calls, accepted(calls.submit(1, "a")))
    queued = accepted(calls.submit(1, "b"))
    reset = calls.reset(1)
    assert calls.retired_epoch == 1
    assert calls.submit(1, "c") == Refused(reason=StaleEpoch(epoch=1, retired=1))
    later = accepted(calls.submit(2, "d"))
    calls.finish(running, "A")
    assert calls.next_turn() == RefuseCall(ticket=queued, reason=StaleEpoch(epoch=1, retired=1))
    calls.finish(queued, "refused")
    assert calls.next_turn() == RunReset(ticket=reset)
    assert calls.next_turn() is None  # the reset is under way
    calls.reset_done(reset)
    assert calls.submit(1, "a") == Refused(reason=StaleEpoch(epoch=1, retired=1))  # forgotten
    assert run(calls) == later
    message = StaleEpoch(epoch=1, retired=1).message
    assert message == "lease epoch 1 is stale: slot was reset through epoch 1 @ $.epoch"


def run_after(calls: SlotCalls[str], ticket: CallTicket) -> CallTicket:
    assert run(calls) == ticket
    return ticket


def test_a_reset_that_fails_breaks_the_slot_for_every_later_call() -> None:
    calls: SlotCalls[str] = SlotCalls()
    reset = calls.reset(1)
    assert calls.next_turn() == RunReset(ticket=reset)
    calls.reset_done(reset, problem="processes [7] survived SIGKILL")
    ticket = accepted(calls.submit(2, "a"))
    reason = SlotBroken(problem="processes [7] survived SIGKILL")
    assert calls.next_turn() == RefuseCall(ticket=ticket, reason=reason)
    assert calls.statistics().broken == "processes [7] survived SIGKILL"
    assert reason.message == "slot is broken: processes [7] survived SIGKILL"


def test_a_reset_withdrawn_before_its_turn_leaves_the_queue_but_its_epoch_stays_retired() -> None:
    calls: SlotCalls[str] = SlotCalls()
    running = run_after(calls, accepted(calls.submit(1, "a")))
    reset = calls.reset(1)
    after = accepted(calls.submit(2, "b"))
    calls.reset_done(reset)
    calls.finish(running, "A")
    assert run(calls) == after
    assert calls.retired_epoch == 1
    with pytest.raises(StateError, match="reset_done: reset 2"):
        calls.reset_done(reset)


def test_close_hands_back_waiting_calls_and_refuses_new_ones() -> None:
    calls: SlotCalls[str] = SlotCalls()
    running = run_after(calls, accepted(calls.submit(1, "a")))
    waiting = accepted(calls.submit(1, "b"))
    assert calls.close() == [waiting]
    assert calls.submit(1, "c") == Refused(reason=Closing())
    assert calls.submit(1, "b") == Refused(reason=Closing())
    calls.finish(running, "A")  # the call under way still reports
    assert calls.submit(1, "a") == Answered(result="A")
    assert calls.next_turn() is None
    assert Closing().message == "the slot server is closing"


def test_finished_results_are_forgotten_oldest_first_beyond_the_limit() -> None:
    calls: SlotCalls[str] = SlotCalls(remember=2)
    for call_id in "abc":
        calls.finish(run_after(calls, accepted(calls.submit(1, call_id))), call_id.upper())
    assert isinstance(calls.submit(1, "a"), Accepted)  # forgotten: it runs again
    assert calls.submit(1, "c") == Answered(result="C")
    calls.check_valid()


def test_illegal_moves_raise_naming_the_event() -> None:
    calls: SlotCalls[str] = SlotCalls()
    ticket = accepted(calls.submit(1, "a"))
    with pytest.raises(StateError, match=r"finish: call 1 \('a'\) has no turn"):
        calls.finish(ticket, "early")
    with pytest.raises(StateError, match="reset_done"):
        calls.reset_done(ResetTicket(number=9, epoch=1))
    with pytest.raises(InvalidInput, match="epoch"):
        calls.reset(-1)
    with pytest.raises(ConfigError, match="remember"):
        SlotCalls(remember=0)


# ---------------------------------------------------------------------- stateful


@dataclass
class _Call:
    ticket: CallTicket
    result: str | None = None
    answers: int = 0


@dataclass
class _Model:
    """What the queue must do, written the slow obvious way."""

    calls: dict[int, _Call] = field(default_factory=dict)
    queue: list[CallTicket | ResetTicket] = field(default_factory=list)
    turn: CallTicket | ResetTicket | None = None
    remembered: dict[tuple[int, str], str] = field(default_factory=dict)
    ran: set[tuple[int, str]] = field(default_factory=set)
    handed_out: list[int] = field(default_factory=list)
    retired: int = 0
    broken: str | None = None
    closed: bool = False


class SlotCallsMachine(RuleBasedStateMachine):
    """Drives a ``SlotCalls`` and a model side by side, answering turns as a server would."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: SlotCalls[str] = SlotCalls(remember=10_000)
        self.model = _Model()
        self.results = 0

    def _pending(self, key: tuple[int, str]) -> CallTicket | None:
        for call in self.model.calls.values():
            ticket = call.ticket
            if (ticket.epoch, ticket.call_id) == key and call.answers == 0:
                return ticket
        return None

    @rule(epoch=st.integers(0, 4), call_id=st.sampled_from("abc"))
    def submit(self, epoch: int, call_id: str) -> None:
        key = (epoch, call_id)
        pending = self._pending(key)
        submission = self.calls.submit(epoch, call_id)
        if pending is not None:
            assert submission == Joined(ticket=pending)
        elif key in self.model.remembered:
            assert submission == Answered(result=self.model.remembered[key])
        elif self.model.closed:
            assert submission == Refused(reason=Closing())
        elif epoch <= self.model.retired:
            assert submission == Refused(reason=StaleEpoch(epoch=epoch, retired=self.model.retired))
        else:
            ticket = accepted(submission)
            assert (ticket.epoch, ticket.call_id) == key
            self.model.calls[ticket.number] = _Call(ticket=ticket)
            self.model.queue.append(ticket)

    @rule(epoch=st.integers(0, 4))
    def reset(self, epoch: int) -> None:
        ticket = self.calls.reset(epoch)
        self.model.retired = max(self.model.retired, epoch)
        self.model.queue.append(ticket)

    @rule()
    def take_turn(self) -> None:
        turn = self.calls.next_turn()
        if self.model.turn is not None or not self.model.queue:
            assert turn is None
            return
        expected = self.model.queue.pop(0)
        assert turn is not None
        assert turn.ticket == expected  # the oldest waiting item, nothing skipped
        self.model.turn = expected
        self.model.handed_out.append(expected.number)
        if isinstance(turn, RunReset):
            return
        assert isinstance(expected, CallTicket)
        key = (expected.epoch, expected.call_id)
        if isinstance(turn, RunCall):
            assert not self.model.closed
            assert expected.epoch > self.model.retired  # a retired epoch never runs
            assert self.model.broken is None
            assert key not in self.model.ran  # at most once per (epoch, call_id)
            self.model.ran.add(key)
            return
        if self.model.closed:
            assert turn.reason == Closing()
        elif expected.epoch <= self.model.retired:
            assert turn.reason == StaleEpoch(epoch=expected.epoch, retired=self.model.retired)
        else:
            assert turn.reason == SlotBroken(problem=str(self.model.broken))
        self._finish(expected, f"refused {turn.reason.message}")

    def _finish(self, ticket: CallTicket, result: str) -> None:
        self.calls.finish(ticket, result)
        call = self.model.calls[ticket.number]
        call.result = result
        call.answers += 1
        self.model.remembered[(ticket.epoch, ticket.call_id)] = result
        self.model.turn = None

    @precondition(lambda self: isinstance(self.model.turn, CallTicket))
    @rule()
    def finish_call(self) -> None:
        ticket = self.model.turn
        assert isinstance(ticket, CallTicket)
        self.results += 1
        self._finish(ticket, f"result {self.results}")

    @precondition(lambda self: isinstance(self.model.turn, ResetTicket))
    @rule(fails=st.booleans())
    def finish_reset(self, fails: bool) -> None:
        ticket = self.model.turn
        assert isinstance(ticket, ResetTicket)
        self._reset_done(ticket, "survivors" if fails else None)
        self.model.turn = None

    @precondition(lambda self: any(isinstance(i, ResetTicket) for i in self.model.queue))
    @rule(data=st.data())
    def withdraw_reset(self, data: st.DataObject) -> None:
        resets = [item for item in self.model.queue if isinstance(item, ResetTicket)]
        ticket = data.draw(st.sampled_from(resets))
        self.model.queue.remove(ticket)
        self._reset_done(ticket, None)

    def _reset_done(self, ticket: ResetTicket, problem: str | None) -> None:
        self.calls.reset_done(ticket, problem)
        if problem is not None:
            self.model.broken = problem
        retired = self.model.retired
        self.model.remembered = {
            key: value for key, value in self.model.remembered.items() if key[0] > retired
        }

    @rule()
    def finish_out_of_turn(self) -> None:
        waiting = [item for item in self.model.queue if isinstance(item, CallTicket)]
        if waiting:
            with pytest.raises(StateError):
                self.calls.finish(waiting[0], "out of turn")

    @rule()
    def close(self) -> None:
        handed_back = self.calls.close()
        self.model.closed = True
        expected = [item for item in self.model.queue if isinstance(item, CallTicket)]
        assert handed_back == expected
        for ticket in handed_back:
            self.model.queue.remove(ticket)
            self.model.calls[ticket.number].answers += 1  # the server answers it: closing

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.calls.check_valid()
        assert self.calls.retired_epoch == self.model.retired
        statistics = self.calls.statistics()
        assert statistics.broken == self.model.broken
        assert statistics.waiting == len(self.model.queue)
        assert statistics.busy == isinstance(self.model.turn, CallTicket)
        assert statistics.closed == self.model.closed
        assert self.model.handed_out == sorted(self.model.handed_out)  # submission order
        assert all(call.answers <= 1 for call in self.model.calls.values())

    def teardown(self) -> None:
        """Never lost: once closed and drained, every accepted call has exactly one answer."""
        self.close()
        if isinstance(self.model.turn, CallTicket):
            self.finish_call()
        while self.model.queue or self.model.turn is not None:
            if isinstance(self.model.turn, ResetTicket):
                self.finish_reset(fails=False)
            self.take_turn()
        assert all(call.answers == 1 for call in self.model.calls.values())


TestSlotCalls = SlotCallsMachine.TestCase


# ---------------------------------------------------------------------- pinned decisions


def test_exactly_remember_finished_results_are_answered_on_repeat() -> None:
    # ``remember`` is how many finished results a repeat is answered from: all of the last
    # ``remember``, not one fewer.
    calls: SlotCalls[str] = SlotCalls(remember=3)
    for call_id in "abcd":
        calls.finish(run_after(calls, accepted(calls.submit(1, call_id))), call_id.upper())
    assert [calls.submit(1, call_id) for call_id in "bcd"] == [
        Answered(result="B"),
        Answered(result="C"),
        Answered(result="D"),
    ]
    assert calls.statistics().calls_run == 4
    calls.check_valid()


def test_a_stale_epoch_is_refused_as_stale_even_on_a_broken_slot() -> None:
    # The refusal names the caller's own fault first: a call whose lease epoch was retired is
    # told its lease is stale, even when the slot also broke meanwhile (its lease is over either
    # way; "broken" is for the calls of a live lease).
    calls: SlotCalls[str] = SlotCalls()
    first = calls.reset(1)
    assert calls.next_turn() == RunReset(ticket=first)
    queued = accepted(calls.submit(2, "a"))  # a live lease's call, queued behind the reset
    second = calls.reset(2)  # retires epoch 2 while the call waits
    calls.reset_done(first, problem="processes [7] survived SIGKILL")
    assert calls.statistics().broken == "processes [7] survived SIGKILL"
    assert calls.next_turn() == RefuseCall(ticket=queued, reason=StaleEpoch(epoch=2, retired=2))
    calls.finish(queued, "refused")
    assert calls.next_turn() == RunReset(ticket=second)
    calls.reset_done(second)
    later = accepted(calls.submit(3, "b"))
    reason = SlotBroken(problem="processes [7] survived SIGKILL")
    assert calls.next_turn() == RefuseCall(ticket=later, reason=reason)


def test_a_reset_ticket_carries_the_epoch_it_retires() -> None:
    calls: SlotCalls[str] = SlotCalls()
    assert calls.reset(3) == ResetTicket(number=1, epoch=3)
    with pytest.raises(InvalidInput) as caught:
        calls.reset(-1)
    assert str(caught.value) == "must be at least 0, got -1 @ epoch"


def _corrupt_pending(calls: SlotCalls[str]) -> None:
    calls._pending[(9, "ghost")] = CallTicket(number=9, epoch=9, call_id="ghost")


def _corrupt_order(calls: SlotCalls[str]) -> None:
    calls._queue.appendleft(ResetTicket(number=99, epoch=1))


def _corrupt_remembered(calls: SlotCalls[str]) -> None:
    calls._done[(9, "x")] = "X"
    calls._done[(9, "y")] = "Y"


def _corrupt_busy(calls: SlotCalls[str]) -> None:
    calls._turn_runs = True


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_pending, "check_valid: pending calls are not the queued and running"),
        (_corrupt_order, "check_valid: the queue is out of submission order"),
        (_corrupt_remembered, "check_valid: more results remembered than allowed"),
        (_corrupt_busy, "check_valid: busy without a running call"),
    ],
)
def test_check_valid_names_the_broken_invariant(
    corrupt: Callable[[SlotCalls[str]], None], message: str
) -> None:
    calls: SlotCalls[str] = SlotCalls(remember=2)
    calls.finish(run_after(calls, accepted(calls.submit(1, "a"))), "A")
    accepted(calls.submit(1, "b"))
    calls.check_valid()
    corrupt(calls)
    with pytest.raises(AssertionError) as caught:
        calls.check_valid()
    assert str(caught.value) == message
