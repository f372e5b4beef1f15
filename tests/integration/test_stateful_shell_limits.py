"""The persistent shell (``bash_stateful``, ``tmux``) under a policy that misbehaves in its own
lease, on the local pool with real bubblewrap and tmux: every such call ends as its own
``TIMEOUT`` or ``TOOL_ERROR`` within its time, never as an infrastructure failure, and the lease
goes on (a shell that had to be killed is started afresh by the next call)."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import AsyncIterator

import pytest

from tests.integration.test_local_pool import config
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.json_values import JSON
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is missing"),
]
_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pool() -> AsyncIterator[LocalSandboxPool]:
    async with LocalSandboxPool(config(containers=1, slots=1)) as running:
        yield running


async def one(
    pool: LocalSandboxPool, lease: Lease, tool: str, timeout_s: float = 10.0, **arguments: JSON
) -> tuple[ToolResult, float]:
    """The result of one call, and how long it took."""
    call = ToolCall(id=f"s{next(_ids)}", name=tool, arguments=arguments)
    started = time.monotonic()
    (result,) = await pool.execute(
        lease.slot.container, [SlotCall(lease=lease, call=call, timeout_s=timeout_s)]
    )
    return result, time.monotonic() - started


async def test_a_command_that_takes_a_while_to_stop_on_ctrl_c_keeps_the_shell(
    pool: LocalSandboxPool,
) -> None:
    """A command that stops on Ctrl-C but cleans up first (pytest, pip) ends as ``TIMEOUT`` and
    the shell keeps its directory and variables."""
    slow_stop = (
        "python3 -c 'import time\ntry: time.sleep(30)\nexcept KeyboardInterrupt: time.sleep(0.8)'"
    )
    async with pool.lease("t") as lease:
        kept, _ = await one(pool, lease, "bash_stateful", command="cd /tmp && export V=kept")
        assert kept.outcome is ToolOutcome.OK
        stopped, took = await one(pool, lease, "bash_stateful", 1.0, command=slow_stop)
        assert stopped.outcome is ToolOutcome.TIMEOUT, stopped
        assert "the shell keeps its state" in (stopped.error or ""), stopped.error
        assert took < 5.0
        after, _ = await one(pool, lease, "bash_stateful", command="echo $PWD $V")
        assert (after.content or "").strip() == "/tmp kept", after


async def test_a_command_that_ignores_ctrl_c_is_killed_with_its_shell(
    pool: LocalSandboxPool,
) -> None:
    async with pool.lease("t") as lease:
        kept, _ = await one(pool, lease, "bash_stateful", command="cd /tmp && V=1")
        assert kept.outcome is ToolOutcome.OK
        stopped, _ = await one(pool, lease, "bash_stateful", 1.0, command="sleep 30")
        assert stopped.outcome is ToolOutcome.TIMEOUT
        assert "got Ctrl-C and stopped; the shell keeps its state" in (stopped.error or "")
        state, _ = await one(pool, lease, "bash_stateful", command="echo $V $(pwd)")
        assert state.content == "1 /tmp\n"  # Ctrl-C was enough: the shell is the same one

        stubborn, took = await one(
            pool, lease, "bash_stateful", 1.0,
            command="trap '' INT; sleep 4; echo late > /workspace/late",
        )  # fmt: skip
        assert stubborn.outcome is ToolOutcome.TIMEOUT, stubborn
        assert "the shell was killed with everything it ran" in (stubborn.error or "")
        assert took < 4.0
        after, _ = await one(pool, lease, "bash_stateful", 2.0, command="echo next $V $(pwd)")
        assert (after.outcome, after.content) == (ToolOutcome.OK, "next /workspace\n"), after
        late, _ = await one(pool, lease, "bash", command="sleep 4; ls /workspace")
        assert late.content == ""  # the killed command never went on


async def test_the_tmux_tool_keeps_to_its_timeout(pool: LocalSandboxPool) -> None:
    async with pool.lease("t") as lease:
        many, took = await one(pool, lease, "tmux", 1.0, keys=["a"] * 3000, enter=False, wait_s=0)
        assert many.outcome is ToolOutcome.TIMEOUT, many
        assert "keys not sent by then were dropped" in (many.error or "")
        assert took < 3.0
        after, _ = await one(pool, lease, "bash", command="echo alive")
        assert after.content == "alive\n", after
        pane, _ = await one(pool, lease, "tmux", keys=[], enter=False, wait_s=0)
        assert pane.outcome is ToolOutcome.OK
        assert "aaaa" in pane.content  # the shell that got the keys is still there


async def test_a_stopped_tmux_server_times_out_and_the_next_call_gets_a_new_shell(
    pool: LocalSandboxPool,
) -> None:
    async with pool.lease("t") as lease:
        first, _ = await one(pool, lease, "bash_stateful", command="echo first")
        assert first.content == "first\n"
        stop = "kill -STOP $(tmux -S /tmp/.trajcore/tmux.sock display -p '#{pid}')"
        stopped, _ = await one(pool, lease, "bash", command=f"{stop} && echo stopped")
        assert stopped.content == "stopped\n", stopped
        hung, took = await one(pool, lease, "bash_stateful", 1.0, command="echo never")
        assert hung.outcome is ToolOutcome.TIMEOUT, hung
        assert "its tmux server did not answer" in (hung.error or "")
        assert took < 3.5
        after, _ = await one(pool, lease, "bash_stateful", command="echo again")
        assert (after.outcome, after.content) == (ToolOutcome.OK, "again\n"), after
        stop_again, _ = await one(pool, lease, "bash", command=f"{stop} && echo stopped")
        assert stop_again.content == "stopped\n", stop_again
        keys, took = await one(pool, lease, "tmux", 1.0, keys="echo x")
        assert keys.outcome is ToolOutcome.TIMEOUT, keys
        assert "its tmux server did not answer" in (keys.error or "")
        assert took < 3.5
        alive, _ = await one(pool, lease, "bash_stateful", command="echo alive")
        assert alive.content == "alive\n", alive


async def test_a_lost_exit_status_is_a_tool_error(pool: LocalSandboxPool) -> None:
    async with pool.lease("t") as lease:
        # the command fills /tmp, where the shell writes its status: the status file stays empty
        filled, _ = await one(
            pool, lease, "bash_stateful", command="dd if=/dev/zero of=/tmp/fill bs=1M; false"
        )
        assert filled.outcome is ToolOutcome.TOOL_ERROR, filled
        assert "exit status was lost" in (filled.error or "")
        freed, _ = await one(pool, lease, "bash", command="rm /tmp/fill")
        assert freed.outcome is ToolOutcome.OK
        after, _ = await one(pool, lease, "bash_stateful", command="false")
        assert (after.outcome, after.exec and after.exec.exit_code) == (ToolOutcome.OK, 1)


async def test_a_path_without_the_system_s_programs_keeps_the_exit_status(
    pool: LocalSandboxPool,
) -> None:
    """A command that sets a PATH without ``/bin`` (or defines ``mv``) is answered with its
    exit status at once, as are the calls after it, in bash and in an sh started at the pane;
    the plumbing's programs are the system's, not what the commands left."""
    async with pool.lease("t") as lease:
        for start in ("", "exec sh"):
            if start:
                await one(pool, lease, "tmux", keys=start, wait_s=0.5)
            for command, code, out in [
                ("export PATH=/nowhere; echo set", 0, "set\n"),
                ("ls /", 127, ""),
                ("mv() { return 1; }; export PATH=/usr/bin:/bin; false", 1, ""),
                ("echo after", 0, "after\n"),
            ]:
                result, took = await one(pool, lease, "bash_stateful", 4.0, command=command)
                assert result.exec is not None, (start, command, result)
                assert (result.exec.exit_code, result.exec.stdout) == (code, out), result
                assert took < 3.0, (start, command, took)


async def test_the_pane_shows_the_commands_and_their_output_not_the_plumbing(
    pool: LocalSandboxPool,
) -> None:
    """``bash_stateful`` and ``tmux`` share one pane: a capture after ``bash_stateful`` calls
    shows each command after the prompt and its output under it, as at a terminal, and
    nothing of how the call runs it (the call typed its wrapper into the pane before: a
    ``trap ... /tmp/.trajcore/shell/N.ended ...`` line per call)."""
    async with pool.lease("t") as lease:
        said, _ = await one(pool, lease, "bash_stateful", command="echo hi")
        assert (said.outcome, said.content) == (ToolOutcome.OK, "hi\n"), said
        failed, _ = await one(
            pool, lease, "bash_stateful", command="cd /tmp && V=1\necho oops >&2; (exit 3)"
        )
        assert failed.exec is not None, failed
        assert (failed.exec.exit_code, failed.exec.stderr) == (3, "oops\n"), failed
        typed, _ = await one(pool, lease, "tmux", keys="echo $? $V $PWD", wait_s=0.5)
        pane = typed.content or ""
        assert "echo hi\nhi\n" in pane, pane
        assert "cd /tmp && V=1\n> echo oops >&2; (exit 3)\noops\n" in pane, pane  # PS2: "> "
        assert "\n3 1 /tmp\n" in pane, pane  # the shell's own $? and state, as typed there
        for plumbing in (".trajcore", "trap", "ended", "__run"):
            assert plumbing not in pane, pane


async def test_a_bash_started_in_place_of_the_shell_or_in_it_runs_the_next_calls(
    pool: LocalSandboxPool,
) -> None:
    """A bash the model starts at the pane (``exec bash``, or ``bash`` in the shell) runs the
    next ``bash_stateful`` calls at once, as the shell did (it has no alias ``__run`` of its
    own: the call typed into it timed out and the shell was killed); ``exit`` from the inner
    bash leaves the outer one at its prompt without the wait for a shell that ends. A Python
    REPL left open cannot run a call: it ends by its timeout, and the next call gets a new
    shell."""
    async with pool.lease("t") as lease:
        kept, _ = await one(pool, lease, "bash_stateful", command="cd /tmp && V=1")
        assert kept.outcome is ToolOutcome.OK, kept
        await one(pool, lease, "tmux", keys="exec bash", wait_s=0.5)
        replaced, took = await one(
            pool, lease, "bash_stateful", command="echo $((1+1)) $PWD; (exit 4)"
        )
        assert replaced.exec is not None, replaced
        assert (replaced.exec.exit_code, replaced.exec.stdout) == (4, "2 /tmp\n"), replaced
        assert took < 3.0
        await one(pool, lease, "tmux", keys="bash", wait_s=0.5)
        inner, took = await one(pool, lease, "bash_stateful", command="W=2; echo inner $W $PWD")
        assert (inner.outcome, inner.content) == (ToolOutcome.OK, "inner 2 /tmp\n"), inner
        assert took < 3.0
        left, took = await one(pool, lease, "bash_stateful", command="exit")
        assert (left.outcome, left.exec and left.exec.exit_code) == (ToolOutcome.OK, 0), left
        assert took < 1.5
        outer, _ = await one(pool, lease, "bash_stateful", command="echo ${W-none} $PWD")
        assert (outer.outcome, outer.content) == (ToolOutcome.OK, "none /tmp\n"), outer
        pane, _ = await one(pool, lease, "tmux", keys=[], enter=False, wait_s=0)
        assert "$ echo ${W-none} $PWD\nnone /tmp\n" in (pane.content or ""), pane
        assert "__run" not in (pane.content or ""), pane

        await one(pool, lease, "tmux", keys="python3", wait_s=0.5)
        in_repl, took = await one(pool, lease, "bash_stateful", command="echo $PWD")
        assert in_repl.exec is not None, in_repl
        assert (in_repl.outcome, in_repl.exec.stdout) == (ToolOutcome.OK, "/workspace\n"), in_repl
        assert "python3 was running in it" in in_repl.exec.stderr, in_repl
        assert took < 4.0


async def test_an_sh_started_in_place_of_the_shell_runs_the_next_calls(
    pool: LocalSandboxPool,
) -> None:
    """``exec sh`` at the pane: an interactive sh reads the plumbing as its ENV, so the next
    calls run in it with their exit codes, its state kept, and the pane shows its prompt, each
    command (continuation lines after PS2) and its output, and ``$?`` typed there is the last
    command's."""
    async with pool.lease("t") as lease:
        await one(pool, lease, "bash_stateful", command="cd /tmp")
        await one(pool, lease, "tmux", keys="exec sh", wait_s=0.5)
        first, took = await one(
            pool, lease, "bash_stateful", command="X=5; echo $((X+1)); (exit 5)"
        )
        assert first.exec is not None, first
        assert (first.exec.exit_code, first.exec.stdout) == (5, "6\n"), first
        assert took < 3.0
        second, _ = await one(
            pool, lease, "bash_stateful", command="echo $X $PWD\necho e >&2; false"
        )
        assert second.exec is not None, second
        assert (second.exec.exit_code, second.exec.stdout) == (1, "5 /tmp\n"), second
        typed, _ = await one(pool, lease, "tmux", keys="echo status $?", wait_s=0.5)
        pane = typed.content or ""
        assert "$ X=5; echo $((X+1)); (exit 5)\n6\n$ echo $X $PWD\n> echo e >&2; false\n" in pane
        assert "5 /tmp\ne\n$ echo status $?\nstatus 1\n" in pane, pane
        assert "__run" not in pane, pane


