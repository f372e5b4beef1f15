"""The SSH pool against a real OpenSSH sshd on 127.0.0.1, this machine playing the remote host.

Each sshd runs from a temporary directory with its own config file, host key, user key,
``authorized_keys``, ``known_hosts`` and port (``trajcore.testing.loopback_sshd``); the client
reads nothing of ``~/.ssh`` (``-F`` an empty file, ``-i``, ``UserKnownHostsFile``), and every
process is ended by pid at the end. The remote command runs this venv's python. Here: the
``SandboxPool`` contract and its generated sequences, the lockstep with the fake pool, and the
faults with the real components (the host dropped mid-batch, one connection killed, a stalled
connection, a server killed), the start check (an unknown host key, a missing python or
trajcore), the fallback to TCP where sshd refuses to forward Unix sockets, and hosts of different
sizes. Skipped, saying why, only where sshd or bubblewrap is missing. ``./dev ssh-test`` runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.flat_settings import split_off
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.pools.ssh_pool import SshPoolConfig, SshSandboxPool
from trajcore.domain.errors import SandboxUnavailable, SlotServerError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.ssh_hosts import SshHost
from trajcore.domain.tools import ToolOutcome
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.loopback_sshd import LoopbackSshd, loopback_sshd, sshd_problem
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.processes import running, stat_fields
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)
from trajcore.testing.sandbox_pool_machine import MachineShape, run_pool_machine

PROBLEM = sshd_problem() or (None if shutil.which("bwrap") else "bubblewrap is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

ISOLATION = SlotIsolation(
    require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
)
KEEPALIVE_S = 1
KEEPALIVE_COUNT = 2  # a stalled connection ends within 3 s
STALL_S = KEEPALIVE_S * (KEEPALIVE_COUNT + 1)


def config(sshd: LoopbackSshd, *hosts: SshHost, **more: object) -> SshPoolConfig:
    settings = sshd.settings(keepalive_s=KEEPALIVE_S, keepalive_count=KEEPALIVE_COUNT)
    values: dict[str, object] = {
        "hosts": hosts or (sshd.host(servers=2, slots=2),),
        "ssh": settings,
        "isolation": ISOLATION,
        "reset_timeout_s": 10.0,
        "start_timeout_s": 60.0,
        "check_timeout_s": 60.0,
        "backoff_s": 0.2,
        "backoff_max_s": 2.0,
    } | more
    server = split_off(SlotServerSettings(), values)
    restart = split_off(SshPoolConfig(hosts=values["hosts"]).restart, values)
    return SshPoolConfig(server=server, restart=restart, **values)  # type: ignore[arg-type]


async def wait_for(condition: object, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` holds; fails after ``timeout_s`` naming ``what``."""
    start = time.monotonic()
    assert callable(condition)
    with anyio.fail_after(timeout_s, shield=False):
        while not condition():  # noqa: ASYNC110 - polling processes, which signal nothing
            await anyio.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def shared_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSshd]:
    with loopback_sshd(tmp_path_factory.mktemp("sshd")) as sshd:
        yield sshd


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[LoopbackSshd]:
    with loopback_sshd(tmp_path) as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def kill_server(pool: SandboxPool, container: str) -> None:
    """A slot server that dies: SIGKILL its process on the host."""
    assert isinstance(pool, SshSandboxPool)
    os.kill(pool.server_pid(container), signal.SIGKILL)


class TestSshSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02  # the lockstep test below drives the same machine

    @pytest.fixture
    def sandbox_pool_factory(self, shared_sshd: LoopbackSshd) -> SandboxPoolFactory:
        @asynccontextmanager
        async def factory(shape: PoolShape) -> AsyncIterator[SandboxPool]:
            host = shared_sshd.host(servers=shape.containers, slots=shape.slots_per_container)
            pool_config = config(shared_sshd, host, acquire_timeout_s=shape.acquire_timeout_s)
            async with SshSandboxPool(pool_config) as pool:
                yield pool

        return factory

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return kill_server


