"""Task environments: the decisions ``test_task_environments`` checks only in part (found by
mutation testing): each refusal's exact field and reason (the tests matched a part of the reason,
which a reason with text around it still holds), the boundaries of the symlink target's length and
of its NUL check, a directory's mode in a planned entry, and how a slot server's lease layer
figures add up (each figure's own sum, the largest, the latest, and the negative figures refused
by name)."""

from __future__ import annotations

import pytest

from trajcore.domain.task_environments import (
    CreateEntry,
    EntryKind,
    ImageLimits,
    LayerRefused,
    LeaseLayerStatistics,
    TaskEnvironmentError,
    UnpackBudget,
    parse_environment_ref,
    plan_entry,
)

LIMITS = ImageLimits(max_path_bytes=16)


def _refusal(
    name: str, kind: EntryKind = EntryKind.FILE, *, link: str = "", size: int = 0
) -> tuple[str, str]:
    with pytest.raises(LayerRefused) as caught:
        plan_entry(
            image="oci:/i", name=name, kind=kind, mode=0o644, size=size, link=link, limits=LIMITS
        )
    return caught.value.field, caught.value.reason


def test_a_reference_is_named_environment_unless_told_and_lists_the_known_transports() -> None:
    """Pins ``parse_environment_ref``'s default field and the list of transports its refusal
    names."""
    with pytest.raises(TaskEnvironmentError) as caught:
        parse_environment_ref(3)
    assert (caught.value.field, caught.value.reason) == ("environment", "must be text, got int")
    with pytest.raises(TaskEnvironmentError) as caught:
        parse_environment_ref(3, field="items[0].environment")
    assert caught.value.field == "items[0].environment"
    with pytest.raises(TaskEnvironmentError) as caught:
        parse_environment_ref("plain")
    assert caught.value.reason == (
        "'plain' names no known transport (one of containers-storage:, docker-daemon:, oci:, "
        "oci-archive:, docker-archive:, directory:)"
    )


@pytest.mark.parametrize(
    ("name", "kind", "link", "field", "reason"),
    [
        ("a\x00b", EntryKind.FILE, "", "oci:/i: entry 'a\\x00b'", "holds a NUL byte"),
        ("a" * 17, EntryKind.FILE, "", f"oci:/i: entry '{'a' * 17}'", "is longer than 16 bytes"),
        ("/etc", EntryKind.FILE, "", "oci:/i: entry '/etc'", "is an absolute path"),
        ("a/../..", EntryKind.FILE, "", "oci:/i: entry 'a/../..'", "has a '..' component"),
        (
            "a/.wh..wh.plnk",
            EntryKind.FILE,
            "",
            "oci:/i: entry 'a/.wh..wh.plnk'",
            "is a reserved whiteout name this unpacker does not know",
        ),
        ("a/.wh.", EntryKind.FILE, "", "oci:/i: entry 'a/.wh.'", "is a whiteout of no name"),
        ("a/.wh..", EntryKind.FILE, "", "oci:/i: entry 'a/.wh..'", "is a whiteout of no name"),
        ("a/.wh...", EntryKind.FILE, "", "oci:/i: entry 'a/.wh...'", "is a whiteout of no name"),
        (
            "l",
            EntryKind.HARDLINK,
            "/etc/shadow",
            "oci:/i: hard link target of 'l': '/etc/shadow'",
            "is an absolute path",
        ),
        ("l", EntryKind.HARDLINK, ".", "oci:/i: entry 'l'", "is a hard link to the layer's root"),
        (
            "s",
            EntryKind.SYMLINK,
            "a\x00b",
            "oci:/i: entry 's'",
            "has an empty symlink target or one holding a NUL byte",
        ),
        (
            "s",
            EntryKind.SYMLINK,
            "/" * 17,
            "oci:/i: entry 's'",
            "has a symlink target longer than 16 bytes",
        ),
    ],
)
def test_a_refused_entry_names_the_image_the_entry_and_exactly_why(
    name: str, kind: EntryKind, link: str, field: str, reason: str
) -> None:
    """Pins the field (image, what was read, the name) and the reason of each refused entry."""
    assert _refusal(name, kind, link=link) == (field, reason)


def test_a_size_on_anything_but_a_file_is_refused_naming_the_entry() -> None:
    """Pins the field and reason of a size declared for a directory."""
    assert _refusal("d", EntryKind.DIRECTORY, size=3) == (
        "oci:/i: entry 'd'",
        "declares 3 bytes for a directory",
    )


