"""The slot server as a real process: real bubblewrap, tmux, HTTP on loopback and a Unix socket.

Each test talks to the server through ``SlotServerClient`` (or raw aiohttp where the point is a
request the client would never send) and checks the bad inputs of the sandbox issue: every one
gets a clear per-call answer while the server and the other slots carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import attrs
import pytest

from tests.environment_roots import image_problem, write_shell_image
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.local_pool import LocalPoolConfig, start_local_pool
from trajcore.adapters.slot_server import runtime as runtime_module
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.seccomp import SeccompUnavailable
from trajcore.adapters.slot_uid_locks import reserve_free
from trajcore.domain.errors import SlotServerError, ToolArgumentError, UnknownSlot, WireError
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE, MAX_SLOT_UID, Bind, SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.kernel_masks import MASKED_PATHS, READ_ONLY_PATHS
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

T = TypeVar("T")
TOKEN = "integration-token"
HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
pytestmark = [
    pytest.mark.skipif(
        not Path("/usr/bin/bwrap").exists() and os.system("command -v bwrap >/dev/null") != 0,
        reason="bubblewrap is not installed",
    ),
    # a source checkout ships no slot helper: every server here builds it at start
    pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc, gcc, clang) for the helper"),
]


@attrs.frozen
class Server:
    process: subprocess.Popen[bytes]
    ready: dict[str, Any]
    root: Path
    uid_base: int = DEFAULT_SLOT_UID_BASE
    """Slot 0's uid, when the server runs as root and was given its base (``start_server``)."""

    def seen(self, path: Path) -> Path:
        """``path`` as the server sees it: through its own mount namespace (``/proc/PID/root``),
        where its mounts (a forked workspace's overlay) are; the host does not see them."""
        return Path(f"/proc/{self.process.pid}/root") / path.relative_to("/")

    def client(self, token: str | None = TOKEN) -> SlotServerClient:
        if self.ready["unix"]:
            return SlotServerClient.unix(self.ready["unix"], token)
        return SlotServerClient.tcp(self.ready["address"], token)


def start_server(
    root: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    uid_base: int | None = None,
) -> Server:
    """A slot server on ``root`` (``prefix``: a program that execs the server's command line;
    ``uid_base``: its slots' first uid, a range the caller holds: ``held_slot_uids``)."""
    token_file = root.parent / f"{root.name}.token"
    token_file.write_text(TOKEN)
    argv = [
        *prefix, sys.executable, "-m", "trajcore.entrypoints.slot_server",
        "--slots", "4", "--root", str(root), "--token-file", str(token_file),
        "--max-processes", "64", "--memory-bytes", str(256 << 20), "--output-cap-bytes", "4096",
        "--min-timeout-s", "0.2", "--file-cap-bytes", str(1 << 20), *extra,
    ]  # fmt: skip
    if "--unix" not in extra:
        argv += ["--listen", "127.0.0.1:0"]
    if uid_base is not None:
        argv += ["--slot-uid-base", str(uid_base), "--slot-uid-lock", "none"]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=None if env is None else env
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(5)
        assert process.stderr is not None
        pytest.fail(f"slot server did not start: {process.stderr.read().decode()}")
    ready = json.loads(line)
    if uid_base is None:
        return Server(process=process, ready=ready, root=root)
    return Server(process=process, ready=ready, root=root, uid_base=uid_base)


def stop_server(server: Server) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(20)
    for stream in (server.process.stdout, server.process.stderr):
        if stream is not None:
            stream.close()
    return code


@contextlib.contextmanager
def searchable_dir(tag: str, under: Path | None = None) -> Iterator[Path]:
    """A fresh directory (below ``under``, by default the system's temporary directory) every
    user may search (not list): a server run as root runs its slots as other uids, which must
    reach their workspaces below it (pytest's own temporary directories are private to their
    owner)."""
    folder = Path(tempfile.mkdtemp(prefix=f"trajcore-{tag}-", dir=under))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This module's ``tmp_path``: one that the slots' uids can reach (``searchable_dir``)."""
    with searchable_dir("test") as folder:
        yield folder


@contextlib.contextmanager
def held_slot_uids(count: int) -> Iterator[int]:
    """The first of ``count`` slot uids this process holds on the host (``slot_uid_locks``)
    until the block ends: the default range, or the next free one when another pool or slot
    server on the host (another test session, an env) holds some of it."""
    if os.geteuid() != 0:
        yield DEFAULT_SLOT_UID_BASE
        return
    held = reserve_free(DEFAULT_SLOT_UID_BASE, count, limit=MAX_SLOT_UID)
    try:
        yield held.first
    finally:
        held.release()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A slot server (its keepers and lease agents: the slot helper, built at start), its
    slots' uids held by this process: the tests read which uids they run as."""
    with searchable_dir("slot-server") as folder, held_slot_uids(4) as base:
        running = start_server(folder / "root", uid_base=base)
        yield running
        assert stop_server(running) == 0


def run(main: Callable[[SlotServerClient], Coroutine[Any, Any, T]], server: Server) -> T:
    async def wrapper() -> T:
        async with server.client() as client:
            return await main(client)

    return asyncio.run(wrapper())


_ids = iter(range(1, 1 << 30))


def call(
    slot: int, tool: str, *, epoch: int = 1, timeout_s: float = 10.0, **arguments: JSON
) -> ExecuteCall:
    return ExecuteCall(
        slot=slot, epoch=epoch, call_id=f"call-{next(_ids)}", tool=tool,
        arguments=arguments, timeout_s=timeout_s,
    )  # fmt: skip


async def one(client: SlotServerClient, c: ExecuteCall) -> ToolResult:
    (result,) = await client.execute([c])
    return result


