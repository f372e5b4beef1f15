"""Finding a hook's forgotten ``await``: the calls a toolbox made whose coroutine never ran.

An env's hook that writes ``tools.check("test -f out")`` without ``await`` gets a coroutine,
which is true in an ``if``: the check never runs and the member would be scored as if it had
passed. Python only warns when the coroutine is collected, after the score is taken. So the
toolboxes the hooks get (``SlotTools``, the hermes ``HermesToolContext``) remember each
coroutine their methods make (``remembered``), and the trajectory runner asks, after each
hook, which of them never started (``CallLog.check_awaited``): the member then fails as an
``env_error`` naming the call and where it was written, instead of taking a score.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import attrs

from trajcore.domain.errors import StateError

__all__ = ["CallLog", "remembered"]

P = ParamSpec("P")
R = TypeVar("R")
_PRUNE_AT = 64  # finished coroutines are dropped from the log once it holds this many


@attrs.define
class CallLog:
    """The coroutines a toolbox's methods made, with where each call was written."""

    _made: list[tuple[str, Coroutine[Any, Any, Any]]] = attrs.field(factory=list, init=False)
    _prune_at: int = attrs.field(default=_PRUNE_AT, init=False)

    def remember(self, name: str, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Note ``coroutine``, made by the call ``name`` (``tools.check() at env.py:41``).

        Started coroutines are dropped once the log holds ``_prune_at``; when most are still
        unstarted (a hook that makes thousands before it gathers them) the threshold doubles,
        so the pruning costs a constant share of each call, never a pass per call."""
        made = self._made
        if len(made) >= self._prune_at:
            made[:] = [m for m in made if inspect.getcoroutinestate(m[1]) == inspect.CORO_CREATED]
            self._prune_at = max(_PRUNE_AT, 2 * len(made))
        made.append((name, coroutine))

    def unawaited(self) -> list[str]:
        """The calls whose coroutine never started (a forgotten ``await``), in the order they
        were made; each is closed, so it never runs later, and the log is emptied."""
        names = []
        for name, coroutine in self._made:
            if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                coroutine.close()
                names.append(name)
        self._made.clear()
        self._prune_at = _PRUNE_AT
        return names

    def check_awaited(self, hook: str, example: str) -> None:
        """Raise when a call was made without ``await`` in ``hook``.

        Raises:
            StateError: naming the calls and how to write them (``example``); the member
                fails as ``env_error``, never with a score.
        """
        calls = self.unawaited()
        if calls:
            raise StateError(
                f"{hook} called {', '.join(calls)} without await, so the call never ran and "
                f"its answer was a coroutine: write `{example}`"
            )


class _Logged(Protocol):
    @property
    def call_log(self) -> CallLog: ...


S = TypeVar("S", bound=_Logged)


def remembered(
    prefix: str,
) -> Callable[
    [Callable[Concatenate[S, P], Coroutine[Any, Any, R]]],
    Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
]:
    """Decorate a toolbox's ``async`` method so each coroutine it makes is remembered in the
    toolbox's ``call_log`` as ``<prefix>.<method>() at <file>:<line>``."""

    def decorate(
        method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
        label = f"{prefix}.{method.__name__}()"

        def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
            coroutine = method(self, *args, **kwargs)
            caller = sys._getframe(1)  # where the call was written, for the error
            where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
            self.call_log.remember(f"{label} at {where}", coroutine)
            return coroutine

        functools.update_wrapper(call, method)
        return call

    return decorate
