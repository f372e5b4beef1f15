"""The env's ``tool_servers`` setting: MCP servers by command or URL, checked before anything runs.

In an env's YAML config (or as JSON text on the command line)::

    tool_servers:
      everything:                                   # the server's name, and its toolset's
        command: npx -y @modelcontextprotocol/server-everything
      files:
        command: [mcp-server-filesystem, /srv/data]
        prefix: fs_                                 # fs_read_file: no clash with the slot tools
        scope: trajectory                           # one session (process) per trajectory
      search:
        url: https://search.example.com/mcp
        token_env: SEARCH_MCP_TOKEN                 # or token: ...
        call_timeout_s: 30

``parse_tool_servers`` turns that into ``MCPServerSetting`` values; every mistake is a
``ConfigError`` naming the field (``tool_servers.files.scope``) and the reason, and an unknown key
is a mistake (a dropped setting never passes silently). ``open_tool_servers`` enters one
``MCPToolServer`` per setting and joins them (``JoinedToolServer``), so the env gets one
``ToolServer`` and one toolset per server.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final

import attrs

from trajcore.adapters.mcp.client import (
    MCPURL,
    MCPCommand,
    MCPEndpoint,
    MCPToolServer,
    SessionScope,
)
from trajcore.adapters.mcp.join import JoinedMember, JoinedToolServer
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import json_value

__all__ = ["MCPServerSetting", "open_tool_servers", "parse_tool_servers"]

FIELD: Final = "tool_servers"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEYS: Final = frozenset(
    {
        "command",
        "url",
        "token",
        "token_env",
        "env",
        "cwd",
        "prefix",
        "scope",
        "call_timeout_s",
        "connect_timeout_s",
        "max_restarts",
        "idle_close_s",
        "annotations",
    }
)


@attrs.frozen(kw_only=True)
class MCPServerSetting:
    """One entry of ``tool_servers``, checked.

    Attributes:
        name: The server's name (1-64 of ``[A-Za-z0-9_.-]``): in messages, and its toolset's.
        endpoint: The command to start or the URL to reach.
        prefix: Put before each of its tool names (``""``: none).
        scope: One session per run (``run``) or per trajectory (``trajectory``).
        call_timeout_s: Limit of one call; ``None`` takes the env's default.
        connect_timeout_s: Limit of opening a session.
        max_restarts: How many times a session that died is opened again.
        idle_close_s: Per-trajectory sessions idle this long are closed (``None``: never).
        annotations: Keys of the server's own in its tools' schemas, no keyword of their draft,
            read as annotations (nothing enforces them): ``[markdownDescription]``.
    """

    name: str
    endpoint: MCPEndpoint = attrs.field(repr=False)
    prefix: str = ""
    scope: SessionScope = SessionScope.RUN
    call_timeout_s: float | None = None
    connect_timeout_s: float = 30.0
    max_restarts: int = 3
    idle_close_s: float | None = 600.0
    annotations: tuple[str, ...] = ()

    def client(self, *, default_call_timeout_s: float) -> MCPToolServer:
        """The (not yet entered) ``MCPToolServer`` for this setting.

        Raises:
            ConfigError: a value out of range, at ``tool_servers.<name>.<field>``.
        """
        call_timeout_s = (
            self.call_timeout_s if self.call_timeout_s is not None else default_call_timeout_s
        )
        try:
            return MCPToolServer(
                self.endpoint,
                name=self.name,
                scope=self.scope,
                call_timeout_s=call_timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                max_restarts=self.max_restarts,
                idle_close_s=self.idle_close_s,
                annotations=self.annotations,
            )
        except ConfigError as exc:
            raise ConfigError(f"{FIELD}.{self.name}.{exc.field}", exc.reason) from None


def parse_tool_servers(value: object) -> tuple[MCPServerSetting, ...]:
    """The settings in ``value``: a mapping of name to entry, JSON text of one, or ``None``.

    Raises:
        ConfigError: at ``tool_servers`` or ``tool_servers.<name>[.<key>]``, saying why.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        value = json_value(value, FIELD, error=ConfigError)
    if not isinstance(value, Mapping):
        raise ConfigError(FIELD, f"expected a mapping of server name to settings, got {value!r}")
    settings = []
    for name, entry in value.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(FIELD, f"server name {name!r}: 1-64 of [A-Za-z0-9_.-]")
        settings.append(_setting(name, entry))
    return tuple(settings)


