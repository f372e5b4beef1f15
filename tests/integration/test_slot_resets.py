"""A reset ends in one of two states, whatever fails inside it: the slot is clean (wiped in
place, or given a new workspace while the old one is set aside for a background sweep), or it is
broken (quarantined), counted in health, and no later lease of it ever runs.

The runtime runs in this process with the Python helper and no bubblewrap (what is tested is the
reset's bookkeeping, not the isolation, which tests/security covers); a failure is forced by
putting a raising function where the wipe or the cleaning is looked up.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server import runtime as runtime_module
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.server import start_http_server
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.errors import SlotServerError, WireError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import ExecuteCall, Health, ResetRequest
from trajcore.domain.tools import ToolOutcome, ToolResult

_ids = itertools.count(1)


def call(epoch: int, command: str) -> ExecuteCall:
    arguments: dict[str, JSON] = {"command": command}
    return ExecuteCall(
        slot=0, epoch=epoch, call_id=f"r{next(_ids)}", tool="bash", arguments=arguments,
        timeout_s=10.0,
    )  # fmt: skip


def config(root: Path) -> RuntimeConfig:
    return RuntimeConfig(
        slots=1, root=root, isolation=SlotIsolation(require_sandbox=False),
        bwrap="/nonexistent/bwrap", use_cgroups=False,
    )  # fmt: skip


@pytest.fixture
def root() -> Iterator[Path]:
    """A server root every uid may search (a root server runs its slots as other uids)."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-resets-"))
    folder.chmod(0o755)
    try:
        yield folder / "root"
    finally:
        remove_tree(folder)


def raise_recursion(*_: object, **__: object) -> None:
    raise RecursionError("maximum recursion depth exceeded")


async def raising_clean(*_: object, **__: object) -> str | None:
    raise RecursionError("maximum recursion depth exceeded")


