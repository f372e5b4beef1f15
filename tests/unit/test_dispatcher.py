"""The tool dispatcher against the in-memory pool: batching, fairness, failures, cancellation.

Batches close deterministically here: either the window is long and ``max_batch_size`` fills
the batch, or the test waits on what the fake recorded, never on a clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import attrs
import pytest

from trajcore.adapters.event_loops import FutureWaiter, asyncio_hooks
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import PoolClosed
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall, time_left_spent
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.ports.event_loop import LoopHooks, ResultWaiter
from trajcore.rollout.dispatcher import ToolDispatcher, _Backend, _Waiter

_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


HookFactory = Callable[[], LoopHooks | None] | None


@pytest.fixture(params=[None, asyncio_hooks], ids=["anyio", "asyncio_hooks"])
def loop_hooks(request: pytest.FixtureRequest) -> HookFactory:
    """Every scenario runs with anyio's portable waiters and with the asyncio loop's own."""
    hooks: HookFactory = request.param
    return hooks


def bash(lease: Lease, command: str, *, timeout_s: float = 5.0) -> SlotCall:
    call = ToolCall(id=f"c{next(_ids)}", name="bash", arguments={"command": command})
    return SlotCall(lease=lease, call=call, timeout_s=timeout_s)


LONG_WINDOW = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=False)


async def wait_until_batches(pool: FakeSandboxPool, count: int) -> None:
    with anyio.fail_after(5):
        while len(pool.batches) < count:  # noqa: ASYNC110 - polls state that has no event
            await anyio.sleep(0.001)


class DelegatingPool:
    """A SandboxPool that hands everything to ``inner`` (subclasses change ``execute``)."""

    def __init__(self, inner: FakeSandboxPool) -> None:
        self.inner = inner

    def lease(
        self, holder: str, *, timeout_s: float | None = None, environment: str | None = None
    ) -> AbstractAsyncContextManager[Lease]:
        return self.inner.lease(holder, timeout_s=timeout_s, environment=environment)

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        return await self.inner.execute(container, calls)

    def statistics(self) -> PoolStatistics:
        return self.inner.statistics()

    async def aclose(self) -> None:
        await self.inner.aclose()


class RaisingPool(DelegatingPool):
    """A SandboxPool whose ``execute`` raises for one container and delegates otherwise."""

    def __init__(self, inner: FakeSandboxPool, broken: str) -> None:
        super().__init__(inner)
        self.broken = broken

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        if container == self.broken:
            raise RuntimeError("connection reset by peer")
        return await self.inner.execute(container, calls)


@pytest.mark.anyio
async def test_calls_from_many_trajectories_go_out_as_one_request_per_container(
    loop_hooks: HookFactory,
) -> None:
    config = BatchConfig(window_ms=60_000.0, max_batch_size=8, eager=False)
    outputs: dict[int, str] = {}
    async with FakeSandboxPool(containers=1, slots_per_container=8) as pool:
        async with ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher:

            async def trajectory(i: int) -> None:
                async with pool.lease(f"t{i}") as lease:
                    (result,) = await dispatcher.run([bash(lease, f"echo out-{i}")])
                    outputs[i] = result.content

            async with anyio.create_task_group() as group:
                for i in range(8):
                    group.start_soon(trajectory, i)
            stats = dispatcher.statistics()
        assert outputs == {i: f"out-{i}\n" for i in range(8)}
        assert len(pool.batches) == 1
        assert len(pool.batches[0][1]) == 8
        assert stats.batches == 1
        assert stats.largest_batch == 8


@pytest.mark.anyio
async def test_each_caller_gets_its_own_results_in_order(loop_hooks: HookFactory) -> None:
    config = BatchConfig(window_ms=1.0, max_batch_size=16)
    got: dict[int, list[str]] = {}
    async with (
        FakeSandboxPool(containers=2, slots_per_container=4) as pool,
        ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
    ):

        async def trajectory(i: int) -> None:
            async with pool.lease(f"t{i}") as lease:
                calls = [bash(lease, f"echo {i}-{k}") for k in range(3)]
                results = await dispatcher.run(calls)
                assert [r.call_id for r in results] == [c.call.id for c in calls]
                got[i] = [r.content for r in results]

        async with anyio.create_task_group() as group:
            for i in range(8):
                group.start_soon(trajectory, i)
    assert got == {i: [f"{i}-{k}\n" for k in range(3)] for i in range(8)}


@pytest.mark.anyio
async def test_a_slow_container_never_delays_another(loop_hooks: HookFactory) -> None:
    config = BatchConfig(window_ms=0.0, max_batch_size=8)
    async with FakeSandboxPool(containers=2, slots_per_container=1) as pool:
        slow, fast = pool.container_names()
        pool.hang_container(slow)
        async with (
            ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("a") as first,
            pool.lease("b") as second,
        ):
            by_container = {first.slot.container: first, second.slot.container: second}
            stuck: list[ToolResult] = []

            async def on_slow() -> None:
                stuck.extend(await dispatcher.run([bash(by_container[slow], "echo slow")]))

            async with anyio.create_task_group() as group:
                group.start_soon(on_slow)
                await wait_until_batches(pool, 1)
                (quick,) = await dispatcher.run([bash(by_container[fast], "echo fast")])
                assert quick.content == "fast\n"
                assert stuck == []  # the slow container's batch is still out
                pool.unhang(slow)
            assert [r.content for r in stuck] == ["slow\n"]


@pytest.mark.anyio
async def test_a_batch_that_raises_fails_only_its_own_calls_as_infra_errors(
    loop_hooks: HookFactory,
) -> None:
    config = BatchConfig(window_ms=0.0, max_batch_size=8)
    async with FakeSandboxPool(containers=2, slots_per_container=2) as fake:
        broken = fake.container_names()[0]
        pool = RaisingPool(fake, broken)
        results: dict[str, ToolResult] = {}
        async with ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher:

            async def trajectory(i: int) -> None:
                async with pool.lease(f"t{i}") as lease:
                    (result,) = await dispatcher.run([bash(lease, f"echo {i}")])
                    results[f"{lease.slot}"] = result

            async with anyio.create_task_group() as group:
                for i in range(4):
                    group.start_soon(trajectory, i)
            assert dispatcher.statistics().failed_batches >= 1
    assert len(results) == 4
    for slot, result in results.items():
        if slot.startswith(f"{broken}/"):
            assert result.outcome is ToolOutcome.INFRA_ERROR
            assert result.error is not None
            assert "connection reset by peer" in result.error
        else:
            assert result.outcome is ToolOutcome.OK


class SequentialPool(DelegatingPool):
    """A SandboxPool that takes, for a batch, 0.6 of the time its slowest slot's calls may take
    one after another (as a slot server runs them), then answers from ``inner``."""

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        per_slot: dict[object, float] = {}
        for call in calls:
            per_slot[call.lease.slot] = per_slot.get(call.lease.slot, 0.0) + call.timeout_s
        await anyio.sleep(0.6 * max(per_slot.values()))
        return await self.inner.execute(container, calls)


@pytest.mark.anyio
async def test_a_batch_of_one_slots_calls_may_take_their_timeouts_added_up(
    loop_hooks: HookFactory,
) -> None:
    """A model's parallel calls in one turn go to one slot in one batch, where the slot server
    runs them one after another: the batch's deadline is their timeouts added up (plus the
    grace), not the longest one's, or a healthy server's calls would all be infra errors."""
    config = BatchConfig(window_ms=60_000.0, max_batch_size=3, eager=False)
    async with FakeSandboxPool(containers=1, slots_per_container=1) as fake:
        pool = SequentialPool(fake)
        async with (
            ToolDispatcher(pool, config, grace_s=0.05, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("t") as lease,
        ):
            calls = [bash(lease, f"echo {k}", timeout_s=0.2) for k in range(3)]
            results = await dispatcher.run(calls)  # 0.36 s, within 3 x 0.2 + 0.05
    assert [r.outcome for r in results] == [ToolOutcome.OK] * 3, results
    assert [r.content for r in results] == ["0\n", "1\n", "2\n"]


@pytest.mark.anyio
async def test_a_cancelled_caller_withdraws_its_queued_calls(loop_hooks: HookFactory) -> None:
    config = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=True)
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        (container,) = pool.container_names()
        pool.hang_container(container)
        async with (
            ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("a") as a,
            pool.lease("b") as b,
        ):
            first: list[ToolResult] = []
            queued = bash(b, "echo never")

            async def run_first() -> None:
                first.extend(await dispatcher.run([bash(a, "echo first")]))

            async with anyio.create_task_group() as group:
                group.start_soon(run_first)
                await wait_until_batches(pool, 1)  # eager: a's call is out, hung
                with anyio.CancelScope() as scope:
                    group.start_soon(lambda: _cancel_soon(scope))
                    await dispatcher.run([queued])  # queued behind the busy batch
                assert scope.cancelled_caught
                pool.unhang(container)
            assert [r.content for r in first] == ["first\n"]
            assert dispatcher.statistics().withdrawn == 1
            await anyio.sleep(0.01)
    assert queued.call.id not in {call.call_id for call in pool.executed}
    assert len(pool.batches) == 1


@pytest.mark.anyio
async def test_calls_waiting_behind_a_busy_batch_go_out_when_it_completes(
    loop_hooks: HookFactory,
) -> None:
    """Eager mode with a window of a minute: the calls offered while the container's batch is
    out (another slot's, and a later call of the busy slot) go out as that batch completes,
    and each batch after it, sent by a task that sent one before, does the same."""
    config = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=True)
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        (container,) = pool.container_names()
        async with (
            ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("a") as a,
            pool.lease("b") as b,
        ):
            for round_ in range(3):
                pool.hang_container(container)
                got: dict[str, list[str]] = {}

                async def run(name: str, calls: list[SlotCall], into: dict[str, list[str]]) -> None:
                    into[name] = [r.content for r in await dispatcher.run(calls)]

                with anyio.fail_after(5):
                    async with anyio.create_task_group() as group:
                        group.start_soon(run, "first", [bash(a, f"echo a{round_}")], got)
                        await wait_until_batches(pool, 2 * round_ + 1)  # out, hung
                        group.start_soon(run, "other", [bash(b, f"echo b{round_}")], got)
                        group.start_soon(run, "later", [bash(a, f"echo c{round_}")], got)
                        await anyio.sleep(0.01)
                        assert len(pool.batches) == 2 * round_ + 1  # both wait for the first
                        pool.unhang(container)
                assert got == {
                    "first": [f"a{round_}\n"], "other": [f"b{round_}\n"],
                    "later": [f"c{round_}\n"],
                }  # fmt: skip
                assert len(pool.batches) == 2 * round_ + 2  # the two went out together
            assert dispatcher.statistics().batches == 6


@pytest.mark.anyio
async def test_a_call_offered_while_the_loop_sleeps_goes_out_in_the_callers_turn(
    loop_hooks: HookFactory,
) -> None:
    """An eager batch that an offer makes due while the loop sleeps is handed to a courier by
    the offering caller itself, so no turn of the dispatcher's loop stands on the call's path:
    when the caller first waits for its result the batch is already out of the planner."""
    config = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=True)
    async with (
        FakeSandboxPool(containers=1, slots_per_container=1) as pool,
        ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
        pool.lease("a") as lease,
    ):
        (warm,) = await dispatcher.run([bash(lease, "echo warm")])
        assert warm.content == "warm\n"
        await anyio.sleep(0.01)  # the loop has looked and sleeps: nothing is due
        caller = dispatcher.run([bash(lease, "echo now")])
        caller.send(None)  # the caller's turn, up to its wait for the result
        planned = dispatcher._planner.statistics()
        caller.close()  # the call is in flight: it finishes, its result is dropped
        assert (planned.ready, planned.in_flight_batches, planned.in_flight_calls) == (0, 1, 1)
        await wait_until_batches(pool, 2)
        with anyio.fail_after(5):
            while dispatcher.statistics().batches < 2:  # noqa: ASYNC110 - no event to wait on
                await anyio.sleep(0.001)
        (after,) = await dispatcher.run([bash(lease, "echo after")])
        assert after.content == "after\n"
        assert [len(calls) for _container, calls in pool.batches] == [1, 1, 1]


@pytest.mark.anyio
async def test_with_another_call_outstanding_the_loop_gathers_the_offer(
    loop_hooks: HookFactory,
) -> None:
    """While another caller's call is out, an offer that makes a batch due at once still goes
    through the loop's turn (which gathers the offers of one iteration into one batch): when
    its caller first waits, the call is still queued."""
    config = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=True)
    async with (
        FakeSandboxPool(containers=2, slots_per_container=1) as pool,
        ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
        pool.lease("a") as a,
        pool.lease("b") as b,
        anyio.create_task_group() as group,
    ):
        assert a.slot.container != b.slot.container
        await dispatcher.run([bash(b, "echo warm")])
        pool.hang_container(a.slot.container)
        group.start_soon(dispatcher.run, [bash(a, "echo busy")])
        await wait_until_batches(pool, 2)  # out, hung
        await anyio.sleep(0.01)  # the loop has looked and sleeps
        caller = dispatcher.run([bash(b, "echo gathered")])
        caller.send(None)
        planned = dispatcher._planner.statistics()
        caller.close()  # still queued: withdrawn
        assert (planned.ready, planned.in_flight_batches) == (1, 1)
        assert dispatcher.statistics().withdrawn == 1
        (after,) = await dispatcher.run([bash(b, "echo after")])  # its container was idle
        assert after.content == "after\n"
        assert pool.batches[2][0] == b.slot.container
        pool.unhang(a.slot.container)


_CALLER = contextvars.ContextVar("caller", default="none")


class ContextRecordingPool(RaisingPool):
    """A pool that records, for each batch, the ``_CALLER`` its courier runs with."""

    def __init__(self, inner: FakeSandboxPool) -> None:
        super().__init__(inner, broken="")
        self.seen: list[str] = []

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        self.seen.append(_CALLER.get())
        return await self.inner.execute(container, calls)


@pytest.mark.anyio
async def test_a_courier_a_caller_starts_runs_in_the_dispatchers_context(
    loop_hooks: HookFactory,
) -> None:
    """A caller whose offer starts a courier (none waiting, the loop asleep) does not lend it
    its own context variables: the courier serves later batches of every trajectory. The
    control: the caller itself sees its variable."""
    config = BatchConfig(window_ms=60_000.0, max_batch_size=64, eager=True)
    async with (
        FakeSandboxPool(containers=1, slots_per_container=1) as inner,
        ToolDispatcher(
            recording := ContextRecordingPool(inner), config, loop_hooks=loop_hooks
        ) as dispatcher,
        inner.lease("a") as lease,
    ):
        await anyio.sleep(0.01)  # the loop has looked and sleeps; no courier exists yet
        token = _CALLER.set("trajectory-1")
        try:
            (result,) = await dispatcher.run([bash(lease, "echo one")])
            assert _CALLER.get() == "trajectory-1"
        finally:
            _CALLER.reset(token)
        assert result.content == "one\n"
        assert recording.seen == ["none"]


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.sleep(0.01)
    scope.cancel()


@pytest.mark.anyio
async def test_cancelling_a_caller_in_flight_costs_no_one_else_their_result(
    loop_hooks: HookFactory,
) -> None:
    config = BatchConfig(window_ms=60_000.0, max_batch_size=2, eager=False)
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        (container,) = pool.container_names()
        pool.hang_container(container)
        async with (
            ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("a") as a,
            pool.lease("b") as b,
        ):
            survivor: list[ToolResult] = []

            async def keep() -> None:
                survivor.extend(await dispatcher.run([bash(b, "echo kept")]))

            async with anyio.create_task_group() as group:
                with anyio.CancelScope() as scope:
                    group.start_soon(keep)
                    group.start_soon(lambda: _cancel_after_batch(pool, scope))
                    await dispatcher.run([bash(a, "echo dropped")])
                assert scope.cancelled_caught
                pool.unhang(container)
            assert [r.content for r in survivor] == ["kept\n"]
        assert pool.statistics().leased == 0
        assert pool.statistics().free == 2


async def _cancel_after_batch(pool: FakeSandboxPool, scope: anyio.CancelScope) -> None:
    await wait_until_batches(pool, 1)
    scope.cancel()


@pytest.mark.anyio
async def test_a_stale_lease_is_rejected_through_the_dispatcher(loop_hooks: HookFactory) -> None:
    async with (
        FakeSandboxPool(containers=1, slots_per_container=1) as pool,
        ToolDispatcher(pool, BatchConfig(), loop_hooks=loop_hooks) as dispatcher,
    ):
        async with pool.lease("old") as old:
            pass
        async with pool.lease("new") as new:
            assert new.slot == old.slot
            assert new.epoch > old.epoch
            stale, fresh = await dispatcher.run([bash(old, "echo x"), bash(new, "echo y")])
    assert stale.outcome is ToolOutcome.REJECTED
    assert fresh.outcome is ToolOutcome.OK
    assert [call.epoch for call in pool.executed] == [new.epoch]


@pytest.mark.anyio
async def test_calls_after_the_pool_closed_are_infra_errors_and_after_exit_pool_closed(
    loop_hooks: HookFactory,
) -> None:
    pool = FakeSandboxPool(containers=1, slots_per_container=1)
    async with (
        pool,
        ToolDispatcher(pool, BatchConfig(), loop_hooks=loop_hooks) as dispatcher,
        pool.lease("t") as lease,
    ):
        await pool.aclose()
        (result,) = await dispatcher.run([bash(lease, "true")])
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert result.error is not None
    assert "closed" in result.error
    with pytest.raises(PoolClosed):
        await dispatcher.run([bash(lease, "true")])


@pytest.mark.anyio
async def test_callers_waiting_when_the_dispatcher_stops_get_pool_closed(
    loop_hooks: HookFactory,
) -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        (container,) = pool.container_names()
        pool.hang_container(container)
        errors: list[BaseException] = []
        async with pool.lease("t") as lease:
            dispatcher = ToolDispatcher(pool, BatchConfig(), loop_hooks=loop_hooks)

            async def caller() -> None:
                try:
                    await dispatcher.run([bash(lease, "true")])
                except PoolClosed as error:
                    errors.append(error)

            async with anyio.create_task_group() as group, dispatcher:
                group.start_soon(caller)
                await wait_until_batches(pool, 1)
            pool.unhang(container)
        assert len(errors) == 1


@pytest.mark.anyio
async def test_exiting_before_the_loop_first_runs_is_clean(loop_hooks: HookFactory) -> None:
    async with FakeSandboxPool() as pool:
        for _ in range(20):
            async with ToolDispatcher(pool, BatchConfig(), loop_hooks=loop_hooks):
                pass  # exit at once: the loop task may not have started yet


@pytest.mark.anyio
async def test_the_backend_looked_up_once_reads_anyios_clock_and_makes_its_events() -> None:
    """The hot path's clock and events (looked up when the dispatcher starts) are anyio's own."""
    backend = _Backend.running()
    for _ in range(3):
        before = anyio.current_time()
        read = backend.clock()
        assert before <= read <= anyio.current_time()
        await anyio.sleep(0.001)
    event = backend.event()
    assert type(event) is type(anyio.Event())
    assert isinstance(event, anyio.Event)
    assert not event.is_set()

    async def set_it() -> None:
        await anyio.sleep(0.001)
        event.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(set_it)
            await event.wait()
    assert event.is_set()
    scope = backend.scope(deadline=anyio.current_time() + 0.001)
    assert type(scope) is type(anyio.CancelScope())
    with anyio.fail_after(5), scope:
        await anyio.sleep(10)
    assert scope.cancelled_caught


def test_without_hooks_the_backend_reads_anyios_clock() -> None:
    assert _Backend.running().clock is anyio.current_time


def test_outside_an_asyncio_loop_there_are_no_asyncio_hooks() -> None:
    assert asyncio_hooks() is None


@pytest.mark.anyio
async def test_the_asyncio_hooks_read_the_loops_clock() -> None:
    hooks = asyncio_hooks()
    assert hooks is not None
    backend = _Backend.running(hooks)
    for _ in range(3):
        before = anyio.current_time()
        read = backend.clock()
        assert before <= read <= anyio.current_time()
        await anyio.sleep(0.001)


def _anyio_waiter() -> ResultWaiter:
    return _Waiter(anyio.Event())


def _future_waiter() -> ResultWaiter:
    return FutureWaiter(asyncio.get_running_loop())


WAITERS = pytest.mark.parametrize("make", [_anyio_waiter, _future_waiter], ids=["anyio", "future"])


@pytest.mark.anyio
async def test_asyncio_hooks_give_the_future_waiter_and_no_hooks_the_anyio_one() -> None:
    assert isinstance(_Backend.running(asyncio_hooks()).waiter(), FutureWaiter)
    assert isinstance(_Backend.running().waiter(), _Waiter)


@WAITERS
@pytest.mark.anyio
async def test_a_waiter_hands_over_its_first_result_whenever_it_is_awaited(
    make: Callable[[], ResultWaiter],
) -> None:
    """The future waiter (asyncio's hot path) and the anyio one behave alike."""
    first = ToolResult.infra_errors([ToolCall(id="a", name="bash")], "first")[0]
    second = ToolResult.infra_errors([ToolCall(id="a", name="bash")], "second")[0]
    early = make()
    assert not early.delivered()
    early.deliver(first)
    early.deliver(second)
    assert early.delivered()
    with anyio.fail_after(5):
        assert await early.wait() is first
    late = make()

    async def deliver_soon() -> None:
        await anyio.sleep(0.001)
        late.deliver(None)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(deliver_soon)
            assert await late.wait() is None
    assert late.delivered()


@WAITERS
@pytest.mark.anyio
async def test_a_delivered_waiter_still_yields_to_a_cancellation(
    make: Callable[[], ResultWaiter],
) -> None:
    waiter = make()
    waiter.deliver(None)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await waiter.wait()
        pytest.fail("wait() returned inside a cancelled scope")
    assert scope.cancelled_caught


@WAITERS
@pytest.mark.anyio
async def test_a_cancelled_wait_leaves_the_waiter_undelivered(
    make: Callable[[], ResultWaiter],
) -> None:
    waiter = make()
    with anyio.move_on_after(0.01) as scope:
        await waiter.wait()
    assert scope.cancelled_caught
    assert not waiter.delivered()  # so the caller withdraws its queued call
    waiter.deliver(None)  # a late result is dropped without an error


@pytest.mark.anyio
async def test_the_dispatchers_clock_is_anyios_time_before_and_after_it_starts(
    loop_hooks: HookFactory,
) -> None:
    """Trajectories read their time here (``run_trajectory``): the same clock as
    ``anyio.current_time()``, whichever waiters the dispatcher runs with."""
    async with FakeSandboxPool(containers=1, slots_per_container=1) as pool:
        dispatcher = ToolDispatcher(pool, BatchConfig(), loop_hooks=loop_hooks)
        before = anyio.current_time()
        assert before <= dispatcher.clock() <= anyio.current_time()
        async with dispatcher:
            await anyio.sleep(0.01)
            before = anyio.current_time()
            assert before <= dispatcher.clock() <= anyio.current_time()


class RecordingPool(DelegatingPool):
    """A SandboxPool that records the calls of each batch as they went out."""

    def __init__(self, inner: FakeSandboxPool) -> None:
        super().__init__(inner)
        self.sent: list[list[SlotCall]] = []

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        self.sent.append(list(calls))
        return await self.inner.execute(container, calls)


@pytest.mark.anyio
async def test_a_turns_time_counts_from_the_offer_for_calls_held_behind_their_slot(
    loop_hooks: HookFactory,
) -> None:
    """A turn's two calls of one slot, one batch each (``max_batch_size`` 1): the second waits
    here until the first is answered. It goes out with its turn's time less that wait, or,
    when the first spent it all, is answered ``TIMEOUT`` without going out."""
    config = BatchConfig(window_ms=0.0, max_batch_size=1, eager=True)
    async with FakeSandboxPool(containers=1, slots_per_container=1) as inner:
        pool = RecordingPool(inner)
        async with ToolDispatcher(pool, config, loop_hooks=loop_hooks) as dispatcher:
            async with pool.lease("t") as lease:
                quick = [attrs.evolve(bash(lease, "echo hi"), time_left_s=30.0) for _ in range(2)]
                with anyio.fail_after(5):
                    answers = await dispatcher.run(quick)
                assert [a.outcome for a in answers] == [ToolOutcome.OK] * 2
                sent = [(call.call, call.time_left_s) for calls in pool.sent for call in calls]
                assert [call for call, _ in sent] == [call.call for call in quick]
                assert all(left is not None and 0 < left <= 30.0 for _, left in sent), sent

                pool.sent.clear()
                long = [attrs.evolve(bash(lease, "sleep 60"), time_left_s=0.2) for _ in range(2)]
                with anyio.fail_after(5):
                    ran, unrun = await dispatcher.run(long)
            assert ran.outcome is ToolOutcome.TIMEOUT  # cut to the turn's 0.2 s in the slot
            assert ran.exec is not None
            assert ran.exec.timed_out
            assert (unrun.outcome, unrun.exec) == (ToolOutcome.TIMEOUT, None)
            assert unrun.error == time_left_spent(0.2)
            assert [[call.call for call in calls] for calls in pool.sent] == [[long[0].call]]
