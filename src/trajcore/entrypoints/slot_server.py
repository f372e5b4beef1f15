"""``trajcore slot-server``: serve N sandboxed slots over HTTP until SIGTERM.

::

    trajcore slot-server --slots 8 --root /srv/slots --listen 127.0.0.1:0 --token-file token
    trajcore slot-server --slots 8 --root /srv/slots --unix /run/slots.sock [--require-sandbox]

TCP needs a bearer token, read from ``--token-file`` or from the environment variable named by
``--token-env`` (which the server then removes from its own environment; a scheduler such as
Nomad passes it that way, never on a command line); a Unix socket is guarded by its file
permissions and takes a token optionally. When the server is healthy it prints exactly one line
of JSON on stdout, ``{"ready": true, "address": ..., "unix": ..., "pid": ..., ...}``, so a parent
process (the local pool, a Nomad task's health check) can wait for it; ``--listen HOST:0`` picks a
free port and the line names it. SIGTERM or SIGINT ends every sandbox, then the process, with
status 0; a second signal, or the first one's close running past ``--stop-deadline`` seconds,
forces the end (the process group it leads is killed: its sandboxes die with it), status 1.
``--parent-pid PID`` (the local pool passes its own pid) makes the server get SIGHUP when that
parent dies, however it dies (Linux's parent-death signal), and stop as on SIGTERM, so a killed
env leaves no slot server behind; Linux sends it once per thread of the parent as they end, so
SIGHUP never forces the end. The server exits at once when PID is already gone. With
``--parent-dir DIR`` as well (the local pool passes its private directory), a server that closes
after its parent died removes DIR, which that parent can no longer do; once closed it ignores
SIGHUP (a killed parent's later ones keep coming), and a forced end first kills every process
the server started, then removes DIR too. A removal that fails is said on stderr and, when
stderr's file went with DIR (the local pool's log of the server lies there), in
``DIR/slot-server-PID.error``. A bad flag or an unusable root exits 2 with ``reason @ field``
on stderr.

A server run as root enters a mount namespace of its own before it starts (its mounts, the
bind of its root and the forked workspaces' overlays, end with it, however it ends, and never
appear on the host; ``nsenter -t PID -m`` shows them); the ready line's ``mount_namespace``
says ``own``, or ``host: <why>`` where it stays in the host's.

The isolation (network, sandbox requirement, limits, timeout range, cgroups, bubblewrap, slot
helper, slot uids) comes from these flags only; nothing a model writes into a call changes it.
Its flags are the fields of ``SlotIsolation`` (``slot_server_flags.isolation_argv`` writes them), so
``--help`` lists exactly what a isolation can say.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.codec import unstructure
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig, check_config
from trajcore.adapters.slot_server.sandboxes import name_process
from trajcore.adapters.slot_server.server import start_http_server
from trajcore.adapters.slot_uid_locks import lock_file
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation, check_slot_uid_range
from trajcore.domain.slot_server_flags import ISOLATION_FLAGS, IsolationFlag

__all__ = ["isolation_of", "main", "parse_args", "wait_for_children_by_pidfd"]

_ORPHAN_REMOVE_TIMEOUT_S = 60.0
_FORCED_KILL_TIMEOUT_S = 5.0  # a forced end: killing what the server started
_FORCED_REMOVE_TIMEOUT_S = 10.0  # then removing ``--parent-dir``


def _reader(flag: IsolationFlag) -> Callable[[str], object]:
    def read(word: str) -> object:
        try:
            return flag.read(word)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{word!r}: {error}") from None

    return read


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, parsed (argparse exits 2 on a malformed one)."""
    parser = argparse.ArgumentParser(
        prog="trajcore slot-server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--slots", type=int, required=True, help="number of slots")
    parser.add_argument("--root", type=Path, required=True, help="directory for workspaces")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", help="HOST:PORT for TCP (needs a token); port 0 = any")
    where.add_argument("--unix", help="path of a Unix socket to listen on")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, help="file holding the bearer token")
    token.add_argument(
        "--token-env",
        metavar="NAME",
        help="environment variable holding the bearer token (removed from the environment once "
        "read)",
    )
    isolation = parser.add_argument_group("isolation (the fields of SlotIsolation)")
    for flag in ISOLATION_FLAGS:
        if flag.codec is None:
            isolation.add_argument(
                flag.name,
                dest=flag.field,
                action="store_const",
                const=not flag.default,
                default=flag.default,
                help=flag.help,
            )
        else:
            isolation.add_argument(
                flag.name,
                dest=flag.field,
                type=_reader(flag),
                default=flag.default,
                metavar=flag.metavar,
                help=f"{flag.help} (default: {flag.codec.show(flag.default)})".replace("%", "%%"),
            )
    lifetime = parser.add_argument_group("lifetime")
    lifetime.add_argument(
        "--parent-pid",
        type=int,
        metavar="PID",
        help="stop (SIGHUP) when this process, the parent, dies; exit at once if it is gone",
    )
    lifetime.add_argument(
        "--parent-dir",
        type=Path,
        metavar="DIR",
        help="with --parent-pid: the parent's directory, removed by a server that outlived it",
    )
    lifetime.add_argument(
        "--stop-deadline",
        type=float,
        default=30.0,
        metavar="S",
        help="after SIGTERM/SIGINT, force the end when closing takes longer (default: 30)",
    )
    images = parser.add_argument_group("task environments (docs/environments.md)")
    images.add_argument(
        "--image-cache",
        type=Path,
        metavar="DIR",
        help="the host's image cache: leases may then run over an image (POST /v1/lease); "
        "off by default",
    )
    images.add_argument(
        "--environment-dir",
        dest="environment_dirs",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder whose trees (itself or below) leases may name as directory:PATH; "
        "repeat for more; none by default (every directory: reference is refused). The slot "
        "owns a listed tree's root-owned files in its lease: list only trees meant for leases",
    )
    for name, gib, what in (
        ("--image-cache-bytes", 32, "the cache's size limit in bytes"),
        ("--snapshot-bytes", 16, "what this server's snapshots (POST /v1/snapshot) may hold"),
    ):
        help_text = f"{what} (default: {gib} GiB)"
        images.add_argument(name, type=int, default=gib << 30, metavar="N", help=help_text)
    parser.add_argument("--slot-helper", dest="retired_slot_helper", help=argparse.SUPPRESS)
    parser.add_argument(
        "--slot-uid-block",
        type=int,
        default=0,
        metavar="K",
        help="this server's block of slot uids: slot i runs as BASE + K*SLOTS + i, so servers "
        "sharing a host's uids never share a slot uid (a Nomad job passes its allocation index)",
    )
    parser.add_argument(
        "--slot-uid-lock",
        default=str(lock_file()),
        metavar="FILE|none",
        help="as root, hold this server's slot uids in the host's reservation file for its life "
        "and refuse to start when another server or pool holds any of them (default: %(default)s"
        ", or $TRAJCORE_SLOT_UID_LOCK); none: the caller holds them",
    )
    return parser.parse_args(argv)


