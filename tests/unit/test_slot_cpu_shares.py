"""The slots' ``cpu`` cgroups as bookkeeping (limits.py, "CPU"), over plain folders standing for
the hierarchy: what ``create``, ``enter``, ``share_cpu`` and ``remove_parent`` write and remove.
tests/integration/test_slot_cpu_cgroups.py checks the real hierarchy."""

from __future__ import annotations

import os
from pathlib import Path

from trajcore.adapters.slot_server.limits import (
    CgroupPlan,
    SlotCgroup,
    remove_parent,
    share_cpu,
)
from trajcore.domain.isolation import SlotIsolation


def _plan(root: Path, *, cpu: bool) -> CgroupPlan:
    pids = root / "pids" / "tag"
    pids.mkdir(parents=True)
    cpu_parent = None
    if cpu:
        cpu_parent = root / "cpu" / "tag"
        (cpu_parent / "server").mkdir(parents=True)
    return CgroupPlan(version=1, pids_parent=pids, memory_parent=None, cpu_parent=cpu_parent)


def test_a_slot_enters_its_cpu_group_with_its_pids_group(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=True)
    cgroup = SlotCgroup(plan, "slot-3")
    cgroup.create(SlotIsolation(max_processes=64))
    assert cgroup.dirs == [plan.pids_parent / "slot-3", tmp_path / "cpu" / "tag" / "slot-3"]
    cgroup.enter(4242)
    for folder in cgroup.dirs:
        assert (folder / "cgroup.procs").read_text() == "4242"
    script = cgroup.enter_prefix()[2]
    assert str(tmp_path / "cpu" / "tag" / "slot-3" / "cgroup.procs") in script


def test_without_a_cpu_hierarchy_a_slot_has_its_pids_group_only(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=False)
    cgroup = SlotCgroup(plan, "slot-0")
    cgroup.create(SlotIsolation(max_processes=64))
    assert cgroup.dirs == [plan.pids_parent / "slot-0"]
    share_cpu(plan, 64)  # nothing to weigh
    assert not (tmp_path / "cpu").exists()


def test_the_groups_weigh_as_the_server_and_its_slots_would_as_sessions(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=True)
    assert plan.cpu_parent is not None
    share_cpu(plan, 64)
    assert (plan.cpu_parent / "cpu.shares").read_text() == str(65 * 1024)
    assert (plan.cpu_parent / "server" / "cpu.shares").read_text() == str(64 * 1024)
    share_cpu(plan, 1000)  # the kernel's largest share, at most
    assert (plan.cpu_parent / "cpu.shares").read_text() == "262144"
    assert (plan.cpu_parent / "server" / "cpu.shares").read_text() == "262144"


def test_removing_the_parent_moves_the_server_back_first(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=True)
    assert plan.cpu_parent is not None
    remove_parent(plan)
    assert (tmp_path / "cpu" / "cgroup.procs").read_text() == str(os.getpid())
    assert not plan.cpu_parent.exists()
    assert not plan.pids_parent.exists()


def test_a_parent_with_a_slot_left_stays(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=True)
    assert plan.cpu_parent is not None
    (plan.cpu_parent / "slot-1").mkdir()
    remove_parent(plan)  # never raises
    assert (plan.cpu_parent / "slot-1").is_dir()


def test_a_slot_weighs_more_only_while_its_next_lease_is_readied(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=True)
    cgroup = SlotCgroup(plan, "slot-2")
    cgroup.create(SlotIsolation(max_processes=64))
    cpu = tmp_path / "cpu" / "tag" / "slot-2"
    cgroup.readying(True)
    assert (cpu / "cpu.shares").read_text() == str(8 * 1024)
    assert not (plan.pids_parent / "slot-2" / "cpu.shares").exists()  # the cpu group only
    cgroup.readying(False)
    assert (cpu / "cpu.shares").read_text() == "1024"


def test_without_a_cpu_group_readying_writes_nothing(tmp_path: Path) -> None:
    plan = _plan(tmp_path, cpu=False)
    cgroup = SlotCgroup(plan, "slot-2")
    cgroup.create(SlotIsolation(max_processes=64))
    cgroup.readying(True)
    assert sorted(path.name for path in (plan.pids_parent / "slot-2").iterdir()) == ["pids.max"]