# What the model leaves at the pane with the ``tmux`` tool, and what the shell is then doing:
# the next ``bash_stateful`` call decides within about a second that the shell is not at its
# prompt, instead of typing into that program and waiting out its timeout.
_LEFT_AT_THE_PANE = {
    "heredoc": ("cat <<EOF", "kept"),
    "read": ("read x", "kept"),
    "repl": ("python3", "replaced"),
    "pager": ("less /workspace/long", "replaced"),
}


@pytest.mark.parametrize("left", sorted(_LEFT_AT_THE_PANE))
async def test_a_shell_not_at_its_prompt_runs_the_next_call_at_once(
    pool: LocalSandboxPool, left: str
) -> None:
    """Each call answers ``ok`` well within its 20 s timeout, and its result says what became
    of the shell: a shell that Ctrl-C brings back to its prompt keeps its directory and
    variables; one that stays in a program is replaced by a fresh shell."""
    keys, end = _LEFT_AT_THE_PANE[left]
    async with pool.lease("t") as lease:
        made, _ = await one(
            pool, lease, "bash_stateful", command="seq 500 > long; cd /tmp && V=kept"
        )
        assert made.outcome is ToolOutcome.OK, made
        typed, _ = await one(pool, lease, "tmux", keys=keys, wait_s=1)
        assert typed.outcome is ToolOutcome.OK, typed
        after, took = await one(pool, lease, "bash_stateful", 20.0, command="echo ok $V $PWD")
        assert after.outcome is ToolOutcome.OK, after
        assert after.exec is not None, after
        assert took < 5.0, (took, after)
        said = after.exec.stderr
        assert "the shell was not at its prompt" in said, after
        if end == "replaced":
            assert after.exec.stdout == "ok /workspace\n", after
            assert "it was replaced by a fresh shell" in said, after
            assert "working directory and variables were reset" in said, after
        else:
            assert after.exec.stdout == "ok kept /tmp\n", after
            assert "directory and variables kept" in said, after
        assert "[stderr]" in (after.content or ""), after
        again, took = await one(pool, lease, "bash_stateful", 20.0, command="echo again")
        assert (again.outcome, again.content) == (ToolOutcome.OK, "again\n"), again
        assert took < 2.0


