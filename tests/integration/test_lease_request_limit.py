"""The slot server measures a lease's request to the slot's keeper before it sends it: one the
keeper would refuse whole (``REQUEST_MAX``, slot_helper.c) is refused as the lease's own
refusal (or the freeze's that would make it), naming the image, the request's size, the limit
and what makes it large (the image's ``Env`` and its layers), and the keeper never sees it.

A plain lease over an image cannot reach the limit (an ``Env`` of at most ``ENV_MAX_BYTES``
and one path); a lease over a snapshot many freezes deep, with long paths, can. Through the
public path: a real slot server under a deep folder freezes its lease again and again until
the freeze whose leases would pass the limit is refused, and the slot goes on. At the check's
own level, against the real keeper in a real bubblewrap: it refuses exactly the requests the
keeper refuses, and the keeper serves the next lease.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.integration.image_leases import image_cache_server
from tests.integration.test_environment_leases import run_in_lease, shell
from tests.integration.test_keeper_request_limit import Keeper, keeper
from tests.integration.test_slot_server import searchable_dir
from trajcore.adapters.slot_server import slot_state
from trajcore.adapters.slot_server.image_cache import CachedImage, ImageUse
from trajcore.adapters.slot_server.image_sources import ENV_MAX_BYTES, image_env
from trajcore.adapters.slot_server.slot_state import (
    REQUEST_MAX,
    Slot,
    lease_request,
    lease_request_problem,
)
from trajcore.adapters.slot_server.snapshots import MAX_DEPTH
from trajcore.adapters.slot_server.workspace import Workspace

__all__ = ["keeper"]  # the fixture, imported for the tests below

HELPER_C = Path(slot_state.__file__).with_name("slot_helper.c")


def env_of(env_bytes: int) -> list[str]:
    """``Env`` entries that hold ``env_bytes`` bytes as ``image_env`` counts them (each entry
    and its NUL), in variables of at most 1000 bytes."""
    count = -(-env_bytes // 1000)
    sizes = [env_bytes // count + (n < env_bytes % count) for n in range(count)]
    return [f"V{n:03d}=" + "x" * (size - 6) for n, size in enumerate(sizes)]


def image(rootfs: Path, env_bytes: int, *, checked: bool = True) -> CachedImage:
    """An image whose ``Env`` holds ``env_bytes`` bytes (``env_of``), checked as an image
    config's is unless ``checked`` is false (a request's size alone, past what an ``Env`` may
    hold)."""
    ref = "oci:/images/big-env"
    env = env_of(env_bytes)
    return CachedImage(
        ref=ref, image_id="0" * 64, rootfs=rootfs, bytes=0, entries=0, hit=True, seconds=0.0,
        env=image_env(env, ref) if checked else tuple(env),
    )  # fmt: skip


@contextmanager
def deep_folder(length: int) -> Iterator[Path]:
    """A fresh searchable folder whose path is ``length`` bytes long."""
    with searchable_dir("request-limit") as base:
        deep = base
        while len(str(deep)) + 250 < length:
            deep /= "d" * 240
        deep /= "d" * (length - len(str(deep)) - 1)
        deep.mkdir(parents=True)
        yield deep


def served(keeper: Keeper, request: str) -> dict[str, object]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reply = keeper.ask(request.encode(), theirs)
    if reply.get("lease") is True:
        assert keeper.ask(b"end")["ended"] is True
    return reply


def test_the_limit_is_the_keepers() -> None:
    found = re.search(r"^#define REQUEST_MAX (\d+)$", HELPER_C.read_text(), re.MULTILINE)
    assert found is not None, f"no REQUEST_MAX in {HELPER_C}"
    assert int(found.group(1)) == REQUEST_MAX


def test_a_fork_over_the_limit_is_refused_before_the_keeper_naming_why(
    keeper: Keeper, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    big = image(rootfs, ENV_MAX_BYTES - 64)  # near the limit of an image's Env
    deep = tmp_path.joinpath(*["d" * 250] * 8)  # long paths, as a cache's may be
    frozen = tuple(deep / "snapshots" / f"{n:032x}" / "root" for n in range(MAX_DEPTH))
    request = lease_request(big, frozen)
    size = len(request.encode())
    assert size >= REQUEST_MAX  # reachable: a snapshot as deep as a snapshot may be
    problem = lease_request_problem(big, frozen)
    assert problem is not None
    for said in (
        big.ref,
        f"{size} bytes",
        f"limit of {REQUEST_MAX - 1} bytes",
        f"Env holds {len(big.env)} variables ({ENV_MAX_BYTES - 64} bytes)",
        f"over {MAX_DEPTH + 1} layers",
    ):
        assert said in problem, (said, problem)
    assert "refused whole" in str(served(keeper, request).get("error"))  # what it spares
    # the keeper goes on: the next lease, over the image alone, is served
    assert lease_request_problem(big) is None
    assert served(keeper, lease_request(big)).get("lease") is True, big


def test_the_check_and_the_keeper_agree_at_the_limit(keeper: Keeper, tmp_path: Path) -> None:
    """A request of ``REQUEST_MAX - 1`` bytes passes both; one byte more, neither."""
    head = len(lease_request(image(tmp_path, 0)).encode())  # "" and each entry: a NUL before
    fits = image(tmp_path, REQUEST_MAX - 2 - head, checked=False)
    assert len(lease_request(fits).encode()) == REQUEST_MAX - 1
    assert lease_request_problem(fits) is None
    assert served(keeper, lease_request(fits)).get("lease") is True
    over = image(tmp_path, REQUEST_MAX - 1 - head, checked=False)
    assert len(lease_request(over).encode()) == REQUEST_MAX
    assert lease_request_problem(over) is not None
    assert "refused whole" in str(served(keeper, lease_request(over)).get("error"))


def test_a_slots_lease_request_is_the_checked_one(tmp_path: Path) -> None:
    slot = Slot(
        index=0, workspace=Workspace(tmp_path / "workspace"), state_dir=tmp_path, cgroup=None
    )
    assert slot.lease_op() == "lease"
    big = image(tmp_path, ENV_MAX_BYTES)
    slot.image = ImageUse(big, None)
    assert slot.lease_op() == lease_request(big)
    assert slot.lease_op_problem() is None  # an image's Env alone never passes the limit
    assert slot.lease_op().split("\0")[:3] == ["lease-image", str(tmp_path), ""]


@pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))
def test_a_freeze_whose_leases_would_pass_the_limit_is_refused_and_the_slot_goes_on() -> None:
    """Each freeze stacks one more layer under the lease; before, the freeze that passed the
    limit was granted and the lease's next call lost the slot's keeper (an infrastructure
    error that named no image)."""
    with deep_folder(3000) as under, searchable_dir("request-limit", under) as folder:
        write_shell_image(folder / "layout", env=env_of(ENV_MAX_BYTES - 64))
        ref = f"oci:{folder / 'layout'}"
        with image_cache_server(folder) as server:

            async def main() -> None:
                async with server.client() as client:
                    await run_in_lease(client, server, 0, 1, ref, command="true")
                    for depth in range(1, MAX_DEPTH + 1):
                        frozen = await client.snapshot(0, 1)
                        if not frozen.ok:
                            break
                        code, text = await shell(server, 0, 1, f"echo {depth} > /layer-{depth}")
                        assert code == 0, (depth, text)
                    assert not frozen.ok, (depth, frozen)
                    assert 1 < depth < MAX_DEPTH, (depth, frozen)
                    error = str(frozen.error)
                    assert frozen.field == "snapshot", frozen
                    for said in (ref, "bytes to the slot's keeper", f"limit of {REQUEST_MAX - 1}",
                                 f"{len(env_of(ENV_MAX_BYTES - 64))} variables",
                                 f"over {depth + 1} layers"):  # fmt: skip
                        assert said in error, (said, error)
                    code, text = await shell(server, 0, 1, f"cat /layer-{depth - 1}")
                    assert (code, text.strip()) == (0, str(depth - 1))  # the lease goes on
                    assert (await client.reset(0, 1)).ok
                    code, text = await shell(server, 0, 2, "echo plain")  # the server's root
                    assert (code, text.strip()) == (0, "plain")

            asyncio.run(main())
