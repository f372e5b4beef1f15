"""The persistent shell (``stateful``, ``tmux``) says truthfully what became of a call the shell
could not report in the usual way: a shell left with too few open files (``ulimit -n 4``).

The agent runs as a plain process on a socket (``slot-helper serve``, as in
tests/unit/test_slot_helper.py), with the host's tmux and bash. Each call is given a timeout it
must not reach: a call that waits it out instead of telling that the command ended is the fault
these tests catch (``timed_out``), not a measured time.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_slot_helper import Agent, agent_argv
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.tool_calls import agent_result, lease_root
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolOutcome

LONG = "20.0"  # no call here should come near it


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Agent]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    running = Agent(agent_argv(tmp_path), tmp_path)
    try:
        yield running
        assert running.close() == 0
    finally:  # a serve agent has no pid namespace: the tmux server it started outlives it
        socket_path = tmp_path / "state" / "tmux.sock"
        tmux = shutil.which("tmux")
        if tmux is not None and socket_path.exists():
            subprocess.run(
                [tmux, "-S", str(socket_path), "kill-server"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip


def run(agent: Agent, command: str) -> dict[str, JSON]:
    return agent.ask("stateful", LONG, "4096", command)


@pytest.mark.parametrize("files", [3, 4])
def test_a_command_that_leaves_its_shell_too_few_files_is_reported_at_once(
    shell: Agent, files: int
) -> None:
    """``ulimit -n 3`` leaves the shell unable to create its status file, ``ulimit -n 4`` to
    write into it: either way the command ended, and the reply has its output, no exit code,
    and says why, without waiting out the timeout or claiming the shell ignored Ctrl-C. The
    shell is of no use for another call: the next one runs in a fresh shell."""
    assert run(shell, "cd /tmp && V=kept")["exit"] == 0
    starved = run(shell, f"ulimit -n {files}; echo ran")
    assert starved["timed_out"] is False, starved
    assert (starved["exit"], starved["signal"], starved["stdout"]) == (None, None, "ran\n")
    stderr = str(starved["stderr"])
    assert "could not report the command's exit status" in stderr, stderr
    assert f"open-files limit (ulimit -n) is {files}" in stderr, stderr
    assert "the next call starts a fresh shell" in stderr, stderr
    after = run(shell, 'echo "v$V" $(ulimit -n)')
    assert (after["exit"], after["stderr"]) == (0, ""), after  # said once, in the reply above
    assert str(after["stdout"]).split()[0] == "v", after  # a fresh shell: V is gone


def test_a_shell_left_with_too_few_files_is_replaced_before_the_next_command(
    shell: Agent,
) -> None:
    """``ulimit -n 5``: the call that sets it reports its status, but the next command could
    not run there (its output cannot be sent to files): it runs in a fresh shell, and its reply
    says why the shell was replaced."""
    assert run(shell, "V=kept")["exit"] == 0
    lowered = run(shell, "ulimit -n 5; echo ran")
    assert (lowered["exit"], lowered["stdout"]) == (0, "ran\n"), lowered
    after = run(shell, 'echo "v$V"')
    assert (after["exit"], after["stdout"], after["timed_out"]) == (0, "v\n", False), after
    stderr = str(after["stderr"])
    assert "open-files limit (ulimit -n) was 5" in stderr, stderr
    assert "it was replaced by a fresh shell" in stderr, stderr


def test_a_limit_typed_at_the_pane_gets_the_shell_replaced(shell: Agent) -> None:
    """The same limit typed through the tmux tool, in a bash started at the pane: the shell
    that would run the call is that inner bash, and it is replaced."""
    assert run(shell, "echo first")["exit"] == 0
    shell.ask("tmux", LONG, "1", "1", "0.3", "20", "bash")
    shell.ask("tmux", LONG, "1", "1", "0.3", "20", "ulimit -n 4")
    after = run(shell, "echo next")
    assert (after["exit"], after["stdout"], after["timed_out"]) == (0, "next\n", False), after
    assert "open-files limit (ulimit -n) was 4" in str(after["stderr"]), after


def test_a_starved_shell_s_command_still_running_is_waited_for(shell: Agent) -> None:
    """With too few files to write its status, a command that still runs (a program in the
    foreground, a loop of builtins in the shell itself) is not taken for one that ended."""
    waited = run(
        shell, "ulimit -n 6; sleep 1; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; echo $i"
    )
    assert (waited["exit"], waited["stdout"], waited["timed_out"]) == (0, "30000\n", False), waited


def test_a_starved_shell_the_command_runs_in_raw_mode_is_not_taken_for_the_call_s_shell(
    shell: Agent,
) -> None:
    """A command whose foreground program is an sh of its own, which sets the terminal raw and
    lowers its own open-files limit: the call's shell is not starved, and waits for it, so the
    call ends with its exit code and its shell (and variables) kept."""
    assert run(shell, "V=kept")["exit"] == 0
    inner = "sh -c 'stty raw </dev/tty; ulimit -n 5; sleep 1'; stty sane </dev/tty; echo done"
    ran = run(shell, inner)
    assert (ran["exit"], ran["stdout"], ran["timed_out"]) == (0, "done\n", False), ran
    after = run(shell, 'echo "v$V"')
    assert (after["exit"], after["stdout"], after["stderr"]) == (0, "vkept\n", ""), after


def test_an_agent_without_tmux_answers_with_the_no_tmux_code(tmp_path: Path) -> None:
    """Where the lease's root has no tmux, both shell tools get an error reply whose ``code``
    is ``no_tmux``: what the server decides on, whatever the error's words. A command that
    fails for a reason of its own carries no code."""
    argv = agent_argv(tmp_path)
    agent = Agent([*argv[:-1], ""], tmp_path)  # no tmux path: as over an image without it
    try:
        assert agent.greeting["tmux"] is False
        stateful = agent.ask("stateful", LONG, "1024", "echo hi")
        keys = agent.ask("tmux", LONG, "1", "1", "0.3", "20", "echo hi")
        for reply in (stateful, keys):
            assert (reply["exit"], reply["code"]) == (None, "no_tmux"), reply
        missing = agent.ask("exec", LONG, "1024", "/no/such/program")
        assert "error" in missing, missing
        assert "code" not in missing, missing
    finally:
        assert agent.close() == 0


def _call(tool: str) -> ExecuteCall:
    return ExecuteCall(slot=0, epoch=1, call_id="c1", tool=tool, timeout_s=5.0)


@pytest.mark.parametrize("tool", ["bash_stateful", "tmux"])
def test_the_no_tmux_code_is_an_infra_error_naming_the_root_the_call_ran_over(tool: str) -> None:
    """The result names the root it was given (taken when the call was sent), not what the
    slot holds when the reply is read; the same words without the code are the command's."""
    reply: dict[str, JSON] = {"exit": None, "error": "tmux is not installed", "code": "no_tmux"}
    result = agent_result(_call(tool), reply, 5.0, sandboxed=True, root="image oci:/x")
    assert result.outcome is ToolOutcome.INFRA_ERROR, result
    assert result.error == f"image oci:/x has no tmux: {tool} cannot run in this sandbox"
    words = agent_result(
        _call(tool), {"exit": None, "error": "tmux is not installed"}, 5.0, sandboxed=True,
        root="image oci:/x",
    )  # fmt: skip
    assert words.outcome is ToolOutcome.TOOL_ERROR, words


