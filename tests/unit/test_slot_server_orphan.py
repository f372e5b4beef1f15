"""An orphaned slot server that cannot remove ``--parent-dir`` says why where it survives."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from trajcore.entrypoints import slot_server


def _cannot_remove(path: Path, *, timeout_s: float | None = None) -> None:
    raise OSError(39, f"still holds ['slots'] (below {path.name})")


def _orphan_of(directory: Path) -> argparse.Namespace:
    return argparse.Namespace(parent_dir=directory, parent_pid=os.getppid(), parent_died=True)


@pytest.mark.parametrize("log_removed", [True, False])
def test_a_failed_removal_is_reported_beside_what_is_left_once_the_log_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_removed: bool
) -> None:
    directory = tmp_path / "trajcore-pool-x"
    directory.mkdir()
    log_path = directory / "local-0.log"
    monkeypatch.setattr(slot_server, "remove_tree", _cannot_remove)
    with log_path.open("w", encoding="utf-8") as log:
        monkeypatch.setattr("sys.stderr", log)
        if log_removed:  # the removal took the log first (the local pool keeps it there)
            log_path.unlink()
        slot_server._remove_orphaned_dir(_orphan_of(directory), timeout_s=0.0)
    reports = list(directory.glob("slot-server-*.error"))
    if log_removed:
        assert [report.name for report in reports] == [f"slot-server-{os.getpid()}.error"]
        assert reports[0].read_text() == (
            f"trajcore slot-server: cannot remove {directory}: "
            "[Errno 39] still holds ['slots'] (below trajcore-pool-x)\n"
        )
    else:
        assert reports == []
        assert "cannot remove" in log_path.read_text()


def test_a_server_whose_parent_lives_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[Path] = []
    monkeypatch.setattr(slot_server, "remove_tree", lambda path, **_: called.append(path))
    args = argparse.Namespace(parent_dir=tmp_path, parent_pid=os.getppid())
    slot_server._remove_orphaned_dir(args, timeout_s=0.0)
    assert called == []
    assert not slot_server._orphaned(args)
    assert slot_server._orphaned(argparse.Namespace(parent_dir=tmp_path, parent_pid=1 << 22))