def _setting(name: str, entry: object) -> MCPServerSetting:
    where = f"{FIELD}.{name}"
    if not isinstance(entry, Mapping):
        raise ConfigError(where, f"expected a mapping with command or url, got {entry!r}")
    unknown = sorted(str(key) for key in entry if key not in _KEYS)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}", f"unknown setting; expected one of {sorted(_KEYS)}"
        )
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise ConfigError(where, "give exactly one of command (stdio) and url (streamable HTTP)")
    endpoint = _command(where, entry) if has_command else _url(where, entry)
    scope_text = entry.get("scope", "run")
    try:
        scope = SessionScope(scope_text)
    except ValueError:
        raise ConfigError(
            f"{where}.scope", f"expected 'run' or 'trajectory', got {scope_text!r}"
        ) from None
    prefix = entry.get("prefix", "")
    if not isinstance(prefix, str) or (prefix and not _NAME.match(prefix)):
        raise ConfigError(f"{where}.prefix", f"expected up to 64 of [A-Za-z0-9_.-], got {prefix!r}")
    setting = MCPServerSetting(
        name=name,
        endpoint=endpoint,
        prefix=prefix,
        scope=scope,
        call_timeout_s=_number(where, entry, "call_timeout_s", None),
        connect_timeout_s=_number(where, entry, "connect_timeout_s", 30.0, optional=False) or 0.0,
        max_restarts=_whole(where, entry, "max_restarts", 3),
        idle_close_s=_number(where, entry, "idle_close_s", 600.0),
        annotations=_keys(where, entry),
    )
    setting.client(default_call_timeout_s=60.0)  # every range checked now, not at start
    return setting


def _command(where: str, entry: Mapping[object, object]) -> MCPCommand:
    command, env, cwd = entry["command"], entry.get("env", {}), entry.get("cwd")
    for key in ("url", "token", "token_env"):
        if key in entry:
            raise ConfigError(f"{where}.{key}", "only for a server given by url")
    if not isinstance(command, str) and not (
        isinstance(command, Sequence) and all(isinstance(part, str) for part in command)
    ):
        raise ConfigError(f"{where}.command", f"expected a command line or a list, got {command!r}")
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError(f"{where}.env", "expected a mapping of names to string values")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}.cwd", f"expected a directory path, got {cwd!r}")
    try:
        parsed = MCPCommand.parse(command, env={str(k): str(v) for k, v in env.items()})
    except ConfigError as exc:
        raise ConfigError(f"{where}.command", exc.reason) from None
    return attrs.evolve(parsed, cwd=cwd)


def _url(where: str, entry: Mapping[object, object]) -> MCPURL:
    for key in ("env", "cwd"):
        if key in entry:
            raise ConfigError(f"{where}.{key}", "only for a server given by command")
    url, token, token_env = entry["url"], entry.get("token"), entry.get("token_env")
    if token is not None and token_env is not None:
        raise ConfigError(f"{where}.token", "give token or token_env, not both")
    if token_env is not None:
        if not isinstance(token_env, str) or not token_env:
            raise ConfigError(f"{where}.token_env", "expected an environment variable's name")
        token = os.environ.get(token_env)
        if not token:
            raise ConfigError(f"{where}.token_env", f"${token_env} is not set or empty")
    if token is not None and (not isinstance(token, str) or not token):
        raise ConfigError(f"{where}.token", "expected a non-empty string")
    if not isinstance(url, str):
        raise ConfigError(f"{where}.url", f"expected an http(s):// URL, got {url!r}")
    try:
        return MCPURL(url=url, token=token)
    except ConfigError as exc:
        raise ConfigError(f"{where}.url", exc.reason) from None


def _number(
    where: str,
    entry: Mapping[object, object],
    key: str,
    default: float | None,
    *,
    optional: bool = True,
) -> float | None:
    value = entry.get(key, default)
    if value is None:
        if not optional:
            raise ConfigError(f"{where}.{key}", "expected a number of seconds, got None")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key}", f"expected a number of seconds, got {value!r}")
    return float(value)


def _keys(where: str, entry: Mapping[object, object]) -> tuple[str, ...]:
    value = entry.get("annotations", [])
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{where}.annotations", f"expected a list of keys, got {value!r}")
    keys = tuple(value)
    bad = [key for key in keys if not isinstance(key, str) or not key or key.startswith("$")]
    if bad:
        raise ConfigError(
            f"{where}.annotations", f"expected names of schema keys (not '$...'), got {bad[0]!r}"
        )
    return keys


def _whole(where: str, entry: Mapping[object, object], key: str, default: int) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}", f"expected a whole number, got {value!r}")
    return value


@asynccontextmanager
async def open_tool_servers(
    settings: Sequence[MCPServerSetting],
    *,
    default_call_timeout_s: float,
    reserved: Mapping[str, str] | None = None,
    before: Sequence[JoinedMember] = (),
) -> AsyncIterator[JoinedToolServer]:
    """Enter one ``MCPToolServer`` per setting and yield them joined, after the members
    ``before`` (e.g. the env's HTTP tool server); exit closes them all.

    Open and close in the same task. The tools are not listed here: ``list_tools`` on the
    joined server lists every member and fails on a clash of names, naming both owners
    (``reserved`` names such as the slot tools count as owned).

    Raises:
        ConfigError: a setting out of range (``tool_servers.<name>.<field>``).
    """
    clients = [(s, s.client(default_call_timeout_s=default_call_timeout_s)) for s in settings]
    async with AsyncExitStack() as stack:
        members = [*before] + [
            JoinedMember(
                name=setting.name,
                server=await stack.enter_async_context(client),
                prefix=setting.prefix,
            )
            for setting, client in clients
        ]
        joined = JoinedToolServer(members, reserved=dict(reserved or {}))
        try:
            yield joined
        finally:
            await joined.aclose()
