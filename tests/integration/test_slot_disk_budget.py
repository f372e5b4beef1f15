"""The disk budget in a slot server without bubblewrap (the bare agent): a background job a
lease leaves running is measured too, between its calls, and ended with the lease.

The runtime runs in process, unsandboxed and without cgroups, with an 8 MiB budget measured
every 0.1 s. Slot 0's call starts a job that writes 1 MiB files every 20 ms up to 400 MiB and
returns at once; slot 1 (the control) writes 1 MiB and goes on working. The job must be gone
(the workspace stops growing) and slot 0's next call must name the budget; its reset empties
the workspace, and the next lease of it runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs

from tests.integration.test_slot_server import call, searchable_dir
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.tools import ToolOutcome

JOB = (
    "(i=0; while [ $i -lt 400 ]; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); "
    "sleep 0.02; done) >/dev/null 2>&1 &\necho started"
)


def _config(folder: Path, *, slots: int, disk_bytes: int, disk_check_s: float) -> RuntimeConfig:
    """A runtime of ``slots`` in ``folder/root``, unsandboxed and without cgroups, with a disk
    budget of ``disk_bytes`` measured every ``disk_check_s``."""
    isolation = SlotIsolation(require_sandbox=False, disk_bytes=disk_bytes, disk_files=1000)
    return RuntimeConfig(
        slots=slots, root=folder / "root", isolation=isolation, bwrap="/nonexistent/bwrap",
        use_cgroups=False, disk_check_s=disk_check_s,
    )  # fmt: skip


@asynccontextmanager
async def _started(config: RuntimeConfig) -> AsyncIterator[SlotRuntime]:
    runtime = SlotRuntime(config)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.aclose()


def _used(folder: Path) -> int:
    total = 0
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def test_a_background_writer_is_ended_with_its_lease_past_the_budget() -> None:
    with searchable_dir("disk-budget") as folder:
        _background_writer(folder)


def _background_writer(tmp_path: Path) -> None:
    config = _config(tmp_path, slots=2, disk_bytes=8 << 20, disk_check_s=0.1)
    workspace = tmp_path / "root" / "slots" / "0"

    async def main() -> None:
        async with _started(config) as runtime:
            started, kept = await runtime.execute(
                [call(0, "bash", command=JOB), call(1, "bash", command="head -c 1048576 "
                 "/dev/zero > keep && echo ok")]
            )  # fmt: skip
            assert started.outcome is ToolOutcome.OK, started
            assert kept.outcome is ToolOutcome.OK, kept
            result = started
            async with asyncio.timeout(20):
                while result.outcome is ToolOutcome.OK:
                    await asyncio.sleep(0.2)
                    (result,) = await runtime.execute([call(0, "bash", command="true")])
            assert result.outcome is ToolOutcome.TOOL_ERROR, result
            assert f"disk budget of {8 << 20} bytes (disk_bytes) reached" in (result.error or "")
            held = _used(workspace)
            await asyncio.sleep(0.5)
            assert _used(workspace) == held  # the job is gone: nothing grows
            assert held < 100 << 20
            (control,) = await runtime.execute([call(1, "bash", command="ls keep")])
            assert control.outcome is ToolOutcome.OK, control
            assert control.exec is not None
            assert control.exec.exit_code == 0
            assert (await runtime.reset(0, 1)).ok
            assert _used(workspace) == 0
            (fresh,) = await runtime.execute([call(0, "bash", epoch=2, command="echo again")])
            assert fresh.outcome is ToolOutcome.OK, fresh
            assert fresh.content.strip() == "again"

    asyncio.run(main())


def test_a_lease_marked_past_its_budget_runs_no_command_on_its_idle_agent() -> None:
    """A lease the watch marked past its budget while its agent started (the watch measured it
    after a ``write_file``, and its first command was starting the agent meanwhile) keeps an
    idle agent: the next command, which takes the agent's fast path, fails naming the budget
    instead of running."""
    with searchable_dir("disk-marked") as folder:
        config = _config(folder, slots=1, disk_bytes=8 << 20, disk_check_s=60.0)

        async def main() -> None:
            async with _started(config) as runtime:
                (first,) = await runtime.execute([call(0, "bash", command="echo up")])
                assert first.outcome is ToolOutcome.OK, first
                (slot,) = runtime._slots  # the state the watch's race leaves
                reason = "disk budget of 8388608 bytes (disk_bytes) reached: marked"
                slot.disk_over = (1, reason)
                (later,) = await runtime.execute([call(0, "bash", command="touch ran")])
                assert later.outcome is ToolOutcome.TOOL_ERROR, later
                assert later.error == reason
                assert not (folder / "root" / "slots" / "0" / "ran").exists()

        asyncio.run(main())


def test_a_lease_marked_past_its_budget_while_its_agent_starts_runs_no_command() -> None:
    """The watch marks the lease past its budget while the call waits for the slot's agent
    (its lease warming): the call fails naming the budget instead of running."""
    with searchable_dir("disk-warming") as folder:
        config = _config(folder, slots=1, disk_bytes=8 << 20, disk_check_s=60.0)
        reason = "disk budget of 8388608 bytes (disk_bytes) reached: marked"

        async def main() -> None:
            async with _started(config) as runtime:
                (first,) = await runtime.execute([call(0, "bash", command="echo up")])
                assert first.outcome is ToolOutcome.OK, first
                (slot,) = runtime._slots  # the watch's race, made to happen

                async def marked_while_warming() -> None:
                    for _ in range(10_000):  # until the call is taken (a few steps)
                        if slot.calls.statistics().busy:
                            break
                        await asyncio.sleep(0)
                    await asyncio.sleep(0)  # the call's task runs first, up to its wait
                    slot.disk_over = (1, reason)

                slot.warm_with(marked_while_warming())
                (later,) = await runtime.execute([call(0, "bash", command="touch ran")])
                assert later.outcome is ToolOutcome.TOOL_ERROR, later
                assert later.error == reason
                assert not (folder / "root" / "slots" / "0" / "ran").exists()

        asyncio.run(main())


def test_a_burst_past_the_budget_just_before_the_hooks_is_seen_by_their_first_call() -> None:
    """The watch measures every 60 s here, so a lease that writes past its budget in one
    command and whose trajectory then ends is not seen by the watch before its score hook runs.
    A hook's call measures first: it fails naming the budget (the member gets the env's
    ``sandbox_budget_score``), and the lease ends; the model's own next call (the control, in
    the other slot) is not measured and runs."""
    burst = "head -c 4194304 /dev/zero > big && echo wrote"
    with searchable_dir("disk-burst") as folder:
        config = _config(folder, slots=2, disk_bytes=2 << 20, disk_check_s=60.0)

        async def main() -> None:
            async with _started(config) as runtime:
                wrote = await runtime.execute(
                    [call(0, "bash", command=burst), call(1, "bash", command=burst)]
                )
                assert [r.outcome for r in wrote] == [ToolOutcome.OK] * 2, wrote
                hook = attrs.evolve(call(0, "bash", command="ls big"), hook=True)
                model = call(1, "bash", command="ls big")
                checked, unchecked = await runtime.execute([hook, model])
                assert checked.outcome is ToolOutcome.TOOL_ERROR, checked
                assert checked.sandbox_budget is not None, checked
                assert f"disk budget of {2 << 20} bytes (disk_bytes) reached" in (
                    checked.error or ""
                )
                assert unchecked.outcome is ToolOutcome.OK, unchecked  # not a hook's: runs

        asyncio.run(main())


def test_the_hooks_own_writes_are_not_measured_call_after_call() -> None:
    """A preparation that uploads file after file (hooks' calls) is not measured before each:
    only the first hook call after the model's calls is. Here the hooks write past the budget
    without a measure (the watch's round is 60 s away), and the first hook call after a model
    call sees it."""
    with searchable_dir("disk-hooks") as folder:
        config = _config(folder, slots=1, disk_bytes=2 << 20, disk_check_s=60.0)
        text = "x" * (1 << 20)

        async def main() -> None:
            async with _started(config) as runtime:
                uploads = [
                    attrs.evolve(call(0, "write_file", path=f"f{i}", content=text), hook=True)
                    for i in range(3)
                ]
                written = await runtime.execute(uploads)
                assert [r.outcome for r in written] == [ToolOutcome.OK] * 3, written
                (model,) = await runtime.execute([call(0, "bash", command="true")])
                assert model.outcome is ToolOutcome.OK, model
                (hook,) = await runtime.execute(
                    [attrs.evolve(call(0, "bash", command="true"), hook=True)]
                )
                assert hook.outcome is ToolOutcome.TOOL_ERROR, hook
                assert hook.sandbox_budget is not None, hook

        asyncio.run(main())
