"""A lease's network namespace is fresh: neither its keeper's nor any other lease's.

Each lease's first process makes its network namespace (loopback up): at the lease request, or
ahead, when the idle keeper readied the lease (tests/integration/test_readied_leases.py). The
keeper holds none by a descriptor. These tests look at it from the host (root reads the
keeper's descriptors): two leases never share one, neither is the keeper's, and the keeper
keeps no copy of one.

The runtime runs in this process with bubblewrap and the compiled helper, as the slot servers
do; warm leases are off, so the keeper stays idle between a reset and the next call.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.tools import ToolOutcome

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="reading a keeper's descriptors needs root"),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-netns-") as path:
        yield path


def keeper_of(sandbox: int) -> int:
    """The pid of the slot keeper below the slot's sandbox process ``sandbox``."""
    todo = [sandbox]
    while todo:
        pid = todo.pop()
        if Path(f"/proc/{pid}/comm").read_text().strip() == "slot-keeper":
            return pid
        for task in Path(f"/proc/{pid}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    raise AssertionError(f"no slot-keeper below {sandbox}")


def held_networks(pid: int) -> list[str]:
    """The network namespaces ``pid`` holds open by a descriptor."""
    links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    return [link for link in links if link.startswith("net:")]


def test_each_lease_runs_in_a_fresh_network_namespace_the_keeper_holds_none(root: Path) -> None:
    config = RuntimeConfig(slots=1, root=root, use_cgroups=False, warm_leases=False)
    probe = "readlink /proc/self/ns/net"
    loopback = (
        "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "socket.create_connection(s.getsockname()); print('loopback-ok')\""
    )

    async def main() -> tuple[str, str, str, list[str], list[str], str]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            (first,) = await runtime.execute([call(1, probe)])
            assert first.outcome is ToolOutcome.OK, first.content
            sandbox = runtime.listing().slots[0].sandbox_pid
            assert sandbox is not None
            keeper = keeper_of(sandbox)
            own = os.readlink(f"/proc/{keeper}/ns/net")
            assert (await runtime.reset(0, 1)).ok
            idle = held_networks(keeper)
            (second,) = await runtime.execute([call(2, probe)])
            assert second.outcome is ToolOutcome.OK, second.content
            during = held_networks(keeper)
            (works,) = await runtime.execute([call(2, loopback)])
            assert (await runtime.reset(0, 2)).ok
            return first.content, second.content, own, idle, during, works.content
        finally:
            await runtime.aclose()

    first, second, own, idle, during, works = asyncio.run(main())
    first_net, second_net = first.strip(), second.strip()
    assert idle == []  # the keeper holds no network namespace for the next lease
    assert second_net not in (own, first_net)  # fresh: neither the keeper's nor the last lease's
    assert first_net != own
    assert during == []  # the keeper keeps no copy of a lease's namespace
    assert works == "loopback-ok\n", works  # its loopback is up
