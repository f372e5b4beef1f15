"""An image refused once is refused at once afterwards, with the same reason, until its source
changes; a failure of the moment is never remembered as a refusal.

A group's members ask for the same image: when it is refused (a layer whose digest does not
match, an ``Env`` that is not ``NAME=VALUE``), every member after the first is answered from
the cache's record (``image_refusals``), the reason saying it was refused earlier, instead of
reading and unpacking the image again. Putting the source right makes a new key, so the next
lease reads it again and is granted.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.image_layouts import Entry, layer_bytes
from tests.integration.test_environment_leases import lease
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server
from tests.podman_images import PODMAN, podman_problem
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_refusals import SourceUnavailable, source_key
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]
EARLIER = "refused earlier"


@pytest.fixture(scope="module")
def cache_server() -> Iterator[tuple[Server, Path]]:
    """A slot server with an image cache, and a folder for the test's images."""
    with searchable_dir("refused-images") as folder:
        running = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        yield running, folder
        assert stop_server(running) == 0


def layer_blob(layout: Path) -> Path:
    """The blob of the only layer of the image at ``layout``."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    digest: str = manifest["layers"][0]["digest"]
    return blobs / digest.removeprefix("sha256:")


def test_a_layer_whose_digest_is_wrong_is_refused_once_then_at_once_until_put_right(
    cache_server: tuple[Server, Path],
) -> None:
    server, folder = cache_server
    layout = folder / "bad-digest"
    write_shell_image(layout, salt="digest")
    blob = layer_blob(layout)
    good = blob.read_bytes()
    other = [Entry(name="etc/", kind=tarfile.DIRTYPE, mode=0o755), Entry(name="etc/x", data=b"x")]
    blob.write_bytes(gzip.compress(layer_bytes(other), mtime=0))
    ref = f"oci:{layout}"

    async def main() -> None:
        first = await lease(server, 0, 1, ref)
        assert first["ok"] is False, first
        reason = str(first["error"])
        assert "but its descriptor says" in reason, first
        assert EARLIER not in reason
        # every later member: the same field and reason, told it was refused earlier
        for slot in (1, 2, 0):
            again = await lease(server, slot, 1, ref)
            assert again["ok"] is False, again
            assert again["field"] == first["field"], again
            assert str(again["error"]).startswith(reason), again
            assert EARLIER in str(again["error"]), again
        blob.write_bytes(good)  # the operator puts the blob right: a new key, read again
        fixed = await lease(server, 0, 1, ref)
        assert fixed["ok"] is True, fixed

    asyncio.run(main())
    asyncio.run(_reset(server, 0, 1))


async def _reset(server: Server, slot: int, epoch: int) -> None:
    async with server.client() as client:
        assert (await client.reset(slot, epoch)).ok


def test_an_image_with_a_bad_env_is_refused_at_once_until_its_layout_is_rewritten(
    cache_server: tuple[Server, Path],
) -> None:
    server, folder = cache_server
    layout = folder / "bad-env"
    write_shell_image(layout, salt="env", env=["NO_EQUALS_SIGN"])
    ref = f"oci:{layout}"

    async def main() -> None:
        first = await lease(server, 3, 1, ref)
        assert first["ok"] is False, first
        assert "NO_EQUALS_SIGN" in str(first["error"]), first
        again = await lease(server, 3, 1, ref)
        assert again["field"] == first["field"], again
        assert str(again["error"]).startswith(str(first["error"])), again
        assert EARLIER in str(again["error"]), again
        write_shell_image(layout, salt="env", env=["GOOD=1"])
        fixed = await lease(server, 3, 1, ref)
        assert fixed["ok"] is True, fixed

    asyncio.run(main())
    asyncio.run(_reset(server, 3, 1))


def test_a_group_asking_at_once_unpacks_a_refused_image_once(
    cache_server: tuple[Server, Path],
) -> None:
    server, folder = cache_server
    layout = folder / "group"
    write_shell_image(layout, salt="group")
    blob = layer_blob(layout)
    blob.write_bytes(blob.read_bytes()[:-8] + bytes(8))  # a damaged end: refused at the end
    ref = f"oci:{layout}"

    async def main() -> list[dict[str, object]]:
        return list(await asyncio.gather(*(lease(server, slot, 2, ref) for slot in range(4))))

    answers = asyncio.run(main())
    assert all(answer["ok"] is False for answer in answers), answers
    told = [EARLIER in str(answer["error"]) for answer in answers]
    # one member read and unpacked it; the others waited on its lock and were told
    assert told.count(False) == 1, answers


def test_a_source_key_changes_with_any_blob_and_an_engines_image_has_none(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_shell_image(layout)
    ref = parse_environment_ref(f"oci:{layout}")
    before = source_key(ref)
    assert before is not None
    blob = layer_blob(layout)
    blob.write_bytes(blob.read_bytes())  # the same bytes, written again: its times change
    assert source_key(ref) != before
    missing = parse_environment_ref(f"oci:{tmp_path / 'none'}")
    assert source_key(missing) is not None  # a missing layout is keyed as missing
    assert source_key(parse_environment_ref("containers-storage:x")) is None


def test_an_engine_past_its_deadline_is_not_remembered_as_a_refusal(tmp_path: Path) -> None:
    why = podman_problem()
    if why is not None:
        pytest.skip(why)
    rootfs = tmp_path / "import.tar"
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    name = f"localhost/trajcore-refusal-test:{uuid.uuid4().hex[:12]}"
    subprocess.run(
        [*PODMAN, "import", str(rootfs), name], check=True, capture_output=True, timeout=120
    )
    try:
        ref = parse_environment_ref(f"containers-storage:{name}")
        late = ImageCache(tmp_path / "cache", max_bytes=1 << 30, engine_timeout_s=1e-6)
        with pytest.raises(SourceUnavailable):
            late.acquire(ref)
        assert len(late.refusals) == 0
        with ImageCache(tmp_path / "cache2", max_bytes=1 << 30).acquire(ref) as use:
            assert not use.image.hit
    finally:
        subprocess.run([*PODMAN, "rmi", "-f", name], capture_output=True, timeout=120, check=False)


def test_a_refusal_is_forgotten_after_its_time(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_shell_image(layout, env=["BAD"])
    ref = parse_environment_ref(f"oci:{layout}")
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, refusal_ttl_s=0)
    for _ in range(2):
        with pytest.raises(TaskEnvironmentError) as caught:
            cache.acquire(ref)
        assert EARLIER not in caught.value.reason
    assert len(cache.refusals) == 0