def test_a_lease_over_the_host_is_named_as_such(tmp_path: Path) -> None:
    slot = Slot(index=0, workspace=Workspace(tmp_path), state_dir=tmp_path, cgroup=None)
    assert lease_root(slot) == "the slot server's host"


@pytest.mark.parametrize(
    ("program", "command"), [("true", "exec true"), ("sleep", "exec sleep 30")]
)
def test_a_command_that_replaces_its_shell_with_a_program_says_so(
    shell: Agent, program: str, command: str
) -> None:
    """``exec PROGRAM``: the shell's process becomes the program, which writes no status. The
    reply says the shell was replaced by it (not that it was killed, nor a timeout), and the
    next call runs in a fresh shell."""
    assert run(shell, "V=kept")["exit"] == 0
    replaced = run(shell, command)
    assert (replaced["exit"], replaced["timed_out"]) == (None, False), replaced
    stderr = str(replaced["stderr"])
    assert f"replaced the shell with a program (exec {program})" in stderr, stderr
    assert "the next call starts a fresh shell" in stderr, stderr
    after = run(shell, 'echo "v$V"')
    assert (after["exit"], after["stdout"]) == (0, "v\n"), after


def test_keys_that_end_the_pane_s_shell_are_answered_with_what_became_of_it(shell: Agent) -> None:
    """``exit`` typed through the tmux tool ends the session, so no pane is left to capture:
    the reply says the shell exited and that the next call starts a fresh one, rather than
    tmux's "no current target"; the next call runs in a fresh shell, and says so too."""
    assert run(shell, "V=kept")["exit"] == 0
    ended = shell.ask("tmux", LONG, "1", "1", "0.5", "20", "exit")
    assert (ended["exit"], ended["timed_out"]) == (0, False), ended
    stderr = str(ended["stderr"])
    assert "no current target" not in stderr, stderr
    assert "the session's shell has exited" in stderr, stderr
    assert "the next bash_stateful or tmux call starts a fresh shell" in stderr, stderr
    after = run(shell, 'echo "v$V"')
    assert (after["exit"], after["stdout"]) == (0, "v\n"), after
    assert str(after["stderr"]).startswith("[the shell had ended since the last call"), after


