"""``sweep_stale`` removes the slot cgroups of slot servers that are gone, and nothing else.

Plain folders stand in for a cgroup hierarchy (``rmdir`` refuses a folder that holds anything,
as the kernel refuses a cgroup that holds a process or a group): a dead server's folder with its
slots' groups goes; a live server's (this process's PID), a folder of another name, a dead
server's folder that still holds a file (the stand-in for a process), and a plain file stay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trajcore.adapters.slot_server.limits import _writable_child, sweep_stale


def _dead_pid() -> int:
    """The PID of a process that has ended and been reaped."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    pid = int(done.stdout)
    assert not Path(f"/proc/{pid}").exists()
    return pid


def test_a_gone_servers_cgroups_are_removed_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    gone = tmp_path / f"trajcore-{dead}-local-0"
    for slot in ("slot-0", "slot-1"):
        (gone / slot).mkdir(parents=True)
    live = tmp_path / f"trajcore-{os.getpid()}-root"
    (live / "slot-0").mkdir(parents=True)
    other = tmp_path / "libpod_parent"
    other.mkdir()
    busy = tmp_path / f"trajcore-{dead}-busy"
    (busy / "slot-0").mkdir(parents=True)
    (busy / "slot-0" / "held").write_text("")
    (tmp_path / f"trajcore-{dead}-file").write_text("")

    assert sweep_stale(tmp_path) == 3  # gone's two slots and gone itself
    assert not gone.exists()
    assert (live / "slot-0").is_dir()  # the control: a running server's stays
    assert other.is_dir()
    assert (busy / "slot-0" / "held").exists()
    assert (tmp_path / f"trajcore-{dead}-file").exists()


def test_a_missing_hierarchy_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep_stale(tmp_path / "absent") == 0


def test_a_servers_folder_is_always_one_it_made_never_one_that_was_there(tmp_path: Path) -> None:
    # another server of the same pid (another pid namespace, the same cgroup file system) may
    # hold trajcore-PID-TAG; the watcher empties what it is given, so it is never taken over
    first = _writable_child(tmp_path, "trajcore-7-server")
    assert first == tmp_path / "trajcore-7-server"
    (first / "theirs").mkdir()
    second = _writable_child(tmp_path, "trajcore-7-server")
    assert second is not None
    assert second != first
    assert second.name.startswith("trajcore-7-server~")
    assert [p.name for p in second.iterdir()] == []
    assert (first / "theirs").is_dir()  # left alone
    # this process's own leaf (not emptied by anyone) is used again as it is
    assert _writable_child(tmp_path, "trajcore-7-server", fresh=False) == first
