"""Where a hook was waiting when the trajectory's deadline ended it, and whose doing that was.

A prepare or score hook still running at the trajectory's deadline is cancelled there. What
it waited on decides the member's status, and the detail says it, as ``hook_failures`` does
for a hook that raised:

- **A call of the hook's that had not answered** (a slot's command, a file read, a tool
  server's call; ``ToolRouter.calls_cut_since``): the slot or the server may have failed, so
  the member fails as ``infra_error``, naming the call.
- **Anything else** (an ``asyncio.sleep``, a lock, a loop of the env's own, a library's
  request): the env's own code did not finish, so the member fails as ``env_error``.

Either way the detail names the hook's innermost frame in the env's code (``file:line in
function``), read from the traceback the cancellation left: the frames outside trajcore, the
standard library and installed packages, else outside trajcore and the standard library.
Neither is ever a score.

With no score reserve (``score_reserve_s`` 0), a member whose turns ran out of time ran them to
the trajectory's deadline itself: its score hook had no time at all, whether it never started
or was ended at its first wait. That is the env's setting, not a failure of the slot or of the
hook's code: the member fails as ``env_error`` with a detail naming ``score_reserve_s``, never
as ``infra_error`` (which the run counts as an outage). These functions never raise and do
no I/O.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from trajcore.domain.agent_loop import StopReason
from trajcore.domain.groups import TrajectoryStatus

__all__ = ["unfinished_hook", "unscored"]

_TRAJCORE = str(Path(__file__).resolve().parents[1]) + os.sep  # the trajcore package
_STDLIB = tuple(
    {os.path.realpath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")}
)
_INSTALLED = tuple(
    {os.path.realpath(sysconfig.get_paths()[key]) + os.sep for key in ("purelib", "platlib")}
)


def _env_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of ``tb`` in the env's code (see the module doc), or ``None``."""
    frames = [(os.path.realpath(frame.filename), frame) for frame in traceback.extract_tb(tb)]
    for others in (_TRAJCORE, *_STDLIB, *_INSTALLED), (_TRAJCORE, *_STDLIB):
        for path, frame in reversed(frames):
            if not path.startswith(others):
                return frame
    return None


def unfinished_hook(
    hook: str, cancelled: BaseException, cut: Sequence[str]
) -> tuple[str, TrajectoryStatus]:
    """The detail and status of a member whose ``hook`` the trajectory's deadline ended
    (``cancelled``: the cancellation that reached the runner; ``cut``: the hook's calls it
    ended unanswered): ``infra_error`` when there were such calls, else ``env_error``.

    ``"score hook did not finish before the trajectory deadline: it was waiting on bash
    'sleep 600', which had not answered (at my_env.py:42 in compute_reward)"``.
    """
    frame = _env_frame(cancelled.__traceback__)
    at = "" if frame is None else (
        f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name})"
    )  # fmt: skip
    said = f"{hook} did not finish before the trajectory deadline"
    if cut:
        return (
            f"{said}: it was waiting on {', '.join(cut)}, which had not answered{at}",
            TrajectoryStatus.INFRA_ERROR,
        )
    return (
        f"{said}: it was waiting in the env's own code, on no call of its tools{at}",
        TrajectoryStatus.ENV_ERROR,
    )


class _Deadlines(Protocol):
    """A trajectory's deadline and the part of it kept for scoring (``RolloutConfig``'s)."""

    @property
    def deadline_s(self) -> float: ...

    @property
    def score_reserve(self) -> float: ...


def unscored(
    config: _Deadlines, stop: StopReason | None, hook: tuple[str, TrajectoryStatus] | None
) -> tuple[str, TrajectoryStatus]:
    """The detail and status of a member to score that the trajectory's deadline left
    unscored: ``stop``, how its loop ended when the turns' deadline ended it or the score hook
    never started, else ``None``; ``hook``, what ``unfinished_hook`` said of its score hook,
    ``None`` when it never started.

    With no score reserve, turns ended as ``time_budget`` there ran to the trajectory's
    deadline: the env's setting left the hook no time, so ``env_error`` saying so, whatever
    the hook waited on. Else the hook's own, or ``infra_error`` when it never started.
    """
    if config.score_reserve == 0 and stop is StopReason.TIME_BUDGET:
        return (
            f"the score hook had no time: the turns ran to the trajectory's deadline "
            f"(deadline_s={config.deadline_s:g} s) and score_reserve_s is 0, which keeps none "
            f"of it for scoring (set score_reserve_s above 0 to score members that run out of "
            f"time)",
            TrajectoryStatus.ENV_ERROR,
        )
    if hook is not None:
        return hook
    return "scoring did not finish before the trajectory deadline", TrajectoryStatus.INFRA_ERROR
