"""Who may change the path to a ``directory:`` tree: a slot server uses such a tree in place,
opening it by path when its lease mounts it, after the cache checked it against the folders it
is allowed from; a user who could rename an entry on that path in between could put a link to
any host folder there. ``swappable`` says whether anyone but root and the server's own user
could; ``require_reachable`` that the slots' uids can reach a tree they need."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

from trajcore.adapters.slot_server.slot_ids import unreachable
from trajcore.domain.errors import ConfigError

__all__ = ["require_reachable", "swappable"]


def swappable(tree: Path) -> str | None:
    """Why a user other than root and this server's could put another tree at ``tree``'s path
    between its check and its lease's mount (which opens it by path), or ``None``.

    Whoever may rename an entry of a folder on the path could swap the checked tree for a link
    to any host folder once its lease is granted. So every folder above it must be owned by
    root or this process's user and writable by no one else, unless it is sticky (``/tmp``)
    and the entry below it is owned by one of them."""
    trusted = {0, os.geteuid()}
    for folder, entry in itertools.pairwise([*reversed(tree.parents), tree]):
        try:
            info, below = os.lstat(folder), os.lstat(entry)
        except OSError as error:
            return f"{entry} cannot be checked: {error.strerror}"
        open_to_others = info.st_mode & 0o022 and not (
            info.st_mode & stat.S_ISVTX and below.st_uid in trusted
        )
        if info.st_uid not in trusted or open_to_others:
            return (
                f"{folder} (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}) may be "
                "changed by users other than root and the slot server's, who could swap the "
                "tree below it for a link to another host folder after this check: folders "
                "above a directory: tree must be writable only by root or the server's user"
            )
    return None


def require_reachable(path: Path, field: str, uid_base: int, what: str) -> None:
    """Raise ``ConfigError`` (``field``) when the slots, run as uids from ``uid_base``, cannot
    search every directory down to ``path``, where ``what`` they need lies."""
    blocked = unreachable(path)
    if blocked is not None:
        raise ConfigError(
            field,
            f"slots run as uids {uid_base}.. and cannot reach {what} under {path}: "
            f"{blocked} is not searchable by others",
        )