def isolation_of(args: argparse.Namespace) -> SlotIsolation:
    """The slot isolation the parsed command line gives.

    Raises:
        ConfigError: A isolation field is out of range, named by its flag.
    """
    values = {flag.field: getattr(args, flag.field) for flag in ISOLATION_FLAGS}
    try:
        return SlotIsolation(**values)
    except ConfigError as error:
        names = {flag.field: flag.name for flag in ISOLATION_FLAGS}
        field, bracket, rest = error.field.partition("[")
        raise ConfigError(names.get(field, field) + bracket + rest, error.reason) from None


def _config(args: argparse.Namespace) -> tuple[RuntimeConfig, str | None]:
    if args.retired_slot_helper is not None:
        raise ConfigError(
            "--slot-helper",
            "was removed: the compiled slot helper (slot_helper.c) is the only keeper; drop the "
            "flag, and where no wheel or image ships the helper, install gcc and libc6-dev so "
            "the server can build it at start",
        )
    isolation = isolation_of(args)
    if args.slots <= 0:
        raise ConfigError("--slots", f"must be > 0, got {args.slots}")
    token: str | None = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError("--token-file", f"cannot read: {error.strerror}") from None
        if not token:
            raise ConfigError("--token-file", "the file is empty")
    if args.token_env is not None:
        token = os.environ.pop(args.token_env, "").strip()
        if not token:
            raise ConfigError(
                "--token-env", f"the environment variable {args.token_env!r} is unset or empty"
            )
    if args.listen is not None and token is None:
        raise ConfigError("--token-file", "TCP needs a bearer token (--token-file or --token-env)")
    if args.slot_uid_block < 0:
        raise ConfigError("--slot-uid-block", f"must be >= 0, got {args.slot_uid_block}")
    if args.image_cache_bytes <= 0:
        raise ConfigError("--image-cache-bytes", f"must be > 0, got {args.image_cache_bytes}")
    if args.snapshot_bytes <= 0:
        raise ConfigError("--snapshot-bytes", f"must be > 0, got {args.snapshot_bytes}")
    if not args.slot_uid_lock.strip():
        raise ConfigError("--slot-uid-lock", "empty: name a file, or none")
    uid_base = isolation.slot_uid_base + args.slot_uid_block * args.slots
    check_slot_uid_range("--slot-uid-block", uid_base, args.slots)
    config = RuntimeConfig(
        slots=args.slots,
        slot_uid_base=uid_base,
        slot_uid_lock=None
        if args.slot_uid_lock.strip().lower() == "none"
        else Path(args.slot_uid_lock).absolute(),
        root=args.root.absolute(),
        isolation=isolation,
        bwrap=isolation.bwrap,
        use_cgroups=isolation.use_cgroups,
        # on unless a benchmark turns it off to measure what it saves (docs/benchmarks.md)
        warm_leases=os.environ.get("TRAJCORE_SLOT_WARM_LEASES", "1") != "0",
        image_cache=None if args.image_cache is None else args.image_cache.absolute(),
        image_cache_bytes=args.image_cache_bytes,
        environment_dirs=tuple(folder.absolute() for folder in args.environment_dirs),
        snapshot_bytes=args.snapshot_bytes,
    )
    try:
        check_config(config)
    except ConfigError as error:
        if error.field != "environment_dirs":
            raise
        raise ConfigError("--environment-dir", error.reason) from None
    return config, token


