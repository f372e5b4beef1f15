"""``SlotTools.check``/``run`` and the file helpers on the local pool: real slot servers, real
bubblewrap; a killed slot server makes them raise, never answer False."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest

from tests.integration.test_local_pool import config, running_now, wait_no_leftovers
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import (
    InfrastructureError,
    InvalidInput,
    SlotBudgetSpent,
    SlotFileError,
    SlotInfraError,
)
from trajcore.domain.json_values import JSONObject
from trajcore.domain.slot_protocol import SLOT_TOOLS
from trajcore.domain.tools import ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def slot_tools(pool: LocalSandboxPool, *, timeout_s: float) -> AsyncIterator[SlotTools]:
    async with (
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=30.0) as lease,
    ):
        router = ToolRouter(
            lease=lease,
            dispatcher=dispatcher,
            tool_server=None,
            offered=frozenset(SLOT_TOOLS),
            tool_timeout_s=timeout_s,
            trajectory_id="t",
        )
        yield SlotTools(router)


async def test_check_run_and_files_on_the_local_pool() -> None:
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=2)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=1.0) as tools:
            assert await tools.check("true") is True
            assert await tools.check("exit 4") is False
            report = await tools.run("echo out; echo err >&2; exit 2")
            assert (report.exit_code, report.stdout, report.stderr) == (2, "out\n", "err\n")
            assert report.sandboxed
            timed = await tools.run("sleep 10")
            assert timed.timed_out
            assert await tools.check("sleep 10") is False
            await tools.write_file("sub/f.txt", "text")
            assert await tools.check('test "$(cat sub/f.txt)" = text')
            assert await tools.read_file("sub/f.txt") == "text"
            with pytest.raises(SlotFileError):
                await tools.read_file("missing.txt")
            with pytest.raises(InvalidInput, match=r"contains '\.\.'"):  # the hook's own
                await tools.read_file("../outside")

            # The slot server dies: the verification has no answer, so it raises.
            os.kill(pool.server_pid(tools.lease.slot.container), signal.SIGKILL)
            with pytest.raises(SlotInfraError, match="infra_error"):
                await tools.check("true")
            with pytest.raises(SlotInfraError):  # the lease is lost with its container
                await tools.run("true")
    await wait_no_leftovers(groups, run_dir, before)


async def test_a_check_after_the_disk_budget_ended_the_lease_names_the_budget() -> None:
    """A lease past its disk budget is ended and every later call of it fails; the score
    hook's check raises ``SlotBudgetSpent`` (a ``SlotInfraError``), naming the budget. It said
    only "tool_error without an exec report" before, so the member's failure hid why."""
    before = running_now()
    base = config(containers=1, slots=1)
    isolation = attrs.evolve(base.server.isolation, disk_bytes=4 << 20)
    budgeted = attrs.evolve(base, server=attrs.evolve(base.server, isolation=isolation))
    async with LocalSandboxPool(budgeted) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=20.0) as tools:
            ended = await tools.bash("head -c 8388608 /dev/zero > fill; sleep 10")
            budget = r"disk budget of 4194304 bytes \(disk_bytes\) reached"
            assert re.match(budget, ended.error or ""), ended
            with pytest.raises(SlotBudgetSpent, match=f"ended for its disk budget: {budget}"):
                await tools.check("true")
    await wait_no_leftovers(groups, run_dir, before)


async def test_a_stateful_call_reaps_the_orphans_that_end_while_it_waits() -> None:
    """The persistent shell's command fills the lease's process limit with background sleepers
    (their parent exits, so they are the agent's: pid 1 of the lease), then needs two processes
    at once. The sleepers end after 3 s and the agent reaps them while it waits for the
    command, so the command's fork (which bash retries) gets through. The agent reaped only
    between calls before: the dead sleepers kept the limit used up until the call ended, and
    the command never forked."""
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=25.0) as tools:
            fill = "sh -c 'while sleep 3 & do :; done' 2>/dev/null"
            command = f'{fill}; echo "$(sleep 0.1; echo forked)"'
            answer = await tools.call("bash_stateful", {"command": command})
            assert answer.exec is not None, answer
            assert (answer.exec.timed_out, answer.exec.stdout) == (False, "forked\n"), answer
    await wait_no_leftovers(groups, run_dir, before)


