"""Several tool servers offered as one ``ToolServer``: the env's external tools from many servers.

``JoinedToolServer`` lists every member once, joins their tools in member order, routes each call
to the member that offers its tool, and gives each member a toolset of its own (named after it).
It is not MCP-specific: any ``ToolServer`` may be a member (an MCP server, the HTTP tool server).
The rules it keeps:

- A member may rename its tools with a ``prefix`` (``fs_`` makes ``read_file`` ``fs_read_file``);
  the call reaches the member under the tool's own name and the result comes back under the
  prefixed one.
- A tool name offered twice (by two members, or by a member and a ``reserved`` name such as a
  slot tool) fails ``list_tools`` with a ``ConfigError`` naming the tool and both owners. A
  prefixed name that is not a valid tool name does too.
- ``execute`` keeps the order of the calls; consecutive calls to one member go to it as one
  request. A call to a tool no member offers is ``REJECTED``. A member's failures are its calls'
  results, as the port says; it raises only ``PoolClosed``.
- ``release(trajectory_id)`` releases that trajectory on every member (those that keep a session
  per trajectory close it). ``aclose`` closes every member (idempotent); it does not exit
  members that were entered with ``async with`` elsewhere: whoever entered them exits them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import attrs

from trajcore.domain.errors import ConfigError, PoolClosed
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec
from trajcore.domain.toolsets import Toolset
from trajcore.ports.tool_server import ToolServer

__all__ = ["JoinedMember", "JoinedToolServer"]


@attrs.frozen(kw_only=True)
class JoinedMember:
    """One server of a ``JoinedToolServer``.

    Attributes:
        name: The member's name: in messages, and the name of its toolset.
        server: The server.
        prefix: Put before each of its tool names (``""``: none).
    """

    name: str
    server: ToolServer = attrs.field(eq=False, repr=False)
    prefix: str = ""


def _members(value: Sequence[JoinedMember]) -> tuple[JoinedMember, ...]:
    return tuple(value)


@attrs.define
class JoinedToolServer:
    """The ``ToolServer`` port over several members (see the module's rules).

    Attributes:
        members: The servers, in the order their tools are offered.
        reserved: Tool names taken already, each with who owns it (``{"bash": "the slot
            tools"}``); a member offering one fails ``list_tools``.

    Raises:
        ConfigError: two members of one name (field ``members``).
    """

    members: Sequence[JoinedMember] = attrs.field(converter=_members)
    reserved: Mapping[str, str] = attrs.field(factory=dict, kw_only=True)
    _routes: dict[str, tuple[JoinedMember, str]] | None = attrs.field(init=False, default=None)
    _specs: list[ToolSpec] = attrs.field(init=False, factory=list)
    _listing: anyio.Lock = attrs.field(init=False, factory=anyio.Lock, repr=False)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        names = [member.name for member in self.members]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigError("members", f"member names must be unique; repeated: {twice}")

    async def list_tools(self) -> list[ToolSpec]:
        """Every member's tools (prefixed), in member order; listed once.

        Raises:
            ConfigError: a tool name offered twice, naming both owners (field ``tools``), or a
                prefixed name that is not a valid tool name.
            ToolServerError, WireError: a member could not list its tools (the message names it).
            PoolClosed: after ``aclose``.
        """
        if self._closed:
            raise PoolClosed("the joined tool server is closed")
        async with self._listing:
            if self._routes is None:
                routes: dict[str, tuple[JoinedMember, str]] = {}
                owners = dict(self.reserved)
                specs: list[ToolSpec] = []
                for member in self.members:
                    for spec in await member.server.list_tools():
                        name = member.prefix + spec.name
                        owner = f"tool server {member.name!r}"
                        if name in owners:
                            raise ConfigError(
                                "tools",
                                f"tool {name!r} is offered by both {owners[name]} and {owner}",
                            )
                        owners[name] = owner
                        renamed = spec if not member.prefix else _renamed(spec, name, member)
                        routes[name] = (member, spec.name)
                        specs.append(renamed)
                self._routes, self._specs = routes, specs
            return list(self._specs)

    def toolsets(self) -> list[Toolset]:
        """One toolset per member that offers tools, named after it, its tools in order.

        Raises:
            ConfigError: called before ``list_tools`` (field ``toolsets``).
        """
        if self._routes is None:
            raise ConfigError("toolsets", "list the tools (list_tools) before asking for toolsets")
        by_member: dict[str, list[str]] = {member.name: [] for member in self.members}
        for name, (member, _) in self._routes.items():
            by_member[member.name].append(name)
        return [
            Toolset(name=member, tools=tools, description=f"the tools of {member}")
            for member, tools in by_member.items()
            if tools
        ]

    async def execute(self, calls: Sequence[ToolCall], *, context: ToolContext) -> list[ToolResult]:
        """Run ``calls`` in order, each on the member offering its tool; one result per call.

        A call made before the tools could be listed, or to a tool no member offers, is
        ``REJECTED`` (or ``INFRA_ERROR`` when listing failed).

        Raises:
            PoolClosed: after ``aclose``, or when a member raises it.
        """
        calls = tuple(calls)
        if self._closed:
            raise PoolClosed("the joined tool server is closed")
        if not calls:
            return []
        if self._routes is None:
            try:
                await self.list_tools()
            except PoolClosed:
                raise
            except Exception as exc:  # noqa: BLE001 - the port raises only PoolClosed
                return [ToolResult.failure(c, ToolOutcome.INFRA_ERROR, str(exc)) for c in calls]
        routes = self._routes or {}
        results: list[ToolResult] = []
        run: list[ToolCall] = []
        run_member: JoinedMember | None = None
        for call in (*calls, None):
            route = routes.get(call.name) if call is not None else None
            member = route[0] if route is not None else None
            if run and (member is not run_member or call is None):
                assert run_member is not None
                results.extend(await self._run(run_member, run, context))
                run = []
            if call is None:
                break
            if route is None:
                results.append(
                    ToolResult.failure(
                        call, ToolOutcome.REJECTED, f"unknown tool {call.name!r} @ name"
                    )
                )
                continue
            run_member = member
            run.append(attrs.evolve(call, name=route[1]))
        return results

    async def _run(
        self, member: JoinedMember, calls: list[ToolCall], context: ToolContext
    ) -> list[ToolResult]:
        answers = await member.server.execute(calls, context=context)
        if len(answers) != len(calls):
            return [
                ToolResult.failure(
                    call,
                    ToolOutcome.INFRA_ERROR,
                    f"tool server {member.name!r} answered {len(calls)} calls "
                    f"with {len(answers)} results",
                )
                for call in calls
            ]
        return [
            attrs.evolve(answer, name=member.prefix + answer.name) if member.prefix else answer
            for answer in answers
        ]

    async def release(self, trajectory_id: str) -> None:
        """Release ``trajectory_id`` on every member, in member order (only the members that
        keep state per trajectory, such as ``MCPToolServer`` with ``SessionScope.TRAJECTORY``,
        have anything to end). Call it when a trajectory ends."""
        for member in self.members:
            await member.server.release(trajectory_id)

    async def aclose(self) -> None:
        """Close every member. Idempotent; later calls raise ``PoolClosed``."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for member in self.members:
                await member.server.aclose()


def _renamed(spec: ToolSpec, name: str, member: JoinedMember) -> ToolSpec:
    try:
        return attrs.evolve(spec, name=name)
    except ConfigError as exc:
        raise ConfigError(
            f"{member.name}.prefix", f"makes tool {spec.name!r} {name!r}: {exc.reason}"
        ) from None
