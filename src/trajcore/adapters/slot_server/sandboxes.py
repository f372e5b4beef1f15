"""A slot's sandbox: its keeper, its lease's agent, and how both are started and ended.

Keeper and agent are one program, the slot helper (``slot_helper.c``; docs/sandbox.md, "The
slot helper and its protocol"). ``Sandboxes`` holds what the server learnt about the host at
start (the helper, the seccomp filter, the staged interpreter, the slot uids, the cgroup
hierarchy) and turns it into processes: a slot's keeper in a new bubblewrap sandbox on its first
lease, a lease from the keeper (one fork), or a bare agent where there is no bubblewrap. Ending a
lease or a sandbox kills its whole process group and cgroup and reaps it within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import attrs

from trajcore.adapters.slot_server.channel import (
    Agent,
    AgentEnded,
    AgentLost,
    AgentSilent,
    Keeper,
    reply_cap,
)
from trajcore.adapters.slot_server.idmaps import IdMaps, open_idmaps
from trajcore.adapters.slot_server.limits import (
    CgroupPlan,
    SlotCgroup,
    command_process_limit,
    rlimits_for,
    tmpfs_budget,
    ucounts_per_namespace,
)
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.seccomp import SeccompUnavailable, compile_filter
from trajcore.adapters.slot_server.slot_ids import shared_python, stage_python, unreachable
from trajcore.adapters.slot_server.slot_processes import (
    end_process,
    end_sessions,
    tmux_output,
)
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.domain.bwrap import (
    IMAGE_KEEPER_CAPABILITIES,
    KEEPER_CAPABILITIES,
    bwrap_argv,
    private_tmp_binds,
)
from trajcore.domain.isolation import SANDBOX_TMP, Bind, SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.kernel_masks import MASKED_PATHS, READ_ONLY_PATHS
from trajcore.domain.seccomp_rules import SECCOMP_RULES, UNCOUNTED_MEMORY_RULES

__all__ = [
    "HELPER_PATH",
    "SHELL_SOCKET",
    "Sandboxes",
    "name_process",
    "prepare_cgroups",
]

_log = logging.getLogger(__name__)

SHELL_SOCKET = "tmux.sock"
"""The persistent shell's tmux socket, in the lease's state directory (the helper's name)."""
_SANDBOX_STATE = "/tmp/.trajcore"  # noqa: S108 - inside the sandbox's private tmpfs
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where the compiled helper appears in every sandbox: a fixed path outside the private /tmp, so
# a helper cached anywhere on the host (under /tmp, under a private home) is bound the same way.
HELPER_PATH = "/run/trajcore/slot-helper"
# Where a keeper whose server has an image cache sees the slot's layer directory (read-write):
# a lease over an image keeps its writable layer there (``upper``, ``work``) and mounts its root
# at ``root`` (slot_helper.c, lease_main).
LAYER_PATH = "/run/trajcore/layer"
# How long a readied lease process may take to greet once it has its lease: its namespaces and
# root are made already (a few milliseconds of work; 0.3 s at the most seen under 256
# trajectories on 2 cores), so one silent past this is hung and a fresh process replaces it.
READIED_GREETING_S = 2.0
# The sandbox's first program waits for a line on its stdout (the read end of a pipe) while the
# server moves it into the slot's cgroup (a process started as the slot's uid cannot move itself
# there), then starts bubblewrap with stdout on /dev/null.
_CGROUP_GATE = 'read -r _ <&1 || exit 125; exec "$@" >/dev/null'


@attrs.define(eq=False)
class Sandboxes:
    """Starts and ends slots' sandboxes, keepers and agents as the host allows.

    Attributes:
        config: The server's config.
        sandboxed: Whether slots run in bubblewrap (else as bare agents).
        symlinks: The isolation's system paths that are symlinks on the host, and their targets.
        cgroups: The cgroup hierarchy slots get, or ``None`` (rlimits only).
        native: The slot helper (keeper and agent); ``None`` only until ``SlotRuntime.start``
            has found it (a server does not start without it). ``native_origin`` says where it
            came from (``"shipped"`` with this install, ``"built at start"``, or ``"given"``).
        uid_base: The first slot uid when slots run as their own uids (the server is root).
        python_binds: What every sandbox binds of the server's interpreter (its installation,
            or a staged copy of it bound at the same place), for the commands and verifiers
            that run Python in a slot (``RuntimeConfig.python``).
        seccomp: Every lease's seccomp filter (classic BPF), or ``None`` when none can be
            built (``seccomp_problem`` says why).
        uncounted_seccomp: The filter of leases whose memory no cgroup counts (``seccomp``
            plus ``UNCOUNTED_MEMORY_RULES``), built on first use.
        notes: What health's detail says about this host besides its problems.
        lowers: Makes idmapped clones of a lease's image and frozen layers (their owner shown
            as the slot's ids: the lease may change their files, each copied up into its own
            layer); ``None`` where the host cannot (the layers are mounted as they are,
            read-only to the lease, and ``notes`` says why).
    """

    config: RuntimeConfig
    sandboxed: bool = False
    symlinks: dict[str, str] = attrs.field(factory=dict)
    cgroups: CgroupPlan | None = None
    native: Path | None = None
    native_origin: str = ""
    uid_base: int | None = None
    python_binds: list[str | Bind] = attrs.field(factory=list)
    seccomp: bytes | None = None
    seccomp_problem: str | None = None
    uncounted_seccomp: bytes | None = None
    notes: list[str] = attrs.field(factory=list)
    lowers: IdMaps | None = None

    def ids(self, index: int) -> tuple[int, int] | None:
        """The host uid and gid slot ``index``'s sandbox runs as, or ``None``: the server's."""
        if self.uid_base is None:
            return None
        uid = self.uid_base + max(index, 0)
        return uid, uid

    def open_idmaps(self, owner: tuple[int, int] | None, slots: int, images: Path) -> IdMaps | None:
        """The idmaps of this server's idmapped clones (``idmaps.open_idmaps``: the user
        namespaces for ``owner``, the server's ids, and for the owner of ``images``, the image
        cache's trees, each mapped to every slot's ids, made now), kept as ``lowers`` when a
        lease's layers can be cloned, else ``notes`` says why not. Blocking."""
        ids = [found for index in range(slots) if (found := self.ids(index)) is not None]
        idmaps, problem = open_idmaps(self.helper(), owner, ids, images)
        if problem is None:
            self.lowers = idmaps
        else:
            self.notes.append(f"the image's files are read-only to leases: {problem}")
        return idmaps

    def own_workspace(self, slot: Slot) -> None:
        """Give the slot's workspace to the slot's uid (mode 0700: no other slot reads it)."""
        ids = self.ids(slot.index)
        if ids is not None:
            os.chown(slot.workspace.root, *ids)
            os.chmod(slot.workspace.root, 0o700)

    def own_layer(self, slot: Slot) -> None:
        """Make the slot's layer directory, the slot's own (mode 0700: no other slot reads it),
        and the next lease's empty layers in it (``ready_layer``)."""
        layer = self.layer_dir(slot)
        layer.mkdir(mode=0o700, parents=True, exist_ok=True)
        ids = self.ids(slot.index)
        if ids is not None:
            os.chown(layer, *ids)
        os.chmod(layer, 0o700)
        self.ready_layer(slot)

    def ready_layer(self, slot: Slot) -> None:
        """Make the next lease's empty ``upper`` and ``work`` in the slot's layer directory, the
        slot's own (mode 0755 under the server's umask, which its keeper has too: as the keeper
        makes them), off the lease's setup: the keeper finds them there (slot_helper.c,
        enter_image). Where one is there already, it is left."""
        ids = self.ids(slot.index)
        for name in ("upper", "work"):
            folder = self.layer_dir(slot) / name
            try:
                folder.mkdir(mode=0o755)
            except FileExistsError:
                continue
            if ids is not None:
                os.chown(folder, *ids)

    def layer_dir(self, slot: Slot) -> Path:
        """The host directory of the slot's writable layer (its leases over images)."""
        return self.config.root / "layers" / str(slot.index)

    def runtime_dir(self) -> Path:
        folder = self.config.root / "runtime"
        folder.mkdir(mode=0o755, exist_ok=True)
        return folder

    def stage_python(self) -> list[str | Bind]:
        """The binds that give a sandbox the server's interpreter: its installation where every
        slot uid can read it, else a staged copy of it bound at the same place."""
        python = Path(self.config.python)
        prefix = Path(os.path.realpath(sys.base_prefix))
        plain: list[str | Bind] = [str(prefix), str(python.parent)]
        if self.uid_base is None or unreachable(python) is None:
            return plain
        if not python.is_relative_to(prefix):
            return plain  # the probe reports that the slots cannot start it
        try:
            staged = shared_python(prefix, python)
        except OSError as error:
            self.notes.append(
                f"the sandbox's Python has its standard library only, copied ({error})"
            )
            staged = stage_python(prefix, python, self.runtime_dir() / "python")
        return [Bind(source=str(staged), dest=str(prefix))]

    def sandbox_argv(
        self, isolation: SlotIsolation, workspace: Path, command: list[str],
        keep_capabilities: Sequence[str] = (),
    ) -> list[str]:  # fmt: skip
        return bwrap_argv(
            isolation,
            workspace=str(workspace),
            command=command,
            bwrap=self.config.bwrap,
            host_symlinks=self.symlinks,
            rebind=self.rebind(),
            keep_capabilities=keep_capabilities,
        )

    def rebind(self) -> list[str | Bind]:
        paths = list(self.python_binds)
        if self.native is not None:
            paths.append(Bind(source=str(self.native), dest=HELPER_PATH))
        return paths

    def warm(self, slot: Slot) -> asyncio.Task[None] | None:
        """Start the slot's next lease now, off the lease's path: after a clean reset, while the
        slot is idle, the keeper makes the fresh namespaces the next lease's first call would
        otherwise wait for. Only where the keeper lives on (a read-only root); a failure is
        left for that call to meet (it starts the lease again and reports why)."""
        if (
            not self.sandboxed
            or not self.config.isolation.read_only_root
            or slot.keeper is None
            or not slot.keeper.alive()
            or slot.agent is not None
            or slot.warming is not None
        ):
            return None

        async def start() -> None:
            with contextlib.suppress(AgentLost):
                slot.warmed = await self.lease_agent(slot, started=time.monotonic())

        return slot.warm_with(start())

    async def ready_lease(self, slot: Slot) -> None:
        """Have the slot's idle keeper ready its next lease: clone the lease's first process
        and make its namespaces now, so that a lease request only hands it the request
        (slot_helper.c, "readied leases"). Only between a reset that proved the slot clean (or
        a keeper's start) and the next lease: the process is made while no tenant's process
        is left, and the next lease request consumes it. Raises ``AgentLost``."""
        keeper = slot.keeper
        if keeper is not None and keeper.alive() and slot.agent is None:
            await keeper.ask("ready", self.config.start_timeout_s)

    async def wait_warm(self, slot: Slot) -> None:
        """Wait for the slot's warming lease to be ready or to fail (never cancels it: a lease
        request cut short would leave the keeper's answer for the next request)."""
        warming = slot.warming
        if warming is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(warming)
            if not warming.done():
                raise asyncio.CancelledError

    async def ensure_agent(self, slot: Slot) -> Agent:
        """The slot's agent: the live one, a warmed one (``sandbox_start_s`` is then how long
        its first call waited for it), or a new lease."""
        started = time.monotonic()
        await self.wait_warm(slot)
        agent = slot.agent
        wanted = None if slot.image is None else slot.lease_op()
        if agent is not None and slot.agent_root != wanted:
            await self.stop_agent(slot)  # a lease warmed over another root than this one's
            agent = None
        if agent is not None and agent.alive():
            if slot.warmed is agent:
                slot.warmed = None
                slot.sandbox_start_s = time.monotonic() - started
            return agent
        if slot.agent is not None:
            await self.stop_agent(slot)
        started = time.monotonic()
        if self.sandboxed:
            agent = await self.lease_agent(slot, started=started)
        else:
            agent = await self.bare_agent(slot, started=started)
        slot.sandbox_start_s = time.monotonic() - started
        return agent

    def memory_counted(self, slot: Slot) -> bool:
        """Whether a cgroup counts the slot's memory (else rlimits and the tmpfs budget bound
        it, and memory files are refused)."""
        return (
            slot.cgroup is not None
            and self.cgroups is not None
            and self.cgroups.memory_parent is not None
        )

    def command_nproc(self, slot: Slot, *, sandboxed: bool) -> int | None:
        """The ``RLIMIT_NPROC`` of the slot's commands other than its hooks' (``None``: no
        reserve). A bare agent runs as the server's user (root under a root server, whom
        RLIMIT_NPROC never binds): only a sandboxed lease's count is its slot's own."""
        own_count = sandboxed and (self.ids(slot.index) is not None or ucounts_per_namespace())
        return command_process_limit(
            self.config.isolation, own_count=own_count, cgroup_pids=slot.cgroup is not None
        )

    def agent_config(self, slot: Slot, *, sandboxed: bool) -> dict[str, JSON]:
        isolation = self.config.isolation
        budget = tmpfs_budget(isolation) if sandboxed else None
        limits: dict[str, JSON] = dict(
            rlimits_for(
                isolation,
                cgroup_pids=slot.cgroup is not None,
                cgroup_memory=self.memory_counted(slot),
                tmpfs_bytes=0 if budget is None else budget.size_bytes,
            )
        )
        commands = self.command_nproc(slot, sandboxed=sandboxed)
        if sandboxed:
            tmpfs = None if budget is None else budget.options()
            return {"workspace": isolation.workspace_path, "state_dir": _SANDBOX_STATE,
                    "limits": limits, "tmpfs": tmpfs, "command_nproc": commands}  # fmt: skip
        slot.state_dir.mkdir(parents=True, exist_ok=True)
        # ``bare`` keeps commands in the agent's session: ending the lease ends that session
        return {"workspace": str(slot.workspace.root), "state_dir": str(slot.state_dir),
                "limits": limits, "command_nproc": commands}  # fmt: skip

    async def lease_filter(self, slot: Slot) -> bytes | None:
        """The seccomp filter of the slot's leases: ``seccomp``, with ``UNCOUNTED_MEMORY_RULES``
        added where the slot has a memory limit that no cgroup counts. Raises ``AgentLost``
        when that filter cannot be built (never a lease with a weaker one)."""
        if (
            self.seccomp is None
            or self.memory_counted(slot)
            or self.config.isolation.memory_bytes is None
        ):
            return self.seccomp
        if self.uncounted_seccomp is None:
            rules = (*SECCOMP_RULES, *UNCOUNTED_MEMORY_RULES)
            try:
                self.uncounted_seccomp = await asyncio.to_thread(compile_filter, rules)
            except SeccompUnavailable as error:
                raise AgentLost(f"cannot build the leases' seccomp filter: {error}") from None
        return self.uncounted_seccomp

    def environment(self, workspace: str, tmp: str) -> dict[str, str]:
        return {
            "PATH": _PATH,
            "HOME": workspace,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "TMPDIR": tmp,
        }

    def create_cgroup(self, slot: Slot) -> None:
        if slot.cgroup is not None:
            try:
                slot.cgroup.create(self.config.isolation)
            except OSError as error:
                raise AgentLost(f"cannot create the slot's cgroup: {error}") from None

    def helper(self) -> Path:
        """The slot helper's path on this host. Raises ``AgentLost`` before the server has
        found it (``SlotRuntime.start`` does, or refuses to start)."""
        if self.native is None:
            raise AgentLost("the slot helper is not set up (the server has not started)")
        return self.native

    async def bare_agent(self, slot: Slot, *, started: float) -> Agent:
        """A lease's agent (``slot-helper bare``) as its own process, outside any sandbox (no
        bubblewrap here), serving on a socket that is its stdin."""
        self.create_cgroup(slot)
        config = self.agent_config(slot, sandboxed=False)
        argv = [str(self.helper()), "bare", "--workspace", str(config["workspace"]),
                "--state-dir", str(config["state_dir"])]  # fmt: skip
        for name, value in cast("dict[str, int]", config["limits"]).items():
            argv += ["--limit", name, str(value)]
        if config["command_nproc"] is not None:
            argv += ["--command-nproc", str(config["command_nproc"])]
        if slot.cgroup is not None:
            argv = slot.cgroup.enter_prefix() + argv
        environment = self.environment(str(config["workspace"]), str(config["state_dir"]))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=theirs.fileno(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
                start_new_session=True,
            )
        except OSError as error:
            ours.close()
            raise AgentLost(f"cannot start the slot's agent: {error}") from None
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        agent = Agent(
            reader=reader, writer=writer, sandboxed=False, started_s=started,
            pid=process.pid, process=process, cap=reply_cap(self.config.isolation),
        )  # fmt: skip
        slot.agent = agent
        try:
            await agent.greeting(self.config.start_timeout_s)
        except AgentLost as error:
            detail = await _stderr_of(process)
            await self.stop_agent(slot)
            raise AgentLost(detail or str(error)) from None
        return agent

    async def ensure_keeper(self, slot: Slot) -> Keeper:
        """The slot's keeper, started (in a new sandbox) when there is none or it died."""
        if slot.keeper is not None and slot.keeper.alive():
            return slot.keeper
        await self.stop_keeper(slot)
        # Off the event loop, as the keeper's layer folder and its cgroup move below: each
        # may wait on the kernel (a journal, an RCU grace period) for tens to hundreds of
        # milliseconds when a group's forks reset at once, every other slot's calls with it.
        await asyncio.to_thread(self.create_cgroup, slot)
        isolation = self.config.isolation
        config = self.agent_config(slot, sandboxed=True)
        carry = private_tmp_binds(isolation, rebind=self.rebind())
        program = await self.lease_filter(slot)
        self.helper()
        inner = [HELPER_PATH, "keep", "--workspace", isolation.workspace_path,
                 "--state-dir", _SANDBOX_STATE, "--tmp", SANDBOX_TMP]  # fmt: skip
        for name, value in cast("dict[str, int]", config["limits"]).items():
            inner += ["--limit", name, str(value)]
        if config["command_nproc"] is not None:
            inner += ["--command-nproc", str(config["command_nproc"])]
        for path, writable in carry:
            inner += ["--carry-rw" if writable else "--carry-ro", path]
        for path in MASKED_PATHS:
            inner += ["--mask", path]
        for path in READ_ONLY_PATHS:
            inner += ["--read-only", path]
        if config["tmpfs"] is not None:
            inner += ["--tmpfs-options", str(config["tmpfs"])]
        if not isolation.allow_network:
            inner.append("--own-network")
        if program is not None:
            inner += ["--seccomp", program.hex()]
        keep = KEEPER_CAPABILITIES
        cache = self.config.image_cache
        if cache is not None:  # leases over images: the cache read-only, the layer read-write
            await asyncio.to_thread(self.own_layer, slot)
            layer = Bind(source=str(self.layer_dir(slot)), dest=LAYER_PATH, writable=True)
            frozen = str(self.config.root / "snapshots")  # snapshots' layers (snapshots.py)
            binds = (
                *isolation.extra_binds, Bind(source=str(cache), dest=str(cache)), layer,
                Bind(source=frozen, dest=frozen),
            )  # fmt: skip
            isolation = attrs.evolve(isolation, extra_binds=binds)
            keep = IMAGE_KEEPER_CAPABILITIES
        argv = self.sandbox_argv(isolation, slot.workspace.root, inner, keep_capabilities=keep)
        # The keeper is the sandbox's first process (pid 1 of its pid namespace): bubblewrap's
        # own reaper would only wait for it (each lease is pid 1 of a namespace of its own, the
        # reaper of what it starts), and costs an idle slot about 0.1 MiB PSS. The keeper's end
        # ends the namespace, every lease with it, as the reaper's did. (bubblewrap 0.4 and
        # newer; the sandbox needs 0.8 for --disable-userns.)
        argv.insert(1, "--as-pid-1")
        keeper = await self.spawn_keeper(slot, argv)
        try:
            await keeper.receive(self.config.start_timeout_s)
        except AgentLost as error:
            detail = await _stderr_of(keeper.process)
            await self.stop_keeper(slot)
            raise AgentLost(detail or str(error)) from None
        if slot.cgroup is not None:
            keeper.pids = frozenset(await asyncio.to_thread(slot.cgroup.pids))
        return keeper

    async def spawn_keeper(self, slot: Slot, argv: list[str]) -> Keeper:
        """Start ``argv`` (the slot's bubblewrap) as the slot's uid (the helper's ``--ids``
        drops to it in the child), inside its cgroup."""
        isolation = self.config.isolation
        ids = self.ids(slot.index)
        gate: tuple[int, int] | None = None
        if slot.cgroup is not None and ids is None:
            argv = slot.cgroup.enter_prefix() + argv
        elif slot.cgroup is not None:
            gate = os.pipe()
            argv = ["/bin/sh", "-c", _CGROUP_GATE, "slot-cgroup", *argv]
        if ids is not None:
            # The helper drops to the slot's ids in the child and checks that they took (docs/
            # sandbox.md, "The slot helper and its protocol"): given a user or a group, Python's
            # subprocess forks the whole server on the event loop; without, it vforks.
            argv = [str(self.helper()), "--ids", f"{ids[0]}:{ids[1]}", *argv]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=theirs.fileno(),
                stdout=asyncio.subprocess.DEVNULL if gate is None else gate[0],
                stderr=asyncio.subprocess.PIPE,
                env=self.environment(isolation.workspace_path, SANDBOX_TMP),
                start_new_session=True,
            )
        except OSError as error:
            ours.close()
            raise AgentLost(f"cannot start the slot's sandbox: {error}") from None
        except BaseException:  # cancelled (a server closing while a keeper starts)
            ours.close()
            raise
        finally:
            theirs.close()
            if gate is not None:
                os.close(gate[0])
        keeper = Keeper(process=process, control=ours)
        slot.keeper = keeper
        if gate is not None:
            assert slot.cgroup is not None
            try:
                await asyncio.to_thread(slot.cgroup.enter, process.pid)
                os.write(gate[1], b"go\n")
            except OSError as error:
                await self.stop_keeper(slot)
                raise AgentLost(f"cannot move the sandbox into its cgroup: {error}") from None
            finally:
                os.close(gate[1])
        return keeper

    async def lease_agent(self, slot: Slot, *, started: float) -> Agent:
        """A new lease from the slot's keeper: fresh namespaces, its own agent and channel.

        Where the keeper gave the lease its readied process (``"readied": true``) and the
        lease's channel ends before the greeting, that process died while it waited (killed,
        out of memory); where it does not greet within ``READIED_GREETING_S`` (or the start
        limit, if shorter), it hung. Nothing of the lease ran in it, so it is ended and the
        lease is asked for again at once and gets a freshly cloned process with the same
        isolation (the keeper has no readied one left). Each such event is logged as a warning
        naming the slot and counted (``Slot.readied_lost``). Raises ``AgentLost``, naming both
        failures when the fresh lease fails too."""
        try:
            return await self._lease_once(slot, started=started)
        except _ReadiedEnded as lost:
            slot.readied_lost += 1
            _log.warning(
                "slot %d: its readied lease process (pid %s in its sandbox) died or hung "
                "before the lease's greeting (%s); starting the lease in a fresh process",
                slot.index, lost.pid, lost,
            )  # fmt: skip
            try:
                return await self._lease_once(slot, started=started)
            except AgentLost as again:
                raise AgentLost(
                    f"the slot's readied lease process (pid {lost.pid}) died or hung before "
                    f"its greeting ({lost}), and a fresh lease failed too: {again}"
                ) from None

    async def _lease_once(self, slot: Slot, *, started: float) -> Agent:
        """Ask the keeper for a lease and wait for its agent's greeting (``lease_agent``).
        Raises ``_ReadiedEnded`` when a readied process took it and died or hung before
        greeting, else ``AgentLost``. A failed lease is ended here, never through
        ``stop_agent``, which waits for the slot's warming lease: this may be that lease."""
        oversized = slot.lease_op_problem()  # never sent: the keeper would refuse it whole
        if oversized is not None:
            raise AgentLost(oversized)
        keeper = await self.ensure_keeper(slot)
        op = slot.lease_op()
        root = None if slot.image is None else op
        lowers, ids, layers = self.lowers, self.ids(slot.index), slot.layers()
        clones = slot.take_clones(layers)
        if clones is None:
            clones = [] if lowers is None else await lowers.lease_clones(ids, layers)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            reply = await keeper.ask(op, self.config.start_timeout_s, theirs, clones)
        except AgentLost:
            ours.close()
            await self.stop_keeper(slot)
            raise
        finally:
            theirs.close()
            for fd in clones:
                os.close(fd)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        pid = reply.get("pid")
        agent = Agent(
            reader=reader, writer=writer, sandboxed=True, started_s=started,
            pid=pid if isinstance(pid, int) else None, cap=reply_cap(self.config.isolation),
        )  # fmt: skip
        slot.agent, slot.agent_root = agent, root
        readied = reply.get("readied") is True
        limit = self.config.start_timeout_s
        try:
            await agent.greeting(min(limit, READIED_GREETING_S) if readied else limit)
        except AgentLost as failed:
            await self._end_agent(slot)
            if readied and isinstance(failed, AgentEnded | AgentSilent):
                raise _ReadiedEnded(str(failed), pid=agent.pid) from None
            raise
        return agent

    async def stop_agent(self, slot: Slot) -> None:
        """End the slot's lease: its agent and every process it started (a warming lease once
        it is ready)."""
        await self.wait_warm(slot)
        await self._end_agent(slot)

    async def _end_agent(self, slot: Slot) -> None:
        """``stop_agent`` without waiting for the slot's warming lease."""
        agent, slot.agent, slot.warmed = slot.agent, None, None
        if agent is None:
            if slot.keeper is None and slot.cgroup is not None:
                slot.cgroup.kill_all()  # what a bare agent left behind
            if slot.keeper is None:
                await _end_shell(slot)
            return
        agent.close_channel()
        if agent.process is not None:
            await end_process(agent.process, slot.cgroup)
            await end_sessions({agent.process.pid})  # what its commands left running
            await _end_shell(slot)
            return
        keeper = slot.keeper
        if keeper is not None:
            try:
                await keeper.ask("end", self.config.start_timeout_s)
            except AgentLost:
                await self.stop_keeper(slot)

    async def stop_keeper(self, slot: Slot) -> None:
        """Kill the slot's sandbox (keeper, lease and all) and reap it."""
        keeper, slot.keeper = slot.keeper, None
        if keeper is None:
            return
        await end_process(keeper.process, slot.cgroup)
        keeper.control.close()


