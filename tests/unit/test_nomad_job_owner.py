"""Whose the Nomad job is: a pool whose job is stopped, purged or registered again by another
pool outside it says so, stops acting on the other pool's allocations and leaves them running at
its close; a job left by a forced end is replaced by the next start with the same ID.

Each test runs the fake Nomad API (``trajcore.testing.fake_nomad``) with real slot servers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from tests.nomad_testbed import OPENAPI, nomad_pool_config, wait_until
from trajcore.adapters.pools.nomad_client import NomadClient, parse_job
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.nomad_job import register_request
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

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


async def test_a_pool_whose_job_another_pool_registered_leaves_that_pool_alone(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address, start_timeout_s=1.0)
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
            await wait_until(
                lambda: any("took it over" in p for p in first.problems), "the first pool says so"
            )
            await anyio.sleep(2.5)  # longer than a join may take: the first pool never joins
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
        with anyio.move_on_after(0.5) as waiting:
            async with pool.lease("t"):
                pytest.fail("a lease on a stopped job")
        assert waiting.cancelled_caught
        assert not any(r.path.endswith("/scale") for r in fake.requests)
        assert _stops(fake) == []


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
