"""A bound on groups failing in a row: a run whose every group fails stops, saying why.

Atropos's loop takes the next item whenever a group is not sent, without a bound: a run whose
every group fails (a score hook that always raises, a model server that died after the start,
a slot server that cannot run a command) would go on forever, logging only that it retries.
``FailingGroups`` counts the training groups in a row whose verdict is ``failed`` with failed
members (too few healthy ones: the env's code, the model server or the infrastructure failed,
never the policy) and raises ``GroupsFailing`` when the count reaches ``max_failed_groups``,
naming the last group's failures. A group that is not failed (sent, or dropped for equal
scores) starts the count again.
"""

from __future__ import annotations

import attrs

from trajcore.domain.groups import GroupStatus
from trajcore.rollout.group import GroupResult

__all__ = ["FailingGroups", "GroupsFailing"]


class GroupsFailing(RuntimeError):
    """``max_failed_groups`` groups in a row failed; the message names the last one's failures
    (each distinct status and detail, with the members it was theirs)."""


@attrs.define
class FailingGroups:
    """The count of failed groups in a row, against ``limit`` (``None``: no bound)."""

    limit: int | None
    in_a_row: int = 0

    def record(self, result: GroupResult) -> None:
        """Count ``result``.

        Raises:
            GroupsFailing: this was the ``limit``-th failed group in a row.
        """
        if result.verdict.status is not GroupStatus.FAILED or not result.verdict.failed:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.limit is None or self.in_a_row < self.limit:
            return
        failures: dict[str, list[int]] = {}
        for index, member in enumerate(result.members):
            outcome = member.outcome
            if not outcome.status.healthy:
                line = f"{outcome.status.value}: {outcome.detail or 'no detail'}"
                failures.setdefault(line, []).append(index)
        named = "; ".join(
            f"member{'s' if len(who) > 1 else ''} {', '.join(map(str, who))} {line}"
            for line, who in failures.items()
        )
        raise GroupsFailing(
            f"{self.in_a_row} groups in a row failed (max_failed_groups={self.limit}); the "
            f"last, {result.group_id}: {named}"
        )
