"""A lease's limits as data: the tmpfs budget, the rlimits, the seccomp rules that bound memory,
sockets and scheduling (the red-team suite in tests/security proves them on real leases)."""

from __future__ import annotations

import errno

import pytest

from trajcore.adapters.slot_server.limits import TmpfsBudget, rlimits_for, tmpfs_budget
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.seccomp_rules import (
    LEASE_SOCKET_FAMILIES,
    SECCOMP_RULES,
    UNCOUNTED_MEMORY_RULES,
    SyscallRule,
)

MIB = 1 << 20


def test_the_tmpfs_budget_is_a_quarter_of_the_memory_in_whole_units() -> None:
    assert tmpfs_budget(SlotIsolation(memory_bytes=256 * MIB)) == TmpfsBudget(
        size_bytes=64 * MIB, inodes=16384
    )
    odd = tmpfs_budget(SlotIsolation(memory_bytes=256 * MIB + 12345))
    assert odd is not None
    assert odd.size_bytes == 64 * MIB  # rounded down to whole 64 KiB
    tiny = tmpfs_budget(SlotIsolation(memory_bytes=4096))
    assert tiny is not None
    assert tiny.size_bytes == 64 << 10  # never 0, which tmpfs reads as "no limit"
    assert tmpfs_budget(SlotIsolation(memory_bytes=None)) is None
    assert TmpfsBudget(size_bytes=65536, inodes=16).options() == "size=65536,nr_inodes=16"


def test_without_a_memory_cgroup_processes_get_the_limit_less_the_tmpfs() -> None:
    isolation = SlotIsolation(memory_bytes=256 * MIB, max_processes=64)
    limits = rlimits_for(isolation, cgroup_pids=False, cgroup_memory=False, tmpfs_bytes=64 * MIB)
    assert limits == {"nice": 0, "core": 0, "nproc": 64, "as": 192 * MIB, "fsize": 1 << 30}
    bare = rlimits_for(isolation, cgroup_pids=False, cgroup_memory=False)
    assert bare["as"] == 256 * MIB  # an agent without a tmpfs of its own


def test_a_file_is_capped_at_one_gib_unless_the_env_says_otherwise() -> None:
    # a runaway `yes > out` stops at the cap instead of filling the host's disk
    assert SlotIsolation().max_file_bytes == 1 << 30
    limits = rlimits_for(SlotIsolation(), cgroup_pids=True, cgroup_memory=True)
    assert limits["fsize"] == 1 << 30
    unbounded = rlimits_for(
        SlotIsolation(max_file_bytes=None), cgroup_pids=True, cgroup_memory=True
    )
    assert "fsize" not in unbounded


def test_with_cgroups_only_the_nice_and_core_limits_and_the_files_are_rlimits() -> None:
    isolation = SlotIsolation(memory_bytes=256 * MIB, max_file_bytes=MIB)
    limits = rlimits_for(isolation, cgroup_pids=True, cgroup_memory=True, tmpfs_bytes=64 * MIB)
    assert limits == {"nice": 0, "core": 0, "fsize": MIB}


def _by_name(name: str, rules: tuple[SyscallRule, ...] = SECCOMP_RULES) -> list[SyscallRule]:
    return [rule for rule in rules if rule.name == name]


def _refuses(rules: list[SyscallRule], value: int) -> bool:
    """Whether one of ``rules`` (on one argument) matches ``value``, as the filter compares."""
    return any(
        (value & rule.mask) == rule.value if rule.op == "masked_eq" else value >= rule.value
        for rule in rules
    )


@pytest.mark.parametrize("name", ["socket", "socketpair"])
def test_only_the_confined_socket_families_are_allowed(name: str) -> None:
    rules = _by_name(name)
    assert {rule.arg for rule in rules} == {0}
    assert {rule.errno for rule in rules} == {errno.EAFNOSUPPORT}
    allowed = {family for family in range(256) if not _refuses(rules, family)}
    assert allowed == set(LEASE_SOCKET_FAMILIES) == {1, 2, 10, 16}  # Unix, IPv4, IPv6, netlink
    assert _refuses(rules, 40)  # AF_VSOCK
    assert _refuses(rules, (1 << 32) | 1)  # the upper half of the register is never ignored


def test_no_scheduling_policy_but_batch_and_idle_is_allowed() -> None:
    rules = _by_name("sched_setscheduler")
    assert {rule.arg for rule in rules} == {1}
    allowed = {policy for policy in range(1 << 16) if not _refuses(rules, policy)}
    assert allowed == {3, 5}  # SCHED_BATCH, SCHED_IDLE
    assert _refuses(rules, 3 | 0x40000000)  # SCHED_RESET_ON_FORK only matters to real time
    (setattr_rule,) = _by_name("sched_setattr")
    assert (setattr_rule.arg, setattr_rule.errno) == (None, errno.ENOSYS)


def test_memory_files_are_refused_only_where_no_cgroup_counts_them() -> None:
    assert not _by_name("memfd_create")
    refused = {rule.name: rule for rule in UNCOUNTED_MEMORY_RULES}
    assert set(refused) == {"memfd_create", "memfd_secret"}
    assert {rule.errno for rule in refused.values()} == {errno.ENOSYS}


def test_a_rule_with_an_unknown_comparison_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        SyscallRule("socket", arg=0, op="lt")
    assert info.value.field == "op"
