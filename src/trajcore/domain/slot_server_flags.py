"""The isolation on ``trajcore slot-server``'s command line: a flag per ``SlotIsolation`` field.

The pools and the job descriptions (local processes, containers, Nomad, SSH, Slurm, cloud) start
a slot server with ``isolation_argv(isolation)``; the server builds its parser from
``ISOLATION_FLAGS`` and reads the words back into the same value. Both come from the one table
below, so a flag cannot mean one thing to a pool and another to the server.

Rules this module keeps:

- The table names every field of ``SlotIsolation``, in field order, each with its flag, its help
  and how its value is written as one word and read back (``_Codec``); a field missing from the
  table, or one the isolation no longer has, fails at import with both lists named. The defaults
  are the isolation's own, never restated here.
- A field whose default is a bool is a switch (no codec): the flag's presence means the
  opposite of the default, and ``isolation_argv`` writes it only when the value differs.
- Every valued flag is written, as one word ``--name=value`` (a path may start with ``-``), so a
  server whose defaults differ still gets this isolation. Floats are written by ``repr`` and read
  back exactly; lists of paths and binds travel as compact JSON.
- Reading a malformed word raises ``ValueError`` saying what was expected; the value is then
  judged by the isolation's own validators when it is built.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import Bind, SlotIsolation

__all__ = ["ISOLATION_FLAGS", "IsolationFlag", "isolation_argv"]


@attrs.frozen
class _Codec:
    """How a value is written as one command-line word (``show``) and read back (``read``,
    raising ``ValueError`` on a malformed word; the field's validator judges the value)."""

    show: Callable[[Any], str]
    read: Callable[[str], Any]
    metavar: str


def _read_optional_int(word: str) -> int | None:
    return None if word == "none" else int(word)


def _show_optional_int(value: int | None) -> str:
    return "none" if value is None else str(value)


def _read_paths(word: str) -> tuple[str, ...]:
    value = json.loads(word)
    if not isinstance(value, list) or not all(isinstance(path, str) for path in value):
        msg = "expected a JSON list of paths"
        raise ValueError(msg)
    return tuple(value)


def _read_binds(word: str) -> tuple[Bind, ...]:
    value = json.loads(word)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        msg = "expected a JSON list of objects"
        raise ValueError(msg)
    try:
        return tuple(Bind(**item) for item in value)
    except (TypeError, ConfigError) as error:
        raise ValueError(str(error)) from None


def _show_binds(value: tuple[Bind, ...]) -> str:
    return json.dumps([attrs.asdict(bind) for bind in value], separators=(",", ":"))


_INT = _Codec(show=str, read=int, metavar="N")
_OPTIONAL_INT = _Codec(show=_show_optional_int, read=_read_optional_int, metavar="N|none")
_SECONDS = _Codec(show=lambda value: repr(float(value)), read=float, metavar="SECONDS")
_PATH = _Codec(show=str, read=str, metavar="PATH")
_PATHS = _Codec(
    show=lambda value: json.dumps(list(value), separators=(",", ":")),
    read=_read_paths,
    metavar="JSON",
)
_BINDS = _Codec(show=_show_binds, read=_read_binds, metavar="JSON")

# field -> (flag, help, codec); ``None`` for a switch. In ``SlotIsolation``'s field order.
_TABLE: dict[str, tuple[str, str, _Codec | None]] = {
    "allow_network": ("--allow-network", "share the host network", None),
    "require_sandbox": ("--require-sandbox", "refuse every call when bwrap is unusable", None),
    "read_only_root": ("--writable-root", "leave the sandbox's root writable", None),
    "workspace_path": ("--workspace-path", "where a slot's workspace appears inside", _PATH),
    "system_paths": ("--system-paths", "host directories bound read-only", _PATHS),
    "extra_binds": (
        "--extra-binds",
        'further binds: [{"source": ..., "dest": ..., "writable": ..., "optional": ...}]',
        _BINDS,
    ),
    "max_processes": ("--max-processes", "processes per slot", _OPTIONAL_INT),
    "memory_bytes": ("--memory-bytes", "memory per slot, in bytes", _OPTIONAL_INT),
    "cpu_seconds": ("--cpu-seconds", "CPU seconds per process", _OPTIONAL_INT),
    "max_file_bytes": ("--max-file-bytes", "largest file a process may write", _OPTIONAL_INT),
    "disk_bytes": ("--disk-bytes", "disk space one lease may fill, in bytes", _OPTIONAL_INT),
    "disk_files": ("--disk-files", "files (inodes) one lease may keep", _OPTIONAL_INT),
    "output_cap_bytes": ("--output-cap-bytes", "bytes kept per stream of a call", _INT),
    "file_cap_bytes": ("--file-cap-bytes", "largest file read or written by a call", _INT),
    "min_timeout_s": ("--min-timeout-s", "shortest limit a call gets", _SECONDS),
    "default_timeout_s": ("--default-timeout-s", "a call's limit when it gives none", _SECONDS),
    "max_timeout_s": ("--max-timeout-s", "longest limit a call gets", _SECONDS),
    "use_cgroups": ("--no-cgroups", "use rlimits only", None),
    "bwrap": ("--bwrap", "bubblewrap executable", _PATH),
    "slot_uid_base": (
        "--slot-uid-base",
        "when run as root, slot i's sandbox runs as host uid/gid BASE+i; a server that is "
        "not root runs every slot as itself",
        _INT,
    ),
}


@attrs.frozen
class IsolationFlag:
    """One ``SlotIsolation`` field as a slot-server flag.

    Attributes:
        field: The field's name (the parser's ``dest``).
        name: The flag (``--memory-bytes``).
        help: What the flag does, for ``--help``.
        default: The field's default.
        codec: How the value is written and read; ``None`` for a switch, whose presence means
            the opposite of ``default``.
    """

    field: str
    name: str
    help: str
    default: object
    codec: _Codec | None

    @property
    def metavar(self) -> str | None:
        """The value's placeholder in ``--help`` (``None`` for a switch)."""
        return None if self.codec is None else self.codec.metavar

    def read(self, word: str) -> object:
        """The value a word on the command line stands for.

        Raises:
            ValueError: The word is malformed (not a number, not JSON), or this is a switch.
        """
        if self.codec is None:
            msg = f"{self.name} is a switch and takes no value"
            raise ValueError(msg)
        return self.codec.read(word)


def _isolation_flags(table: dict[str, tuple[str, str, _Codec | None]]) -> tuple[IsolationFlag, ...]:
    """``table`` as flags, with the isolation's defaults.

    Raises:
        ValueError: the table's fields are not the isolation's, in order (both lists named).
    """
    fields = attrs.fields(SlotIsolation)
    names = [field.name for field in fields]
    if list(table) != names:
        msg = f"the flag table lists {list(table)}, but SlotIsolation's fields are {names}"
        raise ValueError(msg)
    flags = []
    for field in fields:
        name, help_text, codec = table[field.name]
        if (codec is None) != isinstance(field.default, bool):
            msg = f"{field.name}: a switch is exactly a field whose default is a bool"
            raise ValueError(msg)
        flags.append(IsolationFlag(field.name, name, help_text, field.default, codec))
    return tuple(flags)


ISOLATION_FLAGS: tuple[IsolationFlag, ...] = _isolation_flags(_TABLE)
"""Every ``SlotIsolation`` field as its slot-server flag, in field order."""


def isolation_argv(isolation: SlotIsolation) -> list[str]:
    """``isolation`` as ``trajcore slot-server`` flags, in field order: every valued flag as one
    word ``--name=value``, a switch only when the field differs from its default."""
    words: list[str] = []
    for flag in ISOLATION_FLAGS:
        value = getattr(isolation, flag.field)
        if flag.codec is None:
            if value != flag.default:
                words.append(flag.name)
        else:
            words.append(f"{flag.name}={flag.codec.show(value)}")
    return words