def host_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or ``None`` once
    the process is gone. The name may hold spaces and parentheses: fields follow the last ')'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def host_processes_with(marker: str) -> list[int]:
    found = []
    for pid in host_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and b"pytest" not in cmdline:
            found.append(pid)
    return found


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (read from /proc on the host)."""
    children: dict[int, list[int]] = {}
    for pid in host_pids():
        fields = stat_fields(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


async def wait_until_gone(pids: set[int], timeout_s: float = 10.0) -> None:
    """Wait until none of ``pids`` runs any more (gone, or a zombie nobody reaped yet)."""

    def running(pid: int) -> bool:
        fields = stat_fields(pid)
        return fields is not None and fields[0] != "Z"

    async with asyncio.timeout(timeout_s):
        # nothing signals a stranger's exit to this process: polling /proc is the only way
        while any(running(pid) for pid in pids):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def reset_clean(client: SlotServerClient, slot: int, epoch: int) -> None:
    outcome = await client.reset(slot, epoch)
    assert outcome.ok, outcome.error


# --------------------------------------------------------------------------------- basics


def test_health_reports_a_sandboxed_server(server: Server) -> None:
    health = run(lambda client: client.health(), server)
    assert health.slots == 4
    assert health.sandboxed
    assert health.capabilities.bwrap
    assert health.capabilities.network_isolation
    assert health.capabilities.tmux
    assert health.capabilities.slot_helper == "native"
    assert server.ready["capabilities"]["slot_helper"] == "native"
    # a source checkout ships no helper: the server built its own
    assert health.capabilities.slot_helper_origin == "built at start"
    assert not health.allow_network
    assert server.ready["ready"] is True


def test_bash_runs_inside_the_sandbox(server: Server) -> None:
    async def main(client: SlotServerClient) -> ToolResult:
        return await one(client, call(0, "bash", command="pwd; echo err >&2; exit 3"))

    result = run(main, server)
    assert result.outcome is ToolOutcome.OK
    assert result.exec is not None
    assert result.exec.exit_code == 3
    assert result.exec.stdout == "/workspace\n"
    assert result.exec.stderr == "err\n"
    assert result.exec.sandboxed
    assert "[exit code 3]" in result.content


def test_bad_calls_are_rejected_one_by_one_while_good_ones_run(server: Server) -> None:
    async def main(client: SlotServerClient) -> list[ToolResult]:
        return await client.execute(
            [
                call(0, "no_such_tool"),
                call(0, "bash"),
                call(0, "bash", command=42),
                call(0, "write_file", path="x.txt"),
                call(0, "bash", command="echo fine", allow_network=True, require_sandbox=False),
                call(99, "bash", command="true"),
            ]
        )

    unknown, missing, wrong_type, no_content, good, no_slot = run(main, server)
    assert unknown.outcome is ToolOutcome.REJECTED
    assert "unknown tool 'no_such_tool'" in (unknown.error or "")
    assert missing.outcome is ToolOutcome.REJECTED
    assert "required @ $.command" in (missing.error or "")
    assert wrong_type.outcome is ToolOutcome.REJECTED
    assert "expected string, got integer @ $.command" in (wrong_type.error or "")
    assert no_content.outcome is ToolOutcome.REJECTED
    assert "$.content" in (no_content.error or "")
    assert good.outcome is ToolOutcome.OK
    assert good.content == "fine\n"
    assert good.exec is not None
    assert good.exec.sandboxed  # the model's require_sandbox=False changed nothing
    assert no_slot.outcome is ToolOutcome.REJECTED


def test_malformed_batch_is_a_wire_error_naming_the_path(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[int, dict[str, Any]]:
        url = server.ready["address"] + "/v1/execute"
        body = {
            "calls": [{"slot": "zero", "epoch": 1, "call_id": "a", "tool": "bash", "timeout_s": 1}]
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as answer,
        ):
            return answer.status, await answer.json()

    status, body = run(main, server)
    assert status == 400
    assert body["field"] == "$.calls[0].slot"
    assert "expected an integer" in body["error"]


def test_request_without_the_token_gets_401(server: Server) -> None:
    async def raw() -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.ready["address"] + "/v1/health") as answer,
        ):
            return answer.status

    assert asyncio.run(raw()) == 401

    async def wrong_token() -> None:
        async with server.client("not-the-token") as client:
            await client.health()

    with pytest.raises(SlotServerError, match="401"):
        asyncio.run(wrong_token())


# --------------------------------------------------------------------------------- files


def test_write_file_of_20_mb_is_rejected(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, ToolResult]:
        big = await one(client, call(0, "write_file", path="big.txt", content="x" * (20 << 20)))
        after = await one(client, call(0, "bash", command="ls big.txt 2>&1; echo still-here"))
        return big, after

    big, after = run(main, server)
    assert big.outcome is ToolOutcome.REJECTED
    assert "over the" in (big.error or "")
    assert "$.content" in (big.error or "")
    assert "still-here" in after.content
    assert "No such file" in after.content


def test_path_escapes_are_rejected(server: Server) -> None:
    async def main(client: SlotServerClient) -> list[ToolResult]:
        await one(client, call(0, "bash", command="ln -sf /etc out; mkdir -p d; ln -sf d inside"))
        return await client.execute(
            [
                call(0, "read_file", path="../../etc/passwd"),
                call(0, "read_file", path="/etc/passwd"),
                call(0, "read_file", path="out/passwd"),
                call(0, "write_file", path="out/evil", content="x"),
                call(0, "write_file", path="inside/ok.txt", content="kept"),
                call(0, "read_file", path="d/ok.txt"),
            ]
        )

    dotdot, absolute, link_read, link_write, inside_write, inside_read = run(main, server)
    for refused in (dotdot, absolute):  # the request names no file of the workspace
        assert refused.outcome is ToolOutcome.REJECTED, refused
        assert "@ $.path" in (refused.error or "")
    # a well-formed path that finds a symlink leading out: the tool's answer about that file
    leads_out = "it leads out of the workspace through a symlink"
    assert link_read.outcome is ToolOutcome.TOOL_ERROR, link_read
    assert link_read.error == f"cannot read 'out/passwd': {leads_out}"
    assert link_write.outcome is ToolOutcome.TOOL_ERROR, link_write
    assert link_write.error == f"cannot write 'out/evil': {leads_out}"
    assert not Path("/etc/evil").exists()
    assert inside_write.outcome is ToolOutcome.OK
    assert inside_read.content == "kept"


def test_artifacts_read_list_and_archive(server: Server) -> None:
    async def main(client: SlotServerClient) -> None:
        await one(
            client,
            call(
                2, "bash", command="mkdir -p out; printf 'a\\0b' > out/x.bin; echo hi > out/y.txt"
            ),
        )
        found = await client.read_artifact(2, "out/x.bin", max_bytes=2)
        assert found.data == b"a\0"
        assert found.truncated
        assert found.size == 3
        listing = await client.list_artifacts(2, "out")
        assert [e.name for e in listing.entries] == ["x.bin", "y.txt"]
        archive = await client.archive_artifacts(2, "out")
        with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
            assert sorted(tar.getnames()) == ["x.bin", "y.txt"]
        with pytest.raises(ToolArgumentError):
            await client.read_artifact(2, "../x")
        with pytest.raises(FileNotFoundError):
            await client.read_artifact(2, "missing")
        with pytest.raises(UnknownSlot):
            await client.read_artifact(17, "x")

    run(main, server)


# --------------------------------------------------------------------------------- output


def test_200_mb_of_output_is_capped_and_the_server_stays_responsive(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, float]:
        flood = asyncio.create_task(
            one(
                client,
                call(1, "bash", command="echo HEAD; head -c 200000000 /dev/zero; echo; echo TAIL"),
            )
        )
        await asyncio.sleep(0.05)
        started = time.monotonic()
        quick = await one(client, call(3, "bash", command="echo quick"))
        waited = time.monotonic() - started
        assert quick.content == "quick\n"
        return await flood, waited

    flood, waited = run(main, server)
    assert waited < 5
    assert flood.exec is not None
    assert flood.exec.stdout.startswith("HEAD\n")
    assert flood.exec.stdout.endswith("TAIL\n")
    assert flood.exec.stdout_dropped > 199_000_000
    assert f"{flood.exec.stdout_dropped} bytes dropped" in flood.exec.stdout
    assert len(flood.exec.stdout.encode()) < 8192


def test_binary_and_invalid_utf8_output(server: Server) -> None:
    async def main(client: SlotServerClient) -> ToolResult:
        return await one(
            client, call(3, "bash", command="printf 'ok\\377\\376\\000end\\n'; printf '\\351' >&2")
        )

    result = run(main, server)
    assert result.exec is not None
    assert result.exec.stdout == "ok\ufffd\ufffd\x00end\n"
    assert result.exec.stderr == "\ufffd"


# --------------------------------------------------------------------------------- processes


def test_a_command_that_never_exits_is_killed_with_its_children(server: Server) -> None:
    marker = "1000.424242"

    async def main(client: SlotServerClient) -> ToolResult:
        return await one(
            client, call(1, "bash", command=f"sleep {marker} & sleep {marker}", timeout_s=0.5)
        )

    result = run(main, server)
    assert result.outcome is ToolOutcome.TIMEOUT
    assert result.exec is not None
    assert result.exec.timed_out
    deadline = time.monotonic() + 3
    while host_processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(marker) == []


def test_model_timeout_only_shortens(server: Server) -> None:
    async def main(client: SlotServerClient) -> ToolResult:
        return await one(client, call(1, "bash", command="sleep 3", timeout_s=10, timeout=0.3))

    started = time.monotonic()
    result = run(main, server)
    assert result.outcome is ToolOutcome.TIMEOUT
    assert time.monotonic() - started < 2.5


@pytest.mark.slow
def test_a_fork_bomb_is_bounded_and_other_slots_carry_on(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, ToolResult]:
        bomb = asyncio.create_task(
            one(
                client, call(2, "bash", epoch=5, command="b() { b | b & }; b; sleep 2", timeout_s=2)
            )
        )
        await asyncio.sleep(0.5)
        neighbour = await one(client, call(3, "bash", command="echo alive"))
        result = await bomb
        await reset_clean(client, 2, 5)
        return result, neighbour

    bomb, neighbour = run(main, server)
    assert neighbour.content == "alive\n"
    assert bomb.outcome in (ToolOutcome.OK, ToolOutcome.TIMEOUT, ToolOutcome.TOOL_ERROR)


def test_a_memory_hog_is_stopped(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, ToolResult]:
        hog = await one(
            client,
            call(1, "bash", command="exec python3 -c 'x = bytearray(1 << 30); print(len(x))'"),
        )
        after = await one(client, call(1, "bash", command="echo fine"))
        return hog, after

    hog, after = run(main, server)
    assert hog.exec is not None
    assert hog.exec.exit_code != 0
    assert "1073741824" not in hog.exec.stdout
    assert after.content == "fine\n"


def test_another_slots_workspace_is_not_visible(server: Server) -> None:
    async def main(client: SlotServerClient) -> ToolResult:
        await one(client, call(0, "write_file", path="secret.txt", content="slot zero"))
        host_path = server.root / "slots" / "0" / "secret.txt"
        assert host_path.read_text() == "slot zero"
        return await one(
            client,
            call(
                3,
                "bash",
                command=f"ls /workspace; cat {host_path} 2>&1; cat ../0/secret.txt 2>&1; "
                "find / -name secret.txt -not -path '/proc/*' 2>/dev/null; echo done",
                timeout_s=120,  # a walk of the whole root: slow on a loaded 2-core machine
            ),
        )

    result = run(main, server)
    assert "slot zero" not in result.content
    assert "secret.txt\n" not in result.content
    assert result.content.endswith("done\n")


def test_network_is_unreachable_when_not_allowed(server: Server) -> None:
    port = server.ready["address"].rsplit(":", 1)[1]
    probe = (
        'python3 -c "import socket,sys\n'
        f"try:\n socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
        "except OSError as e: print('refused', e)\""
    )

    async def main(client: SlotServerClient) -> ToolResult:
        return await one(client, call(3, "bash", command=probe))

    result = run(main, server)
    assert "refused" in result.content
    assert "connected" not in result.content


# ------------------------------------------------------------------------- ids, state, reset


def test_a_repeated_call_id_returns_the_first_result(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, ToolResult, ToolResult]:
        first = call(0, "bash", command="date +%s%N >> runs.txt; wc -l < runs.txt")
        a, b = await asyncio.gather(one(client, first), one(client, first))
        c = await one(client, first)
        return a, b, c

    a, b, c = run(main, server)
    assert a == b == c
    assert (server.root / "slots" / "0" / "runs.txt").read_text().count("\n") == 1


async def wait_until_busy(runtime: SlotRuntime, slot: int) -> None:
    async with asyncio.timeout(20):
        while not runtime.listing().slots[slot].busy:  # noqa: ASYNC110 - polls state that has no event
            await asyncio.sleep(0.01)


def test_a_reset_interrupts_the_running_call_refuses_queued_ones_and_close_answers_all(
    tmp_path: Path,
) -> None:
    config = RuntimeConfig(slots=1, root=tmp_path / "root", use_cgroups=False)
    slow = call(0, "bash", command="sleep 60", timeout_s=90)
    queued = call(0, "bash", command="echo should-not-run")

    async def main() -> tuple[list[ToolResult], ...]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            async with asyncio.timeout(60):
                batch = asyncio.ensure_future(runtime.execute([slow, queued]))
                await wait_until_busy(runtime, 0)
                repeat = asyncio.ensure_future(runtime.execute([slow]))  # joins the running call
                reset = await runtime.reset(0, 1)
                assert reset.ok, reset.error
                first, joined = await batch, await repeat
                after = await runtime.execute([call(0, "bash", epoch=2, command="echo next")])
                hanging = call(0, "bash", epoch=2, command="sleep 60", timeout_s=90)
                pending = asyncio.ensure_future(
                    runtime.execute([hanging, call(0, "bash", epoch=2, command="echo never")])
                )
                await wait_until_busy(runtime, 0)
                listing = runtime.listing().slots[0]
                assert (listing.calls_run, listing.retired_epoch) == (3, 1)
        finally:
            await runtime.aclose()
        closed = await pending
        late = await runtime.execute([call(0, "bash", epoch=3, command="echo late")])
        return first, joined, after, closed, late

    first, joined, after, closed, late = asyncio.run(main())
    interrupted, refused = first
    # ended mid-run, or refused as stale once its sandbox had started: never run to its end
    assert interrupted.outcome in {ToolOutcome.INFRA_ERROR, ToolOutcome.REJECTED}, interrupted
    assert joined == [interrupted]  # the same call, run once
    assert refused.outcome is ToolOutcome.REJECTED
    assert "lease epoch 1 is stale" in (refused.error or "")
    assert after[0].content == "next\n"
    assert [r.outcome for r in closed + late] == [ToolOutcome.INFRA_ERROR] * 3
    assert all("closing" in (r.error or "") for r in closed + late)


async def wait_for_screen(client: SlotServerClient, slot: int, expected: str) -> ToolResult:
    """Capture the slot's terminal (sending no keys) until ``expected`` shows, for up to 10 s."""
    for _ in range(40):
        shot = await one(client, call(slot, "tmux", keys=[], enter=False, wait_s=0.05))
        if expected in shot.content:
            return shot
        await asyncio.sleep(0.25)
    return shot


