"""What an image's config says about running it (``Env``, ``WorkingDir``, ``User``), read by
the image cache from OCI layouts and podman's store, recorded in ``image.json`` and checked; and
image files that are not regular files (a FIFO, as a hung network mount behaves), refused at
once instead of blocking the server's thread."""

from __future__ import annotations

import json
import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.image_layouts import Entry, write_layout
from tests.podman_images import imported_image
from trajcore.adapters.slot_server.image_cache import CachedImage, ImageCache
from trajcore.adapters.slot_server.image_sources import ENV_MAX_BYTES, ENV_MAX_VARIABLES
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref

FILES = [
    Entry(name="etc/", kind=tarfile.DIRTYPE, mode=0o755),
    Entry(name="etc/hostname", data=b"x\n"),
]
ENV = ["PATH=/opt/venv/bin:/usr/bin:/bin", "TASK_VAR=a=b c", "EMPTY="]


def _acquire(cache: ImageCache, ref: str) -> CachedImage:
    with cache.acquire(parse_environment_ref(ref)) as use:
        return use.image


def test_a_layouts_env_is_recorded_and_given_on_every_use(tmp_path: Path) -> None:
    write_layout(tmp_path / "layout", [FILES], env=ENV)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    first = _acquire(cache, f"oci:{tmp_path / 'layout'}")
    again = _acquire(
        ImageCache(tmp_path / "cache", max_bytes=1 << 30), f"oci:{tmp_path / 'layout'}"
    )
    assert (first.hit, again.hit) == (False, True)
    assert first.env == again.env == tuple(ENV)
    meta = json.loads((tmp_path / "cache" / "images" / first.image_id / "image.json").read_text())
    assert (meta["env"], meta["working_dir"], meta["user"]) == (ENV, "", "")


def test_an_image_without_env_has_none(tmp_path: Path) -> None:
    write_layout(tmp_path / "layout", [FILES])
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    assert _acquire(cache, f"oci:{tmp_path / 'layout'}").env == ()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (["GOOD=1", "BAD=a\0b"], "holds a NUL character @ {image}: config Env[1]"),
        (["=value"], "'=value' does not read NAME=VALUE @ {image}: config Env[0]"),
        (["NOVALUE"], "'NOVALUE' does not read NAME=VALUE @ {image}: config Env[0]"),
        ([f"V{n}=1" for n in range(ENV_MAX_VARIABLES + 1)], "more than the 1000 allowed"),
        ([f"BIG={'x' * ENV_MAX_BYTES}"], f"more than the {ENV_MAX_BYTES} allowed"),
    ],
    ids=["nul", "no-name", "no-equals", "too-many", "too-big"],
)
def test_a_bad_env_refuses_the_image_naming_it(tmp_path: Path, env: list[str], says: str) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [FILES], env=env)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError) as caught:
        _acquire(cache, f"oci:{layout}")
    assert f"@ oci:{layout}: config Env" in str(caught.value)
    assert says.format(image=f"oci:{layout}") in str(caught.value)
    assert list((tmp_path / "cache" / "images").iterdir()) == []


@pytest.fixture
def podman_env_image(tmp_path: Path) -> Iterator[str]:
    """An image imported into podman's store with ENV, WORKDIR and USER, removed afterwards."""
    changes = [
        "ENV PATH=/opt/venv/bin:/usr/bin:/bin",
        "ENV TASK_VAR=hello",
        "WORKDIR /repo",
        "USER 1000",
    ]
    with imported_image(tmp_path, "config", {"etc/hostname": b"x\n"}, changes=changes) as name:
        yield name


def test_an_engines_image_config_is_recorded(tmp_path: Path, podman_env_image: str) -> None:
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    image = _acquire(cache, f"containers-storage:{podman_env_image}")
    assert "PATH=/opt/venv/bin:/usr/bin:/bin" in image.env
    assert "TASK_VAR=hello" in image.env
    assert (image.working_dir, image.user) == ("/repo", "1000")
    again = _acquire(
        ImageCache(tmp_path / "cache", max_bytes=1 << 30), f"containers-storage:{podman_env_image}"
    )
    assert (again.hit, again.env) == (True, image.env)


def _refused_at_once(call: Callable[[], object], fifo: Path) -> BaseException:
    """What ``call`` raised, in a thread of its own; the FIFO is opened for writing afterwards,
    which frees a reader that blocked on it (the code before the check did)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    blocked = worker.is_alive()
    if blocked:  # free it: a writer at the FIFO's other end ends the reader's open
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(60)
    assert not blocked, f"reading the image blocked on the FIFO {fifo}"
    assert len(raised) == 1
    return raised[0]


def test_an_archive_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "image.tar"
    os.mkfifo(fifo)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    error = _refused_at_once(lambda: _acquire(cache, f"oci-archive:{fifo}"), fifo)
    assert isinstance(error, TaskEnvironmentError), error
    assert str(error) == f"{fifo} is not a regular file @ oci-archive:{fifo}"


def test_a_layouts_index_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [FILES])
    (layout / "index.json").unlink()
    os.mkfifo(layout / "index.json")
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    error = _refused_at_once(lambda: _acquire(cache, f"oci:{layout}"), layout / "index.json")
    assert isinstance(error, TaskEnvironmentError), error
    index = layout / "index.json"
    assert str(error) == f"{index} is not a regular file @ oci:{layout}: index.json"