class _ReadiedEnded(AgentLost):
    """A lease's readied process died or hung before its greeting (``Sandboxes.lease_agent``)."""

    def __init__(self, why: str, *, pid: int | None) -> None:
        super().__init__(why)
        self.pid = pid


def name_process(name: str) -> None:
    """Set this process's name as ``ps`` and ``top`` show it (at most 15 bytes kept)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "wb") as comm:
        comm.write(name.encode()[:15])


def prepare_cgroups(cgroups: list[SlotCgroup], isolation: SlotIsolation) -> None:
    for cgroup in cgroups:
        with contextlib.suppress(OSError):
            cgroup.create(isolation)


async def _end_shell(slot: Slot) -> None:
    """End the persistent shell a bare agent started, and everything its shell runs.

    Its tmux server is a daemon in a session of its own: ending the agent's session does not
    end it, and without a cgroup nothing else would, so the next lease of the slot would share
    the host with the last one's shell and jobs. Each pane's shell leads a session of its own;
    every process in those sessions is killed (``nohup`` and ``disown`` jobs included, which a
    hang-up would miss), then the server. A process that left its session with ``setsid`` is
    beyond reach without a cgroup (docs/sandbox.md, "Without cgroups").
    """
    shell_socket = slot.state_dir / SHELL_SOCKET
    tmux = shutil.which("tmux", path=_PATH)  # as the bare agent found it
    if tmux is None or not shell_socket.is_socket():
        return
    panes = await tmux_output(tmux, shell_socket, "list-panes", "-a", "-F", "#{pane_pid}")
    await end_sessions({int(word) for word in panes.split() if word.isdigit()})
    await tmux_output(tmux, shell_socket, "kill-server")


async def _stderr_of(process: asyncio.subprocess.Process) -> str:
    if process.stderr is None:
        return ""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(1):
            return (await process.stderr.read(4096)).decode("utf-8", "replace").strip()
    return ""
