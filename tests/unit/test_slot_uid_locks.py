"""The host's reservations of slot uid ranges (``trajcore.adapters.slot_uid_locks``): two holders
never hold one uid, whatever process or open they hold it through; a holder's end frees its
range, however it ends; a reservation file a stranger could use against the servers is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trajcore.adapters.slot_uid_locks import (
    LOCK_FILE_ENV,
    SlotUidLockError,
    SlotUidsHeld,
    free_base,
    lock_file,
    reserve,
    reserve_free,
)

BASE = 1_900_000_000


@pytest.fixture
def where(tmp_path: Path) -> Path:
    return tmp_path / "run" / "slot-uids"


def test_overlapping_ranges_are_never_held_twice_in_one_process(where: Path) -> None:
    first = reserve(BASE, 4, path=where)
    for start, count in ((BASE, 4), (BASE + 3, 1), (BASE - 2, 3), (BASE - 10, 100)):
        with pytest.raises(SlotUidsHeld) as caught:
            reserve(start, count, path=where)
        assert f"host uids {start}-{start + count - 1} are in use" in str(caught.value)
    beside = [reserve(BASE + 4, 4, path=where), reserve(BASE - 4, 4, path=where)]
    first.release()
    again = reserve(BASE, 4, path=where)  # released: free again
    for reservation in (again, *beside):
        reservation.release()
    assert not again.held
    again.release()  # idempotent


def test_the_file_stays_empty_and_private(where: Path) -> None:
    held = reserve(2_000_000_000, 8, path=where)
    info = where.stat()
    assert (info.st_size, info.st_mode & 0o777) == (0, 0o600)
    assert where.parent.stat().st_mode & 0o777 == 0o755
    held.release()


def test_free_base_skips_held_ranges_and_stops_at_the_limit(where: Path) -> None:
    held = [reserve(BASE, 4, path=where), reserve(BASE + 5, 2, path=where)]
    assert free_base(BASE, 4, limit=BASE + 100, path=where) == BASE + 8  # 4..7 meets 5..6
    assert free_base(BASE + 100, 4, limit=BASE + 200, path=where) == BASE + 100
    with pytest.raises(SlotUidsHeld, match="no free range of 4 after them up to"):
        free_base(BASE, 4, limit=BASE + 7, path=where)
    moved = reserve_free(BASE, 4, limit=BASE + 100, path=where)
    assert moved.first == BASE + 8
    for reservation in (*held, moved):
        reservation.release()


HOLDER = """
import sys, time
from pathlib import Path
from trajcore.adapters.slot_uid_locks import reserve
held = reserve(int(sys.argv[1]), int(sys.argv[2]), path=Path(sys.argv[3]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_holder_killed_frees_its_range_and_another_process_sees_it_held(where: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(BASE), "16", str(where)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SlotUidsHeld):
            reserve(BASE + 15, 1, path=where)
        assert free_base(BASE, 16, limit=BASE + 64, path=where) == BASE + 16
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    reserve(BASE, 16, path=where).release()  # the kernel dropped the dead holder's lock


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_reservation_file_a_stranger_could_use_is_refused(where: Path) -> None:
    where.parent.mkdir(mode=0o755)
    where.touch(mode=0o600)
    os.chown(where, 12345, 12345)  # another user's file: they could hold any range
    with pytest.raises(SlotUidLockError, match="it belongs to uid 12345; remove it"):
        reserve(BASE, 1, path=where)
    os.chown(where, 0, 0)
    where.chmod(0o644)  # others may open it: and hold read locks over any range
    with pytest.raises(SlotUidLockError, match="others may open it"):
        reserve(BASE, 1, path=where)
    where.chmod(0o600)
    where.parent.chmod(0o777)  # others may replace it: two servers, two files, one range
    with pytest.raises(SlotUidLockError, match="others may replace what it holds"):
        reserve(BASE, 1, path=where)
    where.parent.chmod(0o1777)  # sticky (as /tmp): others replace only their own entries
    reserve(BASE, 1, path=where).release()


def test_a_link_in_the_files_place_is_not_followed(tmp_path: Path, where: Path) -> None:
    where.parent.mkdir()
    target = tmp_path / "elsewhere"
    where.symlink_to(target)
    with pytest.raises(SlotUidLockError, match=f"cannot open {where}"):
        reserve(BASE, 1, path=where)
    assert not target.exists()


def test_the_file_is_the_hosts_unless_the_environment_names_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LOCK_FILE_ENV, raising=False)
    assert lock_file() == Path("/run/trajcore/slot-uids")
    monkeypatch.setenv(LOCK_FILE_ENV, "/somewhere/else")
    assert lock_file() == Path("/somewhere/else")