def test_a_reset_that_raises_anything_leaves_the_slot_broken(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> tuple[bool, str | None, ToolResult, Health]:
        runtime = SlotRuntime(config(root))
        await runtime.start()
        try:
            (made,) = await runtime.execute([call(1, "echo secret > left.txt")])
            assert made.outcome is ToolOutcome.OK, made
            monkeypatch.setattr(runtime_module, "clean_slot", raising_clean)
            reset = await runtime.reset(0, 1)
            (later,) = await runtime.execute([call(2, "cat left.txt")])
            return reset.ok, reset.error, later, runtime.health()
        finally:
            await runtime.aclose()

    ok, error, later, health = asyncio.run(main())
    assert not ok
    assert error is not None
    assert "RecursionError" in error
    assert later.outcome is ToolOutcome.INFRA_ERROR, later
    assert "broken" in later.content
    assert "secret" not in later.content
    assert health.broken_slots == (0,)


def test_a_workspace_that_cannot_be_wiped_is_set_aside_and_the_slot_goes_on_clean(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> tuple[bool, ToolResult, Health, list[str]]:
        runtime = SlotRuntime(config(root))
        await runtime.start()
        try:
            (made,) = await runtime.execute([call(1, "echo secret > left.txt")])
            assert made.outcome is ToolOutcome.OK, made
            with monkeypatch.context() as patched:
                patched.setattr(Workspace, "wipe", raise_recursion)
                reset = await runtime.reset(0, 1)
            (later,) = await runtime.execute([call(2, "ls -A; echo end")])
            for _ in range(200):  # the sweep runs in the background
                if not os.listdir(root / "trash"):
                    break
                await asyncio.sleep(0.02)
            return reset.ok, later, runtime.health(), os.listdir(root / "trash")
        finally:
            await runtime.aclose()

    ok, later, health, trash = asyncio.run(main())
    assert ok
    assert (later.outcome, later.content) == (ToolOutcome.OK, "end\n"), later
    assert health.workspaces_set_aside == 1
    assert health.broken_slots == ()
    assert trash == [], "the background sweep did not empty the trash"


def test_a_server_started_over_an_earlier_servers_root_shows_none_of_its_files(
    root: Path,
) -> None:
    """A slot server restarted over the same ``root`` (a crash, a service restart): the earlier
    server's workspaces and slot state go to the trash at start and are swept, with the trash
    it left, so the new server's first lease starts empty."""

    async def main() -> tuple[ToolResult, ToolResult, list[str]]:
        earlier = SlotRuntime(config(root))
        await earlier.start()
        try:
            (made,) = await earlier.execute([call(1, "echo secret > left.txt; mkdir d")])
            assert made.outcome is ToolOutcome.OK, made
        finally:
            await earlier.aclose()
        (root / "trash" / "unswept").mkdir(parents=True)
        (root / "trash" / "unswept" / "file").write_text("left by the earlier server")
        runtime = SlotRuntime(config(root))
        await runtime.start()
        try:
            (first,) = await runtime.execute([call(1, "ls -A; echo end")])
            (works,) = await runtime.execute([call(1, "echo ok > new.txt && cat new.txt")])
            for _ in range(200):  # the sweep runs in the background
                if not os.listdir(root / "trash"):
                    break
                await asyncio.sleep(0.02)
            return first, works, os.listdir(root / "trash")
        finally:
            await runtime.aclose()

    first, works, trash = asyncio.run(main())
    assert (first.outcome, first.content) == (ToolOutcome.OK, "end\n"), first
    assert (works.outcome, works.content) == (ToolOutcome.OK, "ok\n"), works
    assert trash == [], "the start's sweep did not empty the trash"


def test_a_reset_keeps_to_the_limit_the_pools_client_sends(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's client sends its ``reset_timeout_s`` with ``POST /v1/reset``
    (``ResetRequest.timeout_s``) and the server keeps to it: the wipe gets half of it, then the
    workspace is set aside; a request without one gets the server's own ``reset_timeout_s``.
    Before, a pool's limit never reached its servers, so a pool with a shorter one gave up on a
    server still wiping (and lost it with every lease on it)."""
    wipes: list[float] = []

    async def recording_clean(*args: object, wipe_timeout_s: float, **kwargs: object) -> None:
        wipes.append(wipe_timeout_s)

    token = "reset-limit-token-0123456789abcdef"

    async def main() -> list[bool]:
        runtime = SlotRuntime(config(root))  # the server's own reset_timeout_s: 15 s
        await runtime.start()
        server, address = await start_http_server(runtime, token, listen="127.0.0.1:0")
        assert address is not None
        client = SlotServerClient.tcp(address, token)
        try:
            monkeypatch.setattr(runtime_module, "clean_slot", recording_clean)
            answers = []
            for epoch, limit in ((1, 2.0), (2, None)):
                (made,) = await runtime.execute([call(epoch, "true")])
                assert made.outcome is ToolOutcome.OK, made
                if limit is None:  # as a client that sends no limit would
                    answers.append((await runtime.reset(0, epoch)).ok)
                    continue
                client.reset_timeout_s = limit
                answers.append((await client.reset(0, epoch)).ok)
            return answers
        finally:
            await client.aclose()
            await server.aclose()
            await runtime.aclose()

    assert asyncio.run(main()) == [True, True]
    assert wipes == [1.0, 7.5]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_a_reset_limit_that_is_not_finite_seconds_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(WireError) as caught:
        ResetRequest(slot=0, epoch=3, timeout_s=bad)  # type: ignore[arg-type]
    assert caught.value.field == "timeout_s"


def test_a_batch_answered_by_a_server_restarted_in_place_fails_naming_it(root: Path) -> None:
    """A slot server restarted in place (an orchestrator's in-place restart: the same socket and
    token) has none of its slots' state, so a lease's next call must not come back ``OK`` from
    it: each run of a server has its own ``boot`` (in health and in every batch's answer), and
    the client refuses a batch answered by another boot than the one it first saw, which the
    pool takes as the server's loss (every call ``INFRA_ERROR``)."""
    socket = str(root.parent / "server.sock")

    async def serve() -> tuple[SlotRuntime, Any]:
        runtime = SlotRuntime(config(root))
        await runtime.start()
        server, _ = await start_http_server(runtime, None, unix=socket)
        return runtime, server

    async def main() -> tuple[ToolResult, str | None, str, str]:
        client = SlotServerClient.unix(socket)
        runtime, server = await serve()
        first_boot = runtime.boot
        try:
            await client.health()
            (made,) = await client.execute([call(1, "echo kept > state.txt")])
        finally:
            await server.aclose()
            await runtime.aclose()
        runtime, server = await serve()  # the same socket, no memory of slot 0's lease
        try:
            with pytest.raises(SlotServerError) as caught:
                await client.execute([call(1, "cat state.txt")])
            return made, client.boot, first_boot, str(caught.value)
        finally:
            await client.aclose()
            await server.aclose()
            await runtime.aclose()

    made, seen, first_boot, error = asyncio.run(main())
    assert made.outcome is ToolOutcome.OK, made
    assert seen == first_boot
    assert "was restarted" in error
    assert "the state of its slots is gone" in error
