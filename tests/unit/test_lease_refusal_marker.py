"""The marker of a call refused for its lease rather than its arguments
(``ToolResult.lease_refused``): set where such refusals are made (a pool's leasing, the slot
server's queue), carried on the slot server's wire by every writer and reader, and read by the
seed compat wrappers (``hermes_tool_context.answered``, under hermes's ``ToolContext`` and
atropos-agent's ``exec_tool``) instead of the refusal's text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.batch_wire import batch_results
from trajcore.adapters.slot_server.batch_codec import FAST_STRUCTURE, FAST_UNSTRUCTURE
from trajcore.adapters.slot_server.codec import converter, decode, encode
from trajcore.adapters.slot_server.tool_calls import refused
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import InvalidInput, SlotInfraError, WireError
from trajcore.domain.slot_calls import SlotBroken, StaleEpoch
from trajcore.domain.slot_protocol import SLOT_TOOLS, ExecuteCall, ExecuteResponse
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.entrypoints.hermes_tool_context import answered
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter
from trajcore.testing.portal_pools import slot_call

pytestmark = pytest.mark.anyio

CALL = ToolCall(id="c1", name="bash", arguments={"command": "true"})
STALE = "lease fake-0/0#1 is stale or released @ $.epoch"
REFUSED = ToolResult.lease_refusal(CALL, STALE)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_pool_marks_its_refusals_of_a_lease_and_not_those_of_the_arguments() -> None:
    async with FakeSandboxPool(containers=2, slots_per_container=1) as pool:
        async with pool.lease("old") as old:
            pass
        async with pool.lease("a") as a, pool.lease("b") as b:
            stale, elsewhere, outside, fine = await pool.execute(
                a.slot.container,
                [
                    slot_call(old, "bash", command="true"),
                    slot_call(b, "bash", command="true"),  # a slot of the other container
                    slot_call(a, "read_file", path="../outside"),
                    slot_call(a, "bash", command="true"),
                ],
            )
    assert [r.outcome for r in (stale, elsewhere, outside)] == [ToolOutcome.REJECTED] * 3
    assert (stale.lease_refused, elsewhere.lease_refused) == (True, True)
    assert (outside.lease_refused, fine.lease_refused) == (False, False)
    assert outside.error is not None
    assert outside.error.endswith("@ $.path")


def test_the_slot_servers_queue_marks_a_stale_epoch_only() -> None:
    call = ExecuteCall(slot=0, epoch=1, call_id="c1", tool="bash", arguments={}, timeout_s=1.0)
    stale = refused(call, StaleEpoch(epoch=1, retired=1))
    broken = refused(call, SlotBroken(problem="the wipe failed"))
    assert (stale.outcome, stale.lease_refused) == (ToolOutcome.REJECTED, True)
    assert (broken.outcome, broken.lease_refused) == (ToolOutcome.INFRA_ERROR, False)


def test_the_marker_travels_as_a_field_and_round_trips_every_path() -> None:
    plain = ToolResult.failure(attrs.evolve(CALL, id="c2"), ToolOutcome.REJECTED, "x @ $.epoch")
    response = ExecuteResponse(results=[REFUSED, plain], boot="b1")
    body = encode(response)
    tree = json.loads(body)
    assert tree["results"][0]["lease_refused"] is True
    assert "lease_refused" not in tree["results"][1]  # left out at its default
    assert decode(body, ExecuteResponse) == response
    assert FAST_STRUCTURE[ExecuteResponse](tree) == response
    assert FAST_UNSTRUCTURE[ExecuteResponse](response) == tree
    assert converter.structure(converter.unstructure(response), ExecuteResponse) == response
    assert batch_results(body, ["c1", "c2"]) == ([REFUSED, plain], "b1")


@pytest.mark.parametrize(
    ("outcome", "value", "reason"),
    [("rejected", "yes", "bool"), ("tool_error", True, "a refusal of the call's lease")],
)
def test_a_marker_that_is_no_refusal_of_a_lease_is_refused_naming_the_field(
    outcome: str, value: object, reason: str
) -> None:
    item = {"call_id": "c1", "name": "bash", "outcome": outcome, "lease_refused": value}
    body = json.dumps({"results": [item]}).encode()
    assert batch_results(body, ["c1"]) is None  # the fast path leaves it to the general one
    with pytest.raises(WireError, match=reason) as caught:
        decode(body, ExecuteResponse)
    assert caught.value.field == "$.results[0].lease_refused"
    with pytest.raises(InvalidInput):
        ToolResult(call_id="c1", name="bash", outcome=ToolOutcome.TIMEOUT, lease_refused=True)


@asynccontextmanager
async def slot_tools() -> AsyncIterator[SlotTools]:
    async with (
        FakeSandboxPool(slots_per_container=1) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t") as lease,
    ):
        router = ToolRouter(
            lease=lease,
            dispatcher=dispatcher,
            tool_server=None,
            offered=frozenset(SLOT_TOOLS),
            tool_timeout_s=5.0,
            trajectory_id="t",
        )
        yield SlotTools(router)


async def test_the_compat_wrappers_read_the_marker_not_the_refusals_text() -> None:
    # a refusal of the call's own arguments whose text happens to end as a lease's would
    own = ToolResult.failure(CALL, ToolOutcome.REJECTED, "no such option -x @ $.epoch")
    # a refusal of the lease whose text names none of the lease's fields
    lease = ToolResult.lease_refusal(CALL, "the lease ended @ $.command")
    async with slot_tools() as tools:
        assert answered(tools, "bash", own) is own
        with pytest.raises(SlotInfraError, match="the lease ended"):
            answered(tools, "bash", lease)
        with pytest.raises(SlotInfraError, match="is stale or released"):
            answered(tools, "bash", REFUSED)
