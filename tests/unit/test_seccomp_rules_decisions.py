"""Decisions of the lease's seccomp rules that the tests of the built table cannot see (found by
mutation testing): the table is built once, at import, so these tests build its parts again and
check each decision on what they build. Each test's docstring names the decision it pins."""

from __future__ import annotations

import errno

import pytest

from trajcore.domain import seccomp_rules
from trajcore.domain.errors import ConfigError
from trajcore.domain.seccomp_rules import LEASE_SOCKET_FAMILIES, SECCOMP_RULES, SyscallRule


def _refuses(rules: list[SyscallRule], value: int) -> bool:
    """Whether one of ``rules`` (on one argument) matches ``value``, as the filter compares."""
    return any(
        (value & rule.mask) == rule.value if rule.op == "masked_eq" else value >= rule.value
        for rule in rules
    )


@pytest.mark.parametrize("name", ["socket", "socketpair"])
def test_the_socket_rules_allow_only_the_confined_families_of_both_calls(name: str) -> None:
    """Pins the socket rules as built: for ``socket`` and ``socketpair`` each, every family below
    the first unlisted one that is not listed is refused on its low 32 bits, every family from
    there on by one range over the whole register, all with ``EAFNOSUPPORT`` on argument 0."""
    rules = [rule for rule in seccomp_rules._socket_rules() if rule.name == name]
    assert {(rule.arg, rule.errno) for rule in rules} == {(0, errno.EAFNOSUPPORT)}
    assert {rule.mask for rule in rules if rule.op == "masked_eq"} == {0xFFFFFFFF}
    assert [(rule.op, rule.value) for rule in rules if rule.op == "ge"] == [("ge", 17)]
    allowed = {family for family in range(256) if not _refuses(rules, family)}
    assert allowed == set(LEASE_SOCKET_FAMILIES)
    assert _refuses(rules, 0)
    assert _refuses(rules, (1 << 32) | 1)
    assert len(rules) == 17 - len(LEASE_SOCKET_FAMILIES) + 1


def test_the_socket_rules_are_the_ones_in_force() -> None:
    """Pins that every lease's filter holds the socket rules, socket's before socketpair's."""
    built = seccomp_rules._socket_rules()
    assert [rule.name for rule in built] == ["socket"] * 14 + ["socketpair"] * 14
    assert all(rule in SECCOMP_RULES for rule in built)


def test_the_scheduling_rules_leave_only_batch_and_idle() -> None:
    """Pins the scheduling rules as built: ``sched_setscheduler`` to any policy but
    ``SCHED_BATCH`` and ``SCHED_IDLE`` fails with ``EPERM`` on argument 1 (the listed ones on
    their low 32 bits, 8 and up by one range), ``sched_setattr`` with ``ENOSYS``."""
    built = list(seccomp_rules._scheduling_rules())
    setscheduler = [rule for rule in built if rule.name == "sched_setscheduler"]
    assert {(rule.arg, rule.errno) for rule in setscheduler} == {(1, errno.EPERM)}
    assert {rule.mask for rule in setscheduler if rule.op == "masked_eq"} == {0xFFFFFFFF}
    assert [(rule.op, rule.value) for rule in setscheduler if rule.op == "ge"] == [("ge", 8)]
    allowed = {policy for policy in range(1 << 12) if not _refuses(setscheduler, policy)}
    assert allowed == {3, 5}
    assert _refuses(setscheduler, (1 << 32) | 3)
    assert built[-1] == SyscallRule("sched_setattr", errno=errno.ENOSYS)
    assert all(rule in SECCOMP_RULES for rule in built)


@pytest.mark.parametrize("op", ["lt", "", None])
def test_a_rule_with_an_unknown_comparison_is_refused_naming_the_known_ones(op: object) -> None:
    """Pins the comparison check's reason: the operators there are, and the one given."""
    with pytest.raises(ConfigError) as caught:
        SyscallRule("socket", arg=0, op=op)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (
        "op",
        f"must be one of masked_eq, ge, got {op!r}",
    )
    assert SyscallRule("socket", arg=0, op="ge").op == "ge"