def test_stateful_shell_and_tmux(server: Server) -> None:
    async def main(client: SlotServerClient) -> list[ToolResult]:
        return await client.execute(
            [
                call(3, "bash_stateful", command="mkdir -p sub && cd sub && V=42"),
                call(3, "bash_stateful", command="pwd; echo $V; (exit 7)"),
                call(3, "bash_stateful", command="echo $V; exit 5"),
                call(3, "bash_stateful", command="echo fresh-shell"),
                call(3, "tmux", keys="python3 -q", wait_s=0.5),
                call(3, "tmux", keys="print(6 * 7)", wait_s=0.3),
            ]
        ) + [await wait_for_screen(client, 3, "\n42\n")]

    setup, state, exiting, fresh, _, _, answer = run(main, server)
    assert setup.exec is not None
    assert setup.exec.exit_code == 0
    assert state.exec is not None
    assert state.exec.stdout == "/workspace/sub\n42\n"
    assert state.exec.exit_code == 7
    assert exiting.exec is not None
    assert exiting.exec.exit_code == 5
    assert fresh.content == "fresh-shell\n"
    assert "\n42\n" in answer.content


def test_reset_kills_background_processes_and_tmux_and_wipes(server: Server) -> None:
    marker = "4321.777"

    async def main(client: SlotServerClient) -> tuple[list[int], ToolResult, ToolResult]:
        await one(
            client,
            call(1, "bash", epoch=9, command=f"(sleep {marker} >/dev/null 2>&1 &); touch left.txt"),
        )
        tmux_before = set(host_processes_with("tmux.sock"))
        await one(client, call(1, "bash_stateful", epoch=9, command=f"sleep {marker}9 &"))
        # the server's own (another test process's tmux may start meanwhile on a shared host)
        tmux_of_slot = (set(host_processes_with("tmux.sock")) - tmux_before) & process_tree(
            server.process.pid
        )
        assert tmux_of_slot
        before = host_processes_with(marker)
        await reset_clean(client, 1, 9)
        assert not tmux_of_slot & set(host_processes_with("tmux.sock"))
        stale = await one(client, call(1, "bash", epoch=9, command="echo should-not-run"))
        again = await one(client, call(1, "bash", epoch=10, command="ls -A; echo next-lease"))
        return before, stale, again

    before, stale, again = run(main, server)
    assert len(before) >= 2
    assert host_processes_with(marker) == []
    assert stale.outcome is ToolOutcome.REJECTED
    assert "stale" in (stale.error or "")
    assert again.content == "next-lease\n"
    assert list((server.root / "slots" / "1").iterdir()) == []


