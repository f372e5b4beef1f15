"""A group's workspace preparation done once: a preparation lease over the group's environment
runs the prepare hook, is frozen into a snapshot, and the members start from it.

``prepared_group`` holds one lease of its own (``<group_id>/prepare``) over the environment,
runs the env's prepare hook in it with the same ``SlotTools`` a member gets, and freezes the
lease (``EnvironmentPool.snapshot``): what it wrote over the image and in its workspace. Each
member then leases with ``EnvironmentPool.lease_from``: a member whose slot is on the
snapshot's server starts from the snapshot (a copy-on-write fork: no preparation of its own,
the preparation's metadata as its own); any other member, or one whose fork the server refused,
leases the plain image and prepares itself, exactly as without this step. On leaving, the
snapshot is dropped (its files go once the members over it have reset).

It never fails a group: when the pool takes no snapshots, the preparation lease is refused, the
hook raises or returns something that is not a JSON object, or the deadline passes, it logs why
and yields ``None``, and every member prepares itself (and meets the same failure, which its
result then reports as usual).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import cast

import anyio
import attrs

from trajcore.domain.environment_leases import Snapshot
from trajcore.domain.json_values import JSONObject, check_json
from trajcore.domain.slots import Lease
from trajcore.domain.tools import ToolSpec
from trajcore.ports.sandbox_pool import EnvironmentPool, SandboxPool
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter

__all__ = ["Prepared", "member_lease", "prepared_group", "unstarted_lease"]

log = logging.getLogger("trajcore.rollout")


@attrs.frozen(kw_only=True)
class Prepared:
    """A group's preparation, frozen.

    Attributes:
        snapshot: The prepared lease's snapshot, on one slot server.
        metadata: What the prepare hook returned (a JSON object or ``None``).
        duration_s: How long the preparation took (lease, hook and snapshot).
    """

    snapshot: Snapshot
    metadata: JSONObject | None
    duration_s: float


def member_lease(
    pool: SandboxPool,
    holder: str,
    *,
    timeout_s: float,
    environment: str | None,
    prepared: Prepared | None,
) -> AbstractAsyncContextManager[tuple[Lease, bool]]:
    """A group member's lease, and whether it started from the group's ``prepared`` snapshot
    (where the pool can fork it; elsewhere a lease over ``environment``, to prepare itself)."""
    if prepared is not None and isinstance(pool, EnvironmentPool):
        return pool.lease_from(holder, prepared.snapshot, timeout_s=timeout_s)
    return _unforked(pool.lease(holder, timeout_s=timeout_s, environment=environment))


def unstarted_lease(environment: str | None, deadline_s: float) -> str:
    """Why a member's lease had not started when the trajectory's deadline passed.

    Without an environment the member was waiting for a slot. With one, the pool may also
    have had the slot and been waiting for its server to open the environment, which for an
    image's first use on a host means unpacking it: the detail names the image and says so,
    so that a slow or hung image is not taken for too few slots.
    """
    if environment is None:
        return "no slot before the trajectory deadline"
    return (
        f"the lease over {environment} had not started before the trajectory's deadline of "
        f"{round(deadline_s, 1):g} s: no slot came free in time, or the slot's server was still "
        "opening the environment (a first use of an image on a host unpacks it, which can "
        "take minutes; see docs/environments.md, 'A first use and the deadline')"
    )


@asynccontextmanager
async def _unforked(
    leasing: AbstractAsyncContextManager[Lease],
) -> AsyncIterator[tuple[Lease, bool]]:
    async with leasing as lease:
        yield lease, False


@asynccontextmanager
async def prepared_group(
    *,
    group_id: str,
    environment: str,
    prepare: Callable[[SlotTools], Awaitable[JSONObject | None]],
    pool: SandboxPool,
    dispatcher: ToolDispatcher,
    tool_server: ToolServer | None,
    tools: Sequence[ToolSpec],
    tool_timeout_s: float,
    acquire_timeout_s: float,
    deadline_s: float,
) -> AsyncIterator[Prepared | None]:
    """The group's preparation over ``environment`` done once (see the module docstring), or
    ``None`` when it could not be; its snapshot is dropped on exit."""
    holder = f"{group_id}/prepare"

    async def run_hook(lease: Lease) -> object:
        # The hook sees the preparation lease through the same tools a member gets.
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=tool_server,
            offered=frozenset(spec.name for spec in tools),
            tool_timeout_s=tool_timeout_s, trajectory_id=holder,
        )  # fmt: skip
        slot_tools = SlotTools(router, pool=pool, environment=environment)
        metadata = await prepare(slot_tools)
        slot_tools.call_log.check_awaited("prepare hook", "await tools.<method>(...)")
        return metadata  # a forgotten await above: not frozen, each member prepares (and fails)

    prepared = await _prepare(
        group_id=group_id, holder=holder, environment=environment, pool=pool, run_hook=run_hook,
        acquire_timeout_s=acquire_timeout_s, deadline_s=deadline_s,
    )  # fmt: skip
    try:
        yield prepared
    finally:
        if prepared is not None and isinstance(pool, EnvironmentPool):
            with anyio.CancelScope(shield=True):
                await pool.drop_snapshot(prepared.snapshot)


async def _prepare(
    *,
    group_id: str,
    holder: str,
    environment: str,
    pool: SandboxPool,
    run_hook: Callable[[Lease], Awaitable[object]],
    acquire_timeout_s: float,
    deadline_s: float,
) -> Prepared | None:
    """Lease ``holder``'s slot over ``environment``, run the hook in it and freeze it; ``None``
    (logged) when any step could not be done."""
    if not isinstance(pool, EnvironmentPool):
        log.info("group %s: the pool takes no snapshots; each member prepares", group_id)
        return None
    started = anyio.current_time()
    with anyio.move_on_after(deadline_s):
        try:
            async with pool.lease(
                holder, timeout_s=acquire_timeout_s, environment=environment
            ) as lease:
                metadata = await run_hook(lease)
                if metadata is not None and (
                    not isinstance(metadata, dict) or check_json(metadata) is not None
                ):
                    log.warning("group %s: prepare returned %r: not frozen", group_id, metadata)
                    return None
                snapshot = await pool.snapshot(lease, environment)
        except Exception as error:  # noqa: BLE001 - never the group's failure: members prepare
            log.warning(
                "group %s: preparing once over %s failed (%s: %s); each member prepares",
                group_id, environment, type(error).__name__, error,
            )  # fmt: skip
            return None
        return Prepared(
            snapshot=snapshot,
            metadata=cast("JSONObject | None", metadata),  # checked above
            duration_s=anyio.current_time() - started,
        )
    log.warning("group %s: preparing once passed its deadline; each member prepares", group_id)
    return None
