"""What the Nomad pool does with Nomad: against the fake Nomad API and real slot servers.

Each test runs the fake (``trajcore.testing.fake_nomad``) on loopback; its allocations are
real ``trajcore slot-server`` processes. Requests and answers are checked against Nomad's OpenAPI
description when it is found (see ``tests.nomad_testbed``); every test that talks to the fake
ends by asserting that no check failed.
"""

from __future__ import annotations

import math
import signal
import socket
from collections.abc import AsyncIterator

import anyio
import attrs
import pytest

from tests.nomad_testbed import OPENAPI, nomad_pool_config, pool_config, wait_until
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.pools.nomad_client import NomadClient, NomadUnavailable
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.errors import ConfigError, SandboxUnavailable, SlotServerError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.nomad_job import EnvironmentArtifact, NomadJobSettings, register_request
from trajcore.domain.slots import Lease
from trajcore.domain.tools import ToolOutcome
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


def _scale_counts(fake: FakeNomadAPI) -> list[int]:
    counts = []
    for request in fake.requests:
        if request.path.endswith("/scale") and isinstance(request.body, dict):
            count = request.body["Count"]
            assert isinstance(count, int)
            counts.append(count)
    return counts


# ============================================================================ settings


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("address", {"address": "localhost:4646"}),
        ("address", {"address": "http://nomad:99999"}),
        ("address", {"address": "http://nomad:4646/v1/jobs"}),
        ("slots_per_container", {"slots_per_container": 0}),
        ("min_containers", {"min_containers": -1}),
        ("max_containers", {"max_containers": 0}),
        ("max_containers", {"min_containers": 3, "max_containers": 2}),
        ("driver", {"driver": "podman"}),
        ("image", {"driver": "docker", "image": ""}),
        ("privileged", {"driver": "exec", "privileged": True}),
        ("privileged", {"privileged": "yes"}),
        ("job_id", {"job_id": "two words"}),
        ("reschedule_delay_s", {"reschedule_delay_s": 1.0}),
        ("request_timeout_s", {"request_timeout_s": 0}),
        ("poll_interval_s", {"poll_interval_s": math.nan}),
        ("acquire_timeout_s", {"acquire_timeout_s": -1.0}),
        ("purge_on_start", {"purge_on_start": "yes"}),
        ("token", {"token": ""}),
        ("namespace", {"namespace": "bad namespace"}),
        ("datacenters", {"datacenters": ""}),
        ("memory_mb", {"memory_mb": 4}),
        ("command", {"command": ()}),
    ],
)
def test_a_bad_setting_names_its_field(field: str, change: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        pool_config(**change)
    assert caught.value.field == field


def test_the_job_spec_carries_every_job_setting_of_the_config() -> None:
    config = pool_config(
        job_id="slots-2", driver="raw_exec", image="unused",
        command="python -m trajcore.entrypoints.slot_server",
        slots_per_container=3, isolation=SlotIsolation(output_cap_bytes=4096),
        token_env="SLOT_TOKEN",
        nofile_limit=100, nproc_limit=200, datacenters="east, west", namespace="ns", region="eu",
        group="g", task="t", cpu_mhz=7, memory_mb=99, disk_mb=50, restart_attempts=2,
        restart_delay_s=2.0, reschedule_delay_s=9.0, reschedule_max_delay_s=90.0,
        kill_timeout_s=3.0, token="acl-token", image_cache_dir="/c", image_cache_bytes=1 << 30,
        artifacts=[EnvironmentArtifact(source="/s", destination="d")], client_alloc_dir="/a",
    )  # fmt: skip
    spec = config.job_spec(count=3, token="b" * 16)
    defaults = NomadJobSettings()
    assert spec.job is config.job
    docker_only = ("privileged", "image_cache_volume")  # (the default driver's: not raw_exec)
    for field in attrs.fields(NomadJobSettings):
        if field.name not in docker_only:
            assert getattr(config.job, field.name) != getattr(defaults, field.name), field.name
    assert spec.server == config.server
    assert (spec.server.slots_per_container, spec.server.isolation) == (
        3,
        SlotIsolation(output_cap_bytes=4096),
    )
    assert (spec.count, spec.token) == (3, "b" * 16)  # the bearer token, not the ACL token
    assert spec.job.command == ("python", "-m", "trajcore.entrypoints.slot_server")
    assert spec.job.datacenters == ("east", "west")


def test_unset_memory_and_reschedule_ceiling_follow_the_slots_and_the_delay() -> None:
    spec = pool_config(slots_per_container=4, reschedule_delay_s=120.0).job_spec(
        count=1, token="b" * 16
    )
    assert spec.reserved_memory_mb == 512 + 256 * 4
    assert spec.job.max_reschedule_delay_s == 120.0
    assert NomadJobSettings(reschedule_delay_s=5.0).max_reschedule_delay_s == 60.0


# ============================================================================ reaching Nomad


async def test_a_dead_nomad_fails_the_start_naming_the_address() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = nomad_pool_config(f"http://127.0.0.1:{port}", request_timeout_s=2.0)
    with anyio.fail_after(15), pytest.raises(NomadUnavailable) as caught:
        async with NomadSandboxPool(config):
            pytest.fail("a pool started without Nomad")
    assert caught.value.field == "address"
    assert f"127.0.0.1:{port}" in str(caught.value)


async def test_a_silent_nomad_fails_the_start_within_the_request_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        config = nomad_pool_config(f"http://127.0.0.1:{port}", request_timeout_s=0.5)
        with anyio.fail_after(15), pytest.raises(NomadUnavailable) as caught:
            async with NomadSandboxPool(config):
                pytest.fail("a pool started without Nomad")
    assert caught.value.field == "address"


async def test_a_refused_acl_token_is_named() -> None:
    async with FakeNomadAPI(openapi=OPENAPI, acl_token="the-right-token") as fake:
        config = nomad_pool_config(fake.address, token="a-wrong-token")
        with pytest.raises(NomadUnavailable) as caught:
            async with NomadSandboxPool(config):
                pytest.fail("a pool started with a refused token")
        assert caught.value.field == "token"
        assert caught.value.status == 403
        assert fake.job("test-slots") is None
        assert all(r.token == "a-wrong-token" for r in fake.requests[1:])


@pytest.mark.parametrize(
    ("status", "denied"),
    [
        (401, ()),  # the token is refused from the first request on (a proxy's 401)
        (403, ("/v1/job/test-slots/allocations",)),  # it may register, not list (no read-job)
        (401, ("/v1/job/test-slots/allocations",)),
        (403, ("/v1/allocation/",)),  # it may list, not read an allocation for its address
    ],
)
async def test_a_refused_token_fails_the_start_at_once_naming_the_setting_and_status(
    status: int, denied: tuple[str, ...]
) -> None:
    secret = "the-pools-acl-token-0123"
    async with FakeNomadAPI(
        openapi=OPENAPI,
        acl_token=None if denied else "the-right-token",
        acl_status=status,
        acl_denied=denied,
        kill_timeout_cap_s=0.5,
    ) as fake:
        config = nomad_pool_config(fake.address, token=secret, start_timeout_s=60.0)
        with anyio.fail_after(20), pytest.raises(NomadUnavailable) as caught:
            async with NomadSandboxPool(config):
                pytest.fail("a pool started with a refused token")
        assert (caught.value.field, caught.value.status) == ("token", status)
        assert f"HTTP {status}" in str(caught.value)
        assert "--env.nomad_token" in str(caught.value)
        assert secret not in str(caught.value)
        assert fake.job("test-slots") is None
        assert fake.violations == []


async def test_a_refusal_that_echoes_the_token_never_shows_it() -> None:
    secret = "the-pools-acl-token-0123"

    async def echo(request: Request) -> Reply:  # a proxy that quotes what it refused
        header = request.headers.get("x-nomad-token") or ""
        return Reply(status=401, body=f"bad token {header!r}".encode(), content_type="text/plain")

    server = HTTPServer(echo, idle_timeout_s=5.0)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    try:
        client = NomadClient(address=f"http://127.0.0.1:{port}", token=secret, timeout_s=5.0)
        with pytest.raises(NomadUnavailable) as caught:
            await client.read_job("test-slots")
    finally:
        await server.aclose(grace_s=0.5)
    assert (caught.value.field, caught.value.status) == ("token", 401)
    assert secret not in str(caught.value)
    assert "bad token '<the ACL token>'" in str(caught.value)


# ============================================================================ start and stop


async def test_the_pool_registers_its_job_and_serves_min_containers(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address, containers=2, slots_per_container=2)
    async with NomadSandboxPool(config) as pool:
        stats = pool.statistics()
        assert (stats.containers, stats.free) == (2, 4)
        assert len(fake.running("test-slots")) == 2
        register = next(r for r in fake.requests if r.method == "POST")
        assert [r.path for r in fake.requests[:2]] == ["/v1/status/leader", register.path]
        assert register.path == "/v1/job/test-slots"
        assert isinstance(register.body, dict)
        job = register.body["Job"]
        assert isinstance(job, dict)
        task = job["TaskGroups"][0]["Tasks"][0]  # type: ignore[index,call-overload]
        assert isinstance(task, dict)
        env = task["Env"]
        assert isinstance(env, dict)
        token = env["TRAJCORE_SLOT_TOKEN"]
        assert isinstance(token, str)
        assert register.body == register_request(config.job_spec(count=2, token=token))
        async with pool.lease("t") as lease:
            (result,) = await pool.execute(
                lease.slot.container, [slot_call(lease, "bash", command="echo $((6 * 7))")]
            )
        assert result.content == "42\n"
        pool.check_valid()
    assert fake.job("test-slots") is None  # purged on shutdown
    assert fake.running("test-slots") == []


async def test_without_purge_the_job_is_stopped_and_kept_then_purged_on_the_next_start(
    fake: FakeNomadAPI,
) -> None:
    first = nomad_pool_config(fake.address, purge_on_shutdown=False)
    async with NomadSandboxPool(first):
        old = {a.id for a in fake.allocations("test-slots")}
    kept = fake.job("test-slots")
    assert kept is not None
    assert kept["Stop"] is True
    await wait_until(lambda: fake.running("test-slots") == [], "the old allocation stops")
    second = nomad_pool_config(fake.address, purge_on_start=True)
    async with NomadSandboxPool(second) as pool:
        methods = [(r.method, r.path, r.query.get("purge")) for r in fake.requests]
        purge = methods.index(("DELETE", "/v1/job/test-slots", "True"))
        assert methods.index(("POST", "/v1/job/test-slots", None), purge) > purge
        current = {a.id for a in fake.allocations("test-slots", all_versions=False)}
        assert current
        assert current.isdisjoint(old)
        assert {pool.allocation_id(name) for name in pool.container_names()} <= current
    assert fake.job("test-slots") is None


async def test_a_start_without_running_allocations_fails_and_leaves_no_job() -> None:
    async with FakeNomadAPI(openapi=OPENAPI, drivers=("raw_exec",)) as fake:
        config = nomad_pool_config(fake.address, driver="exec", start_timeout_s=1.0)
        with pytest.raises(SlotServerError, match=r"0 of 1 slot servers"):
            async with NomadSandboxPool(config):
                pytest.fail("a pool started with no slot server")
        assert fake.job("test-slots") is None
        assert fake.violations == []


async def test_a_required_sandbox_that_a_server_lacks_fails_the_start(
    fake: FakeNomadAPI,
) -> None:
    flags = SlotIsolation(require_sandbox=True, bwrap="/nonexistent/bwrap", min_timeout_s=0.2)
    config = nomad_pool_config(fake.address, isolation=flags)
    with pytest.raises(SandboxUnavailable, match="bubblewrap") as caught:
        async with NomadSandboxPool(config):
            pytest.fail("a pool started without the sandbox it requires")
    assert not isinstance(caught.value, NomadUnavailable)
    assert fake.job("test-slots") is None


# ============================================================================ losing containers


@pytest.mark.parametrize("how", ["killed", "stopped"])
async def test_a_lost_allocation_is_replaced_and_its_leases_turn_stale(
    fake: FakeNomadAPI, how: str
) -> None:
    async with NomadSandboxPool(nomad_pool_config(fake.address)) as pool:
        async with pool.lease("doomed") as lease:
            (first,) = pool.container_names()
            alloc = pool.allocation_id(first)
            if how == "killed":
                fake.kill_allocation(alloc)
            else:  # an operator stops it; Nomad places a replacement
                await NomadClient(address=fake.address).stop_allocation(alloc)
            await wait_until(
                lambda: pool.container_names() not in ([], [first]), "a replacement joins"
            )
            (stale,) = await pool.execute(first, [slot_call(lease, "bash", command="true")])
            assert stale.outcome is ToolOutcome.INFRA_ERROR  # its lease ended with its server
            assert stale.error == (
                f"slot server {first} was lost: lease {lease.slot}#1 ended with it"
            )
        (second,) = pool.container_names()
        assert pool.allocation_id(second) != alloc
        assert pool.containers_lost == 1
        assert any(first in problem for problem in pool.problems)
        async with pool.lease("after") as after:
            assert after.slot.container == second
            (fine,) = await pool.execute(second, [slot_call(after, "bash", command="echo ok")])
        assert fine.content == "ok\n"
        stats = pool.statistics()
        assert (stats.containers, stats.free + stats.resetting) == (1, 1)
        pool.check_valid()


async def test_a_slot_server_that_fails_a_batch_is_lost_and_its_allocation_stopped(
    fake: FakeNomadAPI,
) -> None:
    async with NomadSandboxPool(nomad_pool_config(fake.address)) as pool:
        async with pool.lease("t") as lease:
            (name,) = pool.container_names()
            alloc = pool.allocation_id(name)
            pool.client(name).grace_s = 0.3
            fake.kill_allocation(alloc, signal.SIGSTOP)  # alive to Nomad, silent to the pool
            (result,) = await pool.execute(
                name, [slot_call(lease, "bash", command="true", timeout_s=0.2)]
            )
            assert result.outcome is ToolOutcome.INFRA_ERROR
            assert name in (result.error or "")
            assert pool.containers_lost == 1
            assert name not in pool.container_names()
            await wait_until(
                lambda: any(r.path == f"/v1/allocation/{alloc}/stop" for r in fake.requests),
                "the pool asks Nomad to stop the allocation",
            )
            await wait_until(lambda: len(pool.container_names()) == 1, "a replacement joins")
        assert pool.allocation_id(pool.container_names()[0]) != alloc
        pool.check_valid()


async def test_nomad_errors_while_running_are_kept_and_retried(fake: FakeNomadAPI) -> None:
    async with NomadSandboxPool(nomad_pool_config(fake.address)) as pool:
        fake.fail_requests(500, times=3, path_prefix="/v1/job/test-slots/allocations")
        await wait_until(
            lambda: sum("HTTP 500" in p for p in pool.problems) == 3, "three failed polls"
        )
        (name,) = pool.container_names()
        fake.kill_allocation(pool.allocation_id(name))
        await wait_until(
            lambda: pool.container_names() not in ([], [name]), "the watch goes on and replaces"
        )


async def test_a_job_that_nomad_will_not_stop_at_close_is_noted(fake: FakeNomadAPI) -> None:
    async with NomadSandboxPool(nomad_pool_config(fake.address)) as pool:
        fake.fail_requests(500, times=1000, path_prefix="/v1/job/test-slots")
    stops = [p for p in pool.problems if p.startswith("could not stop the job: ")]
    assert stops != []
    assert "HTTP 500" in stops[-1]
    assert fake.job("test-slots") is not None  # still registered: the failure is not hidden


# ============================================================================ scaling


async def test_the_job_scales_up_with_demand_within_max_and_back_down_to_min(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address, containers=1, max_containers=2)
    served: list[str] = []
    async with NomadSandboxPool(config) as pool, anyio.create_task_group() as group:
        release = anyio.Event()

        async def hold(holder: str) -> None:
            async with pool.lease(holder) as lease:
                served.append(lease.slot.container)
                await release.wait()

        for holder in ("a", "b", "c"):
            group.start_soon(hold, holder)
        await wait_until(lambda: len(served) == 2, "a second container serves a waiter")
        assert pool.job_count == 2
        assert pool.target == 2
        assert len(set(served)) == 2
        assert pool.statistics().waiting == 1  # the third waits: max_containers is 2
        release.set()
        await wait_until(lambda: len(served) == 3, "the third is served")
        await wait_until(lambda: pool.job_count == 1, "the count drops back to min")
        await wait_until(lambda: len(pool.container_names()) == 1, "the drained one leaves")
        await wait_until(lambda: len(fake.running("test-slots")) == 1, "Nomad stops it")
        assert pool.containers_lost == 0  # drained and removed, never lost
        assert max(_scale_counts(fake)) == 2
        assert _scale_counts(fake)[-1] == 1
        pool.check_valid()


async def test_scaling_down_waits_for_the_leaving_container_to_drain(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address, containers=1, max_containers=2)
    held: dict[str, Lease] = {}
    done = {"a": anyio.Event(), "b": anyio.Event()}
    async with NomadSandboxPool(config) as pool, anyio.create_task_group() as group:

        async def hold(holder: str) -> None:
            async with pool.lease(holder) as lease:
                held[holder] = lease
                await done[holder].wait()

        group.start_soon(hold, "a")
        await wait_until(lambda: "a" in held, "a is served")
        group.start_soon(hold, "b")
        await wait_until(lambda: "b" in held, "b is served by a second container")
        leaving = held["b"].slot.container
        assert leaving != held["a"].slot.container
        done["a"].set()
        await wait_until(lambda: pool.target == 1, "the target drops to one")
        await anyio.sleep(0.3)  # several polls: the count must not drop under b's lease
        assert pool.job_count == 2
        assert leaving in pool.container_names()
        (ok,) = await pool.execute(leaving, [slot_call(held["b"], "bash", command="echo b")])
        assert ok.content == "b\n"
        done["b"].set()
        await wait_until(lambda: pool.job_count == 1, "the count drops once b is released")
        await wait_until(lambda: leaving not in pool.container_names(), "b's container leaves")
        assert pool.containers_lost == 0
        assert _scale_counts(fake) == [2, 1]
        pool.check_valid()


async def test_a_draining_container_rejoins_when_demand_returns(fake: FakeNomadAPI) -> None:
    config = nomad_pool_config(fake.address, containers=1, max_containers=2)
    held: dict[str, Lease] = {}
    done = {holder: anyio.Event() for holder in "abcd"}
    async with NomadSandboxPool(config) as pool, anyio.create_task_group() as group:

        async def hold(holder: str) -> None:
            async with pool.lease(holder) as lease:
                held[holder] = lease
                await done[holder].wait()

        group.start_soon(hold, "a")
        await wait_until(lambda: "a" in held, "a is served")
        group.start_soon(hold, "b")
        await wait_until(lambda: "b" in held, "b is served by a second container")
        second = held["b"].slot.container
        done["a"].set()
        await wait_until(lambda: pool.target == 1, "the target drops: the second drains")
        group.start_soon(hold, "c")
        await wait_until(lambda: "c" in held, "c takes the first container's slot")
        group.start_soon(hold, "d")
        await wait_until(lambda: pool.target == 2, "demand returns")
        assert "d" not in held  # the second container still drains under b
        done["b"].set()
        await wait_until(lambda: "d" in held, "d is served")
        assert held["d"].slot.container == second  # it rejoined; nothing was restarted
        assert held["d"].epoch > held["b"].epoch  # epochs carry on under the same name
        (ok,) = await pool.execute(second, [slot_call(held["d"], "bash", command="echo d")])
        assert ok.content == "d\n"
        assert _scale_counts(fake) == [2]
        assert pool.containers_lost == 0
        pool.check_valid()
        done["c"].set()
        done["d"].set()


async def test_a_slot_server_restarted_in_place_rejoins_as_a_new_container(
    fake: FakeNomadAPI,
) -> None:
    config = nomad_pool_config(fake.address, restart_attempts=1)
    async with NomadSandboxPool(config) as pool:
        async with pool.lease("before") as before:
            (first,) = pool.container_names()
            alloc = pool.allocation_id(first)
            fake.kill_allocation(alloc)
            await wait_until(lambda: pool.container_names() == [f"{first}~1"], "it rejoins")
            (stale,) = await pool.execute(first, [slot_call(before, "bash", command="true")])
            assert stale.outcome is ToolOutcome.INFRA_ERROR  # its lease ended with its server
        assert pool.allocation_id(f"{first}~1") == alloc  # the same allocation, restarted
        async with pool.lease("after") as after:
            (ok,) = await pool.execute(
                after.slot.container, [slot_call(after, "bash", command="echo again")]
            )
        assert ok.content == "again\n"
        assert pool.containers_lost == 1
