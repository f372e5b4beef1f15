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
Neither is ever a score. These functions never raise and do no I/O.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from trajcore.domain.groups import TrajectoryStatus

__all__ = ["unfinished_hook"]

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
