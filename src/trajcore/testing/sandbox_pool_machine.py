"""The ``SandboxPool`` contract as a hypothesis state machine, for one pool or several in lockstep.

``pool_machine(portal, factories, ...)`` builds a ``RuleBasedStateMachine`` that drives one or
more pools (running in ``portal``'s event loop) through generated sequences of what a caller
can do, the same step on every pool, and checks after every step what
``trajcore.ports.sandbox_pool`` promises against a model of the slots:

- leases: interleaved grants and releases by every route (normal exit, an error in the block,
  cancellation while holding); several at once up to a full pool; waiters queued on a full pool
  are served first come, first served and a free slot never sits beside a waiter; a lease
  deadline gives ``AcquireTimeout`` no earlier than asked and not much later; a waiter cancelled
  while queued leaves the queue and takes nothing;
- batches: one result per call, with the call's id, in the order of the calls, across the slots
  of a container; file writes (plain and appending) read back as written, ``echo``/``cat``/``exit``
  give the model's stdout and exit codes, a new lease finds the workspace empty; a call under a
  stale lease or for another container is ``REJECTED``; bad calls (unknown tool, missing or
  mistyped argument, a path out of the workspace) are ``REJECTED`` naming the field; a repeated
  call id returns the first result and does not run again (an appending write repeated leaves one
  copy); a call past its timeout is ``TIMEOUT`` within its deadline; a batch cancelled mid-way
  still lets its lease go;
- faults (when the pool can stage them): a container that dies answers its batch with
  ``INFRA_ERROR``, its leases turn stale (a later call under one is an ``INFRA_ERROR`` too: its
  lease ended with its server, not by its holder), and the pool gets its slots back;
- always: no exception but the port's typed errors; every slot is in exactly one state
  (``free + leased`` is the pool's size once resets settle, ``leased`` is the number of live
  leases the model holds, each on its own slot); leases granted grow by exactly the grants the
  model saw, so every release happened once; the implementation's own ``check_valid`` (if any).

With two or more pools (lockstep), every observable result must also agree between them: each
lease's slot index and epoch and which leases share a container, each call's outcome, contents
and exit codes, and the pools' statistics.

A sequence may end by closing the pools: waiters then get ``PoolClosed``, held leases still
leave their blocks cleanly, ``aclose`` again does nothing, and ``lease`` and ``execute`` raise
``PoolClosed``. Each example opens fresh pools (so a sequence replays the same way: which slot a
lease gets depends on the pool's history) and closes them at its end. Use it through
``SandboxPoolContract.test_generated_sequences`` (``trajcore.testing.sandbox_pool_contract``) or
``run_pool_machine``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack
from typing import Literal

import anyio
import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trajcore.domain.errors import AcquireTimeout, PoolClosed
from trajcore.domain.json_values import JSON
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.budget import machine_settings
from trajcore.testing.portal_pools import SETTLE_S, Hold, open_all, slot_call

__all__ = [
    "CrashHook",
    "MachineShape",
    "pool_machine",
    "run_pool_machine",
]

CrashHook = Callable[[SandboxPool, str], None]
"""Makes the named container of the pool die before or during its next batch."""

SLACK_S = 5.0  # how late a deadline may fire on a loaded machine
CALL_TIMEOUT_S = 0.2  # the timeout of the calls that are meant to time out

_ids = itertools.count(1)

PATHS = ("a.txt", "b.txt", "dir/notes.md")
paths = st.sampled_from(PATHS)
words = st.text(alphabet="abcxyz019", min_size=1, max_size=8)
texts = st.text(alphabet="abc xyz\n019é✓", max_size=40)
BAD_CALLS: tuple[tuple[str, dict[str, JSON]], ...] = (
    ("no_such_tool", {"x": 1}),
    ("bash", {}),
    ("bash", {"command": 42}),
    ("read_file", {"path": "../outside"}),
    ("write_file", {"path": "/etc/passwd", "content": "x"}),
)


@attrs.frozen(kw_only=True)
class MachineShape:
    """The pool the machine expects: its size, and whether lost containers are replaced."""

    containers: int = 2
    slots_per_container: int = 2
    replaces_crashed: bool = True

    @property
    def capacity(self) -> int:
        return self.containers * self.slots_per_container


@attrs.define(eq=False, repr=False)
class _Held:
    """One holder's lease in every pool, and the model of its workspace."""

    holder: str
    holds: list[Hold]
    files: dict[str, str] = attrs.field(factory=dict)
    stale: bool = False
    lost: bool = False  # stale because its container died (its calls: INFRA_ERROR)
    first: list[tuple[list[SlotCall], list[ToolResult]]] = attrs.field(factory=list)

    @property
    def leases(self) -> list[Lease]:
        leases = [hold.lease for hold in self.holds]
        assert all(lease is not None for lease in leases)
        return [lease for lease in leases if lease is not None]

    def __repr__(self) -> str:
        return f"<{self.holder}>"


