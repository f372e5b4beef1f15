"""An idle keeper readies its next lease: the lease's first process and namespaces, made ahead.

Once a reset has proven a slot clean (or a keeper started again), the server asks the slot's
keeper to ready its next lease ("ready", slot_helper.c): the keeper clones the lease's first
process into a new pid namespace, which makes its mount, ipc, uts and network namespaces and
waits; the next lease request hands it the request, and the process goes on with the setup every
lease gets. These tests look at it from the host (root reads /proc): the idle keeper has exactly
one readied child, in namespaces that are neither the keeper's nor the last lease's, the next
lease runs in exactly that process and network namespace (loopback up), no readied process
lives beside a running lease, and a fork's workspace overlay, mounted on the host after the
process was readied, reaches the fork's lease that it became.

The runtime runs in this process with bubblewrap and the compiled helper, as the slot servers
do; warm leases are on (readying is a warming).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.slot_runtime_testbed import searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.sandboxes import READIED_GREETING_S
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="reading a keeper's children needs root"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-readied-") as path:
        yield path


def bash(slot: int, epoch: int, command: str) -> ExecuteCall:
    arguments: dict[str, JSON] = {"command": command}
    return ExecuteCall(
        slot=slot, epoch=epoch, call_id=f"r{slot}-{epoch}-{time.monotonic_ns()}", tool="bash",
        arguments=arguments, timeout_s=10.0,
    )  # fmt: skip


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def keeper_of(sandbox: int) -> int:
    """The pid of the slot keeper below the slot's sandbox process ``sandbox``."""
    todo = [sandbox]
    while todo:
        pid = todo.pop()
        if comm(pid) == "slot-keeper":
            return pid
        todo += children(pid)
    raise AssertionError(f"no slot-keeper below {sandbox}")


def namespaces(pid: int) -> dict[str, str]:
    return {kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("pid", "mnt", "net", "ipc")}


async def readied_after_a_reset(
    runtime: SlotRuntime, slot: int, ref: str
) -> tuple[int, int, list[tuple[int, str]]]:
    """Lease ``slot`` over ``ref`` in epoch 1, run a command, reset it and wait for the next
    lease to be readied: the slot's sandbox process, its keeper and the keeper's children then."""
    assert (await runtime.lease(slot, 1, ref)).ok
    (ran,) = await runtime.execute([bash(slot, 1, "true")])
    assert ran.outcome is ToolOutcome.OK, ran.content
    assert (await runtime.reset(slot, 1)).ok
    await runtime._sandboxes.wait_warm(runtime.slot(slot))
    sandbox = runtime.listing().slots[slot].sandbox_pid
    assert sandbox is not None
    keeper = keeper_of(sandbox)
    return sandbox, keeper, kept_children(keeper)


def kept_children(keeper: int, deadline_s: float = 10.0) -> list[tuple[int, str]]:
    """The keeper's children and their names, once none is still being made (a readied process
    has the keeper's name until its namespaces are made)."""
    limit = time.monotonic() + deadline_s
    while True:
        kids = [(pid, comm(pid)) for pid in children(keeper)]
        if all(name != "slot-keeper" for _, name in kids) or time.monotonic() > limit:
            return kids
        time.sleep(0.01)


def wait_dead(pid: int, deadline_s: float = 10.0) -> None:
    """Return once ``pid`` has exited (a zombie not yet reaped, or gone)."""
    limit = time.monotonic() + deadline_s
    while time.monotonic() < limit:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.005)
    raise AssertionError(f"{pid} still runs {deadline_s} s after SIGKILL")


@attrs.define
class Seen:
    keeper: dict[str, str]
    first: str = ""
    second: str = ""
    during_first: list[tuple[int, str]] = attrs.Factory(list)
    idle: list[tuple[int, str]] = attrs.Factory(list)
    idle_ns: list[dict[str, str]] = attrs.Factory(list)
    during: list[tuple[int, str]] = attrs.Factory(list)
    during_ns: list[dict[str, str]] = attrs.Factory(list)


def net_of(listing: str) -> str:
    """The namespace ``ls -l /proc/self/ns/net`` showed."""
    return listing.split("-> ")[1].split(maxsplit=1)[0]


