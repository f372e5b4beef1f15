"""Warm leases: after a clean reset the slot's keeper starts the next lease at once, so the next
lease's first call does not wait for its namespaces, and the warmed lease is as fresh as one
started by that call (nothing of the lease before it: files, processes, /tmp).

The runtime runs in this process with bubblewrap and the compiled helper, as the slot servers
do; the control turns warming off (``RuntimeConfig.warm_leases``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.tools import ToolOutcome

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-warm-") as path:
        yield path


async def running_after_reset(runtime: SlotRuntime, wait_s: float) -> bool:
    """Whether slot 0's next lease is running within ``wait_s`` of its reset, before any call."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + wait_s
    while loop.time() < stop_at:
        if runtime.listing().slots[0].sandbox_running:
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "control"])
def test_after_a_clean_reset_the_next_lease_starts_before_its_first_call(
    root: Path, warm: bool
) -> None:
    config = RuntimeConfig(slots=1, root=root, use_cgroups=False, warm_leases=warm)
    first = "echo left >/workspace/left.txt; echo left >/tmp/left.txt; sleep 299.5 & echo started"
    second = (
        "ls -A /workspace /tmp; cat /workspace/left.txt /tmp/left.txt 2>/dev/null; "
        "echo leftovers $(ps -eo args | grep -c '[s]leep 299.5')"
    )

    async def main() -> tuple[str, bool, str, bool]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            (started,) = await runtime.execute([call(1, first)])
            assert started.outcome is ToolOutcome.OK, started.content
            (before,) = await runtime.execute([call(1, "sleep 0.2; " + second)])
            assert (await runtime.reset(0, 1)).ok
            running = await running_after_reset(runtime, 5.0)
            (after,) = await runtime.execute([call(2, second)])
            assert after.outcome in (ToolOutcome.OK, ToolOutcome.TOOL_ERROR), after.content
            # a reset of a warmed lease that ran nothing is clean too, and the next lease works
            assert (await runtime.reset(0, 2)).ok
            (third,) = await runtime.execute([call(3, "echo third")])
            return before.content, running, after.content, third.content == "third\n"
        finally:
            await runtime.aclose()

    control, running, seen, third_ran = asyncio.run(main())
    assert "left.txt" in control, control  # the checks see what a lease leaves
    assert control.endswith("leftovers 1\n"), control
    assert running is warm
    assert "left" not in seen.replace("leftovers", ""), seen  # no file of the lease before
    assert seen.endswith("leftovers 0\n"), seen  # and no process of it
    assert third_ran
