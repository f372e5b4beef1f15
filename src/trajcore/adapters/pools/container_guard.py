"""The guard process of a container pool: its containers go when the env is killed.

A container outlives the process that ran it: the engine (podman's conmon, docker's daemon)
keeps it running whatever becomes of the env. A pool's close removes its containers, and a
second signal removes them synchronously (``abandon_container_pools``), but an env killed
without either (SIGKILL by a scheduler or the out-of-memory killer) would leave them holding
their slots, memory and CPU until the next container pool starts on this host and removes
them by their owner labels.

So each container pool starts one small guard process (``guard_containers``, in a session of
its own and deaf to SIGINT, SIGHUP and SIGTERM, so neither a Ctrl-C to the terminal's group
nor a stop signal to the env reaches it). Its stdin is a pipe whose only writer is the pool's
process: the pool tells it each container it starts (``run NAME`` before the engine's ``run``,
``ran NAME`` after), and ``done`` once its close has removed them. The end of that pipe without
``done`` means the pool's process ended: the guard then removes, with the engine's ``rm
--force --volumes``, every container that carries both this pool's ``trajcore.pool`` label and
its ``trajcore.owner`` label (host, pid namespace, pid, start time and the pool's random
instance: one pool of one process, never another's), checks each one's labels again before
removing it, repeats until none is left and every start that was under way when the pool died
has been seen, and removes the token folder, all within ``deadline_s`` (the pool's
``engine_timeout_s`` and ``stop_timeout_s``). What it removed, and what it could not by then
(which the next pool's start removes), it says in the guards' log (``guard_process.guard_log``).

Why a process of our own rather than the engine's options: ``--rm`` and conmon's exit commands
act when a container *exits*, and these containers never exit on their own; the engine has no
option that ties a detached container to the life of the process that started it. Only a
process that outlives the env, and learns of its end from the kernel (the pipe's end closes
however the env ends), can remove them promptly. A guard killed together with the env (a
scheduler that kills the whole cgroup) leaves the containers to the next pool's start.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trajcore.adapters.pools.guard_process import guard_says

__all__ = ["LABEL", "OWNER_LABEL", "guard_argv", "guard_containers", "remove_containers"]

LABEL = "trajcore.pool"
OWNER_LABEL = "trajcore.owner"  # host/pid namespace/pid/start/instance of the pool that ran it

_ROUND_S = 0.5  # between two listings while containers or started ones remain


def _words(engine: str | Sequence[str]) -> list[str]:
    """The engine's command words: its name, or its name and options (``podman --runtime runc``)."""
    return [engine] if isinstance(engine, str) else list(engine)


def _engine(engine: Sequence[str], args: list[str], deadline: float) -> str | None:
    """``engine args``' stdout, or ``None`` when it failed or ran past ``deadline``."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    try:
        done = subprocess.run(
            [*engine, *args], capture_output=True, text=True, timeout=left, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _owned(engine: Sequence[str], labels: dict[str, str], deadline: float) -> dict[str, str] | None:
    """The containers (ID -> name) carrying every one of ``labels`` (``None``: the engine
    failed). Each listed one's labels are read again: only exact matches count."""
    filters: list[str] = []
    for key, value in labels.items():
        filters += ["--filter", f"label={key}={value}"]
    listed = _engine(engine, ["ps", "--all", "--quiet", "--no-trunc", *filters], deadline)
    if listed is None:
        return None
    if not listed.split():
        return {}
    template = "{{.Id}} {{.Name}}" + "".join(
        f' {{{{index .Config.Labels "{key}"}}}}' for key in labels
    )
    described = _engine(engine, ["inspect", "--format", template, *listed.split()], deadline)
    if described is None:  # one was removed since the listing: list again next round
        return None
    owned: dict[str, str] = {}
    for line in described.splitlines():
        words = line.split()
        if len(words) == 2 + len(labels) and words[2:] == list(labels.values()):
            owned[words[0]] = words[1].lstrip("/")
    return owned


def remove_containers(engine: str | Sequence[str], ids: list[str], deadline: float) -> None:
    """``rm --force --volumes`` each (one command each: podman 4.3's rm of several removes
    none when one of them is gone by then), in parallel, bounded by ``deadline``."""
    removals = [
        subprocess.Popen(
            [*_words(engine), "rm", "--force", "--volumes", container_id],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for container_id in ids
    ]  # fmt: skip
    for removal in removals:
        try:
            removal.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            removal.kill()
            removal.wait()


def _read_pool(lines: object) -> tuple[bool, set[str]]:
    """Follow the pool's lines to their end: (whether it said ``done``, the names of the
    containers whose start was under way when they ended)."""
    starting: set[str] = set()
    for line in lines:  # type: ignore[attr-defined]
        word, _, name = str(line).strip().partition(" ")
        if word == "done":
            return True, starting
        if word == "run":
            starting.add(name)
        elif word == "ran":
            starting.discard(name)
    return False, starting


def guard_containers() -> None:
    """The guard process (module doc). ``sys.argv[1:]``: the engine, the pool label's value,
    the owner label's value, the token folder, the deadline in seconds, then the engine's
    options, if any."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # it ends with the pool's pipe, not a signal
    name, prefix, owner, token_folder, deadline_text = sys.argv[1:6]
    engine = [name, *sys.argv[6:]]
    done, starting = _read_pool(sys.stdin)
    if done:
        return
    deadline = time.monotonic() + float(deadline_text)
    labels = {LABEL: prefix, OWNER_LABEL: owner}
    left: dict[str, str] | None = None
    removed: set[str] = set()
    while time.monotonic() < deadline:
        left = _owned(engine, labels, deadline)
        if left is not None:
            starting -= set(left.values())
            if not left and not starting:
                break
            remove_containers(engine, list(left), deadline)
            removed |= set(left.values())
        time.sleep(_ROUND_S)
    shutil.rmtree(token_folder, ignore_errors=True)
    said = f"trajcore container pool {prefix}: its process ended without closing it"
    if left or left is None:
        what = ", ".join(sorted((left or {}).values())) or "the engine failed"
        guard_says(
            f"{said}; could not remove its containers within {deadline_text} s ({what}); "
            "the next container pool's start removes them"
        )
    else:
        names = ", ".join(sorted(removed)) or "none was left"
        guard_says(f"{said}; removed its containers ({names}) and its token folder")


def guard_argv(
    *, engine: str | Sequence[str], prefix: str, owner: str, token_folder: Path, deadline_s: float
) -> list[str]:
    """The command line of the guard of the containers labelled ``prefix`` and ``owner``
    (``guard_process.GuardProcess`` starts it); ``engine``: its name, or its command words."""
    code = f"from {__name__} import guard_containers as g; g()"
    name, *options = _words(engine)
    return [sys.executable, "-c", code, name, prefix, owner, str(token_folder),
            f"{deadline_s:g}", *options]  # fmt: skip