def test_the_fake_and_the_ssh_pool_agree(shared_sshd: LoopbackSshd) -> None:
    shape = MachineShape(containers=2, slots_per_container=2)

    def fake() -> FakeSandboxPool:
        return FakeSandboxPool(containers=2, slots_per_container=2, acquire_timeout_s=30.0)

    def ssh() -> SshSandboxPool:
        return SshSandboxPool(config(shared_sshd, acquire_timeout_s=30.0))

    def crash(pool: SandboxPool, container: str) -> None:
        if isinstance(pool, FakeSandboxPool):
            pool.crash_container(container)
        else:
            kill_server(pool, container)

    run_pool_machine([fake, ssh], shape=shape, crash=crash, scale=0.02)


# ----------------------------------------------------------------------------- faults


@pytest.mark.anyio
async def test_the_host_dropped_mid_batch_answers_infra_error_then_comes_back(
    sshd: LoopbackSshd,
) -> None:
    async with SshSandboxPool(config(sshd)) as pool:
        servers = {name: pool.server_pid(name) for name in pool.container_names()}
        async with pool.lease("victim") as lease:
            container = lease.slot.container
            call = slot_call(lease, "bash", command="sleep 20; echo late", timeout_s=30.0)
            results = []

            async def run() -> None:
                results.extend(await pool.execute(container, [call]))

            started = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await anyio.sleep(1.0)  # the call is running on the host
                sshd.drop()
            answered = time.monotonic() - started - 1.0
            (result,) = results
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            assert answered < STALL_S + 2, answered
        # every server of the host left service, and the tether ended each on the host
        await wait_for(lambda: pool.statistics().free == 0, STALL_S + 5, "the host drained")
        assert pool.containers_lost == 2
        await wait_for(lambda: not any(map(running, servers.values())), 15, "servers ended")
        # the host comes back: replacements join after backoff, and serve
        sshd.restart()
        await wait_for(lambda: len(pool.container_names()) == 2, 60, "replacements joined")
        assert pool.restarts == 2
        async with pool.lease("after") as after:
            (ok,) = await pool.execute(
                after.slot.container, [slot_call(after, "bash", command="echo ok")]
            )
        assert ok.content == "ok\n"
        pool.check_valid()
    assert not any(running(pool_pid) for pool_pid in servers.values())


@pytest.mark.anyio
async def test_a_killed_connection_loses_its_server_only_and_it_is_replaced(
    sshd: LoopbackSshd,
) -> None:
    async with SshSandboxPool(config(sshd)) as pool:
        async with pool.lease("a") as first, pool.lease("b"):
            victim = first.slot.container
            server = pool.server_pid(victim)
            # the session of this server's connection: the sshd ancestor of its tether
            session = _session_of(sshd, server)
            os.kill(session, signal.SIGKILL)
            (result,) = await pool.execute(victim, [slot_call(first, "bash", command="echo x")])
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            await wait_for(lambda: not running(server), 15, "the orphaned server ended")
            others = [name for name in pool.container_names() if name != victim]
            assert others
        await wait_for(lambda: pool.restarts >= 1, 60, "a replacement joined")
        assert victim not in pool.container_names()
        pool.check_valid()


def _session_of(sshd: LoopbackSshd, pid: int) -> int:
    sessions = set(sshd.sessions())
    current = pid
    while current > 1:
        fields = stat_fields(current)
        assert fields is not None, f"process {current} ended before its session was found"
        current = int(fields[1])
        if current in sessions:
            return current
    raise AssertionError(f"no sshd session above {pid}")


@pytest.mark.anyio
async def test_a_stalled_connection_is_noticed_within_the_stall_deadline(
    sshd: LoopbackSshd,
) -> None:
    async with SshSandboxPool(config(sshd, restart_crashed=False)) as pool:
        servers = [pool.server_pid(name) for name in pool.container_names()]
        async with pool.lease("victim") as lease:
            sshd.stall()
            started = time.monotonic()
            (result,) = await pool.execute(
                lease.slot.container, [slot_call(lease, "bash", command="echo x")]
            )
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            assert time.monotonic() - started < STALL_S + 3
        await wait_for(lambda: pool.container_names() == [], STALL_S + 3, "servers lost")
        # on the host, the tether ends its server when the heartbeat stops coming
        await wait_for(lambda: not any(map(running, servers)), STALL_S + 10, "servers ended")