async def test_a_shell_at_its_prompt_keeps_its_state_and_says_nothing_of_it(
    pool: LocalSandboxPool,
) -> None:
    """The control: calls and keys that leave the shell at its prompt (a command the tmux tool
    ran to its end, a bash started in the shell) are run in it, its state kept, and the result
    holds only the command's output."""
    async with pool.lease("t") as lease:
        first, _ = await one(pool, lease, "bash_stateful", command="cd /tmp && V=kept")
        assert (first.outcome, first.content) == (ToolOutcome.OK, ""), first
        await one(pool, lease, "tmux", keys="sleep 0.3; echo typed", wait_s=0)
        second, took = await one(pool, lease, "bash_stateful", 20.0, command="echo $V $PWD")
        assert (second.outcome, second.content) == (ToolOutcome.OK, "kept /tmp\n"), second
        assert second.exec is not None, second
        assert second.exec.stderr == "", second
        assert took < 3.0
        await one(pool, lease, "tmux", keys="bash", wait_s=0.5)
        inner, took = await one(pool, lease, "bash_stateful", 20.0, command="echo $PWD; W=1")
        assert (inner.outcome, inner.content) == (ToolOutcome.OK, "/tmp\n"), inner
        assert took < 3.0
        line, _ = await one(pool, lease, "bash_stateful", 20.0, command="cat <<EOF\n$W\nEOF")
        assert (line.outcome, line.content) == (ToolOutcome.OK, "1\n"), line


