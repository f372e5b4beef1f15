"""The slot helper's agent answers the protocol of docs/sandbox.md ("The slot helper and its
protocol") byte for byte.

The agent runs here as a plain process on a socket (``slot-helper serve``), outside any
sandbox: what is checked is the request protocol, output capture and decoding (against
Python's own UTF-8 decoder and a model of the head-and-tail capture), limits and bad input. Its
life inside a sandbox (the keeper, namespaces, capabilities) is checked through real slot
servers in tests/integration/test_slot_server.py and tests/security; its ``bare`` role in
tests/unit/test_bare_agent.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajcore.adapters.slot_server.channel import encode_request
from trajcore.adapters.slot_server.native_helper import (
    NativeBuildError,
    build_slot_helper,
    cache_dir,
)
from trajcore.adapters.slot_server.slot_ids import unmapped, unreachable
from trajcore.domain.json_values import JSON

HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc, gcc, clang)")


@pytest.fixture(scope="module")
def helper() -> Path:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    return build_slot_helper()


class Agent:
    """One agent process serving requests on a socket (its stdin and stdout)."""

    def __init__(self, argv: list[str], workdir: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket = ours
        # a home of its own: a bare agent's shells must never write into the host user's
        self.home = workdir / "home"
        self.home.mkdir(exist_ok=True)
        self.process = subprocess.Popen(
            argv,
            stdin=theirs.fileno(),
            stdout=theirs.fileno(),
            stderr=subprocess.PIPE,
            cwd=workdir,
            env={**os.environ, "HOME": str(self.home)},
        )
        theirs.close()
        self.socket.settimeout(30)
        self.greeting = self.receive()

    def receive(self) -> dict[str, JSON]:
        size = int.from_bytes(self.exact(4), "big")
        reply = json.loads(self.exact(size))
        assert isinstance(reply, dict)
        return reply

    def exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.socket.recv(size - len(data))
            if not chunk:
                raise EOFError("the agent closed its channel")
            data += chunk
        return data

    def send_raw(self, payload: bytes) -> dict[str, JSON]:
        self.socket.sendall(len(payload).to_bytes(4, "big") + payload)
        return self.receive()

    def ask(self, *fields: str) -> dict[str, JSON]:
        return self.send_raw(encode_request(list(fields)))

    def close(self) -> int:
        self.socket.close()
        code = self.process.wait(10)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return code


def agent_argv(tmp_path: Path) -> list[str]:
    """The command line of the helper's agent (``serve``) in ``tmp_path``."""
    workspace = tmp_path / "workspace"
    state = tmp_path / "state"
    workspace.mkdir()
    tmux = shutil.which("tmux") or ""
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    return [str(build_slot_helper()), "serve", "0", str(state), str(workspace), tmux]