@pytest.mark.anyio
async def test_a_killed_server_is_replaced(sshd: LoopbackSshd) -> None:
    async with SshSandboxPool(config(sshd)) as pool:
        victim = pool.container_names()[0]
        kill_server(pool, victim)
        await wait_for(lambda: pool.restarts == 1, 30, "a replacement joined")
        assert victim not in pool.container_names()
        assert pool.statistics().free == 4


# ----------------------------------------------------------------------------- start check


@pytest.mark.anyio
async def test_an_unknown_host_key_is_refused_unless_the_host_opts_in(
    sshd: LoopbackSshd, tmp_path: Path
) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    refused = sshd.host(known_hosts=str(empty))
    with pytest.raises(SandboxUnavailable, match="host key is not in known_hosts"):
        async with SshSandboxPool(config(sshd, refused)):
            pass
    assert empty.read_text() == ""
    trusting = sshd.host(known_hosts=str(empty), accept_new_host_key=True)
    async with SshSandboxPool(config(sshd, trusting)) as pool:
        assert len(pool.container_names()) == 1
    assert f"[127.0.0.1]:{sshd.port}" in empty.read_text()
    # a changed key is refused even for a host that accepts new ones
    other = (sshd.directory / "user_key.pub").read_text().split()[:2]
    empty.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other)}\n")
    with pytest.raises(SandboxUnavailable, match="host key"):
        async with SshSandboxPool(config(sshd, trusting)):
            pass


@pytest.mark.anyio
async def test_the_start_check_names_what_a_host_lacks(sshd: LoopbackSshd) -> None:
    missing = sshd.host(python="/nonexistent/bin/python3", name="nopython")
    with pytest.raises(SandboxUnavailable, match=r"host nopython: no Python at /nonexistent"):
        async with SshSandboxPool(config(sshd, missing)):
            pass
    system = shutil.which("python3", path="/usr/bin")
    if system is not None:
        bare = sshd.host(python=system, name="bare")
        with pytest.raises(SandboxUnavailable, match=r"host bare: .*trajcore in /usr/bin/python3"):
            async with SshSandboxPool(config(sshd, bare)):
                pass


@pytest.mark.anyio
async def test_a_remote_dir_that_cannot_serve_is_named_at_the_start_check(
    sshd: LoopbackSshd,
) -> None:
    """A missing remote_dir, whatever the transport, and one too long for a Unix socket under
    transport 'unix', fail the start check naming remote_dir (not a remote traceback, not a
    server start that fails until the start timeout); 'auto' falls back to TCP there."""
    for transport in ("auto", "tcp", "unix"):
        host = sshd.host(remote_dir="/nonexistent/trajcore", transport=transport, name=transport)
        found = rf"host {transport}: remote_dir '/nonexistent/trajcore': it does not exist"
        with pytest.raises(SandboxUnavailable, match=found):
            async with SshSandboxPool(config(sshd, host)):
                pass
    deep = Path(sshd.remote_dir) / ("d" * 60) / ("e" * 60)  # (where slot uids may go)
    deep.mkdir(parents=True)
    unix = sshd.host(remote_dir=str(deep), transport="unix", name="deep", servers=1, slots=1)
    with pytest.raises(SandboxUnavailable, match=r"host deep: remote_dir .* cannot hold"):
        async with SshSandboxPool(config(sshd, unix)):
            pass
    auto = sshd.host(remote_dir=str(deep), transport="auto", name="deep", servers=1, slots=1)
    async with SshSandboxPool(config(sshd, auto)) as pool:
        assert pool.transport_of(auto) == "tcp"


@pytest.mark.anyio
async def test_a_start_removes_what_a_killed_pool_left_here_and_keeps_a_live_ones(
    sshd: LoopbackSshd,
) -> None:
    """A pool whose process was SIGKILLed never ran its close: its private directory (the
    forwarded sockets) stays in the temporary directory until the next pool starts."""
    dead_pid = (await anyio.run_process(["sh", "-c", "echo $$"])).stdout.decode().strip()
    parent = Path(tempfile.gettempdir())
    dead = parent / f"trajcore-ssh-{dead_pid}-left"
    alive = parent / f"trajcore-ssh-{os.getpid()}-alive"
    for path in (dead, alive):
        path.mkdir()
        (path / "0.sock").touch()
    try:
        host = sshd.host(servers=1, slots=1)
        async with SshSandboxPool(config(sshd, host)) as pool:
            assert pool.container_names()
        assert not dead.exists()
        assert alive.exists()
    finally:
        for path in (dead, alive):
            shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- transports