async def test_a_plain_call_reaps_the_orphans_that_end_while_it_runs() -> None:
    """A first ``bash`` call fills the lease's process limit with background sleepers that end
    after 3 s (their parent exits, so they are the agent's: pid 1 of the lease); two process
    slots come free as that call ends. The next call takes one of them with a sleeper of its
    own and becomes a bash that tries ``sleep 0 &`` until the fork gets through (bash retries
    a refused fork after 1, 2, 4 and 8 s). The agent reaps the first call's sleepers while the
    second call runs, so it forks once they end. It reaped only between calls before: their
    zombies kept the limit used up until the call ended, and it never forked."""
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=15.0) as tools:
            filled = await tools.bash("sh -c 'while sleep 3 & do :; done' 2>/dev/null; echo full")
            assert filled.content == "full\n", filled
            retry = "until sleep 0 & do :; done; echo forked"
            started = time.monotonic()
            answer = await tools.bash(f"sleep 20 & exec bash -c '{retry}'")
            took = time.monotonic() - started
            assert answer.exec is not None, answer
            assert (answer.exec.timed_out, answer.exec.stdout) == (False, "forked\n"), answer
            assert took < 10.0, took
    await wait_no_leftovers(groups, run_dir, before)


async def test_a_file_the_model_left_unreadable_is_the_models_doing_not_the_slots() -> None:
    """A score hook reads the answer the model left: a FIFO, a socket, a directory, a symlink
    to a device or one that leads out of the workspace. The slot server answers each read and
    write with ``TOOL_ERROR`` naming the path and what is there (it refused them as
    ``REJECTED`` before, which only a malformed request is now), without blocking on the
    FIFO; the hook gets ``SlotFileError`` (the env scores it 0, as a missing file), never
    ``SlotInfraError``, which would fail the member as an infrastructure error and spare the
    model its 0."""
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=5.0) as tools:
            made = (
                "mkfifo fifo && ln -s /dev/null null && ln -s /etc/hostname out && ln -s fifo in"
                " && mkdir dir && ln -s ../.. up && ln -s loop loop && python3 -c "
                "'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && test -S sock"
            )
            assert await tools.check(made)
            found = {
                "fifo": "is a FIFO; only regular files are read or written",
                "in": "is a FIFO; only regular files are read or written",
                "sock": "is a socket; only regular files are read or written",
                "null": "leads out of the workspace through a symlink",
                "out": "leads out of the workspace through a symlink",
                "up/etc/hostname": "leads out of the workspace through a symlink",
                "loop": "resolves through too many symlinks",
                "~/fifo": "is a FIFO; only regular files are read or written",
            }
            for name, what in found.items():
                asked: list[tuple[str, str, JSONObject]] = [
                    ("read_file", "read", {"path": name}),
                    ("write_file", "write", {"path": name, "content": "42"}),
                ]
                for tool, verb, arguments in asked:
                    raw = await tools.call(tool, arguments)
                    assert raw.outcome is ToolOutcome.TOOL_ERROR, raw
                    assert raw.error == f"cannot {verb} {name!r}: it {what}", raw
            patterns = {name: re.escape(what) for name, what in found.items()}
            for name, pattern in [*patterns.items(), ("dir", "(?i)is a directory")]:
                with pytest.raises(SlotFileError, match=pattern) as info:
                    await tools.read_file(name)
                assert info.value.path == name
                with pytest.raises(SlotFileError, match=pattern):
                    await tools.write_file(name, "42")
            assert await tools.check("test -p fifo && test -S sock && test -L null && test -d dir")
    await wait_no_leftovers(groups, run_dir, before)


async def test_a_path_the_hook_got_wrong_is_the_envs_error_not_the_models_file() -> None:
    """A score hook's own path that names no file of the workspace: ``/etc/passwd``, ``..``
    (``~//../x`` too: ``~`` is the workspace). It is the env's mistake, so ``InvalidInput``
    naming ``path`` and why, raised before anything is sent (the trajectory becomes an
    ``env_error``). It was a ``SlotInfraError`` before (the member was dropped as the slot's
    failure). The model's own call with that path is the server's ``REJECTED``."""
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=5.0) as tools:
            for path, why in [
                ("~//../x", "'../x' contains '..'"),
                ("/etc/passwd", "'/etc/passwd' is absolute"),
                ("sub/../../fifo", "contains '..'"),
                ("~/../x", "contains '..'"),
                ("", "must be a non-empty path"),
            ]:
                with pytest.raises(InvalidInput, match=re.escape(why)) as info:
                    await tools.read_file(path)
                assert info.value.field == "path"
                assert not isinstance(info.value, SlotFileError | InfrastructureError)
                with pytest.raises(InvalidInput, match=re.escape(why)):
                    await tools.write_file(path, "42")
                raw = await tools.call("read_file", {"path": path})
                assert raw.outcome is ToolOutcome.REJECTED, raw
                assert (raw.error or "").endswith("@ $.path"), raw
            assert not await tools.check("ls -A | grep -q .")  # nothing was written
    await wait_no_leftovers(groups, run_dir, before)
