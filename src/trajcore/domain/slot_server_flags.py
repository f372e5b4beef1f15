"""The slot server's policy as command-line flags: one value, used by every pool that starts one.

A slot server (``trajcore slot-server``) takes its whole sandbox policy from its command line:
network, whether a sandbox is required, per-slot limits, output caps, the range call timeouts are
clamped into. The local pool starts slot servers as child processes and the Nomad pool writes
them into a job; both build the flags here, so the two pools cannot drift apart in what a policy
means on the wire.

Rules it keeps:

- Every number is checked when the value is built; a bad one is a ``ConfigError`` naming the
  field and the reason, so a pool never starts a server that would exit on its flags.
- ``min_timeout_s <= default_timeout_s <= max_timeout_s``.
- ``argv()`` is a pure function of the value: the same policy always gives the same words, in
  the same order, with floats written by ``repr`` so they read back exactly.
- Where the server listens, its slot count and its workspace root are not policy: the caller
  adds them (a local socket, a Nomad port, a task directory).
"""

from __future__ import annotations

import math

import attrs

from trajcore.domain.errors import ConfigError

__all__ = [
    "DEFAULT_SLOT_UID_BASE",
    "MAX_SLOT_UID",
    "MIN_SLOT_UID_BASE",
    "SLOT_HELPERS",
    "SlotServerFlags",
    "check_slot_uid_range",
]

# What runs a slot's keeper and lease agents: see ``trajcore slot-server --slot-helper``.
SLOT_HELPERS: tuple[str, ...] = ("auto", "native", "python")

# A slot server run as root runs slot ``i``'s sandbox as host uid and gid ``base + i``. The
# default lies far above ordinary accounts (1000..60000), the ``nobody`` ids (65534) and the
# subordinate id ranges that ``useradd`` hands out (100000 upwards, 65536 per user), and below
# 2**31 so that no tool reading a uid as a signed number sees a negative one.
DEFAULT_SLOT_UID_BASE = 1_900_000_000
MIN_SLOT_UID_BASE = 65536
MAX_SLOT_UID = (1 << 31) - 1


def check_slot_uid_range(field: str, base: object, count: int) -> None:
    """Raise ``ConfigError`` unless ``base .. base + count - 1`` are usable slot uids."""
    if isinstance(base, bool) or not isinstance(base, int):
        raise ConfigError(field, f"must be an integer, got {base!r}")
    if base < MIN_SLOT_UID_BASE:
        raise ConfigError(
            field, f"must be >= {MIN_SLOT_UID_BASE} (above ordinary accounts), got {base}"
        )
    if base + count - 1 > MAX_SLOT_UID:
        raise ConfigError(
            field, f"{base} + {count} slots runs past the largest slot uid {MAX_SLOT_UID}"
        )


def _positive_int(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(attribute.name, f"must be an integer >= 1, got {value!r}")


def _optional_positive_int(
    _: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(attribute.name, f"must be None or an integer >= 1, got {value!r}")


def _positive_seconds(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ConfigError(attribute.name, f"must be finite seconds > 0, got {value!r}")


def _slot_helper(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in SLOT_HELPERS:
        raise ConfigError(
            attribute.name, f"must be one of {', '.join(SLOT_HELPERS)}, got {value!r}"
        )


def _executable(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value or value != value.strip() or "\0" in value:
        raise ConfigError(attribute.name, f"must be a program name or path, got {value!r}")


@attrs.frozen(kw_only=True)
class SlotServerFlags:
    """The sandbox policy a slot server is started with; the env's, never the model's.

    Attributes:
        allow_network: Slots share the host network (otherwise only a private loopback).
        require_sandbox: The server refuses calls when bubblewrap is unusable; otherwise calls
            run unsandboxed and say so.
        max_processes, memory_mb, cpu_seconds: Limits per slot (``cpu_seconds`` ``None``: none).
        output_cap_bytes: Bytes kept per stream of one call.
        file_cap_bytes: Largest file ``read_file`` returns and ``write_file`` accepts.
        min_timeout_s, default_timeout_s, max_timeout_s: The range call timeouts are clamped into.
        use_cgroups: Try cgroups for the per-slot limits before rlimits.
        bwrap: The bubblewrap executable, as the server's host names it.
        slot_helper: What runs each slot's keeper and lease agents: ``"native"`` (the compiled
            helper; the server refuses to start without it), ``"python"``, or ``"auto"`` (native
            when the server's host can build it, else Python).
        slot_uid_base: When the server runs as root, slot ``i`` runs as host uid and gid
            ``slot_uid_base + i`` (never as root); ignored by a server that is not root.
    """

    allow_network: bool = False
    require_sandbox: bool = False
    max_processes: int = attrs.field(default=256, validator=_positive_int)
    memory_mb: int = attrs.field(default=2048, validator=_positive_int)
    cpu_seconds: int | None = attrs.field(default=None, validator=_optional_positive_int)
    output_cap_bytes: int = attrs.field(default=64 << 10, validator=_positive_int)
    file_cap_bytes: int = attrs.field(default=10 << 20, validator=_positive_int)
    min_timeout_s: float = attrs.field(default=1.0, validator=_positive_seconds)
    default_timeout_s: float = attrs.field(default=120.0, validator=_positive_seconds)
    max_timeout_s: float = attrs.field(default=3600.0, validator=_positive_seconds)
    use_cgroups: bool = True
    bwrap: str = attrs.field(default="bwrap", validator=_executable)
    slot_helper: str = attrs.field(default="auto", validator=_slot_helper)
    slot_uid_base: int = DEFAULT_SLOT_UID_BASE

    def __attrs_post_init__(self) -> None:
        check_slot_uid_range("slot_uid_base", self.slot_uid_base, 1)
        for name in ("allow_network", "require_sandbox", "use_cgroups"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if not self.min_timeout_s <= self.default_timeout_s <= self.max_timeout_s:
            raise ConfigError(
                "default_timeout_s",
                f"must lie in [min_timeout_s, max_timeout_s] = "
                f"[{self.min_timeout_s}, {self.max_timeout_s}], got {self.default_timeout_s}",
            )

    def argv(self) -> list[str]:
        """The policy flags of ``trajcore slot-server``, in a fixed order."""
        words = [
            f"--bwrap={self.bwrap}",  # one word: a path may start with '-'
            "--max-processes", str(self.max_processes), "--memory-mb", str(self.memory_mb),
            "--output-cap-bytes", str(self.output_cap_bytes),
            "--file-cap-bytes", str(self.file_cap_bytes),
            "--min-timeout-s", repr(float(self.min_timeout_s)),
            "--default-timeout-s", repr(float(self.default_timeout_s)),
            "--max-timeout-s", repr(float(self.max_timeout_s)),
        ]  # fmt: skip
        if self.cpu_seconds is not None:
            words += ["--cpu-seconds", str(self.cpu_seconds)]
        if self.allow_network:
            words.append("--allow-network")
        if self.require_sandbox:
            words.append("--require-sandbox")
        if not self.use_cgroups:
            words.append("--no-cgroups")
        if self.slot_helper != "auto":
            words += ["--slot-helper", self.slot_helper]
        if self.slot_uid_base != DEFAULT_SLOT_UID_BASE:
            words += ["--slot-uid-base", str(self.slot_uid_base)]
        return words
