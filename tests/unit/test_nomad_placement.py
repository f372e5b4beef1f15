"""Why Nomad placed nothing: a start that gets no slot server says what Nomad's evaluation
reported (no node in the job's datacenters, a driver no client has, exhausted resources), and the
fake Nomad places a job only where its datacenters match its node's, as Nomad does."""

from __future__ import annotations

import anyio
import pytest

from tests.nomad_testbed import OPENAPI, nomad_pool_config
from trajcore.adapters.pools.nomad_client import placement_failure
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.errors import SlotServerError, WireError
from trajcore.domain.json_values import JSON
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("driver", "datacenters", "said"),
    [
        ("exec", "dc1", "1 nodes evaluated; filtered: missing drivers 1"),
        ("raw_exec", "dc2,eu-*", "0 nodes evaluated; no ready node in dc2, eu-*"),
    ],
)
async def test_a_start_nomad_cannot_place_says_why(
    driver: str, datacenters: str, said: str
) -> None:
    async with FakeNomadAPI(openapi=OPENAPI, drivers=("raw_exec",)) as fake:
        config = nomad_pool_config(
            fake.address, start_timeout_s=1.0, driver=driver, datacenters=datacenters
        )
        with anyio.fail_after(15), pytest.raises(SlotServerError) as caught:
            async with NomadSandboxPool(config):
                pytest.fail("a pool started with nothing placed")
        assert f"Nomad could not place 1 allocation(s) of group slots: {said}" in str(caught.value)
        assert fake.job("test-slots") is None
        assert fake.violations == []


async def test_a_datacenter_glob_that_matches_the_node_places_the_job() -> None:
    async with FakeNomadAPI(openapi=OPENAPI, kill_timeout_cap_s=0.5) as fake:
        config = nomad_pool_config(fake.address, datacenters="*")
        async with NomadSandboxPool(config) as pool:
            assert len(pool.container_names()) == 1
        assert fake.violations == []


def _evaluation(index: int, failed: JSON = None, status: str = "complete") -> JSON:
    evaluation: dict[str, JSON] = {"Status": status, "CreateIndex": index}
    if failed is not None:
        evaluation["FailedTGAllocs"] = {"slots": failed}
    return evaluation


def test_the_latest_complete_evaluation_says_what_was_exhausted() -> None:
    exhausted: JSON = {
        "NodesEvaluated": 3,
        "CoalescedFailures": 1,
        "NodesAvailable": {"dc1": 3},
        "DimensionExhausted": {"memory": 2, "cpu": 1},
        "QuotaExhausted": ["mem quota"],
    }
    listing: JSON = [_evaluation(9, exhausted), _evaluation(5), _evaluation(12, status="blocked")]
    assert placement_failure(listing, "slots") == (
        "Nomad could not place 2 allocation(s) of group slots: 3 nodes evaluated; "
        "exhausted: cpu 1, memory 2; quota exhausted: mem quota"
    )
    assert placement_failure([_evaluation(9, exhausted), _evaluation(10)], "slots") == ""
    assert placement_failure(listing, "other") == ""
    assert placement_failure(None, "slots") == ""
    with pytest.raises(WireError) as caught:
        placement_failure([{"Status": "complete", "FailedTGAllocs": {"slots": []}}], "slots")
    assert caught.value.field == "$[0].FailedTGAllocs['slots']"