@pytest.fixture
def sh_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    """An agent whose PATH holds no bash (as a root of busybox or dash only): its persistent
    shell is ``/bin/sh``, which has no line editor."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    argv = agent_argv(tmp_path)
    bare = tmp_path / "no-bash"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    running = Agent(argv, tmp_path)
    try:
        yield running
        assert running.close() == 0
    finally:
        socket_path = tmp_path / "state" / "tmux.sock"
        if socket_path.exists():
            subprocess.run(
                [argv[-1], "-S", str(socket_path), "kill-server"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip


@pytest.mark.parametrize("files", [3, 4])
def test_an_sh_left_with_too_few_files_is_reported_at_once(sh_shell: Agent, files: int) -> None:
    """The same in a root without bash: ``/bin/sh`` has no line editor to tell that it is back
    at its prompt, but it is seen blocked reading its terminal as the terminal's foreground.
    ``ulimit -n 3`` leaves it unable to create even the command's output files: the reply says
    why there is no exit status, at once, and the next call runs in a fresh shell."""
    assert run(sh_shell, "V=kept")["exit"] == 0
    starved = run(sh_shell, f"ulimit -n {files}; echo ran")
    assert (starved["timed_out"], starved["exit"], starved["signal"]) == (False, None, None)
    stderr = str(starved["stderr"])
    assert f"open-files limit (ulimit -n) is {files}" in stderr, starved
    after = run(sh_shell, 'echo "v$V"')
    assert (after["exit"], after["stdout"]) == (0, "v\n"), after


def test_an_sh_s_starved_command_still_running_is_waited_for(sh_shell: Agent) -> None:
    """A starved sh that still runs its command (a program in the foreground, then a loop of
    builtins in the shell itself) is not taken for one back at its prompt: the reply comes
    once the command has ended, with all its output (dash cannot write the status at 6)."""
    waited = run(
        sh_shell, "ulimit -n 6; sleep 1; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; echo $i"
    )
    assert (waited["stdout"], waited["timed_out"]) == ("30000\n", False), waited
