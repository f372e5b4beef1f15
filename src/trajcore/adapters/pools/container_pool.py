"""``ContainerSandboxPool``: K slot-server containers on this machine, through podman or docker.

The pool core (``pool_core``) over a supervised source whose servers are containers of the
slot-server image (``Containerfile``; ``./dev image`` builds ``localhost/trajcore/slot-server``)
run by the engine's command line. Each container serves ``slots_per_container`` slots on TCP,
published on a random loopback port, with a bearer token the pool draws at start and mounts
read-only into every container. Leasing, batches, resets and the fault rules are the local
pool's: a container that fails a batch or a reset is killed and replaced, one that dies on its
own (``podman kill``, an out-of-memory kill) is replaced the same way, and its leases turn stale.

Containers are named ``{name_prefix}-{index}-{generation}`` and labelled
``trajcore.pool={name_prefix}`` and ``trajcore.owner=host/pidns/pid/start/instance`` (the pool's
that runs the pool, and which of its pools). A container outlives a process killed without
its close (SIGKILL, an OOM kill of the env): the pool's guard process (``container_guard``)
sees the env end and removes that pool's containers at once; and on start the pool removes
every container labelled ``trajcore.pool`` whose owner process has ended on this host,
whatever its prefix, and those of its own prefix without an owner label; it refuses
(``ConfigError`` on ``name_prefix``) a prefix whose containers a running pool holds, rather
than remove them. Other containers are never touched, and after ``run`` each container is
named by its ID. The bearer token lies in a private temporary folder named after the process
(``trajcore-containers-PID.START-*``); a start also removes those whose process has ended.
``aclose`` stops and removes every container it started, including the dead ones. The default
prefix is random, so two pools never share one.

What the sandbox needs from the engine (the options ``engine_options`` defaults to): ``/proc``
unmasked (podman ``--security-opt unmask=ALL``, docker ``--security-opt
systempaths=unconfined``) so bubblewrap can mount a fresh ``/proc``; the engine's seccomp profile
off (``--security-opt seccomp=unconfined``; every lease gets trajcore's own filter); explicit
``--ulimit nofile=..,nproc=..`` within this host's hard limits; and with podman, ``--runtime runc``
where runc is installed (crun refuses hybrid cgroup hosts). No ``--privileged``.

Every wait is bounded: each engine command (``engine_timeout_s``), a container's start and
health (``start_timeout_s``), resets, leases, and stopping (``stop_timeout_s`` of grace, then a
forced removal). The engine's commands run in a session of their own: a terminal's Ctrl-C
is the env's to handle (it closes the pool); it never ends a command under the pool (a ``wait``
that ended so would read as a container that ended, replaced while the pool closes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import anyio
import attrs

from trajcore.adapters.pools.container_guard import (
    LABEL,
    OWNER_LABEL,
    guard_argv,
    remove_containers,
)
from trajcore.adapters.pools.guard_process import GuardProcess
from trajcore.adapters.pools.pool_core import Endpoint
from trajcore.adapters.pools.reconciled import composed_settings, part
from trajcore.adapters.pools.server_processes import abandon_each, run_command
from trajcore.adapters.pools.supervision import (
    SupervisedPool,
    SupervisedPoolConfig,
    hold_slot_uids,
)
from trajcore.domain.converters import command_words
from trajcore.domain.errors import ConfigError, SandboxUnavailable, SlotServerError
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.validators import (
    nonempty_text,
    optional_text,
    positive_seconds,
)

__all__ = [
    "DEFAULT_IMAGE",
    "ContainerPoolConfig",
    "ContainerSandboxPool",
    "abandon_container_pools",
    "default_engine_options",
    "find_engine",
]

DEFAULT_IMAGE = "localhost/trajcore/slot-server:latest"
_log = logging.getLogger(__name__)
_PORT = 8765  # where the server listens inside its container
_TOKEN_FILE_IN_CONTAINER = "/run/trajcore/token"  # noqa: S105 - a path, not a secret
_CACHE_IN_CONTAINER = "/var/cache/trajcore/images"  # the image cache's mount point
_SLOTS_IN_CONTAINER = "/srv/slots"  # the server's --root (the image's ENTRYPOINT)
_TOKEN_FOLDERS = "trajcore-containers-"  # noqa: S105 - the token folders' names, not a secret
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")
# what podman ("image not known") and docker ("No such image") say of an image they lack
_MISSING_IMAGE = re.compile(r"image not known|no such image|no such object", re.IGNORECASE)
# ... and of a container that is gone already
_MISSING_CONTAINER = re.compile(r"no such container|no container with", re.IGNORECASE)


def find_engine() -> str | None:
    """``podman`` when installed, else ``docker``, else ``None``."""
    for engine in ("podman", "docker"):
        if shutil.which(engine) is not None:
            return engine
    return None


def default_engine_options(engine: str) -> tuple[str, ...]:
    """The ``run`` options the sandbox needs on this host (see the module docstring)."""
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nofile = 65536 if nofile == resource.RLIM_INFINITY else nofile
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    limits = ("--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}")
    if Path(engine).name == "podman":
        runtime = ("--runtime", "runc") if shutil.which("runc") is not None else ()
        masks = ("--security-opt", "unmask=ALL")
    else:
        runtime = ()
        masks = ("--security-opt", "systempaths=unconfined")
    return (*runtime, *limits, *masks, "--security-opt", "seccomp=unconfined")


def _prefix(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and (not isinstance(value, str) or _PREFIX.fullmatch(value) is None):
        raise ConfigError(
            attribute.name,
            f"must be None or a container name prefix ([A-Za-z0-9][A-Za-z0-9_.-]*, at most 41 "
            f"characters), got {value!r}",
        )


def _options(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    return command_words(value, field="engine_options")


@composed_settings
@attrs.frozen(kw_only=True)
class ContainerPoolConfig(SupervisedPoolConfig):
    """How the container pool runs its slot servers: ``SupervisedPoolConfig``'s settings and
    these.

    Attributes:
        server: The slot servers' settings (``SlotServerSettings``; by default 60 s for a
            container's start, up to health).
        image: The slot-server image (``./dev image`` builds the default).
        engine: ``podman``, ``docker`` or a path to one; ``None``: podman if installed, else
            docker.
        engine_options: ``run`` options in place of ``default_engine_options(engine)``, all
            of them: to add a limit (``--memory 8g``, ``--pids-limit``), start from those.
        name_prefix: The containers' names and label; ``None``: ``trajcore-<random>``.
        engine_timeout_s: Longest one engine command (run, port, rm, ...) may take.
        environment_dirs: Host directories mounted read-only at the same path in every
            container, so that the ``oci:``, ``oci-archive:``, ``docker-archive:`` and
            ``directory:`` environments under them resolve there (comma-separated text is
            accepted); they are also the folders ``directory:`` trees may come from
            (``SupervisedPoolConfig.environment_dirs``). ``image_cache_dir`` is mounted at
            ``/var/cache/trajcore/images``, and the slots' writable layers live on a volume of
            each container's own (docs/deploy.md, "Task environments in containers").
    """

    server: SlotServerSettings = part(
        SlotServerSettings, lambda: SlotServerSettings(start_timeout_s=60.0)
    )
    image: str = attrs.field(default=DEFAULT_IMAGE, validator=nonempty_text)
    engine: str | None = attrs.field(default=None, validator=optional_text)
    engine_options: tuple[str, ...] | None = attrs.field(default=None, converter=_options)
    name_prefix: str | None = attrs.field(default=None, validator=_prefix)
    stop_timeout_s: float = attrs.field(default=10.0, validator=positive_seconds)
    engine_timeout_s: float = attrs.field(default=60.0, validator=positive_seconds)

    def server_args(self, index: int) -> list[str]:
        """The slot server's arguments (after the image's entrypoint) for container ``index``."""
        return [
            "--slots", str(self.server.slots_per_container), "--listen", f"0.0.0.0:{_PORT}",
            "--token-file", _TOKEN_FILE_IN_CONTAINER, *isolation_argv(self.server_isolation(index)),
            "--slot-uid-lock", "none", *self.image_cache_argv(Path(_CACHE_IN_CONTAINER)),
        ]  # fmt: skip

    def volume_args(self) -> list[str]:
        """The ``run`` options of the environments: the image cache, the slots' layers on a
        volume of their own (an overlay's upper layer cannot sit on the container's own
        overlay root), and ``environment_dirs`` read-only."""
        if self.image_cache_dir is None:
            return []
        args = ["--volume", f"{self.image_cache_dir}:{_CACHE_IN_CONTAINER}"]
        args += ["--mount", f"type=volume,destination={_SLOTS_IN_CONTAINER}"]
        for folder in self.environment_dirs:
            args += ["--volume", f"{folder}:{folder}:ro"]
        return args


# ============================================================================ the engine


def _write_token(folder: Path, token: str) -> Path:
    """The token file: its directory is the owner's alone (``mkdtemp``); the file itself is
    readable by the container's server, whichever uid the engine maps it to."""
    path = folder / "token"
    path.write_text(token, encoding="utf-8")
    path.chmod(0o644)
    return path


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (``/proc``'s clock ticks since boot), to tell it from a
    later process of the same pid; ``None`` when there is no such process, ``"-"`` when this
    host has no ``/proc`` (then only whether the pid exists counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "-"
    except OSError:
        return "-"
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else "-"


def _process_ended(pid: int, start: str) -> bool:
    """Whether process ``pid`` that started at ``start`` (``_process_start``) has ended."""
    now = _process_start(pid)
    return now is None or (start not in ("-", "") and now not in ("-", start))


def _token_folder_prefix() -> str:
    """The token folder's name up to its random end: ``trajcore-containers-PID.START-``."""
    pid = os.getpid()
    return f"{_TOKEN_FOLDERS}{pid}.{_process_start(pid) or '-'}-"


def _remove_ended_token_folders() -> None:
    """Remove the token folders of processes that ended without their pools' close (killed):
    each names its process (``_token_folder_prefix``); others' are left, and so are folders
    this user cannot remove."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_TOKEN_FOLDERS}*.*-*"):
        pid_text, _, start = (
            folder.name.removeprefix(_TOKEN_FOLDERS).split("-", 1)[0].partition(".")
        )
        ours = pid_text.isdigit() and int(pid_text) == os.getpid()
        if pid_text.isdigit() and not ours and _process_ended(int(pid_text), start):
            shutil.rmtree(folder, ignore_errors=True)


def _pid_namespace() -> str:
    """This process's pid namespace (its inode), ``-`` where ``/proc`` does not say: a pid
    means a process only within its namespace (an env in a container of its own, sharing the
    host's engine and name)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


def _owner_value(instance: str) -> str:
    """The owner label of this process's pool ``instance``:
    ``host/pid-namespace/pid/start/instance``."""
    pid = os.getpid()
    start = _process_start(pid) or "-"
    return f"{socket.gethostname()}/{_pid_namespace()}/{pid}/{start}/{instance}"


def _owner_state(owner: str) -> str:
    """``"ended"``: the pool behind ``owner`` is gone (its process ended on this host, in this
    pid namespace, or it is a closed pool of this process); ``"running"``: it runs here;
    ``"unknown"``: another host's or another pid namespace's, where its pid says nothing (or no
    owner label: a container of an older trajcore)."""
    host, space, pid_text, start, instance = ([*owner.split("/", 4), "", "", "", ""])[:5]
    here = _pid_namespace()
    if host != socket.gethostname() or not pid_text.isdigit() or space in ("-", "") or here == "-":
        return "unknown"
    if space != here:
        return "unknown"
    pid = int(pid_text)
    if _process_ended(pid, start):
        return "ended"
    if pid == os.getpid():
        return "running" if instance in {engine.instance for engine in _OPEN} else "ended"
    return "running"


@attrs.frozen
class _Container:
    """The handle of one started container: its engine name, and its ID once it runs (every
    later command names it by ID, so no other container of the same name is ever touched)."""

    name: str
    id: str = ""

    @property
    def ref(self) -> str:
        return self.id or self.name


@attrs.define(eq=False)
class _EngineContainers:
    """The ``Launcher`` of the container pool: one engine command line per step."""

    config: ContainerPoolConfig
    prefix: str
    engine: str = ""
    options: tuple[str, ...] = ()
    _token: str = attrs.field(init=False, repr=False, factory=lambda: secrets.token_urlsafe(32))
    _token_file: Path | None = attrs.field(init=False, default=None)
    _starts: int = attrs.field(init=False, default=0)
    instance: str = attrs.field(init=False, factory=lambda: secrets.token_hex(6))
    guard: GuardProcess = attrs.field(init=False, factory=GuardProcess)

    async def _run(self, *args: str, check: bool = True, extra_s: float = 0.0) -> str:
        """``engine args``, bounded by ``engine_timeout_s`` (plus ``extra_s``); its stdout.

        Raises ``SlotServerError`` when it fails (with ``check``) or does not finish in time
        (always; the engine's command is killed then)."""
        limit = self.config.engine_timeout_s + extra_s
        with anyio.move_on_after(limit) as deadline:
            # a session of its own: a Ctrl-C to the terminal's group is the env's to handle
            # (it closes the pool), not a signal that fails the engine's command under it
            done = await run_command([self.engine, *args], start_new_session=True)
        if deadline.cancelled_caught:
            raise SlotServerError(
                f"{self.engine} {args[0]} did not finish within {limit:g} s (engine_timeout_s)"
            )
        if check and done.returncode != 0:
            error = done.stderr.decode("utf-8", "replace").strip()[-2000:]
            raise SlotServerError(f"{self.engine} {args[0]} failed ({done.returncode}): {error}")
        return done.stdout.decode("utf-8", "replace").strip()

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        self.config, _ = hold_slot_uids(self.config, stack)  # a rootful engine maps uids as is
        if os.geteuid() != 0:
            _log.warning(
                "the container pool does not run as root, so it reserves no slot uids on this "
                "host: a rootful engine (docker, or podman run by root) runs its slots as host "
                "uids %d and up, which another pool on this host may also use; give each env "
                "process its own range (slot_uid_base)",
                self.config.server.isolation.slot_uid_base,
            )
        engine = self.config.engine or find_engine()
        if engine is None or shutil.which(engine) is None:
            raise SandboxUnavailable(
                f"no container engine: {engine or 'neither podman nor docker'} is not installed"
            )
        self.engine = engine
        configured = self.config.engine_options
        self.options = default_engine_options(engine) if configured is None else configured
        try:
            await self._run("image", "inspect", "--format", "{{.Id}}", self.config.image)
        except SlotServerError as error:
            if _MISSING_IMAGE.search(str(error)) is None:  # the engine itself failed: say how
                raise SandboxUnavailable(
                    f"the container engine {engine} cannot be used: {error}"
                ) from None
            raise SandboxUnavailable(
                f"the image {self.config.image} is not there ({engine}); ./dev image builds it"
            ) from None
        await self._clear_leftovers()
        _remove_ended_token_folders()
        folder = Path(tempfile.mkdtemp(prefix=_token_folder_prefix()))
        try:
            await self.guard.start(
                guard_argv(
                    engine=engine, prefix=self.prefix, owner=_owner_value(self.instance),
                    token_folder=folder,
                    deadline_s=self.config.engine_timeout_s + self.config.stop_timeout_s,
                )
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        stack.push_async_callback(self.guard.release)  # last: once every container is gone
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        self._token_file = _write_token(folder, self._token)
        _OPEN.add(self)
        stack.callback(_OPEN.discard, self)

    def abandon(self, grace_s: float) -> None:
        """Remove every container of this pool's label and its token folder, synchronously,
        each engine command bounded by ``grace_s`` (see ``abandon_container_pools``)."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = subprocess.run(
                [self.engine, "ps", "--all", "--quiet", "--filter", f"label={LABEL}={self.prefix}"],
                capture_output=True, text=True, timeout=grace_s, check=False,
            )  # fmt: skip
            remove_containers(self.engine, listed.stdout.split(), time.monotonic() + grace_s)
        if self._token_file is not None:
            shutil.rmtree(self._token_file.parent, ignore_errors=True)
        # the guard is not told "done": once this process exits it lists the pool's
        # containers again (an engine run under way here may still make one) and removes them
        _OPEN.discard(self)

    async def _clear_leftovers(self) -> None:
        """Remove what pools that are gone left, refuse a prefix a running pool holds.

        Removed: every container labelled ``trajcore.pool`` whose owner ended on this host
        (whatever its prefix: a pool whose process was killed, or a closed one of this
        process), and those of this prefix without an owner label (an older trajcore's).
        Refused (``ConfigError`` on ``name_prefix``): this prefix while a running pool, or one
        of another host, has containers of it. Others' containers are never touched.
        """
        listed = (await self._run("ps", "--all", "--quiet", "--filter", f"label={LABEL}")).split()
        if not listed:
            return
        template = (
            f'{{{{.Id}}}} {{{{index .Config.Labels "{LABEL}"}}}} '
            f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}'
        )
        # check=False: a container removed since the listing fails only its own line
        described = await self._run("inspect", "--format", template, *listed, check=False)
        leftovers: list[str] = []
        for line in described.splitlines():
            container_id, prefix, owner = ([*line.split(maxsplit=2), "", ""])[:3]
            owner = "" if owner == "<no value>" else owner
            state = _owner_state(owner) if owner else "unknown"
            if state == "ended" or (prefix == self.prefix and not owner):
                leftovers.append(container_id)
            elif prefix == self.prefix:
                where = owner.rsplit("/", 2)[0]
                raise ConfigError(
                    "name_prefix",
                    f"{self.prefix!r} is in use by a running container pool ({where}: host/pid "
                    "namespace/pid): give this pool another name_prefix, or close that one",
                )
        async with anyio.create_task_group() as removing:
            for container_id in leftovers:  # one each: podman 4.3's rm of several removes
                # none when one of them is gone by then (another pool removed it first)
                removing.start_soon(self._remove, container_id)

    async def _remove(self, container_id: str) -> None:
        with contextlib.suppress(SlotServerError):
            await self._run("rm", "--force", "--volumes", container_id, check=False)

    async def launch(self, index: int, name: str) -> tuple[Endpoint, _Container]:
        assert self._token_file is not None
        self._starts += 1
        container = _Container(f"{self.prefix}-{index}-{self._starts}")
        self.guard.tell(f"run {container.name}")  # a container of that name may appear now
        try:
            try:
                started = await self._started(container, index)
            finally:
                self.guard.tell(f"ran {container.name}")
            if started:  # the ID it printed
                container = attrs.evolve(container, id=started.split()[-1])
            published = await self._run("port", container.ref, str(_PORT), check=False)
            port = published.splitlines()[0].rsplit(":", 1)[-1] if published else ""
            if not port.isdigit():  # it ended already (the engine unpublishes an ended one)
                with anyio.CancelScope(shield=True):
                    said = await self.describe(container)
                raise SlotServerError(
                    f"container {container.name} publishes no port for {_PORT} "
                    f"({published!r}); its server said: {said}"
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop(container)
            raise
        return Endpoint("tcp", f"127.0.0.1:{port}", self._token), container

    async def _started(self, container: _Container, index: int) -> str:
        """``run`` server ``index``'s container: its ID, or ``SlotServerError`` with what the
        engine said (and, with ``engine_options`` set, what those replace)."""
        try:
            return await self._run(
                "run", "--detach", "--name", container.name, "--label", f"{LABEL}={self.prefix}",
                "--label", f"{OWNER_LABEL}={_owner_value(self.instance)}", *self.options,
                "--publish", f"127.0.0.1::{_PORT}",
                "--volume", f"{self._token_file}:{_TOKEN_FILE_IN_CONTAINER}:ro",
                *self.config.volume_args(), self.config.image, *self.config.server_args(index),
            )  # fmt: skip
        except SlotServerError as error:
            if self.config.engine_options is None:
                raise
            defaults = " ".join(default_engine_options(self.engine))
            raise SlotServerError(
                f"{error} (engine_options replaces the options the sandbox needs: start from "
                f"default_engine_options({self.engine!r}), here {defaults!r})"
            ) from None

    async def wait(self, handle: _Container) -> None:
        while True:
            await run_command([self.engine, "wait", handle.ref], start_new_session=True)
            if not await self._running(handle):
                return
            await anyio.sleep(0.5)  # the engine's wait gave up early (or was signalled): again

    async def _running(self, handle: _Container) -> bool:
        with contextlib.suppress(SlotServerError):
            state = await self._run("inspect", "--format", "{{.State.Running}}", handle.ref)
            return state == "true"
        return False

    async def kill(self, handle: _Container) -> None:
        with contextlib.suppress(SlotServerError):
            await self._run("kill", handle.ref, check=False)

    async def stop(self, handle: _Container) -> None:
        """``stop`` with the grace, then ``rm --force`` whatever the stop did (it may hang or
        fail); a container the engine would not remove is a warning naming it."""
        grace = self.config.stop_timeout_s
        with contextlib.suppress(SlotServerError):
            seconds = str(max(1, round(grace)))
            await self._run("stop", "--time", seconds, handle.ref, check=False, extra_s=grace)
        try:
            await self._run("rm", "--force", "--volumes", handle.ref)
        except SlotServerError as error:
            if not _MISSING_CONTAINER.search(str(error)):
                warnings.warn(
                    f"the container pool could not remove its container {handle.name}: {error}",
                    ResourceWarning,
                    stacklevel=1,
                )

    async def describe(self, handle: _Container) -> str:
        with (
            contextlib.suppress(OSError, TimeoutError),
            anyio.fail_after(self.config.engine_timeout_s),
        ):
            done = await run_command(
                [self.engine, "logs", "--tail", "20", handle.ref],
                start_new_session=True,
            )
            return (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-2000:]
        return ""


_OPEN: set[_EngineContainers] = set()
"""The engines of this process's open container pools, for ``abandon_container_pools``."""


def abandon_container_pools(grace_s: float = 10.0) -> int:
    """Remove every open container pool's containers and token folder, synchronously.

    For a process that must exit now, without running the pools' close (a forced stop, a second
    signal): each pool's containers (by its label) are removed with the engine's ``rm
    --force``, each engine command bounded by ``grace_s``. The pools are unusable afterwards.
    Safe to call from a signal handler or another thread. Returns how many pools it ended.
    """
    return abandon_each(_OPEN, grace_s)


# ============================================================================ the pool


class ContainerSandboxPool(SupervisedPool[_Container]):
    """The SandboxPool port over K slot-server containers. ``async with ContainerSandboxPool(c)``.

    Entering removes the containers of pools that are gone (module doc), starts every
    container and waits until each is healthy; it raises ``SandboxUnavailable`` when no engine
    or image is there, when the engine fails (with what it said), or when a sandbox is required
    and missing, ``ConfigError`` when a running pool holds its ``name_prefix``, and
    ``SlotServerError`` when a container does not start in time; nothing is left running
    either way. Leaving closes it: every container it started is stopped and removed.

    Attributes:
        config: The pool's settings.
        prefix: The containers' name prefix and label value.
    """

    def __init__(self, config: ContainerPoolConfig | None = None) -> None:
        self.config = config = config or ContainerPoolConfig()
        self.prefix = config.name_prefix or f"trajcore-{secrets.token_hex(4)}"
        self._engine = _EngineContainers(config, self.prefix)
        super().__init__(self._engine, config, label="container")

    @property
    def engine(self) -> str:
        """The engine's command (known once the pool started)."""
        return self._engine.engine

    def engine_name(self, container: str) -> str:
        """The engine's name for the container behind pool container ``container``.

        Raises ``KeyError``.
        """
        return self._supervised.launched[container].name