_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_SLAVE = 0x4000, 1 << 19


def _own_mount_namespace() -> str:
    """Enter a mount namespace of this server's own, whose mounts never reach the host's.

    With an image cache the server binds its root onto itself (a shared mount, for the forked
    workspaces' overlays) and mounts those overlays; in the host's namespace, a server killed
    without its close (SIGKILL, the OOM killer) left them there. In a namespace of its own they
    end with its last process. Every mount is made a slave first: what the host mounts later
    still reaches the server (a cache or an image folder mounted after it started), and nothing
    the server mounts goes back. Called before any thread starts (``unshare`` moves only the
    calling thread).

    Returns ``own``, or ``host: <why>`` where it cannot (not Linux, not root: no namespace and no
    overlays either, an ``unshare`` the host refuses).
    """
    if not sys.platform.startswith("linux"):
        return "host: not Linux"
    if os.geteuid() != 0:
        return "host: the server does not run as root (it mounts nothing)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return f"host: unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_SLAVE), None) != 0:
        # Still in a namespace of its own; its mounts may propagate to the host's peers.
        return f"own (mounts not made slaves: {os.strerror(ctypes.get_errno())})"
    return "own"


def _force_exit(args: argparse.Namespace) -> NoReturn:
    """End now: the process group this server leads (its sandboxes), else the process alone.

    An orphaned server (``_orphaned``) first kills every process it started, so nothing writes
    below ``--parent-dir`` any more, and removes that directory (within
    ``_FORCED_REMOVE_TIMEOUT_S``): a forced end must not leave it behind either.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("trajcore slot-server: stopping forcibly\n")
        sys.stderr.flush()
    if _orphaned(args):
        _kill_descendants(_FORCED_KILL_TIMEOUT_S)
        _remove_orphaned_dir(args, timeout_s=_FORCED_REMOVE_TIMEOUT_S)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _descendants(root: int) -> list[int]:
    """The pids of ``root``'s live descendants (zombies left out), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # gone while we looked
        fields = text[text.rindex(")") + 2 :].split()  # the name may hold ')' and spaces
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _kill_descendants(timeout_s: float) -> None:
    """SIGKILL every process this one started (its sandboxes, whatever runs in them), again
    until none is left or ``timeout_s`` has passed (one may fork while the others die).

    Their process groups are their own, so killing this server's group would not reach them
    at once (they die with it later, through bubblewrap's ``--die-with-parent``)."""
    if not sys.platform.startswith("linux"):
        return
    deadline = time.monotonic() + timeout_s
    while (left := _descendants(os.getpid())) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _die_with_parent(parent_pid: int) -> bool:
    """Ask Linux for SIGHUP when the parent dies; False when ``parent_pid`` is already gone.

    Raises:
        ConfigError: ``--parent-pid`` is not a positive pid.
    """
    if parent_pid <= 0:
        raise ConfigError("--parent-pid", f"must be a pid (> 0), got {parent_pid}")
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGHUP), 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    # The parent may have died before the request: then no signal will ever come.
    return os.getppid() == parent_pid