@attrs.frozen
class _Op:
    """One call of a batch: what to run and under which held lease."""

    held: _Held
    tool: str
    arguments: dict[str, JSON]
    repeat_of: int | None = None  # index into held.first of the call repeated


def _observed(result: ToolResult) -> tuple[object, ...]:
    """What a caller may rely on in a result, for comparing pools in lockstep."""
    if result.outcome is not ToolOutcome.OK:
        return (result.call_id, result.outcome)
    if result.exec is None:
        return (result.call_id, result.outcome, result.content)
    return (result.call_id, result.outcome, result.exec.exit_code, result.exec.stdout)


def _counts(stats: PoolStatistics) -> tuple[int, ...]:
    return (
        stats.containers, stats.free, stats.leased, stats.resetting, stats.quarantined,
        stats.draining, stats.waiting,
    )  # fmt: skip


PoolFactory = Callable[[], AbstractAsyncContextManager[SandboxPool]]
"""Opens a pool of the machine's shape (``async with factory() as pool``) and closes it."""


def pool_machine(
    portal: BlockingPortal,
    factories: Sequence[PoolFactory],
    *,
    shape: MachineShape,
    crash: CrashHook | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine class that opens a pool from each factory per example (in ``portal``'s
    loop) and drives them in lockstep."""
    assert factories, "give at least one pool factory"

    def stats_of(pool: SandboxPool) -> PoolStatistics:
        return portal.call(pool.statistics)

    def check_valid(pool: SandboxPool) -> None:
        check = getattr(pool, "check_valid", None)
        if callable(check):
            portal.call(check)

    class SandboxPoolMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.stack = ExitStack()
            self.pools = open_all(self.stack, portal, factories)
            self.closed = False
            self.held: list[_Held] = []
            self.queue: list[_Held] = []
            self.gone: list[_Held] = []  # the latest released leases, for stale calls
            self.granted = [stats_of(pool).leases_granted for pool in self.pools]
            self.expired = [stats_of(pool).leases_expired for pool in self.pools]
            self.grants = 0
            self.expiries = 0
            self.settle()

        # ----------------------------------------------------------------- helpers

        @property
        def live(self) -> list[_Held]:
            return [held for held in self.held if not held.stale]

        def full(self) -> bool:
            return len(self.live) == shape.capacity

        def take(self, holder: str, timeout_s: float) -> _Held:
            return _Held(holder, [Hold(portal, pool, holder, timeout_s) for pool in self.pools])

        def grant(self, held: _Held) -> None:
            for hold in held.holds:
                hold.wait_entered()
            self.grants += 1
            leases = held.leases
            first = leases[0]
            for lease in leases:
                assert lease.holder == held.holder
                assert (lease.slot.index, lease.epoch) == (first.slot.index, first.epoch), leases
            self.held.append(held)

        def settle(self) -> None:
            """Wait for resets, replacements and grants to show, then move granted waiters."""
            deadline = time.monotonic() + SETTLE_S
            while True:
                all_stats = [stats_of(pool) for pool in self.pools]
                waiting = [
                    sum(1 for queued in self.queue if queued.holds[i].lease is None)
                    for i in range(len(self.pools))
                ]
                if all(
                    s.resetting == 0
                    and s.waiting == waiting[i]
                    and (s.free == 0 or s.waiting == 0)
                    and (not shape.replaces_crashed or s.containers == shape.containers)
                    for i, s in enumerate(all_stats)
                ):
                    break
                assert time.monotonic() < deadline, f"the pools never settled: {all_stats}"
                time.sleep(0.005)
            granted = [
                all(hold.lease is not None for hold in queued.holds) for queued in self.queue
            ]
            count = sum(granted)
            assert granted == [True] * count + [False] * (len(granted) - count), (
                f"waiters served out of order: {list(zip(self.queue, granted, strict=True))}"
            )
            for queued in self.queue[:count]:
                self.grant(queued)
            self.queue = self.queue[count:]

        def same_container(self, a: _Held, b: _Held) -> bool:
            answers = {
                x.slot.container == y.slot.container
                for x, y in zip(a.leases, b.leases, strict=True)
            }
            assert len(answers) == 1, f"pools disagree on whether {a} and {b} share a container"
            return answers.pop()

        def expect(self, op: _Op, result: ToolResult, batch_container: bool) -> None:
            """Check ``result`` against the model, and apply the op to the model."""
            held = op.held
            if held.lost and batch_container:
                assert result.outcome is ToolOutcome.INFRA_ERROR, (op, result)
                assert result.error
                return
            if held.stale or not batch_container:
                assert result.outcome is ToolOutcome.REJECTED, (op, result)
                assert result.error
                return
            args = op.arguments
            if (op.tool, args) in BAD_CALLS:
                assert result.outcome is ToolOutcome.REJECTED, (op, result)
                assert result.error is not None
                assert "@" in result.error, f"the refusal names no field: {result.error}"
                return
            if op.tool == "write_file":
                assert result.outcome is ToolOutcome.OK, (op, result)
                path, content = str(args["path"]), str(args["content"])
                held.files[path] = (held.files.get(path, "") if args["append"] else "") + content
            elif op.tool == "read_file":
                path = str(args["path"])
                if path in held.files:
                    assert (result.outcome, result.content) == (ToolOutcome.OK, held.files[path])
                else:
                    assert result.outcome is ToolOutcome.TOOL_ERROR, (op, result)
                    assert result.error
            else:
                assert result.outcome is ToolOutcome.OK, (op, result)
                assert result.exec is not None
                command = str(args["command"])
                name, _, rest = command.partition(" ")
                if name == "echo":
                    assert (result.exec.exit_code, result.exec.stdout) == (0, rest + "\n")
                elif name == "cat":
                    if rest in held.files:
                        assert result.exec.exit_code == 0
                        assert result.exec.stdout == held.files[rest]
                    else:
                        assert result.exec.exit_code != 0
                else:
                    assert result.exec.exit_code == int(rest), (op, result)

        # ----------------------------------------------------------------- leasing

        @precondition(lambda self: not self.closed and not self.full())
        @rule(holder=words)
        def lease(self, holder: str) -> None:
            self.grant(self.take(holder, 10.0))
            # a fresh lease finds its workspace empty
            fresh = self.held[-1]
            self.run_ops([_Op(fresh, "read_file", {"path": p}) for p in PATHS], fresh)

        @precondition(lambda self: not self.closed and not self.full())
        @rule(holder=words)
        def lease_all_free(self, holder: str) -> None:
            for k in range(shape.capacity - len(self.live)):
                self.grant(self.take(f"{holder}{k}", 10.0))

        def let_go(self, held: _Held, how: Literal["normal", "error", "cancel"]) -> None:
            self.held.remove(held)
            for hold in held.holds:
                hold.release(how)
            if not held.stale:
                held.stale = True
                self.gone = [*self.gone[-2:], held]  # its lease, now stale, stays in use

        @precondition(lambda self: not self.closed and self.held)
        @rule(data=st.data(), how=st.sampled_from(["normal", "error", "cancel"]))
        def release(self, data: st.DataObject, how: Literal["normal", "error", "cancel"]) -> None:
            self.let_go(data.draw(st.sampled_from(self.held), label="held"), how)

        @precondition(lambda self: not self.closed and self.full() and not self.queue)
        @rule(data=st.data(), holder=words)
        def release_and_lease_the_freed_slot(self, data: st.DataObject, holder: str) -> None:
            old = data.draw(st.sampled_from(self.live), label="held")
            left: dict[str, JSON] = {"path": PATHS[0], "content": "left behind", "append": False}
            self.run_ops([_Op(old, "write_file", left)], old)  # the next holder must not see it
            self.let_go(old, "normal")
            self.settle()
            self.lease(holder)
            new = self.held[-1]
            for before, after in zip(old.leases, new.leases, strict=True):
                assert after.slot == before.slot, "the only free slot was not the one leased"
                assert after.epoch > before.epoch, "a new lease kept the old epoch"

        @precondition(lambda self: not self.closed and self.full() and len(self.queue) < 3)
        @rule(holder=words)
        def queue_waiter(self, holder: str) -> None:
            held = self.take(f"waiter-{holder}", 60.0)
            self.queue.append(held)
            self.settle()

        @precondition(lambda self: not self.closed and self.queue)
        @rule(data=st.data())
        def cancel_waiter(self, data: st.DataObject) -> None:
            held = data.draw(st.sampled_from(self.queue), label="waiter")
            self.queue.remove(held)
            for hold in held.holds:
                assert hold.lease is None
                hold.release("cancel")
                assert hold.lease is None, "a cancelled waiter got a slot"

        @precondition(lambda self: not self.closed and self.full())
        @rule(timeout_s=st.sampled_from([0.02, 0.1]))
        def lease_deadline(self, timeout_s: float) -> None:
            held = self.take("late", timeout_s)
            for hold in held.holds:
                done, _ = concurrent.futures.wait([hold.future], timeout=timeout_s + SLACK_S)
                took = time.monotonic() - hold.started
                assert done, f"a {timeout_s} s lease deadline did not fire within {SLACK_S} s"
                assert isinstance(hold.future.exception(), AcquireTimeout), hold.future
                assert hold.lease is None
                assert took >= timeout_s * 0.9, f"a {timeout_s} s deadline fired after {took} s"
            self.expiries += 1

        # ----------------------------------------------------------------- batches

        @precondition(lambda self: not self.closed and self.live)
        @rule(data=st.data())
        def batch(self, data: st.DataObject) -> None:
            target = data.draw(st.sampled_from(self.live), label="container of")
            ops: list[_Op] = []
            for _ in range(data.draw(st.integers(1, 6), label="calls")):
                held = data.draw(st.sampled_from(self.held + self.gone), label="under")
                kind = data.draw(
                    st.sampled_from(
                        ["write", "read", "echo", "cat", "exit", "bad", "repeat", "again"]
                    ),
                    label="kind",
                )
                if kind == "repeat" and held.first and not held.stale:
                    ops.append(_Op(held, "", {}, data.draw(st.integers(0, len(held.first) - 1))))
                    continue
                if kind == "again" and ops and ops[-1].repeat_of is None:
                    # the previous call again, same id, in the same batch
                    ops.append(attrs.evolve(ops[-1], repeat_of=-1))
                    continue
                if kind == "write":
                    arguments: dict[str, JSON] = {
                        "path": data.draw(paths), "content": data.draw(texts),
                        "append": data.draw(st.booleans()),
                    }  # fmt: skip
                    ops.append(_Op(held, "write_file", arguments))
                elif kind == "read":
                    ops.append(_Op(held, "read_file", {"path": data.draw(paths)}))
                elif kind == "echo":
                    ops.append(_Op(held, "bash", {"command": f"echo {data.draw(words)}"}))
                elif kind == "cat":
                    ops.append(_Op(held, "bash", {"command": f"cat {data.draw(paths)}"}))
                elif kind == "bad":
                    tool, arguments = data.draw(st.sampled_from(BAD_CALLS))
                    ops.append(_Op(held, tool, arguments))
                else:
                    ops.append(
                        _Op(held, "bash", {"command": f"exit {data.draw(st.integers(0, 3))}"})
                    )
            self.run_ops(ops, target)

        def run_ops(self, ops: list[_Op], target: _Held) -> None:
            # "again" ops repeat the op before them: run them with that op's call
            plain = [op for op in ops if op.repeat_of != -1]
            index = {id(op): k for k, op in enumerate(plain)}
            expanded: list[tuple[_Op, int]] = []  # (op, index of the plain op whose call it uses)
            last = -1
            for op in ops:
                if op.repeat_of == -1:
                    expanded.append((op, last))
                else:
                    last = index[id(op)]
                    expanded.append((op, last))
            # run the plain ops with their duplicates inserted as the same SlotCall
            calls_by_pool: list[list[SlotCall]] = [[] for _ in self.pools]
            call_ids = [f"machine-{next(_ids)}" for _ in plain]
            for _, k in expanded:
                source = plain[k]
                for i in range(len(self.pools)):
                    if source.repeat_of is not None:
                        calls_by_pool[i].append(source.held.first[source.repeat_of][0][i])
                        continue
                    lease = source.held.holds[i].lease
                    assert lease is not None
                    call = ToolCall(id=call_ids[k], name=source.tool, arguments=source.arguments)
                    calls_by_pool[i].append(SlotCall(lease=lease, call=call, timeout_s=10.0))
            results: list[list[ToolResult]] = []
            for i, pool in enumerate(self.pools):
                container = target.leases[i].slot.container
                got = portal.call(pool.execute, container, calls_by_pool[i])
                assert len(got) == len(calls_by_pool[i]), "not one result per call"
                assert [r.call_id for r in got] == [c.call.id for c in calls_by_pool[i]], (
                    "results out of the order of the calls"
                )
                results.append(got)
            for position, (op, k) in enumerate(expanded):
                observed = {_observed(results[i][position]) for i in range(len(self.pools))}
                assert len(observed) == 1, f"pools disagree on {op}: {observed}"
                result = results[0][position]
                on_target = self.same_container(op.held, target)
                if op.repeat_of is not None:
                    if op.held.lost and on_target:
                        assert result.outcome is ToolOutcome.INFRA_ERROR, (op, result)
                        continue
                    if op.held.stale or not on_target:
                        assert result.outcome is ToolOutcome.REJECTED, (op, result)
                        continue
                    # the same call id again: the first result, and it does not run again
                    for i in range(len(self.pools)):
                        if op.repeat_of == -1:
                            first = results[i][expanded_first(expanded, k)]
                        else:
                            first = op.held.first[op.repeat_of][1][i]
                        assert results[i][position] == first, (op, results[i][position], first)
                    continue
                self.expect(op, result, on_target)
                if not op.held.stale and on_target:
                    op.held.first.append(
                        (
                            [calls_by_pool[i][position] for i in range(len(self.pools))],
                            [results[i][position] for i in range(len(self.pools))],
                        )
                    )

        @precondition(lambda self: not self.closed and self.live)
        @rule(data=st.data())
        def call_times_out(self, data: st.DataObject) -> None:
            held = data.draw(st.sampled_from(self.live), label="held")
            for hold in held.holds:
                lease = hold.lease
                assert lease is not None
                call = slot_call(lease, "bash", timeout_s=CALL_TIMEOUT_S, command="sleep 5")
                started = time.monotonic()
                (result,) = portal.call(hold.pool.execute, lease.slot.container, [call])
                took = time.monotonic() - started
                assert result.outcome is ToolOutcome.TIMEOUT, result
                assert result.exec is not None
                assert result.exec.timed_out
                assert took < CALL_TIMEOUT_S + SLACK_S, f"a {CALL_TIMEOUT_S} s call took {took} s"

        @precondition(lambda self: not self.closed and self.live)
        @rule(data=st.data(), after_s=st.sampled_from([0.0, 0.02, 0.1]))
        def cancel_batch_then_release(self, data: st.DataObject, after_s: float) -> None:
            held = data.draw(st.sampled_from(self.live), label="held")
            for hold in held.holds:
                lease = hold.lease
                assert lease is not None
                call = slot_call(lease, "bash", command="sleep 2")
                portal.call(_cancelled_batch, hold.pool, call, after_s)
            self.held.remove(held)
            for hold in held.holds:
                hold.release("normal")

        @precondition(lambda self: not self.closed and crash is not None and self.live)
        @rule(data=st.data())
        def crash_container(self, data: st.DataObject) -> None:
            assert crash is not None
            victim = data.draw(st.sampled_from(self.live), label="victim")
            on_it = [held for held in self.live if self.same_container(held, victim)]
            for i, pool in enumerate(self.pools):
                crash(pool, victim.leases[i].slot.container)
            for i, pool in enumerate(self.pools):
                calls = [slot_call(held.leases[i], "bash", command="echo x") for held in on_it]
                got = portal.call(pool.execute, victim.leases[i].slot.container, calls)
                assert [r.call_id for r in got] == [c.call.id for c in calls]
                for result in got:
                    assert result.outcome is ToolOutcome.INFRA_ERROR, result
                    assert result.error
            for held in on_it:
                held.stale = held.lost = True

        # ----------------------------------------------------------------- closing

        @precondition(lambda self: not self.closed)
        @rule()
        def close(self) -> None:
            leases = [(held, held.leases) for held in self.held]
            for pool in self.pools:
                portal.call(pool.aclose)
            self.closed = True
            for queued in self.queue:
                for hold in queued.holds:
                    done, _ = concurrent.futures.wait([hold.future], timeout=SETTLE_S)
                    assert done, "a waiter was still queued after aclose"
                    assert isinstance(hold.future.exception(), PoolClosed), hold.future
                    assert hold.lease is None
            self.queue = []
            for held, _ in leases:
                for hold in held.holds:
                    hold.release("normal")
            self.held = []
            for _, held_leases in leases[:1]:
                for pool, lease in zip(self.pools, held_leases, strict=True):
                    call = slot_call(lease, "bash", command="true")
                    with pytest.raises(PoolClosed):
                        portal.call(pool.execute, lease.slot.container, [call])

        @precondition(lambda self: self.closed)
        @rule()
        def closed_pool_refuses(self) -> None:
            for pool in self.pools:
                portal.call(pool.aclose)  # idempotent
                late = Hold(portal, pool, "late", 10.0)
                done, _ = concurrent.futures.wait([late.future], timeout=SETTLE_S)
                assert done, "lease on a closed pool did not end"
                assert isinstance(late.future.exception(), PoolClosed), late.future

        # ----------------------------------------------------------------- invariants

        @invariant()
        def slots_are_accounted_for(self) -> None:
            if self.closed:
                return
            self.settle()
            live = self.live
            for i, pool in enumerate(self.pools):
                check_valid(pool)
                stats = stats_of(pool)
                assert stats.leased == len(live), (stats, live)
                assert stats.quarantined == 0, stats
                if shape.replaces_crashed:
                    assert stats.free + stats.leased == shape.capacity, stats
                assert stats.leases_granted - self.granted[i] == self.grants, (
                    f"{stats.leases_granted - self.granted[i]} grants counted, {self.grants} seen"
                )
                assert stats.leases_expired - self.expired[i] == self.expiries, stats
                slots = {(h.leases[i].slot.container, h.leases[i].slot.index) for h in live}
                assert len(slots) == len(live), "two live leases share a slot"
            counts = {_counts(stats_of(pool)) for pool in self.pools}
            assert len(counts) == 1, f"pools disagree on their statistics: {counts}"

        def teardown(self) -> None:
            with self.stack:
                for queued in self.queue:
                    for hold in queued.holds:
                        hold.release("cancel")
                self.queue = []
                while self.held:
                    held = self.held.pop()
                    for hold in held.holds:
                        hold.release("normal")

    return SandboxPoolMachine


def expanded_first(expanded: list[tuple[_Op, int]], k: int) -> int:
    """The position of the first op that used plain call ``k``."""
    return next(position for position, (_, used) in enumerate(expanded) if used == k)


async def _cancelled_batch(pool: SandboxPool, call: SlotCall, after_s: float) -> None:
    with anyio.move_on_after(after_s) as scope:
        await pool.execute(call.container, [call])
    assert scope.cancelled_caught, "a 2 s command finished before its cancellation"


def run_pool_machine(
    factories: Sequence[PoolFactory],
    *,
    shape: MachineShape,
    crash: CrashHook | None = None,
    scale: float = 0.2,
    step_scale: float = 0.4,
) -> None:
    """Open a pool from each factory, drive them all with generated sequences, close them.

    The loaded hypothesis profile sets the budget: ``scale`` times its ``max_examples``
    sequences, each of at most ``step_scale`` times its ``stateful_step_count`` steps.
    """
    with start_blocking_portal("asyncio") as portal:
        machine = pool_machine(portal, factories, shape=shape, crash=crash)
        run_state_machine_as_test(machine, settings=machine_settings(scale, step_scale))
