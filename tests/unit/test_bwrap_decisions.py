"""Decisions of the bubblewrap vector that the isolation tests check only in part (found by
mutation testing): which rebinds a system bind already covers. Each test's docstring names the
decision it pins."""

from __future__ import annotations

import pytest

from trajcore.domain.bwrap import bwrap_argv
from trajcore.domain.isolation import SlotIsolation


def _rebound(system_paths: tuple[str, ...], path: str) -> bool:
    argv = bwrap_argv(
        SlotIsolation(system_paths=system_paths), workspace="/w", command=["k"], rebind=[path]
    )
    return any(argv[i : i + 3] == ["--ro-bind", path, path] for i in range(len(argv)))


@pytest.mark.parametrize(
    ("system_paths", "path"),
    [
        (("/usr/",), "/usr/lib/python3"),
        (("/",), "/opt/py"),
        (("/opt/BOX",), "/opt/BOX/lib"),
        (("/usr",), "/usr"),
    ],
)
def test_a_path_under_a_system_bind_is_not_bound_again(
    system_paths: tuple[str, ...], path: str
) -> None:
    """Pins when a system bind covers a rebind: the path is the bind's root or under it, the
    root read without its trailing ``/`` (only ``/``: other characters stay), and ``/`` covers
    every path."""
    assert not _rebound(system_paths, path)


@pytest.mark.parametrize(
    ("system_paths", "path"),
    [(("/usr",), "/usrlocal/py"), (("/opt/BOX",), "/opt/BO/lib"), (("/",), "/tmp/venv")],
)
def test_a_path_beside_a_system_bind_or_under_tmp_is_bound(
    system_paths: tuple[str, ...], path: str
) -> None:
    """Pins that a path sharing only a prefix of characters with a system bind is not covered,
    and that a path under the private ``/tmp`` is bound even when a system bind covers it."""
    assert _rebound(system_paths, path)
