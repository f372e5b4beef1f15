"""A bound on groups failing in a row: a run whose every group fails stops, saying why.

Atropos's loop takes the next item whenever a group is not sent, without a bound: a run whose
every group fails (a score hook that always raises, a model server that died after the start,
a slot server that cannot run a command) would go on forever, logging only that it retries.
``FailingGroups`` counts the training groups in a row whose verdict is ``failed`` with failed
members (too few healthy ones: the env's code, the model server or the infrastructure failed,
never the policy) and raises ``GroupsFailing`` when the count reaches ``max_failed_groups``,
naming the last group's failures. A group that is not failed (sent, or dropped for equal
scores) starts the count again.

In ``serve`` the groups run in Atropos's worker tasks, whose exceptions Atropos logs and drops
(``handle_env``), so a ``GroupsFailing`` raised there would stop nothing. ``RunStop`` carries it
to the run: ``stop(error)`` from a worker, and ``run(loop)`` cancels Atropos's loop and raises
the error in the run's own task, which closes the services and ends the command; and
``stop_workers`` cancels the worker tasks Atropos left running when a run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import attrs

from trajcore.domain.groups import GroupStatus
from trajcore.entrypoints.atropos_bases import BaseEnv
from trajcore.rollout.group import GroupResult

__all__ = ["FailingGroups", "GroupsFailing", "RunStop", "stop_workers"]


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


@attrs.define
class RunStop:
    """An error a worker task hit that must end the run, carried to the run's own task."""

    error: BaseException | None = None
    _stopped: anyio.Event | None = None

    def stop(self, error: BaseException) -> None:
        """End the run with ``error`` (the first one given wins)."""
        if self.error is None:
            self.error = error
        if self._stopped is not None:
            self._stopped.set()

    async def run(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop`` until it returns or ``stop`` is called; then cancel it and raise.

        Raises:
            BaseException: the error given to ``stop``, or the one ``loop`` raised (as is).
        """
        self._stopped = anyio.Event()
        try:
            async with anyio.create_task_group() as group:

                async def until_stopped() -> None:
                    assert self._stopped is not None
                    await self._stopped.wait()
                    group.cancel_scope.cancel()

                async def looping() -> None:
                    await loop()
                    group.cancel_scope.cancel()

                if self.error is None:
                    group.start_soon(until_stopped)
                    group.start_soon(looping)
        except BaseExceptionGroup as raised:  # the loop's own error, as it raised it
            if len(raised.exceptions) == 1:
                raise raised.exceptions[0] from None
            raise
        finally:
            self._stopped = None
        if self.error is not None:
            raise self.error


async def stop_workers(env: BaseEnv) -> None:
    """Cancel the env's Atropos tasks still running (workers, evaluation) and wait at most 30 s,
    shielded, for them to end: each releases its slots on the way out."""
    tasks = (*env.workers, *env.eval_workers, env.eval_runner)
    running = [task for task in tasks if task is not None and not task.done()]
    for task in running:
        task.cancel()
    if running:
        with anyio.move_on_after(30, shield=True):
            await asyncio.gather(*running, return_exceptions=True)