def test_a_forks_reset_keeps_its_layer_folder_from_another_slots_sweep(tmp_path: Path) -> None:
    """A fork's reset makes a ``layer-*`` folder in the trash and fills it in steps: in a worker
    thread, its workspace overlay is unmounted (each detach waits for the kernel) and the
    fork's folder renamed into it; then the rest of the layer. Another slot's reset ending
    meanwhile sweeps the trash. Here the fork's thread loses the CPU between making the folder
    and its rename, as on a loaded host, until that sweep has passed: the folder being filled
    is left alone, and the reset proves its slot clean (removed half filled, the rename failed,
    and a clean slot was reported unclean and quarantined)."""
    if os.geteuid() != 0:
        pytest.skip("a fork's workspace overlay needs a root server")
    if (problem := image_problem()) is not None:
        pytest.skip(problem)
    folder = tmp_path / "forks"
    folder.mkdir()
    folder.chmod(0o711)  # the slots' uids search it for the image
    write_shell_image(folder / "layout", salt="forked-reset-sweep")
    ref = f"oci:{folder / 'layout'}"
    config = RuntimeConfig(
        slots=3, root=folder / "root", use_cgroups=False, warm_leases=False,
        image_cache=folder / "cache",
    )  # fmt: skip
    trash = folder / "root" / "trash"
    held, go = threading.Event(), threading.Event()
    rename = Path.rename

    def slow_rename(source: Path, target: str | os.PathLike[str]) -> Path:
        into = Path(target).parent
        if into.parent == trash and into.name.startswith("layer-1-") and not held.is_set():
            held.set()  # slot 1's reset, between making its folder and filling it
            go.wait(30)
        return rename(source, target)

    def swept_later() -> bool:  # slot 2's folder, after slot 1's in the sweep's order
        return any(entry.name.startswith("layer-2-") for entry in trash.iterdir())

    async def main() -> tuple[bool, str | None]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            assert (await runtime.lease(0, 1, ref)).ok
            made = await runtime.execute([call(0, "bash", command="echo ready > prepared.txt")])
            assert made[0].outcome is ToolOutcome.OK, made
            frozen = await runtime.snapshot(0, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            assert runtime.snapshots is not None
            if runtime.snapshots.fork_workspaces() != "overlay":
                pytest.skip(
                    "the race is in a forked workspace overlay's unmount; this host forks "
                    f"workspaces as {runtime.snapshots.fork_workspaces()}"
                )
            answers = await runtime.fork(ref, frozen.snapshot, [(1, 1), (2, 1)])
            assert [a.ok for a in answers] == [True, True], answers
            assert runtime.snapshots.forked(runtime.slot(1).workspace.root)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(Path, "rename", slow_rename)
                first = asyncio.ensure_future(runtime.reset(1, 1))
                assert await asyncio.to_thread(held.wait, 30)  # in the unmount's worker thread
                other = await runtime.reset(2, 1)  # ends with a sweep of the trash
                assert other.ok, other.error
                async with asyncio.timeout(30):  # until that sweep has passed slot 1's folder
                    while swept_later():  # noqa: ASYNC110 - polls state that has no event
                        await asyncio.sleep(0.01)
                go.set()
                reset = await first
            assert (await runtime.reset(0, 1)).ok
            return reset.ok, reset.error
        finally:
            go.set()
            await runtime.aclose()

    ok, error = asyncio.run(main())
    assert ok, error


# --------------------------------------------------------------------------------- leases


def status_fields(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_every_lease_is_fresh_namespaces_without_capabilities(server: Server) -> None:
    marker = "4321.888"
    leftovers = (
        f"echo tmp >/tmp/left; echo shm >/dev/shm/left; (sleep {marker} >/dev/null 2>&1 &); echo $$"
    )
    probe = (
        "ls -A /tmp /dev/shm; touch /dev/planted 2>&1 || echo dev-read-only; "
        "mount -t tmpfs none /tmp 2>&1 || echo mount-refused; "
        "ls /proc | grep -c '^[0-9]'; echo $$"
    )

    async def main(client: SlotServerClient) -> tuple[ToolResult, ...]:
        await reset_clean(client, 3, 49)  # whatever earlier tests left in slot 3
        status = await one(client, call(3, "bash", epoch=50, command="cat /proc/self/status"))
        first = await one(client, call(3, "bash", epoch=50, command=leftovers))
        keeper = (await client.list_slots()).slots[3].sandbox_pid
        await reset_clean(client, 3, 50)
        second = await one(client, call(3, "bash", epoch=51, command=probe))
        kept = (await client.list_slots()).slots[3].sandbox_pid
        assert keeper is not None
        assert kept == keeper, "the slot's keeper sandbox lives on across leases"
        return status, first, second

    status, first, second = run(main, server)
    fields = status_fields(status.content)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, (key, fields[key])
    assert fields["NoNewPrivs"].strip() == "1"
    assert int(first.content.split()[-1]) < 10, "a lease's shell is low in its own pid namespace"
    lines = second.content.split("\n")
    assert lines[:4] == ["/dev/shm:", "", "/tmp:", ".trajcore"], second.content
    assert "dev-read-only" in second.content
    assert "mount-refused" in second.content
    assert int(lines[-3]) <= 6, f"only the lease's own processes are visible: {second.content}"
    assert host_processes_with(marker) == []


def test_commands_run_as_batch_work(server: Server) -> None:
    # field 41 of /proc/PID/stat is the scheduling policy; 3 is SCHED_BATCH (a command never
    # preempts the slot server that woke its agent)
    result = run(
        lambda client: one(
            client, call(1, "bash", epoch=80, command="cut -d' ' -f41 /proc/$$/stat")
        ),
        server,
    )
    assert result.content.strip() == "3", result


def test_commands_run_nicer_than_their_agent(server: Server) -> None:
    # field 19 of /proc/PID/stat is the nice value: a command's is its agent's (the lease's pid
    # 1, at the slot server's) plus 10, so the server's own work waits less behind commands.
    # The agent sets it just after the spawn returns (posix_spawn cannot set it in the child):
    # a command that reads it in its first moments under load can still see the agent's, so
    # this one reads it a moment in.
    result = run(
        lambda client: one(
            client,
            call(
                1, "bash", epoch=85, command="sleep 0.1; cut -d' ' -f19 /proc/1/stat /proc/$$/stat"
            ),
        ),
        server,
    )
    agent, command = (int(line) for line in result.content.split())
    assert command == min(agent + 10, 19), result


def test_the_lease_reaps_its_orphans(server: Server) -> None:
    """A background process that outlives its command and ends is reaped by the lease's pid 1
    (its agent): no zombie keeps a process slot for the rest of the lease."""

    async def main(client: SlotServerClient) -> ToolResult:
        await one(client, call(1, "bash", epoch=90, command="(sleep 0.1 &); (sleep 0.1 &); true"))
        await one(client, call(1, "bash", epoch=90, command="sleep 0.5"))
        return await one(
            client, call(1, "bash", epoch=90, command="cat /proc/[0-9]*/stat | cut -d' ' -f3")
        )

    states = run(main, server).content.split()
    assert states, "no process states were read"
    assert "Z" not in states, states


def test_a_hostile_lease_cannot_reach_its_keeper_or_the_next_lease(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[ToolResult, ...]:
        keeper = (await client.list_slots()).slots[2].sandbox_pid
        pythons = await one(client, call(2, "bash", epoch=60, command="cat /proc/[0-9]*/comm"))
        killed = await one(client, call(2, "bash", epoch=60, command="kill -9 -1; echo after"))
        still = await one(client, call(2, "bash", epoch=60, command="echo same-lease"))
        await reset_clean(client, 2, 60)
        fresh = await one(client, call(2, "bash", epoch=61, command="echo next-lease"))
        listing = (await client.list_slots()).slots[2]
        assert keeper is None or listing.sandbox_pid == keeper
        return pythons, killed, still, fresh

    pythons, killed, still, fresh = run(main, server)
    # The lease sees one Python: its own agent (pid 1). The keeper is outside its namespace.
    names = pythons.content.split()
    assert names.count("slot-lease") == 1, names
    assert "slot-keeper" not in names, names
    assert not [name for name in names if name.startswith("python")], names
    assert killed.outcome in (ToolOutcome.OK, ToolOutcome.TOOL_ERROR)
    assert still.content == "same-lease\n"
    assert fresh.content == "next-lease\n"


def test_a_dead_keeper_fails_its_lease_and_the_next_lease_gets_a_new_one(server: Server) -> None:
    async def main(client: SlotServerClient) -> tuple[list[ToolResult], ToolResult, int, int]:
        await one(client, call(0, "bash_stateful", epoch=70, command="cd /tmp"))
        keeper = (await client.list_slots()).slots[0].sandbox_pid
        assert keeper is not None
        sandbox = process_tree(keeper)
        assert len(sandbox) >= 3, sandbox  # bubblewrap, the keeper, the lease's agent
        os.kill(keeper, signal.SIGKILL)
        # The kill ends the keeper's sandbox asynchronously: the claim is about a lease whose
        # keeper is dead, so wait until none of the sandbox's processes runs.
        await wait_until_gone(sandbox)
        # The lease's shell state went with it: no call of this lease runs on a stand-in.
        lost = [
            await one(client, call(0, "bash_stateful", epoch=70, command="pwd")),
            await one(client, call(0, "bash", epoch=70, command="echo again")),
        ]
        await reset_clean(client, 0, 70)
        fresh = await one(client, call(0, "bash", epoch=71, command="echo fresh"))
        replaced = (await client.list_slots()).slots[0].sandbox_pid
        assert replaced is not None
        return lost, fresh, keeper, replaced

    lost, fresh, keeper, replaced = run(main, server)
    for result in lost:
        assert result.outcome is ToolOutcome.INFRA_ERROR, result
    assert "reset the slot" in (lost[1].error or ""), lost[1]
    assert fresh.content == "fresh\n"
    assert replaced != keeper


# --------------------------------------------------------------------------------- other servers


def test_unix_socket_and_fail_closed_without_bwrap(tmp_path: Path) -> None:
    socket_path = str(tmp_path / "slots.sock")
    server = start_server(
        tmp_path / "root",
        "--unix",
        socket_path,
        "--bwrap",
        "/nonexistent/bwrap",
        "--require-sandbox",
    )
    try:

        async def main(client: SlotServerClient) -> tuple[bool, ToolResult]:
            health = await client.health()
            return health.sandboxed, await one(client, call(0, "bash", command="echo escaped"))

        sandboxed, result = run(main, server)
    finally:
        assert stop_server(server) == 0
    assert not sandboxed
    assert result.outcome is ToolOutcome.INFRA_ERROR
    assert "bubblewrap" in (result.error or "")


def slot_server_exit(
    root: Path, *flags: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A slot server started to fail: its exit status and output (within 60 s)."""
    return subprocess.run(
        [sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
         "--root", str(root), "--unix", str(root.with_suffix(".sock")), *flags],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_without_the_helper_or_a_compiler_the_server_refuses_to_start_naming_the_fix(
    tmp_path: Path,
) -> None:
    """No silent weaker sandbox: a host that can neither find nor build the slot helper gets
    no server, and the error says what to install. The control: the same server with a
    compiler serves."""
    no_compiler = {**os.environ, "CC": "/nonexistent/cc", "TRAJCORE_CACHE_DIR": str(tmp_path)}
    refused = slot_server_exit(tmp_path / "none", env=no_compiler)
    assert refused.returncode == 2, refused
    assert refused.stdout == ""
    assert "slot_helper" in refused.stderr, refused.stderr
    assert "/nonexistent/cc" in refused.stderr, refused.stderr
    assert "gcc and libc6-dev" in refused.stderr, refused.stderr
    assert "ships the slot helper" in refused.stderr, refused.stderr
    assert not list(tmp_path.glob("none/slots/*")), "no slot was set up"

    control = start_server(tmp_path / "control", "--unix", str(tmp_path / "control.sock"))
    try:
        result = run(lambda client: one(client, call(0, "bash", command="echo served")), control)
    finally:
        assert stop_server(control) == 0
    assert result.content == "served\n"


@pytest.mark.parametrize("helper", ["python", "native", "auto"])
def test_the_retired_slot_helper_flag_is_refused_naming_the_replacement(
    helper: str, tmp_path: Path
) -> None:
    refused = slot_server_exit(tmp_path / "root", "--slot-helper", helper, env=dict(os.environ))
    assert refused.returncode == 2, refused
    assert "--slot-helper" in refused.stderr, refused.stderr
    assert "compiled slot helper (slot_helper.c) is the only keeper" in refused.stderr
    assert "gcc and libc6-dev" in refused.stderr, refused.stderr


def test_sigterm_ends_every_sandbox_and_a_dead_server_is_a_slot_server_error(
    tmp_path: Path,
) -> None:
    marker = "2468.1357"
    server = start_server(tmp_path / "root")

    async def main(client: SlotServerClient) -> None:
        await one(client, call(0, "bash", command=f"(sleep {marker} >/dev/null 2>&1 &)"))
        assert host_processes_with(marker)

    run(main, server)
    assert stop_server(server) == 0
    deadline = time.monotonic() + 3
    while host_processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(marker) == []

    async def after(client: SlotServerClient) -> None:
        await client.health()

    with pytest.raises(SlotServerError):
        run(after, server)


def test_a_server_killed_mid_call_fails_the_request(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root")

    async def main(client: SlotServerClient) -> None:
        pending = asyncio.create_task(
            one(client, call(0, "bash", command="sleep 30", timeout_s=30))
        )
        await asyncio.sleep(0.5)
        server.process.kill()
        await pending

    try:
        with pytest.raises(SlotServerError):
            run(main, server)
    finally:
        stop_server(server)


def test_wire_error_on_a_protocol_violation() -> None:
    async def main() -> None:
        from aiohttp import web

        async def garbage(_: web.Request) -> web.Response:
            return web.Response(text='{"protocol_version": "one"}', content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/health", garbage)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with SlotServerClient.tcp(f"127.0.0.1:{port}", TOKEN) as client:
                with pytest.raises(WireError, match=r"\$\.protocol_version"):
                    await client.health()
        finally:
            await runner.cleanup()

    asyncio.run(main())


# --------------------------------------------------------------------------------- under /tmp


def test_paths_bound_under_tmp_are_carried_into_every_lease(tmp_path: Path) -> None:
    """A lease mounts a fresh /tmp, so what the sandbox binds under /tmp (a workspace placed
    there, an extra bind) must be bound back into each lease, read-only where it was."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "given.txt").write_text("from the host\n")
    isolation = SlotIsolation(
        require_sandbox=True,
        workspace_path="/tmp/work",
        extra_binds=(Bind(source=str(data), dest="/tmp/data"),),
        max_processes=64,
        memory_bytes=256 << 20,
    )
    config = RuntimeConfig(slots=1, root=tmp_path / "root", isolation=isolation)
    script = (
        "echo written >/tmp/work/out.txt; cat /tmp/data/given.txt; "
        "touch /tmp/data/planted 2>/dev/null || echo data-read-only; echo scratch >/tmp/scratch"
    )

    async def main() -> tuple[list[ToolResult], str]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            results = []
            for epoch in (1, 2):  # a second lease binds them again
                (result,) = await runtime.execute([call(0, "bash", epoch=epoch, command=script)])
                results.append(result)
                assert (await runtime.reset(0, epoch)).ok
            return results, runtime.capabilities.slot_helper
        finally:
            await runtime.aclose()

    results, running = asyncio.run(main())
    assert running == "native"
    for result in results:
        assert result.outcome is ToolOutcome.OK, result
        assert result.content == "from the host\ndata-read-only\n", result
    assert not (data / "planted").exists()


# --------------------------------------------------------------------------------- slot uids

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not AS_ROOT, reason="slots run as their own uids only when the slot server is root"
)


async def fresh_lease(client: SlotServerClient, *slots: int) -> int:
    """Reset ``slots`` past whatever earlier tests used; returns the epoch of the new lease."""
    listing = await client.list_slots()
    epoch = max(listing.slots[slot].retired_epoch for slot in slots) + 1
    for slot in slots:
        await reset_clean(client, slot, epoch)
    return epoch + 1


def host_uids(pid: int) -> list[int]:
    """The real, effective, saved and file-system uids of ``pid``, read by the host."""
    fields = status_fields(Path(f"/proc/{pid}/status").read_text())
    return [int(value) for value in fields["Uid"].split()]


@needs_root
def test_each_slot_runs_as_its_own_unprivileged_uid(server: Server) -> None:
    marker = "4321.777"
    shadow = "cat /etc/shadow >/dev/null 2>&1 && echo shadow-read || echo shadow-refused"

    async def main(
        client: SlotServerClient,
    ) -> tuple[list[ToolResult], list[dict[int, list[int]]], list[list[int]]]:
        epoch = await fresh_lease(client, 0, 1)
        results = await client.execute(
            [
                call(slot, "bash", epoch=epoch, command=f"(sleep {marker} &) ; {shadow}; id -u")
                for slot in (0, 1)
            ]
        )
        listing = await client.list_slots()
        seen, sleepers = [], []
        for slot in (0, 1):
            pid = listing.slots[slot].sandbox_pid
            assert pid is not None
            tree = process_tree(pid)
            seen.append({pid: host_uids(pid) for pid in tree if stat_fields(pid) is not None})
            sleepers.append([pid for pid in host_processes_with(marker) if pid in tree])
        for slot in (0, 1):
            await reset_clean(client, slot, epoch)
        return results, seen, sleepers

    results, seen, sleepers = run(main, server)
    for slot in (0, 1):
        result = results[slot]
        assert result.outcome is ToolOutcome.OK, result.content
        assert "shadow-refused" in result.content
        expected = server.uid_base + slot
        assert result.content.split()[-1] == str(expected), "inside uid == outside uid"
        assert len(sleepers[slot]) == 1, "the background process is in the slot's sandbox tree"
        for pid, uids in seen[slot].items():
            assert uids == [expected] * 4, (pid, uids)
    assert not set(seen[0]) & set(seen[1])


@needs_root
def test_a_workspace_belongs_to_its_slot_and_no_other(server: Server) -> None:
    async def main(client: SlotServerClient) -> list[ToolResult]:
        epoch = await fresh_lease(client, 0)
        return await client.execute(
            [call(0, "bash", epoch=epoch, command="touch mine && stat -c '%u %a' /workspace mine")]
        )

    (result,) = run(main, server)
    assert result.outcome is ToolOutcome.OK, result.content
    workspace = server.root / "slots" / "0"
    assert workspace.stat().st_uid == server.uid_base
    assert workspace.stat().st_mode & 0o777 == 0o700
    assert (workspace / "mine").stat().st_uid == server.uid_base
    assert (server.root / "slots" / "1").stat().st_uid == server.uid_base + 1


@needs_root
def test_a_root_the_slot_uids_cannot_reach_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    token_file = tmp_path / "t.token"
    token_file.write_text(TOKEN)
    done = subprocess.run(
        [sys.executable, "-m", "trajcore.entrypoints.slot_server", "--slots", "1",
         "--root", str(private / "root"), "--unix", str(tmp_path / "s.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{private} (mode 700) is not searchable by others" in done.stderr
    assert "@ root" in done.stderr


# --------------------------------------------------------------------------------- kernel


def mount_options(pid: int) -> dict[str, str]:
    """Each mount point of ``pid``'s mount namespace (the last mount on it) and its per-mount
    options, read by the host from ``/proc/PID/mountinfo``."""
    found = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        found[fields[4]] = fields[5]
    return found


def lease_pid(sandbox_pid: int, marker: str) -> int:
    (pid,) = [pid for pid in host_processes_with(marker) if pid in process_tree(sandbox_pid)]
    return pid


def test_kernel_interfaces_are_masked_and_read_only(server: Server) -> None:
    marker = "4321.555"
    # opened for appending and never written (``:`` writes nothing): a kernel setting that
    # opened here would be writable, which is the finding
    probes = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/net/ipv4/ip_default_ttl",
        "/proc/sysrq-trigger",
        "/proc/sys/vm/drop_caches",
    ]
    command = (
        f"(sleep {marker} >/dev/null 2>&1 &); "
        + "".join(f"(: >>{path}) 2>/dev/null && echo opened {path}; " for path in probes)
        + "wc -c </proc/keys; ls -A /proc/acpi 2>/dev/null | wc -l; echo done"
    )

    async def main(client: SlotServerClient) -> tuple[ToolResult, dict[str, str]]:
        epoch = await fresh_lease(client, 2)
        result = await one(client, call(2, "bash", epoch=epoch, command=command))
        sandbox = (await client.list_slots()).slots[2].sandbox_pid
        assert sandbox is not None
        mounts = mount_options(lease_pid(sandbox, marker))
        await reset_clean(client, 2, epoch)
        return result, mounts

    result, mounts = run(main, server)
    assert result.outcome is ToolOutcome.OK, result.content
    assert "opened" not in result.content
    assert result.content.split()[:3] == ["0", "0", "done"], result.content
    for path in READ_ONLY_PATHS:
        if Path(path).exists():
            assert mounts[path].split(",")[0] == "ro", (path, mounts.get(path))
    for path in MASKED_PATHS:
        if Path(path).exists() and path.startswith("/proc/"):
            assert path in mounts, f"{path} is not masked"
    assert Path("/proc/keys").exists(), "the host lists keys; the lease reads nothing (above)"


# --------------------------------------------------------------------------------- seccomp

# x86-64 system call numbers the probe makes through ctypes (``os`` has no wrappers for them)
X86_64 = os.uname().machine == "x86_64"
needs_x86_64 = pytest.mark.skipif(not X86_64, reason="the probe's syscall numbers are x86-64's")
SYSCALL_PROBE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CALLS = {
    "unshare_user": lambda: libc.unshare(0x10000000),
    "unshare_net_user": lambda: libc.unshare(0x10000000 | 0x40000000),
    "keyctl_session": lambda: libc.syscall(250, 0, -3, 0),
    "add_key": lambda: libc.syscall(248, b"user", b"canary", b"value", 5, -3),
    "request_key": lambda: libc.syscall(249, b"user", b"canary", None, -3),
    "ptrace_attach": lambda: libc.syscall(101, 16, 1, 0, 0),
    "pidfd_getfd": lambda: libc.syscall(438, os.pidfd_open(1), 3, 0),
    "process_vm_readv": lambda: libc.syscall(310, 1, 0, 0, 0, 0, 0),
    "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
    "bpf": lambda: libc.syscall(321, 0, 0, 0),
    "perf_event_open": lambda: libc.syscall(298, 0, 0, -1, -1, 0),
    "userfaultfd": lambda: libc.syscall(323, 0),
    "open_by_handle_at": lambda: libc.syscall(304, 0, 0, 0),
    "setns": lambda: libc.syscall(308, os.pidfd_open(1), 0),
    "clone3": lambda: libc.syscall(435, 0, 0),
    "personality_read_implies_exec": lambda: libc.syscall(135, 0x0400000),
    "ioctl_tiocsti": lambda: libc.syscall(16, 0, 0x5412, b"x"),
    "getpid": lambda: libc.syscall(39),
}
for name in sys.argv[1:]:
    ctypes.set_errno(0)
    result = CALLS[name]()
    error = ctypes.get_errno()
    print(name, "allowed" if result >= 0 else errno.errorcode.get(error, error))
print("seccomp_mode", open("/proc/self/status").read().split("Seccomp:")[1].split()[0])
"""
REFUSED = {
    "unshare_user": "EPERM", "unshare_net_user": "EPERM", "keyctl_session": "EPERM",
    "add_key": "EPERM", "request_key": "EPERM", "ptrace_attach": "EPERM",
    "pidfd_getfd": "EPERM", "process_vm_readv": "EPERM", "mount": "EPERM", "bpf": "EPERM",
    "perf_event_open": "EPERM", "userfaultfd": "EPERM", "open_by_handle_at": "EPERM",
    "setns": "EPERM", "clone3": "ENOSYS", "personality_read_implies_exec": "EPERM",
    "ioctl_tiocsti": "EPERM",
}  # fmt: skip
# The calls the control runs on the host: none of them changes anything outside the probe's own
# short-lived process (its stdin is /dev/null, so TIOCSTI has no terminal to type into).
HARMLESS_ON_HOST = (
    "unshare_user", "keyctl_session", "bpf", "perf_event_open", "open_by_handle_at",
    "clone3", "personality_read_implies_exec", "ioctl_tiocsti", "getpid",
)  # fmt: skip


def probe_results(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines() if " " in line)


@needs_x86_64
def test_every_lease_runs_under_the_seccomp_filter(server: Server) -> None:
    names = " ".join([*REFUSED, "getpid"])
    command = f"python3 - {names} <<'EOF'\n{SYSCALL_PROBE}\nEOF\n"

    async def main(client: SlotServerClient) -> ToolResult:
        epoch = await fresh_lease(client, 2)
        result = await one(client, call(2, "bash", epoch=epoch, command=command))
        await reset_clean(client, 2, epoch)
        return result

    result = run(main, server)
    assert result.outcome is ToolOutcome.OK, result.content
    seen = probe_results(result.content)
    for name, errno_name in REFUSED.items():
        assert seen.get(name) == errno_name, (name, result.content)
    assert seen["getpid"] == "allowed"
    assert seen["seccomp_mode"] == "2"


@needs_x86_64
def test_the_seccomp_probe_sees_those_calls_pass_without_the_filter() -> None:
    """The control: the same probe, unsandboxed on the host, gets past the calls the filter
    refuses (they fail for their bad arguments, if at all, never as the filter answers)."""
    done = subprocess.run(
        [sys.executable, "-c", SYSCALL_PROBE, *HARMLESS_ON_HOST],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    seen = probe_results(done.stdout)
    assert seen["seccomp_mode"] == "0"
    for name in HARMLESS_ON_HOST:
        assert seen[name] != REFUSED.get(name), (name, done.stdout)


@needs_x86_64
def test_a_foreign_abi_system_call_kills_the_process(server: Server) -> None:
    x32_getpid = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')"
    command = f'python3 -c "{x32_getpid}"; echo status=$?'

    async def main(client: SlotServerClient) -> ToolResult:
        epoch = await fresh_lease(client, 2)
        result = await one(client, call(2, "bash", epoch=epoch, command=command))
        await reset_clean(client, 2, epoch)
        return result

    result = run(main, server)
    assert "survived" not in result.content
    assert "status=159" in result.content, result.content  # 128 + SIGSYS


# --------------------------------------------------------------------------------- channel


def lease_processes(sandbox_pid: int, marker: str) -> tuple[int, int]:
    """The host pids of a lease's agent and of its process running ``marker``."""
    tree = process_tree(sandbox_pid)
    (sleeper,) = [pid for pid in host_processes_with(marker) if pid in tree]
    fields = stat_fields(sleeper)
    assert fields is not None
    return int(fields[1]), sleeper


def test_the_lease_agent_is_not_dumpable(server: Server) -> None:
    marker = "4321.444"
    command = (
        f"(sleep {marker} >/dev/null 2>&1 &); ls /proc/1/fd 2>&1; "
        "ls /proc/self/fd >/dev/null && echo own-fds"
    )

    def owners(agent: int, sleeper: int) -> tuple[str, int, int]:
        name = Path(f"/proc/{agent}/comm").read_text().strip()
        agent_owner, sleeper_owner = (
            Path(f"/proc/{pid}/environ").stat().st_uid for pid in (agent, sleeper)
        )
        return name, agent_owner, sleeper_owner

    async def main(client: SlotServerClient) -> tuple[ToolResult, str, int, int]:
        epoch = await fresh_lease(client, 2)
        result = await one(client, call(2, "bash", epoch=epoch, command=command))
        sandbox = (await client.list_slots()).slots[2].sandbox_pid
        assert sandbox is not None
        seen = owners(*lease_processes(sandbox, marker))
        await reset_clean(client, 2, epoch)
        return result, *seen

    result, name, agent_owner, sleeper_owner = run(main, server)
    assert name == "slot-lease"
    assert "Permission denied" in result.content, result.content
    assert "own-fds" in result.content
    # /proc/PID's private files belong to root for a process that is not dumpable, to the
    # process's uid otherwise
    assert agent_owner == 0
    assert sleeper_owner == (server.uid_base + 2 if AS_ROOT else os.geteuid())
    assert sleeper_owner != agent_owner or not AS_ROOT


def test_each_lease_has_a_network_namespace_of_its_own(server: Server) -> None:
    marker = "4321.333"
    loopback = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "socket.create_connection(s.getsockname()); print('loopback-ok')"
    )
    command = f'(sleep {marker} >/dev/null 2>&1 &); python3 -c "{loopback}"'

    async def main(client: SlotServerClient) -> tuple[list[ToolResult], list[str], str]:
        results, namespaces = [], []
        for _ in range(2):
            epoch = await fresh_lease(client, 2)
            results.append(await one(client, call(2, "bash", epoch=epoch, command=command)))
            sandbox = (await client.list_slots()).slots[2].sandbox_pid
            assert sandbox is not None
            _, sleeper = lease_processes(sandbox, marker)
            namespaces.append(os.readlink(f"/proc/{sleeper}/ns/net"))
            keeper_namespace = os.readlink(f"/proc/{sandbox}/ns/net")
            await reset_clean(client, 2, epoch)
        return results, namespaces, keeper_namespace

    results, namespaces, keeper_namespace = run(main, server)
    for result in results:
        assert result.content == "loopback-ok\n", result.content
    assert namespaces[0] != namespaces[1]
    assert keeper_namespace not in namespaces


# A stand-in for the slot helper run as a bare agent (on fd 0, a socket): it greets, then
# answers each request as its command asks (a real program, so the slot server's reader meets
# hostile frames).
FAKE_AGENT = """#!{python}
import json, os, sys, time
def send(data):
    os.write(0, len(data).to_bytes(4, "big") + data)
def read(size):
    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
send(b'{{"ready": true, "pid": 1, "tmux": false}}')
while True:
    body = read(int.from_bytes(read(4), "big"))
    if b"oversize" in body:
        os.write(0, (320 << 20).to_bytes(4, "big") + b"{{")
        time.sleep(60)
    elif b"not-json" in body:
        send(b"forged")
    elif b"a-list" in body:
        send(b"[0, 1]")
    elif b"wrong-type" in body:
        send(b'{{"exit": "0", "stdout": "forged result"}}')
    else:
        send(json.dumps({{"exit": 0, "stdout": "honest", "stderr": ""}}).encode())
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash runs the jobs")
@pytest.mark.parametrize("tool", ["bash", "bash_stateful"])
@pytest.mark.parametrize("ending", ["reset", "close"])
@pytest.mark.parametrize("job", ["{} &", "nohup {} >/dev/null 2>&1 &", "{} & disown"])
def test_an_unsandboxed_slots_processes_end_with_its_lease(
    tool: str, ending: str, job: str, tmp_path: Path
) -> None:
    """Without bubblewrap and cgroups, a command's background job outlives the command, and the
    persistent shell's tmux server is a daemon outside the lease agent's session. A reset, and
    the server's close, must still end them before anyone else gets the slot."""
    if tool == "bash_stateful" and shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: no persistent shell to end")
    marker = f"trajcore-job-{tool}-{ending}-{os.getpid()}"
    markers = [marker]
    if tool == "bash_stateful":
        markers.append(str(tmp_path / "root"))  # the shell's tmux socket lies below
    config = RuntimeConfig(
        slots=1, root=tmp_path / "root", isolation=SlotIsolation(require_sandbox=False),
        bwrap="/nonexistent/bwrap", use_cgroups=False,
    )  # fmt: skip

    async def main() -> dict[str, list[int]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            command = job.format(f"bash -c 'exec -a {marker} sleep 600'") + "\necho up"
            (started,) = await runtime.execute([call(0, tool, command=command)])
            assert started.outcome is ToolOutcome.OK, started.content
            assert started.exec is not None
            assert not started.exec.sandboxed
            # the control: the check sees the job (and the shell's server) while the lease runs;
            # read until every marker shows in one pass (a process between nohup's, bash's and
            # sleep's exec can read as no command line for an instant)
            async with asyncio.timeout(10):
                while not all((seen := {m: host_processes_with(m) for m in markers}).values()):  # noqa: ASYNC110 - a stranger's exec
                    await asyncio.sleep(0.01)
            if ending == "reset":
                assert (await runtime.reset(0, 1)).ok
            else:
                await runtime.aclose()
            await wait_until_gone({pid for pids in seen.values() for pid in pids})
            return seen
        finally:
            await runtime.aclose()

    try:
        seen = asyncio.run(main())
        assert all(seen.values()), f"the check missed one: {seen}"
    finally:
        for pid in {pid for m in markers for pid in host_processes_with(m)}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("attack", ["oversize", "not-json", "a-list", "wrong-type"])
def test_a_forged_or_oversize_reply_ends_the_lease(attack: str, tmp_path: Path) -> None:
    fake = tmp_path / "fake-helper"
    fake.write_text(FAKE_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    isolation = SlotIsolation(require_sandbox=False, min_timeout_s=0.1)
    config = RuntimeConfig(
        slots=1, root=tmp_path / "root", isolation=isolation, bwrap="/nonexistent/bwrap",
        slot_helper_path=fake, use_cgroups=False, agent_grace_s=30.0,
    )  # fmt: skip

    async def main() -> tuple[ToolResult, ToolResult, ToolResult, float]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            started = time.monotonic()
            (hit,) = await runtime.execute([call(0, "bash", epoch=1, command=attack)])
            took = time.monotonic() - started
            (after,) = await runtime.execute([call(0, "bash", epoch=1, command="honest")])
            assert (await runtime.reset(0, 1)).ok
            (fresh,) = await runtime.execute([call(0, "bash", epoch=2, command="honest")])
            return hit, after, fresh, took
        finally:
            await runtime.aclose()

    hit, after, fresh, took = asyncio.run(main())
    assert hit.outcome is ToolOutcome.INFRA_ERROR, hit.content
    assert "forged result" not in hit.content
    if attack == "oversize":
        assert f"{320 << 20} bytes, over the cap" in hit.content
        assert took < 10, "refused at the header, not after waiting for 320 MiB"
    else:
        assert "malformed reply" in hit.content or "not JSON" in hit.content, hit.content
    assert after.outcome is ToolOutcome.INFRA_ERROR
    assert "reset the slot" in after.content
    assert fresh.outcome is ToolOutcome.OK
    assert fresh.content == "honest"


# --------------------------------------------------------------------------------- pools, cache


def test_a_tcp_local_pool_starts_its_servers_and_runs_calls() -> None:
    async def main() -> tuple[list[ToolResult], list[int]]:
        config = LocalPoolConfig(
            containers=2, transport="tcp",
            server=SlotServerSettings(
                slots_per_container=1, acquire_timeout_s=60.0,
                isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2),
            ),
        )  # fmt: skip
        async with start_local_pool(config) as pool:
            results, uids = [], []
            for _ in range(2):
                async with pool.lease("tcp-test") as lease:
                    command = ToolCall(id=f"t{next(_ids)}", name="bash",
                                       arguments={"command": "id -u"})  # fmt: skip
                    results += await pool.execute(
                        lease.slot.container, [SlotCall(lease=lease, call=command, timeout_s=20)]
                    )
                    uids.append(int(results[-1].content.split()[0]))
            return results, uids

    results, uids = asyncio.run(main())
    for result in results:
        assert result.outcome is ToolOutcome.OK, result.content
    if AS_ROOT:  # each slot its own uid (past the module's server's range while it runs)
        assert len(set(uids)) == 2, uids
        assert all(uid >= DEFAULT_SLOT_UID_BASE for uid in uids), uids


def test_a_helper_cache_under_tmp_serves_leases_with_the_compiled_helper(tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # under /tmp: the lease's private /tmp hides it
    cache.mkdir(mode=0o755)
    environment = {**os.environ, "TRAJCORE_CACHE_DIR": str(cache)}
    server = start_server(tmp_path / "root", env=environment)
    try:

        async def main(client: SlotServerClient) -> tuple[Any, ToolResult]:
            return await client.health(), await one(client, call(0, "bash", command="echo ok"))

        health, result = run(main, server)
    finally:
        assert stop_server(server) == 0
    assert list(cache.glob("slot-helper-*")), "the helper was built in the named cache"
    assert health.capabilities.slot_helper == "native", health.capabilities.detail
    assert result.content == "ok\n"


def test_with_network_allowed_the_hosts_sysctls_stay_read_only(tmp_path: Path) -> None:
    marker = "4321.222"
    ttl = "/proc/sys/net/ipv4/ip_default_ttl"  # the host's own: the lease shares its network
    command = f"(sleep {marker} >/dev/null 2>&1 &); (: >>{ttl}) 2>/dev/null && echo opened"
    server = start_server(tmp_path / "root", "--allow-network")
    try:

        async def main(client: SlotServerClient) -> tuple[ToolResult, dict[str, str], str]:
            result = await one(client, call(0, "bash", command=command))
            sandbox = (await client.list_slots()).slots[0].sandbox_pid
            assert sandbox is not None
            pid = lease_pid(sandbox, marker)
            return result, mount_options(pid), os.readlink(f"/proc/{pid}/ns/net")

        result, mounts, network = run(main, server)
    finally:
        assert stop_server(server) == 0
    assert network == os.readlink("/proc/self/ns/net"), "the lease shares the host's network"
    assert "opened" not in result.content
    assert mounts["/proc/sys"].split(",")[0] == "ro"


# Joins a new session keyring, adds a canary key to it, then execs the rest of its command line:
# whatever it starts (a slot server, or the control's reader) inherits that keyring.
PLANT_KEY = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
secret = sys.argv[1].encode()
assert libc.syscall(250, 1, None) >= 0  # KEYCTL_JOIN_SESSION_KEYRING: a new, anonymous one
assert libc.syscall(248, b"user", b"trajcore-canary", secret, len(secret), -3) >= 0  # add_key
os.execvp(sys.argv[2], sys.argv[2:])
"""
READ_KEY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = libc.syscall(250, 10, -3, b"user", b"trajcore-canary", 0)  # KEYCTL_SEARCH @s
if found < 0:
    print("search refused", ctypes.get_errno())
else:
    buffer = ctypes.create_string_buffer(256)
    size = libc.syscall(250, 11, found, buffer, 256)  # KEYCTL_READ
    print("read", buffer.raw[: max(size, 0)].decode())
"""


@needs_x86_64
def test_a_key_on_the_servers_session_keyring_is_out_of_every_leases_reach(
    tmp_path: Path,
) -> None:
    secret = f"canary-{os.getpid()}-{time.monotonic_ns()}"
    plant = (sys.executable, "-c", PLANT_KEY, secret)
    # the control: the reader, started the same way but unsandboxed, finds and reads the key
    control = subprocess.run(
        [*plant, sys.executable, "-c", READ_KEY],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert control.stdout.strip() == f"read {secret}"
    server = start_server(tmp_path / "root", prefix=plant)
    command = f"python3 - <<'EOF'\n{READ_KEY}\nEOF\ncat /proc/keys; echo done"
    try:
        result = run(lambda client: one(client, call(0, "bash", command=command)), server)
    finally:
        assert stop_server(server) == 0
    assert result.outcome is ToolOutcome.OK, result.content
    assert secret not in result.content
    assert "trajcore-canary" not in result.content
    assert result.content.startswith("search refused 1\n"), result.content


def no_libseccomp(rules: object) -> bytes:
    """Stands in for ``compile_filter`` on a host without libseccomp."""
    raise SeccompUnavailable("libseccomp is not installed (stand-in)")


@pytest.mark.parametrize("required", [True, False])
def test_without_libseccomp_a_required_sandbox_fails_closed_and_health_says_so(
    required: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_module, "compile_filter", no_libseccomp)
    isolation = SlotIsolation(require_sandbox=required, min_timeout_s=0.1)
    config = RuntimeConfig(slots=1, root=tmp_path / "root", isolation=isolation)
    status = "grep Seccomp: /proc/self/status"

    async def main() -> tuple[bool, str, ToolResult]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            (result,) = await runtime.execute([call(0, "bash", command=status)])
            return runtime.sandboxed, runtime.health().capabilities.detail, result
        finally:
            await runtime.aclose()

    sandboxed, detail, result = asyncio.run(main())
    assert "leases run without a seccomp filter: libseccomp is not installed" in detail
    if required:
        assert not sandboxed
        assert result.outcome is ToolOutcome.INFRA_ERROR
        assert "seccomp" in result.content
    else:
        assert sandboxed, detail
        assert result.content.split() == ["Seccomp:", "0"]


@needs_root
def test_without_cgroups_the_process_limit_binds_each_slot(tmp_path: Path) -> None:
    """``RLIMIT_NPROC`` (64 here) counts a slot uid's processes: a lease that keeps forking
    stops near it, counted from the host, while another slot still starts its commands."""
    marker = "4321.111"
    spawn = f"i=0; while [ $i -lt 150 ]; do sleep {marker} & i=$((i+1)); done 2>/dev/null; wait"
    server = start_server(tmp_path / "root", "--no-cgroups")
    try:

        async def main(client: SlotServerClient) -> tuple[int, ToolResult]:
            flood = asyncio.create_task(one(client, call(0, "bash", command=spawn, timeout_s=3)))
            await asyncio.sleep(1.5)
            sandbox = (await client.list_slots()).slots[0].sandbox_pid
            assert sandbox is not None
            tree = process_tree(sandbox)
            counted = len([pid for pid in host_processes_with(marker) if pid in tree])
            neighbour = await one(client, call(1, "bash", command="echo alive"))
            await flood
            return counted, neighbour

        counted, neighbour = run(main, server)
    finally:
        assert stop_server(server) == 0
    assert 30 <= counted <= 64, f"{counted} sleeps ran in the flooding slot"
    assert neighbour.content == "alive\n"