def _listening_inodes() -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    found: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


@pytest.mark.anyio
async def test_a_forwarded_server_opens_no_port_on_the_host(sshd: LoopbackSshd) -> None:
    async with SshSandboxPool(config(sshd)) as pool:
        assert pool.transport_of(pool.config.hosts[0]) == "unix"
        for name in pool.container_names():
            server = pool.server_pid(name)
            assert _socket_inodes(server), "the server holds its Unix socket"
            assert not _socket_inodes(server) & _listening_inodes()
        # control: the TCP transport does listen on the host's network
    async with SshSandboxPool(config(sshd, sshd.host(transport="tcp"))) as pool:
        (name,) = pool.container_names()
        assert _socket_inodes(pool.server_pid(name)) & _listening_inodes()


@pytest.mark.anyio
async def test_where_sshd_refuses_forwarding_tcp_with_the_token_serves(tmp_path: Path) -> None:
    with loopback_sshd(tmp_path, ["AllowStreamLocalForwarding no"]) as sshd:
        with pytest.raises(SandboxUnavailable, match="Unix-socket forwarding"):
            async with SshSandboxPool(config(sshd, sshd.host(transport="unix"))):
                pass
        async with SshSandboxPool(config(sshd, sshd.host())) as pool:
            assert pool.transport_of(pool.config.hosts[0]) == "tcp"
            async with pool.lease("t") as lease:
                (ok,) = await pool.execute(
                    lease.slot.container, [slot_call(lease, "bash", command="echo tcp")]
                )
                assert ok.content == "tcp\n"
                address = pool.client(lease.slot.container).base_url
            stranger = SlotServerClient.tcp(address, "not-the-token")
            try:
                with pytest.raises(SlotServerError, match="401"):
                    await stranger.health()
            finally:
                await stranger.aclose()


@pytest.mark.anyio
async def test_hosts_of_different_sizes_serve_their_own_slot_counts(sshd: LoopbackSshd) -> None:
    small = sshd.host(servers=1, slots=1, name="small")
    large = sshd.host(servers=2, slots=3, name="large")
    async with SshSandboxPool(config(sshd, small, large)) as pool:
        assert pool.statistics().free == 7
        hosts = sorted(pool.host_of(name).label for name in pool.container_names())
        assert hosts == ["large", "large", "small"]
        pool.check_valid()


# ----------------------------------------------------------------------------- the env's settings


@pytest.mark.anyio
async def test_hermes_ssh_backend_maps_to_the_ssh_pool_and_runs_a_call(
    shared_sshd: LoopbackSshd,
) -> None:
    from tests.unit.test_agent_env import QWEN
    from trajcore.entrypoints.atropos import pools
    from trajcore.entrypoints.atropos.config import AgentEnvConfig
    from trajcore.entrypoints.seed_settings import SeedSettingWarning

    host = shared_sshd.host()
    with pytest.warns(SeedSettingWarning, match="terminal_backend"):
        env_config = AgentEnvConfig(
            tokenizer_name=QWEN,
            terminal_backend="ssh",
            ssh_host=host.address,
            ssh_user=host.user,
            ssh_port=host.port,
            ssh_key=host.identity_file,
            ssh_known_hosts=host.known_hosts,
            ssh_python=host.python,
            local_containers=1,
            slots_per_container=2,
        )
    assert env_config.sandbox == "ssh"
    pool = pools.make_pool(env_config)
    assert isinstance(pool, SshSandboxPool)
    assert pool.config.hosts[0].identity_file == host.identity_file
    async with pool:
        async with pool.lease("hermes") as lease:
            (ok,) = await pool.execute(
                lease.slot.container, [slot_call(lease, "bash", command="echo hermes")]
            )
        assert ok.content == "hermes\n"