def test_an_idle_keeper_readies_the_next_lease_and_the_lease_runs_in_it(root: Path) -> None:
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")
    probe = "ls -l /proc/self/ns/net"
    held: list[int] = []  # the first lease's network namespace, open from the host

    async def main() -> Seen:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            assert (await runtime.lease(0, 1, ref)).ok
            (first,) = await runtime.execute([bash(0, 1, probe)])
            assert first.outcome is ToolOutcome.OK, first.content
            sandbox = runtime.listing().slots[0].sandbox_pid
            assert sandbox is not None
            keeper = keeper_of(sandbox)
            seen = Seen(keeper=namespaces(keeper), first=first.content)
            seen.during_first = kept_children(keeper)
            # Hold the first lease's network namespace open from the host until the end, so the
            # kernel cannot give its inode number to a later namespace: "not the last lease's"
            # then compares two namespaces that existed at once.
            held.append(os.open(f"/proc/{seen.during_first[0][0]}/ns/net", os.O_RDONLY))
            assert (await runtime.reset(0, 1)).ok
            await runtime._sandboxes.wait_warm(runtime.slot(0))
            seen.idle = kept_children(keeper)
            seen.idle_ns = [namespaces(pid) for pid, _ in seen.idle]
            assert (await runtime.lease(0, 2, ref)).ok
            (second,) = await runtime.execute([bash(0, 2, probe)])
            assert second.outcome is ToolOutcome.OK, second.content
            seen.second = second.content
            seen.during = kept_children(keeper)
            seen.during_ns = [namespaces(pid) for pid, _ in seen.during]
            assert keeper_of(sandbox) == keeper  # the same keeper all along
            assert (await runtime.reset(0, 2)).ok
            return seen
        finally:
            await runtime.aclose()

    try:
        seen = asyncio.run(main())
        assert [os.readlink(f"/proc/self/fd/{fd}") for fd in held] == [net_of(seen.first)]
    finally:
        for fd in held:
            os.close(fd)
    first_net, second_net = net_of(seen.first), net_of(seen.second)
    assert [name for _, name in seen.during_first] == ["slot-lease"]
    assert [name for _, name in seen.idle] == ["slot-readied"], seen.idle  # readied while idle
    (readied,) = seen.idle_ns
    for kind in ("pid", "mnt", "net", "ipc"):  # fresh namespaces of its own
        assert readied[kind] != seen.keeper[kind], kind
    assert readied["net"] != first_net  # not the last lease's
    assert seen.during == [(seen.idle[0][0], "slot-lease")]  # it became the lease, alone
    assert second_net == readied["net"]  # the lease runs in its network namespace
    assert second_net != first_net
    (during,) = seen.during_ns
    assert during["pid"] == readied["pid"]


