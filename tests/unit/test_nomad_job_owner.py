"""Whose the Nomad job is: a pool whose job is stopped, purged or registered again by another
pool outside it says so, stops acting on the other pool's allocations and leaves them running at
its close; a job left by a forced end is replaced by the next start with the same ID. A pool
whose ACL token Nomad refuses after its start stops leasing until Nomad accepts it again.

Each test runs the fake Nomad API (``trajcore.testing.fake_nomad``) with real slot servers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from tests.nomad_testbed import OPENAPI, group_and_task, nomad_pool_config, wait_until
from trajcore.adapters.pools.nomad_client import NomadClient, NomadUnavailable, parse_job
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import register_request
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.portal_pools import slot_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def fake() -> AsyncIterator[FakeNomadAPI]:
    async with FakeNomadAPI(openapi=OPENAPI, kill_timeout_cap_s=0.5) as api:
        yield api
        assert api.violations == []


def _stops(fake: FakeNomadAPI) -> list[str]:
    return [r.path for r in fake.requests if r.path.endswith("/stop")]


def _count(fake: FakeNomadAPI, path: str) -> int:
    return sum(1 for r in fake.requests if r.method == "GET" and r.path == path)


async def test_a_pool_whose_job_another_pool_registered_leaves_that_pool_alone(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address)  # each start waits as long as it needs
    opened, close = anyio.Event(), anyio.Event()
    pools: list[NomadSandboxPool] = []

    async def run_first() -> None:
        async with NomadSandboxPool(config) as first:
            pools.append(first)
            opened.set()
            await close.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(run_first)
        await opened.wait()
        (first,) = pools
        async with NomadSandboxPool(config) as second:
            (name,) = second.container_names()
            (theirs,) = fake.running("test-slots")
            await wait_until(
                lambda: any("took it over" in p for p in first.problems), "the first pool says so"
            )
            # Every listing shows the second pool's allocation. A pool that took it for its own
            # would join it, and a join starts by reading the allocation (its address; only a
            # join reads one), then stops it once the join fails. Both pools poll in this
            # event loop, so twenty more listings leave the first pool's polls and any join
            # they started the time to show, however slow the machine: no deadline to race.
            listing = "/v1/job/test-slots/allocations"
            listings = _count(fake, listing)
            await wait_until(lambda: _count(fake, listing) >= listings + 20, "twenty more polls")
            assert _count(fake, f"/v1/allocation/{theirs.id}") == 1  # the second pool's join
            assert _stops(fake) == []
            assert first.container_names() == []
            close.set()
            await wait_until(lambda: len(pools) == 1 and first.closed, "the first pool closes")
            await anyio.sleep(0.5)
            assert second.container_names() == [name]
            assert fake.job("test-slots") is not None
            assert len(fake.running("test-slots")) == 1
            assert any("left Nomad job test-slots running" in p for p in first.problems)
    assert fake.job("test-slots") is None  # the second pool's close purges it


@pytest.mark.parametrize("purge", [False, True])
async def test_a_job_stopped_outside_the_pool_is_said_and_not_scaled(
    fake: FakeNomadAPI, purge: bool
) -> None:
    config = nomad_pool_config(fake.address, min_containers=1, max_containers=2)
    async with NomadSandboxPool(config) as pool:
        await NomadClient(address=fake.address).deregister("test-slots", purge=purge)
        what = "purged" if purge else "stopped"
        await wait_until(
            lambda: any(f"test-slots was {what} outside this pool" in p for p in pool.problems),
            "the pool says the job was stopped",
        )
        await wait_until(lambda: pool.container_names() == [], "its server leaves service")
        with anyio.fail_after(5), pytest.raises(NomadUnavailable, match=f"{what} outside"):
            async with pool.lease("t"):
                pytest.fail("a lease on a stopped job")
        assert not any(r.path.endswith("/scale") for r in fake.requests)
        assert _stops(fake) == []


def _job_token(fake: FakeNomadAPI) -> str:
    """The slot token of the job as the pool last registered it."""
    registered = [r for r in fake.requests if (r.method, r.path) == ("POST", "/v1/job/test-slots")]
    body = registered[-1].body
    assert isinstance(body, dict)
    job = body["Job"]
    assert isinstance(job, dict)
    _, task = group_and_task(job)
    env = task["Env"]
    assert isinstance(env, dict)
    token = env["TRAJCORE_SLOT_TOKEN"]
    assert isinstance(token, str)
    return token


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("stop", "was stopped outside this pool (nomad job stop)"),
        ("purge", "was purged outside this pool"),
        ("take over", "took it over"),
    ],
)
async def test_leases_waiting_on_a_job_lost_outside_the_pool_fail_at_once(
    fake: FakeNomadAPI, how: str, said: str
) -> None:
    config = nomad_pool_config(fake.address, acquire_timeout_s=600.0)  # the default deadline
    failures: list[NomadUnavailable] = []
    async with NomadSandboxPool(config) as pool:

        async def wait_for_a_slot(name: str) -> None:
            with pytest.raises(NomadUnavailable) as caught:
                async with pool.lease(name):
                    pytest.fail("a lease on a job lost outside the pool")
            failures.append(caught.value)

        async with pool.lease("holder"), anyio.create_task_group() as group:
            group.start_soon(wait_for_a_slot, "first")
            group.start_soon(wait_for_a_slot, "second")
            await wait_until(lambda: pool.statistics().waiting == 2, "both wait for the slot")
            nomad = NomadClient(address=fake.address)
            if how == "take over":
                other = config.job_spec(count=1, token="another-pools-token-0123456789")
                await nomad.register("test-slots", register_request(other))
            else:
                await nomad.deregister("test-slots", purge=how == "purge")
            with anyio.fail_after(10):  # (they waited out acquire_timeout_s before)
                await wait_until(lambda: len(failures) == 2, "the waiting leases fail")
        with anyio.fail_after(5), pytest.raises(NomadUnavailable) as new:
            async with pool.lease("late"):
                pytest.fail("a lease on a job lost outside the pool")
        for error in [*failures, new.value]:
            assert error.field == "job_id"
            assert "Nomad job test-slots " in str(error)
            assert said in str(error)
        assert pool.statistics().waiting == 0
        pool.check_valid()


async def test_leasing_goes_on_when_the_job_is_the_pools_again(fake: FakeNomadAPI) -> None:
    config = nomad_pool_config(fake.address)
    async with NomadSandboxPool(config) as pool:
        nomad = NomadClient(address=fake.address)
        await nomad.deregister("test-slots", purge=False)
        await wait_until(lambda: pool.leasing.suspended, "the pool stops leasing")
        with anyio.fail_after(5), pytest.raises(NomadUnavailable):
            async with pool.lease("early"):
                pytest.fail("a lease on a stopped job")
        again = config.job_spec(count=1, token=_job_token(fake))
        await nomad.register("test-slots", register_request(again))  # an operator's job run
        await wait_until(lambda: any("is this pool's" in p for p in pool.problems), "it is said")
        async with pool.lease("after", timeout_s=20.0) as lease:
            assert lease.slot.container in pool.container_names()


@pytest.mark.parametrize("status", [403, 401])
async def test_a_token_revoked_after_the_start_stops_leasing_until_it_is_accepted_again(
    status: int,
) -> None:
    secret = "the-pools-acl-token-0123"
    async with FakeNomadAPI(
        openapi=OPENAPI, acl_token=secret, acl_status=status, kill_timeout_cap_s=0.5
    ) as fake:
        config = nomad_pool_config(fake.address, token=secret, acquire_timeout_s=600.0)
        failures: list[NomadUnavailable] = []
        async with NomadSandboxPool(config) as pool:

            async def wait_for_a_slot(name: str) -> None:
                with pytest.raises(NomadUnavailable) as caught:
                    async with pool.lease(name):
                        pytest.fail("a lease while Nomad refuses the pool's token")
                failures.append(caught.value)

            async with pool.lease("holder") as held, anyio.create_task_group() as group:
                group.start_soon(wait_for_a_slot, "first")
                await wait_until(lambda: pool.statistics().waiting == 1, "it waits for the slot")
                fake.acl_token = "the-token-that-replaced-it"  # the pool's token is revoked
                with anyio.fail_after(10):  # (it waited out acquire_timeout_s before)
                    await wait_until(lambda: len(failures) == 1, "the waiting lease fails")
                (ok,) = await pool.execute(
                    held.slot.container, [slot_call(held, "bash", command="echo held")]
                )
                assert ok.content == "held\n"  # a held lease goes on
            with anyio.fail_after(5), pytest.raises(NomadUnavailable) as new:
                async with pool.lease("late"):
                    pytest.fail("a lease while Nomad refuses the pool's token")
            for error in [*failures, new.value]:
                assert (error.field, error.status) == ("token", status)
                assert "Nomad job test-slots" in str(error)
                assert "--env.nomad_token" in str(error)
                assert secret not in str(error)
            said = [p for p in pool.problems if "refused the pool's ACL token at" in p]
            assert len(said) == 1, pool.problems
            assert all(secret not in p for p in pool.problems)
            fake.acl_token = secret  # accepted again
            await wait_until(lambda: not pool.leasing.suspended, "leasing goes on")
            async with pool.lease("after", timeout_s=20.0) as lease:
                assert lease.slot.container in pool.container_names()
            pool.check_valid()
        assert fake.job("test-slots") is None
        assert fake.violations == []


async def test_a_start_whose_job_is_stopped_meanwhile_fails_at_once() -> None:
    async with FakeNomadAPI(openapi=OPENAPI, datacenter="elsewhere") as fake:  # never placed
        config = nomad_pool_config(fake.address, start_timeout_s=60.0)

        async def stop_it() -> None:
            await wait_until(lambda: fake.job("test-slots") is not None, "the job is registered")
            await NomadClient(address=fake.address).deregister("test-slots", purge=False)

        async with anyio.create_task_group() as group:
            group.start_soon(stop_it)
            with anyio.fail_after(20), pytest.raises(NomadUnavailable) as caught:
                async with NomadSandboxPool(config):
                    pytest.fail("a pool started on a stopped job")
        assert caught.value.field == "job_id"
        assert "Nomad job test-slots was stopped outside this pool" in str(caught.value)
        assert fake.violations == []


async def test_a_job_left_by_a_forced_end_is_replaced_by_the_next_start(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address)
    left = config.job_spec(count=3, token="a-dead-pools-token-0123456789")
    await NomadClient(address=fake.address).register("test-slots", register_request(left))
    await wait_until(lambda: len(fake.running("test-slots")) == 3, "the old servers run")
    old = {a.id for a in fake.running("test-slots")}
    async with NomadSandboxPool(config) as pool:
        await wait_until(lambda: len(fake.running("test-slots")) == 1, "the old ones stop")
        (new,) = fake.running("test-slots")
        assert new.id not in old
        assert [pool.allocation_id(name) for name in pool.container_names()] == [new.id]
    assert fake.running("test-slots") == []


def test_a_job_answer_is_read_for_its_owner_and_a_malformed_one_is_named() -> None:
    body: JSONObject = {
        "Version": 4,
        "Stop": False,
        "TaskGroups": [
            {"Name": "other", "Tasks": [{"Name": "slot-server", "Env": {"T": "no"}}]},
            {"Name": "slots", "Tasks": [{"Name": "slot-server", "Env": {"T": "mine"}}]},
        ],
    }
    state = parse_job(body, group="slots", task="slot-server", token_env="T")
    assert (state.version, state.stopped, state.token) == (4, False, "mine")
    state = parse_job({"Stop": None}, group="slots", task="slot-server", token_env="T")
    assert (state.version, state.stopped, state.token) == (0, False, None)
    with pytest.raises(WireError) as caught:
        parse_job({"Version": "4"}, group="slots", task="slot-server", token_env="T")
    assert caught.value.field == "$.Version"