def captured(data: bytes, cap: int) -> tuple[str, int]:
    """What the protocol says a stream of ``data`` under ``cap`` comes back as: whole when it
    fits, else its first ``cap // 2`` and last ``cap - cap // 2`` bytes around a marker, each
    decoded as Python decodes UTF-8 with replacement; and how many bytes were dropped."""
    if len(data) <= cap:
        return data.decode("utf-8", "replace"), 0
    head, tail = data[: cap // 2], data[len(data) - (cap - cap // 2) :]
    dropped = len(data) - len(head) - len(tail)
    text = f"{head.decode('utf-8', 'replace')}\n[... {dropped} bytes dropped ...]\n"
    return text + tail.decode("utf-8", "replace"), dropped


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    running = Agent(agent_argv(tmp_path), tmp_path)
    try:
        yield running
        assert running.close() == 0
    finally:
        # a bare agent has no pid namespace: the tmux server it started outlives it
        socket_path = tmp_path / "state" / "tmux.sock"
        tmux = shutil.which("tmux")
        if tmux is not None and socket_path.exists():
            subprocess.run(
                [tmux, "-S", str(socket_path), "kill-server"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip


def test_a_request_over_the_cap_ends_the_agent_unread(tmp_path: Path) -> None:
    running = Agent(agent_argv(tmp_path), tmp_path)
    running.socket.sendall(((16 << 20) + 1).to_bytes(4, "big") + b"x" * 64)
    with pytest.raises((EOFError, ConnectionResetError)):  # reset: it left bytes unread
        running.receive()
    assert running.close() == 1
    # the control: a request at the cap is read and answered
    (tmp_path / "control").mkdir()
    control = Agent(agent_argv(tmp_path / "control"), tmp_path)
    padding = "#" * ((16 << 20) - 100)  # too long for execve: answered with an error
    reply = control.ask("exec", "10.0", "64", "/bin/true", padding)
    assert reply["exit"] is None
    assert "cannot start /bin/true" in str(reply["error"])
    assert control.close() == 0


def test_the_greeting_names_the_agent_and_tmux(agent: Agent) -> None:
    assert agent.greeting["ready"] is True
    assert agent.greeting["pid"] == agent.process.pid
    assert agent.greeting["tmux"] is (shutil.which("tmux") is not None)


def test_exec_reports_code_streams_and_duration(agent: Agent) -> None:
    reply = agent.ask("exec", "10.0", "1024", "/bin/sh", "-c", "printf out; printf err >&2; exit 3")
    assert (reply["exit"], reply["signal"], reply["stdout"], reply["stderr"]) == (
        3,
        None,
        "out",
        "err",
    )
    assert (reply["stdout_dropped"], reply["stderr_dropped"], reply["timed_out"]) == (0, 0, False)
    assert isinstance(reply["duration"], float)
    assert 0 < reply["duration"] < 10


def test_a_timeout_kills_the_whole_process_group(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    reply = agent.ask(
        "exec", "0.3", "1024", "/bin/sh", "-c", f"(sleep 1; touch {marker}) & sleep 5"
    )
    assert (reply["timed_out"], reply["signal"], reply["exit"]) == (True, 9, None)
    after = agent.ask("exec", "5.0", "1024", "/bin/sh", "-c", "sleep 1.2")
    assert after["exit"] == 0
    assert not marker.exists(), "a background child of the timed-out command survived"


def test_commands_get_default_signals_and_no_agent_descriptors(agent: Agent) -> None:
    # SIGPIPE back to its default: `yes | head` ends instead of spinning on EPIPE
    reply = agent.ask("exec", "10.0", "1024", "/bin/sh", "-c", "yes | head -c 4; echo")
    assert (reply["stdout"], reply["stderr"]) == ("y\ny\n\n", "")
    listing = agent.ask("exec", "10.0", "4096", "/bin/sh", "-c", "ls /proc/$$/fd")
    assert sorted(str(listing["stdout"]).split()) == ["0", "1", "2"]


def test_output_over_the_cap_keeps_head_and_tail(agent: Agent) -> None:
    script = "i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done"
    reply = agent.ask("exec", "10.0", "200", "/bin/sh", "-c", script)
    text = str(reply["stdout"])
    assert text.startswith("line0\nline1\n")
    assert text.endswith("line1998\nline1999\n")
    assert reply["stdout_dropped"] == sum(len(f"line{i}\n") for i in range(2000)) - 200
    assert f"[... {reply['stdout_dropped']} bytes dropped ...]" in text


# Bytes where UTF-8 validity turns: lead bytes of each length (with their narrowed second-byte
# ranges: E0, ED, F0, F4), the range ends of continuation bytes, and bytes never valid.
UTF8_EDGES = list(
    b"\x00\x0a\x1f\x22\x5c\x7f\x80\x8f\x90\x9f\xa0\xbf\xc0\xc1"
    b"\xc2\xdf\xe0\xe1\xec\xed\xee\xef\xf0\xf1\xf3\xf4\xf5\xff"
)
output_bytes = st.lists(
    st.sampled_from(UTF8_EDGES)
    | st.integers(min_value=0, max_value=255)
    | st.text(max_size=3).map(lambda text: text.encode("utf-8", "surrogatepass")),
    max_size=120,
).map(lambda parts: b"".join(p if isinstance(p, bytes) else bytes([p]) for p in parts))


@given(data=output_bytes, cap=st.integers(min_value=1, max_value=400))
@settings(max_examples=100, deadline=None)
def test_any_bytes_decode_as_python_decodes_them(
    data: bytes, cap: int, helper: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The agent's capture and UTF-8 replacement are the protocol's (``captured``), byte for
    byte, for every output."""
    folder = tmp_path_factory.mktemp("bytes")
    source = folder / "data"
    source.write_bytes(data)
    expected_text, expected_dropped = captured(data, cap)
    native = Agent([str(helper), "serve", "0", str(folder / "state"), str(folder), ""], folder)
    try:
        reply = native.ask("exec", "10.0", str(cap), "/bin/cat", str(source))
    finally:
        assert native.close() == 0
    assert reply["stdout"] == expected_text
    assert reply["stdout_dropped"] == expected_dropped
    if len(data) <= cap // 2:
        assert reply["stdout"] == data.decode("utf-8", "replace")


def test_every_edge_sequence_decodes_as_python_decodes_it(agent: Agent, tmp_path: Path) -> None:
    """Exhaustive over the edge bytes: every 3-byte sequence of them, and every 4-byte one
    that starts with a 4-byte lead, each followed by an ASCII byte, in one output."""
    leads = [0xF0, 0xF1, 0xF4, 0xF5]
    threes = [bytes([a, b, c]) + b"." for a in UTF8_EDGES for b in UTF8_EDGES for c in UTF8_EDGES]
    fours = [
        bytes([a, b, c, d]) + b"."
        for a in leads
        for b in UTF8_EDGES
        for c in UTF8_EDGES
        for d in UTF8_EDGES
    ]
    data = b"".join(threes + fours)
    source = tmp_path / "edges"
    source.write_bytes(data)
    reply = agent.ask("exec", "30.0", str(2 * len(data)), "/bin/cat", str(source))
    assert reply["stdout_dropped"] == 0
    assert reply["stdout"] == data.decode("utf-8", "replace")


def test_bad_requests_get_an_error_and_the_agent_goes_on(agent: Agent) -> None:
    truncated = agent.send_raw(b"\x00\x00\x00\x09exec")
    assert truncated == {
        "exit": None,
        "error": "agent failed: ValueError: a malformed request of 8 bytes",
    }
    unknown = agent.ask("launch", "rockets")
    assert unknown["error"] == 'unknown op "launch"'
    short = agent.ask("exec", "10.0", "1024")
    assert short["error"] == (
        "agent failed: ValueError: an exec request needs a timeout, a cap and a program"
    )
    not_a_number = agent.ask("exec", "soon", "1024", "/bin/true")
    assert not_a_number["error"] == (
        "agent failed: TypeError: timeout must be a finite number, got soon"
    )
    nul = agent.ask("exec", "10.0", "1024", "/bin/echo", "a\0b")
    assert nul["error"] == "agent failed: ValueError: argv holds a NUL byte"
    missing = agent.ask("exec", "10.0", "1024", "/no/such/program")
    assert str(missing["error"]).startswith("cannot start /no/such/program: ")
    assert agent.ask("exec", "10.0", "1024", "/bin/sh", "-c", "echo fine")["stdout"] == "fine\n"


def test_stateful_shell_keeps_state_and_tmux_answers(agent: Agent) -> None:
    if not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    first = agent.ask("stateful", "10.0", "1024", "cd /tmp && X=41")
    assert first["exit"] == 0
    second = agent.ask("stateful", "10.0", "1024", "echo $((X+1)) $(pwd); exit 4")
    assert (second["exit"], second["stdout"]) == (4, "42 /tmp\n")
    pane = agent.ask("tmux", "10.0", "1", "1", "0.3", "20", "echo from-the-pane")
    assert "from-the-pane" in str(pane["stdout"])
    slow = agent.ask("stateful", "0.5", "1024", "sleep 5")
    assert (slow["timed_out"], slow["exit"]) == (True, None)


def test_a_shell_s_history_stays_in_its_own_folder(agent: Agent, tmp_path: Path) -> None:
    """A persistent bash that exits writes its history under the slot's state folder (a reset
    discards it), never into ``$HOME``: the workspace in a sandbox (a file the env's check would
    see), the server's user's home for a bare agent."""
    if not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    assert agent.ask("stateful", "10.0", "1024", "echo history-marker")["exit"] == 0
    assert agent.ask("stateful", "10.0", "1024", "exit")["exit"] == 0
    assert agent.ask("stateful", "10.0", "1024", "echo $HISTFILE")["exit"] == 0
    written = [path for path in (tmp_path / "state").rglob("history") if path.is_file()]
    assert len(written) == 1, written
    assert "echo history-marker" in written[0].read_text()
    assert sorted(agent.home.iterdir()) == []


def test_a_shell_command_that_ignores_ctrl_c_is_killed_with_its_shell(
    agent: Agent, tmp_path: Path
) -> None:
    """Past its timeout a command gets Ctrl-C (signal 2: the shell keeps its state); one the
    shell is not back from soon after is killed with the shell (signal 9), and the next call
    starts a fresh shell."""
    if not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    marker = tmp_path / "late"
    assert agent.ask("stateful", "10.0", "1024", "V=1")["exit"] == 0
    stopped = agent.ask("stateful", "0.5", "1024", "sleep 30")
    assert (stopped["timed_out"], stopped["signal"], stopped["exit"]) == (True, 2, None)
    assert agent.ask("stateful", "10.0", "1024", 'echo "v$V"')["stdout"] == "v1\n"
    started = time.monotonic()
    stubborn = agent.ask("stateful", "0.5", "1024", f"trap '' INT; sleep 5; touch {marker}")
    assert (stubborn["timed_out"], stubborn["signal"], stubborn["exit"]) == (True, 9, None)
    assert time.monotonic() - started < 4.0  # the timeout, 2 s to settle, then the kill
    after = agent.ask("stateful", "10.0", "1024", 'echo "next$V"')
    assert (after["exit"], after["stdout"]) == (0, "next\n")
    time.sleep(max(0.0, started + 6.0 - time.monotonic()))
    assert not marker.exists(), "the command that ignored Ctrl-C went on"


def test_tmux_keys_keep_to_the_timeout(agent: Agent) -> None:
    if not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    started = time.monotonic()
    many = agent.ask("tmux", "0.5", "1", "0", "0", "20", *(["a"] * 3000))
    assert time.monotonic() - started < 1.5
    assert (many["timed_out"], many["exit"], many["signal"]) == (True, None, None)
    assert "aaa" in str(many["stdout"])  # the pane as it was, with the keys sent in time
    assert agent.ask("stateful", "10.0", "1024", "echo fine")["stdout"] == "fine\n"
    short = agent.ask("tmux", "10.0", "1", "0")
    assert short["error"] == (
        "agent failed: ValueError: a tmux request needs a timeout, literal, enter, wait and lines"
    )


@pytest.mark.parametrize("request_fields", [
    ("stateful", "0.5", "1024", "echo never"),
    ("tmux", "0.5", "1", "1", "0.1", "20", "echo never"),
], ids=["stateful", "tmux"])  # fmt: skip
def test_a_stopped_tmux_server_is_killed_and_the_next_call_starts_a_new_shell(
    agent: Agent, tmp_path: Path, request_fields: tuple[str, ...]
) -> None:
    tmux = shutil.which("tmux")
    if tmux is None or not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    assert agent.ask("stateful", "10.0", "1024", "echo first")["stdout"] == "first\n"
    shown = subprocess.run(
        [tmux, "-S", str(tmp_path / "state" / "tmux.sock"), "display", "-p", "#{pid}"],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    server = int(shown.stdout)
    os.kill(server, signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = agent.ask(*request_fields)
        assert time.monotonic() - started < 2.0
        assert (hung["timed_out"], hung["signal"], hung["exit"]) == (True, 9, None)
        again = agent.ask("stateful", "10.0", "1024", "echo again")
        assert (again["exit"], again["stdout"]) == (0, "again\n")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
    state = (Path("/proc") / str(server) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in {"Z", "X"}


@pytest.mark.parametrize(
    "swap",
    [
        'o=$(readlink /proc/$$/fd/1); rm "$o"; ln -s /dev/zero "$o"',
        'o=$(readlink /proc/$$/fd/1); rm "$o"; mkfifo "$o"',
    ],
    ids=["symlink-to-dev-zero", "fifo"],
)
def test_a_command_that_swaps_its_output_file_cannot_stall_the_agent(
    agent: Agent, swap: str
) -> None:
    """The persistent shell's output files live where commands can reach them: one swapped for
    an endless device or a FIFO is not read (nothing blocks, nothing spins), and the shell
    goes on."""
    if not agent.greeting["tmux"]:
        pytest.skip("tmux is not installed")
    swapped = agent.ask("stateful", "10.0", "1024", swap)
    assert (swapped["exit"], swapped["stdout"], swapped["timed_out"]) == (0, "", False)
    assert isinstance(swapped["duration"], float)
    assert swapped["duration"] < 5
    after = agent.ask("stateful", "10.0", "1024", "echo still-here")
    assert after["stdout"] == "still-here\n"


def test_numbers_must_be_finite_and_fields_exact(agent: Agent) -> None:
    for bad in ("inf", "nan", "-inf", "1e999"):
        reply = agent.ask("exec", bad, "1024", "/bin/true")
        assert "timeout must be a finite number" in str(reply["error"]), (bad, reply)
    assert agent.ask("exec\0x", "10.0", "1024", "/bin/true")["error"] == 'unknown op "exec\\u0000x"'
    huge = agent.ask("exec", "10.0", "1e30", "/bin/sh", "-c", "echo capped")
    assert huge["stdout"] == "capped\n"


@needs_compiler
def test_the_build_is_cached_and_reused(tmp_path: Path) -> None:
    first = build_slot_helper(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = build_slot_helper(tmp_path)
    assert again == first
    assert again.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [first.name]


def test_a_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(NativeBuildError, match="names no executable compiler"):
        build_slot_helper(tmp_path)


def test_a_failing_compiler_is_reported_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(NativeBuildError, match=r"failed to build the slot helper.*is broken"):
        build_slot_helper(tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]


def test_a_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(NativeBuildError, match=r"writable by others \(mode 777\)"):
        build_slot_helper(shared)


@needs_compiler
def test_a_cached_binary_others_can_write_is_refused(tmp_path: Path) -> None:
    built = build_slot_helper(tmp_path)
    built.chmod(0o777)
    with pytest.raises(NativeBuildError, match="writable by others"):
        build_slot_helper(tmp_path)


def test_without_a_home_the_cache_must_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAJCORE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "relative/home")
    with pytest.raises(NativeBuildError, match="set TRAJCORE_CACHE_DIR"):
        cache_dir()
    monkeypatch.setenv("TRAJCORE_CACHE_DIR", "/srv/cache")
    assert cache_dir() == Path("/srv/cache")


def test_slot_uids_outside_a_remapped_range_are_named() -> None:
    whole = "         0          0 4294967295\n"
    assert unmapped(1_900_000_000, 64, whole) is None
    container = "         0     100000      65536\n"
    assert unmapped(1000, 64, container) is None
    problem = unmapped(1_900_000_000, 4, container)
    assert problem == "uids 1900000000..1900000003 are not mapped here (mapped: 0..65535)"
    assert unmapped(65500, 64, container) is not None  # runs past the end of the range


def test_a_directory_others_cannot_search_is_named() -> None:
    base = Path(tempfile.mkdtemp(prefix="trajcore-reach-"))  # in /tmp, which all may search
    try:
        base.chmod(0o711)
        private = base / "private"
        (private / "inner").mkdir(parents=True)
        (private / "inner").chmod(0o755)
        private.chmod(0o700)
        assert unreachable(private / "inner") == f"{private} (mode 700)"
        private.chmod(0o711)
        assert unreachable(private / "inner") is None
    finally:
        shutil.rmtree(base)


def test_what_a_command_forks_first_runs_as_nice_as_the_command(agent: Agent) -> None:
    """The command's nice value is set before it execs: a child it forks at once (here ``cut``,
    forked by the shell first thing) has it too, never the agent's."""
    own = os.getpriority(os.PRIO_PROCESS, agent.process.pid)
    nicer = min(own + 10, 19)
    seen: set[object] = set()
    for _ in range(60):
        reply = agent.ask(
            "exec", "10.0", "1024", "/bin/sh", "-c", "cut -d' ' -f19 /proc/self/stat; true"
        )
        seen.add(reply["stdout"])
    assert seen == {f"{nicer}\n"}
