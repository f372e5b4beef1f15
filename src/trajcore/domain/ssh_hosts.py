"""SSH hosts that run slot servers, as pure data: the host list, the ``ssh`` command lines, and
what a host's start check reported.

The SSH pool (``adapters/pools/ssh_pool``) runs slot servers on machines an operator reaches
with ``ssh``. Everything it decides without touching a socket lives here:

- ``SshHost``: one host as the operator names it (address, user, port, key, known_hosts, how
  many servers and slots, the remote ``python``, how the pool reaches its servers), checked when
  built. Nothing a host setting holds may become an ``ssh`` option by accident: an address or
  user starting with ``-`` is refused, extra options must read ``Key=Value``.
- ``SshSettings``: what every host shares (the ``ssh`` program, its config file, deadlines).
- ``ssh_argv``: the whole ``ssh`` command line of one connection as a pure function. Host keys
  are always verified: ``StrictHostKeyChecking yes`` unless the host opts in by name
  (``accept_new_host_key``: ``accept-new``, which still refuses a *changed* key). ``BatchMode``
  (never a password prompt), ``ConnectTimeout`` and ``ServerAliveInterval``/``CountMax`` (a
  stalled connection ends the client within ``stall_deadline_s``) are always set.
- ``host_lacks``: a host's check report (the JSON its ``python`` printed) to the list of what the
  host lacks, each in words an operator can act on.

Rules: no I/O, no clock; paths are text; every bad setting is a ``ConfigError`` naming its field.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.validators import flag, positive_int, whole_number

__all__ = [
    "MIN_PYTHON",
    "SshHost",
    "SshSettings",
    "SshTransport",
    "host_lacks",
    "remote_command",
    "ssh_argv",
]

MIN_PYTHON = (3, 11)
SshTransport = Literal["auto", "unix", "tcp"]

_WORD = re.compile(r"^[^\s\-][^\s]*$")  # no whitespace, not an option
_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*=\S.*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")


def _word(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or _WORD.fullmatch(value) is None:
        raise ConfigError(
            attribute.name,
            f"must be one word without whitespace that does not start with '-', got {value!r}",
        )


def _optional_word(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        _word(_, attribute, value)  # type: ignore[arg-type]


def _absolute(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
        raise ConfigError(
            attribute.name, f"must be an absolute path without whitespace, got {value!r}"
        )


def _options(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError("ssh_options", f"must be a list of 'Key=Value' words, got {value!r}")
    words = tuple(value)
    for index, word in enumerate(words):
        if not isinstance(word, str) or _OPTION.fullmatch(word) is None:
            raise ConfigError(
                f"ssh_options[{index}]", f"must read 'Key=Value' (an ssh -o option), got {word!r}"
            )
    return words


def _transport(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in ("auto", "unix", "tcp"):
        raise ConfigError(attribute.name, f"must be 'auto', 'unix' or 'tcp', got {value!r}")


def _name(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and (not isinstance(value, str) or _NAME.fullmatch(value) is None):
        raise ConfigError(
            attribute.name,
            f"must be None or a short name ([A-Za-z0-9][A-Za-z0-9_.-]*), got {value!r}",
        )


@attrs.frozen(kw_only=True)
class SshHost:
    """One machine that runs slot servers, reached with ``ssh``.

    Attributes:
        address: The host name, IP address or ``Host`` alias of the ssh config.
        user: The login name (``None``: ssh's default, from its config or the local user).
        port: The sshd port (``None``: ssh's default, from its config or 22).
        servers: Slot servers this host runs.
        slots: Slots each of them serves.
        python: The remote interpreter that has trajcore installed (a venv's ``bin/python``).
        identity_file: A private key file (``None``: the agent's keys, then ssh's defaults).
        known_hosts: The known_hosts file that vouches for the host's key (``None``: ssh's).
        accept_new_host_key: Trust this host's key on first contact and record it (ssh's
            ``accept-new``); a changed key is refused all the same. Off: an unknown key is
            refused.
        transport: ``unix``: the pool reaches each server through a Unix socket forwarded by
            ssh (no port opens on the host's network); ``tcp``: the server listens on
            ``tcp_bind`` with a bearer token and the pool connects to ``tcp_address``;
            ``auto``: ``unix`` where the host's sshd forwards Unix sockets, else ``tcp``.
        tcp_bind: The address a TCP server listens on, on the host.
        tcp_address: The address the pool connects to for TCP (``None``: ``address``).
        remote_dir: The host directory under which each server gets a private directory.
        ssh_options: More ``-o Key=Value`` options for this host.
        name: The host's name in container names and messages (``None``: from ``address``).
    """

    address: str = attrs.field(validator=_word)
    user: str | None = attrs.field(default=None, validator=_optional_word)
    port: int | None = attrs.field(default=None, validator=whole_number(1, optional=True))
    servers: int = attrs.field(default=1, validator=positive_int)
    slots: int = attrs.field(default=4, validator=positive_int)
    python: str = attrs.field(default="python3", validator=_word)
    identity_file: str | None = attrs.field(default=None, validator=_optional_word)
    known_hosts: str | None = attrs.field(default=None, validator=_optional_word)
    accept_new_host_key: bool = attrs.field(default=False, validator=flag)
    transport: SshTransport = attrs.field(default="auto", validator=_transport)
    tcp_bind: str = attrs.field(default="0.0.0.0", validator=_word)  # noqa: S104 - the host's
    tcp_address: str | None = attrs.field(default=None, validator=_optional_word)
    remote_dir: str = attrs.field(default="/tmp", validator=_absolute)  # noqa: S108 - remote
    ssh_options: tuple[str, ...] = attrs.field(default=(), converter=_options)
    name: str | None = attrs.field(default=None, validator=_name)

    def __attrs_post_init__(self) -> None:
        if self.port is not None and self.port > 65535:
            raise ConfigError("port", f"must be a TCP port in [1, 65535], got {self.port}")

    @property
    def label(self) -> str:
        """The host's short name: ``name``, else ``address`` with other characters as ``-``."""
        if self.name is not None:
            return self.name
        return re.sub(r"[^A-Za-z0-9_.-]", "-", self.address)[:41] or "host"

    @property
    def destination(self) -> str:
        """``user@address`` or ``address``: ssh's destination word."""
        return self.address if self.user is None else f"{self.user}@{self.address}"


@attrs.frozen(kw_only=True)
class SshSettings:
    """What every host's connections share.

    Attributes:
        ssh: The ssh client program.
        config_file: ssh's config file (``-F``); ``None``: ssh's usual files.
        connect_timeout_s: Longest a connection may take to be set up (``ConnectTimeout``).
        keepalive_s: Seconds between keepalives on a quiet connection (``ServerAliveInterval``).
        keepalive_count: Unanswered keepalives before the connection is given up.
    """

    ssh: str = attrs.field(default="ssh", validator=_word)
    config_file: str | None = attrs.field(default=None, validator=_optional_word)
    connect_timeout_s: int = attrs.field(default=10, validator=positive_int)
    keepalive_s: int = attrs.field(default=5, validator=positive_int)
    keepalive_count: int = attrs.field(default=3, validator=positive_int)

    @property
    def stall_deadline_s(self) -> float:
        """Longest a stalled connection lives before ssh gives it up (the last keepalive's
        interval included)."""
        return float(self.keepalive_s * (self.keepalive_count + 1))


def ssh_argv(
    host: SshHost,
    settings: SshSettings,
    remote: Sequence[str],
    *,
    forward: tuple[str, str] | None = None,
) -> list[str]:
    """The ``ssh`` command line that runs ``remote`` (argument words) on ``host``.

    ``forward``: ``(local socket, remote socket)`` forwarded with ``-L`` (the local socket is
    created by ssh, mode 0600; the connection fails at start when it cannot be, so a pool never
    waits on a forward that does not exist). ``remote`` is quoted for the remote shell.
    """
    argv = [settings.ssh]
    if settings.config_file is not None:
        argv += ["-F", settings.config_file]
    checking = "accept-new" if host.accept_new_host_key else "yes"
    options = [
        "BatchMode=yes",
        f"StrictHostKeyChecking={checking}",
        f"ConnectTimeout={settings.connect_timeout_s}",
        f"ServerAliveInterval={settings.keepalive_s}",
        f"ServerAliveCountMax={settings.keepalive_count}",
        "ExitOnForwardFailure=yes",
        "StreamLocalBindUnlink=yes",
        "ControlMaster=no",
        "ControlPath=none",
        "RequestTTY=no",
    ]
    if host.known_hosts is not None:
        options += [f"UserKnownHostsFile={host.known_hosts}", "GlobalKnownHostsFile=/dev/null"]
    if host.identity_file is not None:
        argv += ["-i", host.identity_file]
        options.append("IdentitiesOnly=yes")
    options += host.ssh_options
    for option in options:
        argv += ["-o", option]
    if host.port is not None:
        argv += ["-p", str(host.port)]
    if forward is not None:
        argv += ["-L", f"{forward[0]}:{forward[1]}"]
    return [*argv, "-T", "--", host.destination, remote_command(remote)]


def remote_command(words: Sequence[str]) -> str:
    """``words`` as one command line for the remote user's shell (each word quoted)."""
    return shlex.join(words)


def host_lacks(
    report: Mapping[str, JSON], *, python: str, need_bwrap: bool, need_tmux: bool
) -> list[str]:
    """What the host whose check printed ``report`` lacks, in an operator's words ([]: nothing).

    ``report`` holds ``python`` (``[major, minor, micro]``), ``trajcore`` (its version or
    ``null``), ``trajcore_error``, ``bwrap`` and ``tmux`` (paths or ``null``) and
    ``bwrap_error`` (why bubblewrap could not make a sandbox there, or ``null``).
    """
    lacks: list[str] = []
    version = report.get("python")
    if (
        not isinstance(version, list)
        or len(version) < 2
        or not all(isinstance(part, int) for part in version)
    ):
        lacks.append(f"a Python that reports its version at {python}")
    elif (version[0], version[1]) < MIN_PYTHON:
        shown = ".".join(str(part) for part in version)
        lacks.append(f"Python >= 3.11 at {python} (it is {shown})")
    if not isinstance(report.get("trajcore"), str):
        error = report.get("trajcore_error")
        lacks.append(
            f"trajcore in {python} (pip install trajcore: the core install): "
            f"{error if isinstance(error, str) else 'not importable'}"
        )
    if need_bwrap:
        if not isinstance(report.get("bwrap"), str):
            lacks.append("bubblewrap (bwrap is not on PATH; apt-get install bubblewrap)")
        elif isinstance(report.get("bwrap_error"), str):
            lacks.append(f"a usable bubblewrap: {report['bwrap_error']}")
    if need_tmux and not isinstance(report.get("tmux"), str):
        lacks.append("tmux (the persistent shell needs it; apt-get install tmux)")
    return lacks
