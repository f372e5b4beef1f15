"""What a command's result says when the slot's memory limit ended a process of it.

A slot server whose slots may use 64 MiB (``memory_bytes``), with cgroups where the host lets it
make them. ``tail -n 1`` keeps the line it reads whole, so fed 1 GiB without a newline it grows
until something stops it:

- With a memory cgroup, the kernel's out-of-memory killer ends it with SIGKILL, which a shell
  reports as for any SIGKILL (exit 137, or ``Killed``). The result must carry a line naming the
  slot's memory limit. The host reads ``oom_kill`` of the slot's memory cgroup
  (``memory.oom_control`` on v1, ``memory.events`` on v2) before and after: it rose, so the
  killer really acted. Controls: a SIGKILL the OOM killer did not send, to a background
  ``sleep`` (the shell reports exit 137) and to the command's own shell (the result says
  "killed by signal 9"), leaves the count as it was and gets no such line.
- Without cgroups (``--no-cgroups``), ``RLIMIT_AS`` makes the allocation fail: nothing is
  killed, the program says why itself, and the result carries no such line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.harness import (
    Server,
    argv_of,
    bwrap_missing,
    compiler,
    end,
    host_pids,
    leased,
    server_root,
    start_server,
    stop_server,
    token,
)

LIMIT = 64 << 20
HOG = "head -c 1G /dev/zero | tail -n 1 > /dev/null"
OOM_LINE = f"killed by the kernel's out-of-memory killer: the slot's memory limit of {LIMIT} bytes"


def small_server(*extra: str) -> Iterator[Server]:
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to run a slot in")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("oom") as root:
        running = start_server(root, "--memory-bytes", str(LIMIT), *extra)
        yield running
        stop_server(running)


@pytest.fixture(scope="module")
def oom_server() -> Iterator[Server]:
    """A slot server whose slots may use 64 MiB, with cgroups where the host allows them."""
    yield from small_server()


@pytest.fixture(scope="module")
def rlimit_server() -> Iterator[Server]:
    """The same with cgroups off: rlimits bound a slot's memory."""
    yield from small_server("--no-cgroups")


def oom_kill_file(pid: int) -> Path | None:
    """The file of ``pid``'s memory cgroup that counts its out-of-memory kills, or ``None``."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
            return found if found.exists() else None
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (folder / "memory.max").exists():
                return folder / "memory.events"
    return None


def oom_kills(events: Path) -> int:
    for line in events.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise AssertionError(f"{events} counts no oom_kill")


async def lease_process(marker: str) -> int:
    """The host pid of the lease's process whose command line carries ``marker``."""
    with anyio.fail_after(10):
        while True:
            for pid in host_pids():
                argv = argv_of(pid)
                if argv is not None and marker in argv:
                    return pid
            await anyio.sleep(0.02)


def test_a_command_the_memory_limit_killed_says_so(oom_server: Server) -> None:
    server = oom_server
    marker = token()

    async def main() -> tuple[Path, int, int, list[tuple[str, str | None]]]:
        async with server.client() as client, leased(server, client, 0) as lease:
            # the lease's first call (its agent starts for it), then one sent to an idle agent
            first = await lease.bash(HOG, timeout_s=60)
            await lease.bash(f"(sh -c 'sleep 30' {marker} >/dev/null 2>&1 &)")
            sleeper = await lease_process(marker)
            try:
                events = oom_kill_file(sleeper)
            finally:
                end([sleeper])
            if events is None or "slot-" not in str(events):
                pytest.skip("the slot server has no memory cgroup here (rlimits only)")
            before = oom_kills(events)
            second = await lease.bash(HOG, timeout_s=60)
            seen = [(first.content, first.error), (second.content, second.error)]
            return events, before, oom_kills(events), seen

    events, before, after, seen = anyio.run(main)
    assert before >= 1, f"{events}: the out-of-memory killer did not act on the first call"
    assert after > before, f"{events}: the out-of-memory killer did not act on the second call"
    for content, error in seen:
        assert OOM_LINE in content, content
        assert "(memory_bytes) was reached" in content, content
        assert error is None, error  # the shell ended normally: exit 137 is the command's answer
        assert "[exit code 137]" in content, content


def test_a_kill_the_memory_limit_did_not_send_is_not_blamed_on_it(oom_server: Server) -> None:
    server = oom_server
    marker = token()

    async def main() -> tuple[Path | None, int, int, list[tuple[str, str | None]]]:
        async with server.client() as client, leased(server, client, 1) as lease:
            await lease.bash(f"(sh -c 'sleep 30' {marker} >/dev/null 2>&1 &)")
            sleeper = await lease_process(marker)
            try:
                events = oom_kill_file(sleeper)
            finally:
                end([sleeper])
            before = 0 if events is None else oom_kills(events)
            seen = []
            for command in ("sleep 100 & kill -9 $!; wait $!", "kill -9 $$"):
                result = await lease.bash(command)
                seen.append((result.content, result.error))
            return events, before, 0 if events is None else oom_kills(events), seen

    events, before, after, seen = anyio.run(main)
    assert after == before, f"{events}: the out-of-memory killer acted during the control"
    (background, _), (own_shell, own_error) = seen
    assert "[exit code 137]" in background, background
    assert own_error is not None, own_shell
    assert "killed by signal 9" in own_error, own_shell
    for content, error in seen:
        assert "out-of-memory" not in content, content
        assert error is None or "out-of-memory" not in error, error


def test_without_cgroups_an_allocation_past_the_limit_fails_and_nothing_is_blamed_on_the_killer(
    rlimit_server: Server,
) -> None:
    server = rlimit_server

    async def main() -> tuple[str, int | None]:
        async with server.client() as client, leased(server, client, 0) as lease:
            result = await lease.bash(HOG, timeout_s=60)
            assert result.exec is not None, result
            return result.content, result.exec.exit_code

    content, exit_code = anyio.run(main)
    assert exit_code not in (0, 137), content  # tail failed to allocate, it was not killed
    assert "tail:" in content, content  # and said so itself
    assert "out-of-memory" not in content, content