def test_a_readied_lease_becomes_a_fork_and_sees_the_forked_workspace(root: Path) -> None:
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-fork")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=2, root=root, image_cache=root.parent / "cache")

    async def main() -> tuple[list[tuple[int, str]], list[tuple[int, str]], str, str]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            # slot 1's keeper, then a readied lease
            sandbox, keeper, idle = await readied_after_a_reset(runtime, 1, ref)
            assert (await runtime.lease(0, 1, ref)).ok
            made = "mkdir -p /workspace/src && echo prepared > /workspace/src/file"
            (prepared,) = await runtime.execute([bash(0, 1, made)])
            assert prepared.outcome is ToolOutcome.OK, prepared.content
            frozen = await runtime.snapshot(0, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            (answer,) = await runtime.fork(ref, frozen.snapshot, [(1, 2)])
            assert answer.ok, answer
            assert runtime.slot(1).workspace.root.is_mount()  # the snapshot's, an overlay
            (read,) = await runtime.execute([bash(1, 2, "cat /workspace/src/file")])
            during = kept_children(keeper)
            fork_keeper = keeper_of(sandbox)
            assert (await runtime.reset(1, 2)).ok
            assert (await runtime.reset(0, 1)).ok
            return idle, during, read.content, str(fork_keeper == keeper)
        finally:
            await runtime.aclose()

    idle, during, read, same = asyncio.run(main())
    assert [name for _, name in idle] == ["slot-readied"], idle
    assert same == "True"
    assert during == [(idle[0][0], "slot-lease")]  # the readied process is the fork's lease
    assert read == "prepared\n", read  # and sees the overlay mounted after it was readied


def test_no_lease_is_readied_while_a_lease_runs_and_a_dead_readied_one_is_replaced(
    root: Path,
) -> None:
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-guard")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")

    async def main() -> tuple[dict[str, JSON], list[tuple[int, str]], int, list[tuple[int, str]]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            assert (await runtime.lease(0, 1, ref)).ok
            (ran,) = await runtime.execute([bash(0, 1, "true")])
            assert ran.outcome is ToolOutcome.OK, ran.content
            keeper = runtime.slot(0).keeper
            assert keeper is not None
            during = await keeper.ask("ready", 10.0)  # asked while the lease runs
            sandbox = runtime.listing().slots[0].sandbox_pid
            assert sandbox is not None
            pid = keeper_of(sandbox)
            beside = kept_children(pid)
            assert (await runtime.reset(0, 1)).ok
            await runtime._sandboxes.wait_warm(runtime.slot(0))
            ((killed, name),) = kept_children(pid)
            assert name == "slot-readied"
            os.kill(killed, signal.SIGKILL)  # as a reset's proof of an empty slot kills it
            wait_dead(killed)  # as that proof waits for it: the next lease comes after
            assert (await runtime.lease(0, 2, ref)).ok
            (again,) = await runtime.execute([bash(0, 2, "echo still")])
            assert again.outcome is ToolOutcome.OK, again.content
            after = kept_children(pid)
            assert (await runtime.reset(0, 2)).ok
            return during, beside, killed, after
        finally:
            await runtime.aclose()

    during, beside, killed, after = asyncio.run(main())
    assert during == {"readied": False}  # nothing readied beside a running lease
    assert [name for _, name in beside] == ["slot-lease"]
    ((lease, name),) = after  # the next lease cloned afresh, the dead one reaped
    assert name == "slot-lease"
    assert lease != killed


def namespace_pids(pid: int) -> list[int]:
    """``pid``'s number in each pid namespace it is in, the host's first, its own last."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(word) for word in line.split()[1:]]
    raise AssertionError(f"no NSpid for {pid}")


# What a lease's isolation looks like from inside (the image's shell has no grep)
_PROBE = (
    "id -u; while read -r line; do case $line in Seccomp:*|CapEff:*|NoNewPrivs:*) "
    'echo "$line";; esac; done < /proc/self/status'
)


async def _leased_then_readied(runtime: SlotRuntime, ref: str) -> tuple[ToolResult, int, int]:
    """Slot 0 leased over ``ref`` (epoch 1), probed, reset, and its next lease readied: the
    probe's result, the keeper's pid and the readied process's (as the host sees them)."""
    assert (await runtime.lease(0, 1, ref)).ok
    (first,) = await runtime.execute([bash(0, 1, _PROBE)])
    assert first.outcome is ToolOutcome.OK, first.content
    assert (await runtime.reset(0, 1)).ok
    await runtime._sandboxes.wait_warm(runtime.slot(0))
    sandbox = runtime.listing().slots[0].sandbox_pid
    assert sandbox is not None
    keeper = keeper_of(sandbox)
    ((readied, name),) = kept_children(keeper)
    assert name == "slot-readied"
    return first, keeper, readied


def test_a_readied_process_that_dies_after_taking_its_lease_is_replaced_at_once(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The keeper hands the lease to its readied process, which dies before it greets (killed
    from the host, as the kernel's OOM killer would): the lease's channel ends, and the lease
    is started again at once in a fresh process, with a warning naming the slot. (It was a
    failed greeting that left the slot's first call waiting for ever.)"""
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-died")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")

    async def main() -> tuple[int, int, list[tuple[int, str]], str, str, float, int]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            first, keeper, readied = await _leased_then_readied(runtime, ref)
            inner = namespace_pids(readied)[-2]  # as its keeper sees it
            # Stopped, it takes the lease's request (the keeper's hand-over succeeds) but
            # cannot greet; killed once the keeper has answered, before the greeting.
            os.kill(readied, signal.SIGSTOP)
            assert (await runtime.lease(0, 2, ref)).ok  # the lease starts, warming
            slot = runtime.slot(0)
            limit = time.monotonic() + 10
            while slot.agent is None and time.monotonic() < limit:  # noqa: ASYNC110 - the warming task sets it
                await asyncio.sleep(0.002)
            assert slot.agent is not None  # the keeper answered: handed over
            assert slot.agent.pid == inner
            os.kill(readied, signal.SIGKILL)
            started = time.monotonic()
            (again,) = await asyncio.wait_for(runtime.execute([bash(0, 2, _PROBE)]), 30)
            took = time.monotonic() - started
            assert again.outcome is ToolOutcome.OK, again.content
            lease = kept_children(keeper)
            assert (await runtime.reset(0, 2)).ok
            assert runtime.listing().slots[0].readied_lost == slot.readied_lost  # reported
            return inner, readied, lease, again.content, first.content, took, slot.readied_lost
        finally:
            await runtime.aclose()

    with caplog.at_level(logging.WARNING, logger="trajcore.adapters.slot_server.sandboxes"):
        inner, readied, lease, seen, before, took, lost = asyncio.run(main())
    assert took < 3.0, took  # not the greeting's 10 s deadline, nor for ever
    ((fresh, name),) = lease
    assert name == "slot-lease"
    assert fresh != readied  # a freshly cloned process
    assert seen == before  # the same uid, filter, capabilities as the lease before it
    assert seen.splitlines()[0] != "0"
    assert "Seccomp:\t2" in seen
    assert lost == 1
    (warning,) = [r for r in caplog.records if "readied lease process" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith(f"slot 0: its readied lease process (pid {inner} ")


def test_a_readied_process_that_hangs_after_taking_its_lease_is_replaced_in_seconds(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The keeper hands the lease to its readied process, which hangs (stopped: it never
    greets, and its channel stays open): after ``READIED_GREETING_S``, not the start's 10 s
    limit, it is ended and the lease starts in a fresh process with the same isolation, with
    a warning naming the slot; the hung process is gone."""
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-hung")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")
    assert config.start_timeout_s > READIED_GREETING_S + 3  # the control: a longer limit

    async def main() -> tuple[int, list[tuple[int, str]], str, str, float, int]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            first, keeper, readied = await _leased_then_readied(runtime, ref)
            os.kill(readied, signal.SIGSTOP)  # takes the hand-over, never greets
            started = time.monotonic()
            assert (await runtime.lease(0, 2, ref)).ok
            (again,) = await asyncio.wait_for(runtime.execute([bash(0, 2, _PROBE)]), 30)
            took = time.monotonic() - started
            assert again.outcome is ToolOutcome.OK, again.content
            lease = kept_children(keeper)
            assert (await runtime.reset(0, 2)).ok
            return readied, lease, again.content, first.content, took, runtime.slot(0).readied_lost
        finally:
            await runtime.aclose()

    with caplog.at_level(logging.WARNING, logger="trajcore.adapters.slot_server.sandboxes"):
        readied, lease, seen, before, took, lost = asyncio.run(main())
    assert READIED_GREETING_S <= took < READIED_GREETING_S + 3.0, took
    ((fresh, name),) = lease  # the hung one is gone: the keeper holds the fresh lease alone
    assert name == "slot-lease"
    assert fresh != readied
    assert seen == before  # the same uid, filter, capabilities as the lease before it
    assert "Seccomp:\t2" in seen
    assert lost == 1
    (warning,) = [r for r in caplog.records if "readied lease process" in r.getMessage()]
    assert "did not greet within" in warning.getMessage()


def test_an_idle_slot_holds_its_bubblewrap_its_keeper_and_the_readied_lease_alone(
    root: Path,
) -> None:
    """The keeper is the sandbox's first process (pid 1 of its pid namespace, no reaper of
    bubblewrap's between them): an idle slot over an image is three processes, and a lease
    replaces the readied one."""
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-chain")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")

    async def main() -> tuple[int, list[int], int, list[tuple[int, str]], list[tuple[int, str]]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            sandbox, keeper, idle = await readied_after_a_reset(runtime, 0, ref)
            assert (await runtime.lease(0, 2, ref)).ok
            (again,) = await runtime.execute([bash(0, 2, "echo $$")])
            assert again.outcome is ToolOutcome.OK, again.content
            during = kept_children(keeper)
            assert (await runtime.reset(0, 2)).ok
            return keeper, children(sandbox), namespace_pids(keeper)[-1], idle, during
        finally:
            await runtime.aclose()

    keeper, below_sandbox, keeper_number, idle, during = asyncio.run(main())
    assert below_sandbox == [keeper]  # bubblewrap's own child is the keeper
    assert keeper_number == 1  # the first process of the sandbox's pid namespace
    assert [name for _, name in idle] == ["slot-readied"], idle
    assert during == [(idle[0][0], "slot-lease")]


def mount_table(pid: int) -> list[list[str]]:
    """``pid``'s mount namespace as ``/proc/PID/mountinfo`` lists it, each line's fields."""
    return [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]


def test_a_lease_over_an_image_writes_a_volatile_layer(root: Path) -> None:
    """The lease's overlay never syncs its writable layer, which its reset throws away: no
    disk flush when the lease ends (its mount options, read from the host)."""
    layout = root.parent / "layout"
    write_shell_image(layout, salt="readied-volatile")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=1, root=root, image_cache=root.parent / "cache")

    async def main() -> list[list[str]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        roots: list[list[str]] = []
        try:
            for epoch in (1, 2):  # the first lease, and one after a reset
                assert (await runtime.lease(0, epoch, ref)).ok
                (ran,) = await runtime.execute([bash(0, epoch, "echo kept > /written")])
                assert ran.outcome is ToolOutcome.OK, ran.content
                sandbox = runtime.listing().slots[0].sandbox_pid
                assert sandbox is not None
                ((lease, _),) = kept_children(keeper_of(sandbox))
                roots += [fields for fields in mount_table(lease) if fields[4] == "/"]
                assert (await runtime.reset(0, epoch)).ok
            return roots
        finally:
            await runtime.aclose()

    roots = asyncio.run(main())
    assert len(roots) == 2, roots
    for fields in roots:
        dash = fields.index("-")
        assert fields[dash + 1] == "overlay", fields
        options = set(fields[dash + 3].split(","))
        assert options & {"volatile", "fsync=volatile"}, fields  # (6.x kernels show the second)