async def test_a_command_that_kills_its_shell_ends_its_call_at_once(
    pool: LocalSandboxPool,
) -> None:
    """``kill -9 $$`` leaves no exit status (no EXIT trap runs): the call ends as soon as the
    shell's process has, as a ``TOOL_ERROR`` that says the next call gets a fresh shell,
    instead of waiting out its timeout."""
    async with pool.lease("t") as lease:
        await one(pool, lease, "bash_stateful", command="cd /tmp && V=1")
        killed, took = await one(pool, lease, "bash_stateful", 20.0, command="kill -9 $$")
        assert killed.outcome is ToolOutcome.TOOL_ERROR, killed
        assert "the shell ended while it ran the command" in (killed.error or ""), killed
        assert took < 3.0
        after, took = await one(pool, lease, "bash_stateful", 20.0, command="echo ok ${V-} $PWD")
        assert (after.outcome, after.content) == (ToolOutcome.OK, "ok /workspace\n"), after
        assert took < 3.0


async def test_a_command_that_exits_the_shell_says_the_next_call_starts_afresh(
    pool: LocalSandboxPool,
) -> None:
    """``exit`` ends the persistent shell: its own reply says so (its directory and variables
    are gone), and the next call runs in a fresh shell without saying it again."""
    async with pool.lease("t") as lease:
        await one(pool, lease, "bash_stateful", command="cd /tmp && export V=1")
        ended, _ = await one(pool, lease, "bash_stateful", command="exit")
        assert ended.outcome is ToolOutcome.OK, ended
        assert ended.exec is not None
        assert "[the command ended the shell: the next call starts a fresh shell" in (
            ended.exec.stderr
        ), ended
        after, _ = await one(pool, lease, "bash_stateful", command="echo ok ${V-} $PWD")
        assert (after.outcome, after.content) == (ToolOutcome.OK, "ok /workspace\n"), after
        assert after.exec is not None
        assert after.exec.stderr == "", after


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("tmux", {"keys": "exit", "wait_s": 0.5}),  # typed at the shell's prompt
        # the shell killed from another call (the bracket keeps this command's own line from
        # matching: the shell's is ``bash --rcfile .../rc``)
        ("bash", {"command": "pkill -KILL -f -- '-[-]rcfile' && sleep 0.5"}),
    ],
)
async def test_a_shell_that_ended_between_calls_is_replaced_saying_so(
    pool: LocalSandboxPool, tool: str, arguments: dict[str, JSON]
) -> None:
    """A shell ended by something other than its own command (``exit`` typed through the tmux
    tool, or killed from another call): the next call's reply starts with a line
    saying its directory and variables were reset."""
    async with pool.lease("t") as lease:
        kept, _ = await one(pool, lease, "bash_stateful", command="cd /tmp && export V=1")
        assert kept.outcome is ToolOutcome.OK
        await one(pool, lease, tool, 10.0, **arguments)
        after, _ = await one(pool, lease, "bash_stateful", command="echo ok ${V-} $PWD")
        assert after.outcome is ToolOutcome.OK, after
        assert after.exec is not None
        assert after.exec.stdout == "ok /workspace\n", after
        assert after.exec.stderr.startswith("[the shell had ended since the last call"), after


async def test_a_command_that_leaves_its_shell_too_few_files_is_no_timeout(
    pool: LocalSandboxPool,
) -> None:
    """``ulimit -n 4`` in a sandbox's persistent shell: the call returns the command's output as
    a ``TOOL_ERROR`` saying why there is no exit status (never a timeout whose shell ignored
    Ctrl-C), and the next call runs in a fresh shell."""
    async with pool.lease("t") as lease:
        starved, _ = await one(pool, lease, "bash_stateful", command="ulimit -n 4; echo ran")
        assert starved.outcome is ToolOutcome.TOOL_ERROR, starved
        assert starved.error == "the command ended without an exit status", starved
        assert starved.content.startswith("ran\n"), starved
        assert "open-files limit (ulimit -n) is 4" in starved.content, starved
        after, _ = await one(pool, lease, "bash_stateful", command="echo next")
        assert (after.outcome, after.content) == (ToolOutcome.OK, "next\n"), after
