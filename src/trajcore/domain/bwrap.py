"""The bubblewrap argument vector of a slot's sandbox, as a pure function of the slot isolation.

A slot server starts one bubblewrap (``bwrap``) sandbox per slot, with the slot's keeper as its
first process. ``bwrap_argv`` turns the isolation plus a few facts about the host into the exact
argument vector; keeping it pure lets the tests state its properties (no network namespace is
ever missing when network is off, the workspace is the only writable host path, capabilities
are always dropped) without starting a process.

Rules this module keeps:

- New user, pid, ipc and uts namespaces always; a new network namespace unless
  ``allow_network``; a new cgroup namespace where the kernel has one (``--unshare-cgroup-try``).
- The root is bubblewrap's own tmpfs holding read-only binds of the system directories, then
  remounted read-only; the host's root is never bound whole, so ``/root``, ``/home`` and the other
  slots' workspaces are simply absent. Host top-level paths that are symlinks (``/bin -> usr/bin``)
  are recreated as symlinks, not bound.
- The slot's workspace is the only host path bound read-write, at ``workspace_path``; ``/tmp`` is
  a private tmpfs, and anything the agent needs that lives under ``/tmp`` on the host (a virtual
  environment, say) is bound back read-only *after* the tmpfs, or it would be hidden
  (``private_tmp_binds`` lists them for a lease that mounts a fresh ``/tmp``).
- ``--die-with-parent`` (the sandbox cannot outlive its slot server), ``--new-session`` (no
  terminal injection), ``--cap-drop ALL``, ``--chdir`` into the workspace. The only capabilities
  ever kept are ``KEEPER_CAPABILITIES``, and only when the caller asks for them: the slot's
  keeper needs them, inside the sandbox's own user namespace, to give every lease new pid,
  mount, ipc and uts namespaces; each lease drops every capability before it runs anything
  (the slot helper, ``trajcore/adapters/slot_server/slot_helper.c``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SANDBOX_TMP, Bind, SlotIsolation

__all__ = ["IMAGE_KEEPER_CAPABILITIES", "KEEPER_CAPABILITIES", "bwrap_argv", "private_tmp_binds"]

# What a slot's keeper keeps, within the sandbox's user namespace only: CAP_SYS_ADMIN to make a
# lease's namespaces and mounts, CAP_SETPCAP to empty its own bounding set (its leases inherit it),
# CAP_NET_ADMIN to bring up the loopback of a lease's own network namespace.
KEEPER_CAPABILITIES: tuple[str, ...] = ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_NET_ADMIN")
# A keeper whose leases may run over a task environment also keeps CAP_DAC_OVERRIDE: overlayfs
# works in its upper layer's ``work`` directory (mode 0) with the mounting process's rights.
# Only files of the sandbox's own uid are in reach of it (the keeper never executes anything).
IMAGE_KEEPER_CAPABILITIES: tuple[str, ...] = (*KEEPER_CAPABILITIES, "CAP_DAC_OVERRIDE")


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def bwrap_argv(
    isolation: SlotIsolation,
    *,
    workspace: str,
    command: Sequence[str],
    bwrap: str = "bwrap",
    host_symlinks: Mapping[str, str] | None = None,
    rebind: Sequence[str | Bind] = (),
    keep_capabilities: Sequence[str] = (),
) -> list[str]:
    """The full ``bwrap`` argument vector that runs ``command`` in a sandbox for one slot.

    Args:
        isolation: The slot's isolation.
        workspace: The slot's workspace on the host, bound read-write at
            ``isolation.workspace_path``.
        command: The program (and its arguments) to start as the sandbox's first process.
        bwrap: The bubblewrap executable.
        host_symlinks: Which of ``isolation.system_paths`` are symlinks on the host, and their
            targets; those are recreated with ``--symlink`` instead of bound.
        rebind: Host paths the command needs (the Python it runs on, say) that the system binds
            or the private ``/tmp`` would leave out; bound read-only at the same place. Paths
            already covered by a system bind and not under ``/tmp`` are skipped. A ``Bind``
            instead names a different host source (a staged copy) for its ``dest``; it is
            always bound, read-only.
        keep_capabilities: Capabilities the command keeps inside the sandbox's user namespace
            (``--cap-add`` after ``--cap-drop ALL``); only ``KEEPER_CAPABILITIES`` are accepted.

    Returns the vector, starting with ``bwrap`` and ending with ``command``.

    Raises:
        ConfigError: ``workspace`` is not absolute, ``command`` is empty, or a capability to keep
            is not one of ``KEEPER_CAPABILITIES``.
    """
    if not workspace.startswith("/"):
        raise ConfigError("workspace", f"{workspace!r} is not an absolute path")
    if not command:
        raise ConfigError("command", "must name a program")
    for capability in keep_capabilities:
        if capability not in IMAGE_KEEPER_CAPABILITIES:
            raise ConfigError(
                "keep_capabilities",
                f"{capability!r} is not one a keeper may keep ({', '.join(KEEPER_CAPABILITIES)})",
            )
    links = dict(host_symlinks or {})
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if not isolation.allow_network:
        argv.append("--unshare-net")
    argv += ["--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for capability in keep_capabilities:
        argv += ["--cap-add", capability]
    argv += ["--hostname", "slot"]
    for path in isolation.system_paths:
        if path in links:
            argv += ["--symlink", links[path], path]
        else:
            argv += ["--ro-bind-try", path, path]
    argv += ["--tmpfs", SANDBOX_TMP, "--proc", "/proc", "--dev", "/dev"]
    for wanted in rebind:
        if isinstance(wanted, Bind):
            argv += ["--ro-bind", wanted.source, wanted.dest]
            continue
        path = wanted
        covered = any(_under(path, p) for p in isolation.system_paths if p not in links)
        if covered and not _under(path, SANDBOX_TMP):
            continue
        argv += ["--ro-bind", path, path]
    for bind in isolation.extra_binds:
        flag = "--bind" if bind.writable else "--ro-bind"
        argv += [flag + ("-try" if bind.optional else ""), bind.source, bind.dest]
    argv += ["--bind", workspace, isolation.workspace_path]
    if isolation.read_only_root:
        argv += ["--remount-ro", "/"]
    argv += ["--chdir", isolation.workspace_path, "--", *command]
    return argv


def private_tmp_binds(
    isolation: SlotIsolation, *, rebind: Sequence[str | Bind] = ()
) -> list[tuple[str, bool]]:
    """The sandbox paths ``bwrap_argv`` (given the same ``rebind``) binds *under* the private
    ``/tmp``, in bind order, each with whether it is writable: a lease that mounts a fresh
    ``/tmp`` must bind these back as they were."""
    dests = [path.dest if isinstance(path, Bind) else path for path in rebind]
    found = [(path, False) for path in dests if _under(path, SANDBOX_TMP)]
    found += [
        (bind.dest, bind.writable)
        for bind in isolation.extra_binds
        if _under(bind.dest, SANDBOX_TMP)
    ]
    if _under(isolation.workspace_path, SANDBOX_TMP):
        found.append((isolation.workspace_path, True))
    return found
