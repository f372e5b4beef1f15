"""A hook's call never shares a slot call id with a model's call of the same lease: real slot
server, real bubblewrap. The slot server answers a repeated ``(epoch, call_id)`` with the first
call's result, so a shared id would hand a check the model's own output."""

from __future__ import annotations

import pytest

from tests.integration.test_local_pool import config, running_now, wait_no_leftovers
from tests.integration.test_slot_tools_local import slot_tools
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.tools import ToolCall

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_model_call_named_like_a_hook_call_does_not_answer_the_hook() -> None:
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=5.0) as tools:
            # the model names its calls as the hooks' toolbox does (a parser keeps ids the
            # model wrote, e.g. Mistral's): each of them must still run as its own call
            forged = [
                ToolCall(id=f"ctx_{n}", name="bash", arguments={"command": "echo forged"})
                for n in range(3)
            ]
            for call in forged:
                (result,) = await tools.router.run([call])
                assert "forged" in result.content
            assert await tools.check("exit 1") is False
            report = await tools.run("echo checked")
            assert report.stdout == "checked\n"
            assert await tools.check("exit 1") is False
    await wait_no_leftovers(groups, run_dir, before)
