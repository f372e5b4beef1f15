"""A lease's disk budget: what its writable area is measured to hold, and the watch that ends a
lease past it (``adapters.slot_server.disk_budget``), on real directories."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import cast

import pytest

from trajcore.adapters.slot_server.channel import Agent
from trajcore.adapters.slot_server.disk_budget import DiskWatch, measure_area, over_budget
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation

MIB = 1 << 20


def _fill(folder: Path, files: int, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        (folder / f"f{index}").write_bytes(b"x" * size)


def test_the_area_is_counted_as_du_counts_it(tmp_path: Path) -> None:
    area = tmp_path / "area"
    _fill(area / "sub", 3, MIB)
    os.link(area / "sub" / "f0", area / "again")  # one inode, two names: its blocks once
    with (area / "sparse").open("wb") as sparse:  # a hole takes no blocks
        sparse.truncate(1 << 30)
    (area / "link").symlink_to("/etc/passwd")  # never followed
    use = measure_area([area, tmp_path / "missing"], max_bytes=None, max_files=None)
    assert not use.over
    assert use.files == 7  # sub, its 3 files, the second name, the sparse file, the link
    assert 3 * MIB <= use.bytes < 3 * MIB + (1 << 16)


def test_the_walk_stops_once_past_either_budget(tmp_path: Path) -> None:
    _fill(tmp_path / "a", 50, 4096)
    by_files = measure_area([tmp_path / "a"], max_bytes=None, max_files=10)
    assert by_files.over
    assert by_files.files == 11
    by_bytes = measure_area([tmp_path / "a"], max_bytes=8192, max_files=None)
    assert by_bytes.over
    assert by_bytes.bytes > 8192
    assert by_bytes.files < 50


def test_a_nest_deeper_than_path_max_is_walked(tmp_path: Path) -> None:
    """A lease may nest directories past the kernel's PATH_MAX (500 levels of 10-letter names,
    5,500 bytes): the walk counts them and the file at the bottom. It opened each directory by
    its full path before, so the deep ones failed with ENAMETOOLONG and a lease within its
    budget was ended as one whose disk budget "cannot be checked"."""
    area = tmp_path / "area"
    area.mkdir()
    depth = 500
    fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):  # relative to the last one: the full path is too long to name
            os.mkdir("dddddddddd", dir_fd=fd)
            inner = os.open("dddddddddd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        bottom = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(bottom, b"x" * 4096)
        os.close(bottom)
    finally:
        os.close(fd)
    use = measure_area([area], max_bytes=None, max_files=None)
    assert use.unreadable is None
    assert not use.over
    assert use.files == depth + 1
    assert use.bytes >= 4096
    capped = measure_area([area], max_bytes=None, max_files=depth)
    assert capped.over
    assert capped.unreadable is None


def test_the_reason_names_the_budget_and_its_setting() -> None:
    isolation = SlotIsolation(disk_bytes=8 * MIB, disk_files=200)
    by_bytes = measure_area([], max_bytes=None, max_files=None)
    assert over_budget(by_bytes, isolation) is None
    from trajcore.adapters.slot_server.disk_budget import DiskUse

    reason = over_budget(DiskUse(9 * MIB, 9, over=True), isolation)
    assert reason is not None
    assert reason.startswith(f"disk budget of {8 * MIB} bytes (disk_bytes) reached")
    files = over_budget(DiskUse(10, 201, over=True), isolation)
    assert files is not None
    assert files.startswith("disk budget of 200 files (disk_files) reached")
    unreadable = over_budget(DiskUse(0, 0, over=False, unreadable="/w/d"), isolation)
    assert unreadable is not None
    assert "cannot be checked" in unreadable


def test_the_default_budget_is_10_gib_and_a_million_files() -> None:
    isolation = SlotIsolation()
    assert (isolation.disk_bytes, isolation.disk_files) == (10 << 30, 1_000_000)
    assert SlotIsolation(disk_bytes=None, disk_files=None).disk_bytes is None


@pytest.mark.parametrize("field", ["disk_bytes", "disk_files"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_a_bad_budget_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(**{field: value})  # type: ignore[arg-type]  # bad input on purpose
    assert caught.value.field == field
    assert "must be None or an integer >= 1" in caught.value.reason


def _slot(tmp_path: Path) -> Slot:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return Slot(index=0, workspace=Workspace(workspace), state_dir=tmp_path, cgroup=None)


def _marks(slot: Slot) -> tuple[object, object]:
    return slot.disk_over, slot.disk_written


def _watch(slot: Slot, ended: list[int], retired: int = 0) -> DiskWatch:
    async def end_lease(ended_slot: Slot) -> None:
        ended.append(ended_slot.index)

    return DiskWatch(
        isolation=SlotIsolation(disk_bytes=MIB, disk_files=100),
        areas=lambda watched: [watched.workspace.root],
        end_lease=end_lease,
        retired=lambda _: retired,
    )


def test_a_lease_past_its_budget_is_marked_with_the_reason(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    ended: list[int] = []
    watch = _watch(slot, ended)
    slot.disk_written = 7  # a write_file of lease epoch 7; no agent (nothing to stop)
    _fill(slot.workspace.root, 4, MIB)
    (reason,) = asyncio.run(watch.tick([slot]))
    assert reason is not None
    assert "disk_bytes" in reason
    assert slot.disk_over == (7, reason)
    assert ended == []  # no live lease process to end


def test_a_lease_within_its_budget_or_already_reset_is_left_alone(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    ended: list[int] = []
    slot.disk_written = 3
    _fill(slot.workspace.root, 1, 4096)
    assert asyncio.run(_watch(slot, ended).tick([slot])) == []
    assert _marks(slot) == (None, None)  # measured: nothing new to measure
    _fill(slot.workspace.root, 4, MIB)
    slot.disk_written = 3
    assert asyncio.run(_watch(slot, ended, retired=3).tick([slot])) == []  # reset already
    assert slot.disk_over is None


def test_a_lease_whose_first_command_starts_during_the_measure_is_ended(tmp_path: Path) -> None:
    """A lease measured after a ``write_file``, its agent only warmed (nothing of it runs),
    whose first command takes that agent while the walk runs: when the walk finds it past its
    budget, it is live, so its processes are ended too (else a background writer it started
    would go on, and the watch, finding it marked, never looks at it again)."""
    slot = _slot(tmp_path)
    ended: list[int] = []
    agent = cast("Agent", object())  # the watch only compares it by identity
    slot.agent = slot.warmed = agent
    slot.disk_written = 7
    _fill(slot.workspace.root, 4, MIB)

    def area(watched: Slot) -> list[Path]:
        watched.warmed = None  # the lease's first command takes the warmed agent meanwhile
        return [watched.workspace.root]

    watch = _watch(slot, ended)
    watch.areas = area
    (reason,) = asyncio.run(watch.tick([slot]))
    assert slot.disk_over == (7, reason)
    assert ended == [0]


def test_a_directory_swapped_for_a_link_during_the_walk_is_never_followed(tmp_path: Path) -> None:
    """The lease renames a directory the walk has queued and puts a link to the host's files
    in its place, again and again: no walk may count what lies behind the link (the host's
    5,000 files here), whatever the timing. The walk before read the queued path with a call
    that follows links."""
    import threading

    outside = tmp_path / "host"
    _fill(outside, 5000, 0)
    area = tmp_path / "area"
    _fill(area, 20000, 0)  # the root's listing keeps the walk busy after it queued "d"
    (area / "d").mkdir()
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            try:
                os.rename(area / "d", area / "d.real")
                os.symlink(outside, area / "d")
                stop.wait(0.0005)  # a link half the time, the directory the other half
                os.unlink(area / "d")
                os.rename(area / "d.real", area / "d")
                stop.wait(0.0005)
            except OSError:
                continue

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        counts = [measure_area([area], max_bytes=None, max_files=None).files for _ in range(40)]
    finally:
        stop.set()
        swapper.join(timeout=10)
    assert not swapper.is_alive()
    assert max(counts) <= 20003, counts  # the 20,000 files, d (or d.real, or a link), no more
