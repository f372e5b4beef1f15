"""``measure_layer`` and ``empty_trash``: what a reset set aside of a lease's layer is measured
once, ``du``-like, within its deadline, before the trash's sweep removes it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from trajcore.adapters.slot_server.resets import (
    Trash,
    _set_layer_aside,
    empty_trash,
    measure_layer,
)


def blocks(path: Path) -> int:
    return path.lstat().st_blocks * 512


def make_layer(folder: Path) -> Path:
    """A layer folder as a reset sets it aside: ``upper`` and ``work``, and a fork's folder."""
    upper = folder / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "big").write_bytes(os.urandom(100_000))
    os.link(upper / "etc" / "big", upper / "same")  # a hard link: its blocks count once
    (upper / "link").symlink_to("/nowhere")
    (folder / "work" / "work").mkdir(parents=True)
    fork = folder / "fork-1-abc" / "upper"
    fork.mkdir(parents=True)
    (fork / "notes").write_bytes(os.urandom(50_000))
    (folder / "fork-1-abc" / "lower").mkdir()
    (folder / "fork-1-abc" / "lower" / "not-the-lease's").write_bytes(os.urandom(80_000))
    return folder


def test_a_layer_counts_its_upper_and_its_forks_upper_each_inode_once(tmp_path: Path) -> None:
    layer = make_layer(tmp_path / "layer-0-x")
    size = measure_layer(layer)
    upper = layer / "upper"
    fork = layer / "fork-1-abc" / "upper"
    expected = sum(
        blocks(path)
        for path in (upper / "etc", upper / "etc" / "big", upper / "link", fork / "notes")
    )
    assert size.bytes == expected  # not the link twice, not work/ nor the fork's lower
    assert size.bytes >= 150_000
    assert size.entries == 5  # etc, etc/big, same, link, notes
    assert not size.cut_short


def test_a_layer_without_an_upper_measures_nothing(tmp_path: Path) -> None:
    (tmp_path / "layer-0-x" / "work").mkdir(parents=True)
    size = measure_layer(tmp_path / "layer-0-x")
    assert (size.bytes, size.entries, size.cut_short) == (0, 0, False)


def test_a_walk_past_its_deadline_stops_and_says_so(tmp_path: Path) -> None:
    size = measure_layer(make_layer(tmp_path / "layer-0-x"), timeout_s=0.0)
    assert size.cut_short
    assert size.entries < 5


def test_the_sweep_measures_each_layer_once_and_removes_it(tmp_path: Path) -> None:
    trash = tmp_path / "trash"
    make_layer(trash / "layer-0-x")
    make_layer(trash / "layer-1-y")  # measured by an earlier sweep that could not remove it
    (trash / "slots-0-z").mkdir()  # a workspace set aside: removed, not measured
    (trash / "slots-0-z" / "file").write_bytes(b"x" * 10_000)
    heard: list[int] = []
    measured = {"layer-1-y"}
    left, layers = empty_trash(
        trash, 10.0, measured=measured, on_layer=lambda s: heard.append(s.bytes)
    )
    assert left == []
    assert [size.bytes for size in layers] == heard
    assert len(heard) == 1  # layer-0-x alone
    assert heard[0] >= 150_000
    assert measured == set()  # what was removed is forgotten
    assert list(trash.iterdir()) == []
    assert empty_trash(trash, 10.0) == ([], [])


def test_a_reset_sets_the_layer_aside_but_the_empty_folders_the_keeper_mounts_on(
    tmp_path: Path,
) -> None:
    """``upper``, ``work`` and anything else go to the trash; ``root`` and ``lower-N`` stay
    (the same folders: the next lease's keeper need not make them again) while empty."""
    layer = make_layer(tmp_path / "layers" / "0")
    for name in ("root", "lower-0", "lower-1", "lower-x"):
        (layer / name).mkdir()
    (layer / "lower-1" / "planted").write_text("x")  # not empty: set aside with the rest
    kept = {name: (layer / name).stat().st_ino for name in ("root", "lower-0")}
    aside = tmp_path / "trash" / "layer-0-x"
    assert _set_layer_aside(layer, tmp_path / "trash", aside) is None
    assert {path.name: path.stat().st_ino for path in layer.iterdir()} == kept
    assert sorted(path.name for path in aside.iterdir()) == [
        "fork-1-abc", "lower-1", "lower-x", "upper", "work",
    ]  # fmt: skip
    assert (aside / "lower-1" / "planted").read_text() == "x"


def test_a_sweep_leaves_the_folder_a_reset_is_filling_for_a_later_sweep(tmp_path: Path) -> None:
    """A reset fills its ``layer-*`` folder in steps while other slots' resets start sweeps: a
    sweep meanwhile measures and removes the others and leaves that one, which the sweep asked
    for once it is filled takes (measured once, whole)."""

    async def main() -> tuple[list[str], list[str], Trash]:
        trash = Trash(tmp_path / "trash")
        tasks: set[asyncio.Task[None]] = set()
        make_layer(trash.folder / "layer-0-x")  # another slot's, set aside whole
        with trash.setting_aside("layer-1") as aside:
            assert aside.parent == trash.folder
            assert aside.name.startswith("layer-1-")
            aside.mkdir()  # half filled: its upper comes next
            trash.sweep(tasks)
            await asyncio.gather(*tasks)
            during = sorted(path.name for path in trash.folder.iterdir())
            make_layer(aside)  # the rest of the lease's layer
        trash.sweep(tasks)
        await asyncio.gather(*tasks)
        return during, sorted(path.name for path in trash.folder.iterdir()), trash

    during, after, trash = asyncio.run(main())
    assert len(during) == 1
    assert during[0].startswith("layer-1-")  # left alone while it was filled
    assert after == []
    assert trash.left == ()
    assert trash.layers.measured == 2
    assert trash.layers.bytes >= 2 * 150_000  # layer-1 measured whole, not empty