def test_a_symlink_target_of_exactly_the_limit_is_kept() -> None:
    """Pins the symlink target's length limit as inclusive."""
    plan = plan_entry(
        image="i",
        name="s",
        kind=EntryKind.SYMLINK,
        mode=0o777,
        size=0,
        link="/" * 16,
        limits=LIMITS,
    )
    assert plan == CreateEntry(
        path=("s",), kind=EntryKind.SYMLINK, mode=0o755, size=0, link="/" * 16
    )


def test_a_planned_directory_keeps_its_owners_bits() -> None:
    """Pins that a planned entry's mode is ``safe_mode`` of its own kind: a directory written with
    no bits keeps its owner's read, write and search bits."""
    plan = plan_entry(
        image="i", name="d", kind=EntryKind.DIRECTORY, mode=0, size=0, link="", limits=LIMITS
    )
    assert plan == CreateEntry(path=("d",), kind=EntryKind.DIRECTORY, mode=0o700, size=0)


def test_the_budget_names_the_image_and_the_entry_past_each_limit() -> None:
    """Pins the field of each budget refusal."""
    budget = UnpackBudget(image="oci:/i", limits=ImageLimits(max_bytes=4, max_entries=1))
    with pytest.raises(LayerRefused) as caught:
        budget.charge("big", 5)
    assert (caught.value.field, caught.value.reason) == (
        "oci:/i: entry 'big'",
        "the image unpacks to more than 4 bytes",
    )
    budget.charge("a", 1)
    with pytest.raises(LayerRefused) as caught:
        budget.charge("b", 0)
    assert (caught.value.field, caught.value.reason) == (
        "oci:/i: entry 'b'",
        "the image holds more than 1 entries",
    )


def test_lease_layer_figures_add_up_keep_the_largest_and_the_latest() -> None:
    """Pins ``LeaseLayerStatistics.add``: one more layer measured per call; bytes, entries, the
    cut-short count and the seconds are sums; the largest layer is kept when a smaller one
    follows; the latest layer's size and entries are the last call's."""
    figures = LeaseLayerStatistics().add(size=700, entries=9, cut_short=True, seconds=0.5)
    assert figures == LeaseLayerStatistics(
        measured=1,
        bytes=700,
        entries=9,
        largest_bytes=700,
        last_bytes=700,
        last_entries=9,
        cut_short=1,
        measure_seconds=0.5,
    )
    figures = figures.add(size=300, entries=4, cut_short=False, seconds=0.25)
    assert figures == LeaseLayerStatistics(
        measured=2,
        bytes=1000,
        entries=13,
        largest_bytes=700,
        last_bytes=300,
        last_entries=4,
        cut_short=1,
        measure_seconds=0.75,
    )
    figures = figures.add(size=900, entries=2, cut_short=True, seconds=1.0)
    assert (figures.measured, figures.largest_bytes, figures.last_bytes, figures.cut_short) == (
        3,
        900,
        900,
        2,
    )


def test_a_lease_layer_of_zero_size_entries_and_seconds_is_counted() -> None:
    """Pins that only a negative figure is refused: a layer that wrote nothing, measured in no
    time, is still one layer measured."""
    figures = LeaseLayerStatistics().add(size=0, entries=0, cut_short=False, seconds=0.0)
    assert figures == LeaseLayerStatistics(measured=1)


@pytest.mark.parametrize(
    ("size", "entries", "seconds", "message"),
    [
        (-1, 0, 0.0, "size: a layer's figure cannot be negative, got -1"),
        (0, -2, 0.0, "entries: a layer's figure cannot be negative, got -2"),
        (0, 0, -0.5, "seconds: a layer's figure cannot be negative, got -0.5"),
    ],
)
def test_a_negative_lease_layer_figure_is_refused_naming_it(
    size: int, entries: int, seconds: float, message: str
) -> None:
    """Pins the refusal of each negative figure of ``LeaseLayerStatistics.add``: a
    ``ValueError`` whose whole message names the figure and the value given."""
    with pytest.raises(ValueError, match="cannot be negative") as caught:
        LeaseLayerStatistics().add(size=size, entries=entries, cut_short=False, seconds=seconds)
    assert str(caught.value) == message