async def _serve(
    args: argparse.Namespace, config: RuntimeConfig, token: str | None, mounts: str
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(forceable: bool) -> None:
        if stop.is_set():
            if forceable:
                _force_exit(args)
            return
        stop.set()
        loop.call_later(args.stop_deadline, _force_exit, args)

    with _signals_to(loop, args, on_signal):
        return await _run(args, config, token, mounts, stop)


@contextlib.contextmanager
def _signals_to(
    loop: asyncio.AbstractEventLoop,
    args: argparse.Namespace,
    on_signal: Callable[[bool], None],
) -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP, handled from here to the exit of the process.

    Within the block each goes to ``on_signal`` on the loop (``forceable``: not a SIGHUP; a
    SIGHUP also sets ``args.parent_died``). After it, while ``--parent-dir`` is removed and the
    interpreter exits, SIGHUP only sets ``args.parent_died``, and SIGTERM or SIGINT forces the end.

    The handlers are the process's (``signal.signal``), never the loop's: closing a loop gives
    each signal it handled the default action back, for a moment even when taken back before,
    and another thread of the server may take a signal in that moment. Linux sends the
    parent-death SIGHUP again each time the parent's thread that counts as the server's parent
    ends, so a killed multi-threaded parent's SIGHUPs are spread over its threads' exits; one
    that came under the default action killed the server while it removed ``--parent-dir``, and
    left the directory behind. Whichever thread a signal lands on, its number goes to a socket
    the loop reads (``signal.set_wakeup_fd``), which wakes the main thread, where its handler
    runs.
    """
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    within = True

    def handle(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            args.parent_died = True  # (its process may still be ending: getppid() cannot tell)
        if within:
            with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
                loop.call_soon_threadsafe(on_signal, signum != signal.SIGHUP)
                return
        if signum != signal.SIGHUP:
            _force_exit(args)

    def drain() -> None:
        with contextlib.suppress(OSError):
            while reader.recv(4096):
                pass

    loop.add_reader(reader.fileno(), drain)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handle)
    # a parent-death SIGHUP held back since ``main`` asked for it is handled now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        within = False
        signal.set_wakeup_fd(previous)
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


async def _run(
    args: argparse.Namespace,
    config: RuntimeConfig,
    token: str | None,
    mounts: str,
    stop: asyncio.Event,
) -> int:
    runtime = SlotRuntime(config)
    try:
        await runtime.start()
    except BaseException:
        await runtime.aclose()
        raise
    try:
        server, address = await start_http_server(
            runtime,
            token,
            listen=None if args.unix is not None else str(args.listen),
            unix=args.unix,
        )
    except BaseException:
        await runtime.aclose()
        raise
    try:
        ready = {
            "ready": True,
            "address": address,
            "unix": args.unix,
            "pid": os.getpid(),
            "slots": config.slots,
            "sandboxed": runtime.sandboxed,
            "capabilities": unstructure(runtime.capabilities),
            "mount_namespace": mounts,
        }
        if not stop.is_set():  # a signal during the start: stop without saying ready
            name_process("slot-server")
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()
            # Everything loaded so far lives as long as the server: out of the collector's
            # sight, full collections only walk what calls allocate.
            gc.collect()
            gc.freeze()
        await stop.wait()
    finally:
        await server.aclose()
        await runtime.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the slot server until SIGTERM. Returns the exit status (0, or 2 on a bad config)."""
    args = parse_args(argv)
    # Held back until the loop handles it (``_serve``): under the default action, a parent that
    # died during the start would kill the server before it could remove ``--parent-dir``.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        return _main(args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _main(args: argparse.Namespace) -> int:
    try:
        if args.parent_pid is not None and not _die_with_parent(args.parent_pid):
            sys.stderr.write(f"trajcore slot-server: the parent {args.parent_pid} is gone\n")
            _remove_orphaned_dir(args)
            return 1
        if not args.stop_deadline > 0:
            raise ConfigError("--stop-deadline", f"must be > 0, got {args.stop_deadline}")
        config, token = _config(args)
    except (ConfigError, OSError) as error:
        sys.stderr.write(f"trajcore slot-server: {error}\n")
        return 2
    mounts = _own_mount_namespace()  # before asyncio.run starts any thread
    wait_for_children_by_pidfd()
    try:
        return asyncio.run(_serve(args, config, token, mounts))
    except (OSError, ConfigError) as error:
        sys.stderr.write(f"trajcore slot-server: {error}\n")
        return 2
    finally:
        _remove_orphaned_dir(args)


def wait_for_children_by_pidfd() -> bool:
    """Have asyncio learn of its children's exits from a pidfd on the event loop, where the
    kernel has pidfds (Linux 5.3); whether it now does.

    Python 3.11's default, the threaded watcher, starts one thread per child (each keeper's
    lives as long as the keeper), and under load a thread's start alone took up to 300 ms on
    the loop. From 3.12 asyncio picks the pidfd watcher itself where the kernel allows."""
    if sys.version_info >= (3, 12):
        return True
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False  # an older kernel: asyncio's threaded watcher stays
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


def _orphaned(args: argparse.Namespace) -> bool:
    """Whether ``--parent-dir`` is this server's to remove: its ``--parent-pid`` died."""
    if args.parent_dir is None or args.parent_pid is None:
        return False
    # (SIGHUP may come while the parent is still ending: getppid() cannot tell yet)
    return bool(getattr(args, "parent_died", False)) or os.getppid() != args.parent_pid


def _remove_orphaned_dir(
    args: argparse.Namespace, *, timeout_s: float = _ORPHAN_REMOVE_TIMEOUT_S
) -> None:
    """Remove ``--parent-dir`` when the parent of ``--parent-pid`` died (its close never ran).

    A failure is reported where it survives the removal (``_report_leftover``)."""
    if not _orphaned(args):
        return
    # The parent's other servers are closing too and may still be writing below DIR: try again
    # until the tree is gone or the deadline passes.
    directory: Path = args.parent_dir.absolute()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            remove_tree(directory, timeout_s=max(0.1, deadline - time.monotonic()))
        except OSError as error:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            _report_leftover(directory, f"cannot remove {directory}: {error}")
        return


def _report_leftover(directory: Path, why: str) -> None:
    """Say ``why`` on stderr and, when stderr's file is no longer linked anywhere (the local
    pool's log of this server lies in ``directory``, and the removal took it first), in
    ``directory/slot-server-PID.error``, beside what was left, so the reason is not lost."""
    line = f"trajcore slot-server: {why}\n"
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line)
        sys.stderr.flush()
    try:
        if os.fstat(sys.stderr.fileno()).st_nlink > 0:
            return
    except (OSError, ValueError, AttributeError):
        pass  # no stderr, or no file behind it
    with contextlib.suppress(OSError):
        (directory / f"slot-server-{os.getpid()}.error").write_text(line, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
