"""Task environment references and the planning of image layer entries (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError
from trajcore.domain.task_environments import (
    CreateEntry,
    EntryKind,
    EnvironmentRef,
    ImageLimits,
    LayerRefused,
    MakeOpaque,
    RemoveLower,
    SkipDevice,
    TaskEnvironmentError,
    UnpackBudget,
    parse_environment_ref,
    plan_entry,
    safe_mode,
)

LIMITS = ImageLimits()


def _plan(
    name: str, kind: EntryKind = EntryKind.FILE, *, mode: int = 0o644, size: int = 0, link: str = ""
) -> object:
    return plan_entry(
        image="oci:/i", name=name, kind=kind, mode=mode, size=size, link=link, limits=LIMITS
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "containers-storage:localhost/repo:tag",
            EnvironmentRef(transport="containers-storage", location="localhost/repo:tag"),
        ),
        (
            "docker-daemon:python:3.11",
            EnvironmentRef(transport="docker-daemon", location="python:3.11"),
        ),
        ("oci:/images/layout", EnvironmentRef(transport="oci", location="/images/layout")),
        (
            "oci:/images/layout:v2",
            EnvironmentRef(transport="oci", location="/images/layout", tag="v2"),
        ),
        ("oci:/a:b:", EnvironmentRef(transport="oci", location="/a:b")),
        (
            "oci-archive:/x.tar:t",
            EnvironmentRef(transport="oci-archive", location="/x.tar", tag="t"),
        ),
        ("docker-archive:/x.tar", EnvironmentRef(transport="docker-archive", location="/x.tar")),
        ("directory:/srv/rootfs", EnvironmentRef(transport="directory", location="/srv/rootfs")),
        # spaces inside a path, printable punctuation and no-break spaces are the path's own
        ("directory:/srv/my root", EnvironmentRef(transport="directory", location="/srv/my root")),
        ("directory:/srv/a~\xa0b", EnvironmentRef(transport="directory", location="/srv/a~\xa0b")),
    ],
)
def test_references_in_the_transports_people_know(text: str, expected: EnvironmentRef) -> None:
    ref = parse_environment_ref(text)
    assert ref == expected
    assert parse_environment_ref(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("docker://python:3.11", "no known transport"),
        ("python:3.11", "no known transport"),
        ("plain", "no known transport"),
        ("oci:", "no image name or path"),
        ("oci:relative/layout", "must be absolute"),
        ("directory:rootfs", "must be absolute"),
        ("containers-storage:", "no image name or path"),
        ("containers-storage:   ", "starts or ends with whitespace"),
        ("oci:/x\n", "starts or ends with whitespace"),
        ("oci:/x ", "starts or ends with whitespace"),
        (" oci:/x", "starts or ends with whitespace"),
        ("\toci:/x", "starts or ends with whitespace"),
        ("oci:/a\x00b", "control character '\\x00'"),
        ("oci:/a\x1fb", "control character '\\x1f'"),
        ("oci:/a\nb", "control character '\\n'"),
        ("oci:/a\x7fb", "control character '\\x7f'"),
        ("oci:/a\x9fb", "control character '\\x9f'"),
    ],
)
def test_a_bad_reference_names_its_field_and_why(text: str, reason: str) -> None:
    with pytest.raises(TaskEnvironmentError) as caught:
        parse_environment_ref(text, field="items[3].environment")
    assert caught.value.field == "items[3].environment"
    assert reason in caught.value.reason


def test_a_reference_must_be_text() -> None:
    with pytest.raises(TaskEnvironmentError, match="must be text, got int"):
        parse_environment_ref(3)


def test_entries_are_planned_at_normalized_relative_paths() -> None:
    assert _plan("./usr//bin/./tool", mode=0o4755, size=5) == CreateEntry(
        path=("usr", "bin", "tool"), kind=EntryKind.FILE, mode=0o755, size=5
    )
    assert _plan("./", EntryKind.DIRECTORY) is None
    assert _plan("etc/", EntryKind.DIRECTORY, mode=0o1777) == CreateEntry(
        path=("etc",), kind=EntryKind.DIRECTORY, mode=0o755, size=0
    )
    assert _plan("bin", EntryKind.SYMLINK, link="/usr/bin") == CreateEntry(
        path=("bin",), kind=EntryKind.SYMLINK, mode=0o644, size=0, link="/usr/bin"
    )
    assert _plan("a/b", EntryKind.HARDLINK, link="./c//d") == CreateEntry(
        path=("a", "b"), kind=EntryKind.HARDLINK, mode=0o644, size=0, link="c/d"
    )


def test_whiteouts_remove_or_make_opaque() -> None:
    assert _plan("etc/.wh.passwd") == RemoveLower(path=("etc", "passwd"))
    assert _plan(".wh.top") == RemoveLower(path=("top",))
    assert _plan("var/cache/.wh..wh..opq") == MakeOpaque(path=("var", "cache"))
    assert _plan(".wh..wh..opq") == MakeOpaque(path=())


@pytest.mark.parametrize(
    ("name", "kind", "link", "reason"),
    [
        ("/etc/passwd", EntryKind.FILE, "", "absolute"),
        ("a/../../b", EntryKind.FILE, "", "'..'"),
        ("a\x00b", EntryKind.FILE, "", "NUL"),
        ("etc/mem", EntryKind.CHAR_DEVICE, "", "character device"),
        ("sda", EntryKind.BLOCK_DEVICE, "", "block device"),
        ("x", EntryKind.OTHER, "", "other"),
        ("a/.wh..wh.plnk", EntryKind.FILE, "", "reserved whiteout"),
        ("a/.wh.", EntryKind.FILE, "", "whiteout of no name"),
        ("a/.wh.x", EntryKind.DIRECTORY, "", "whiteout name on a directory"),
        ("l", EntryKind.HARDLINK, "/etc/shadow", "absolute"),
        ("l", EntryKind.HARDLINK, "../x", "'..'"),
        ("l", EntryKind.HARDLINK, ".", "hard link to the layer's root"),
        ("s", EntryKind.SYMLINK, "", "empty symlink target"),
        (".", EntryKind.FILE, "", "layer's root"),
    ],
)
def test_a_refused_entry_names_the_image_and_the_entry(
    name: str, kind: EntryKind, link: str, reason: str
) -> None:
    with pytest.raises(LayerRefused) as caught:
        _plan(name, kind, link=link)
    assert caught.value.field.startswith("oci:/i: ")
    assert reason in caught.value.reason


def test_device_nodes_under_dev_are_skipped() -> None:
    assert _plan("dev/console", EntryKind.CHAR_DEVICE) == SkipDevice(path=("dev", "console"))
    assert _plan("./dev/loop0", EntryKind.BLOCK_DEVICE) == SkipDevice(path=("dev", "loop0"))
    with pytest.raises(LayerRefused):
        _plan("dev", EntryKind.CHAR_DEVICE)  # /dev itself as a device: not under it


def test_long_names_and_link_targets_are_refused() -> None:
    limits = ImageLimits(max_path_bytes=16)
    with pytest.raises(LayerRefused, match="longer than 16 bytes"):
        plan_entry(
            image="i", name="a" * 17, kind=EntryKind.FILE, mode=0, size=0, link="", limits=limits
        )
    with pytest.raises(LayerRefused, match="symlink target longer than 16"):
        plan_entry(
            image="i",
            name="s",
            kind=EntryKind.SYMLINK,
            mode=0,
            size=0,
            link="/" * 17,
            limits=limits,
        )
    assert plan_entry(
        image="i", name="a" * 16, kind=EntryKind.FILE, mode=0, size=0, link="", limits=limits
    )


def test_sizes_belong_to_files_only() -> None:
    with pytest.raises(LayerRefused, match="declares 4 bytes for a directory"):
        _plan("d", EntryKind.DIRECTORY, size=4)
    with pytest.raises(LayerRefused, match="declares -1 bytes"):
        _plan("f", EntryKind.FILE, size=-1)


def test_safe_modes_drop_special_bits_and_group_other_write() -> None:
    assert safe_mode(0o7777, EntryKind.FILE) == 0o755
    assert safe_mode(0o000, EntryKind.FILE) == 0o000
    assert safe_mode(0o000, EntryKind.DIRECTORY) == 0o700
    assert safe_mode(0o1777, EntryKind.DIRECTORY) == 0o755


def test_the_budget_refuses_the_first_entry_past_a_limit() -> None:
    budget = UnpackBudget(image="i", limits=ImageLimits(max_bytes=10, max_entries=3))
    budget.charge("a", 4)
    budget.charge("b", 6)
    with pytest.raises(LayerRefused, match="more than 10 bytes"):
        budget.charge("c", 1)
    budget.charge("d", 0)
    with pytest.raises(LayerRefused, match="more than 3 entries"):
        budget.charge("e", 0)
    assert (budget.entries, budget.bytes) == (3, 10)


def test_limits_are_checked_settings() -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        ImageLimits(max_bytes=0)


_NAME_PART = st.sampled_from(["a", "b", ".", "..", "", ".wh.x", "dev", "é", "\udcff"])


@given(st.lists(_NAME_PART, min_size=1, max_size=6), st.booleans())
def test_a_planned_path_never_leaves_the_tree(parts: list[str], absolute: bool) -> None:
    name = ("/" if absolute else "") + "/".join(parts)
    try:
        plan = _plan(name)
    except LayerRefused:
        return
    if plan is None:
        return
    assert isinstance(plan, CreateEntry | RemoveLower | MakeOpaque)
    assert ".." not in plan.path
    assert "" not in plan.path
    assert "." not in plan.path
    assert not absolute
